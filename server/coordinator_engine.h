// The coordinator engine's parts (server/coordinator.h is its interface):
// the connection and deferred-reply records and the CoordinatorImpl class,
// whose members are defined in coordinator.cc (listening, the serving
// thread, stopping), coordinator_connections.cc (accepting, reading,
// authenticating, dispatching), coordinator_writes.cc (writing, refusing
// and closing), coordinator_requests.cc (registration, maps, barriers and
// the replies they defer) and coordinator_kv.cc (the KV store). Internal to
// gridsync_coordinator.
//
// Thread safety: one Boost.Asio io_context on its own thread. Every piece of state below (members,
// barriers, KV, waiters, connections) is touched only from that thread, so it needs no locks;
// Stop() posts the shutdown to it and joins.
//
// Per connection: reads continue while a deferred request (getMap with
// waitComplete, barrier, kvGet) is pending, so that a peer that disconnects
// while waiting is noticed and removed at once. Requests read meanwhile are
// queued and handled in order once the deferred reply has gone out. Their
// bytes stay in the max_pending_bytes budget until they are handled (a
// connection may queue a quarter of it), so that a waiting connection
// cannot pile up decoded requests outside every bound; past the budget the
// connection is refused (CoordinatorClient never queues: it sends one
// request at a time).
//
// The bytes are common/wire/coord_codec.h's, shared with the client: its
// frame format, its decode boundary wire::DecodeRequest() (one frame into
// plain C++ values; every Cap'n Proto exception becomes a Corruption Status)
// and its reply encoders. Handlers work on validated values only. Framing and
// decoding errors get an error reply and close that connection; semantic
// errors (rank taken, tables differ) get an error reply and the connection
// stays open.
#pragma once

#include <capnp/common.h>
#include <kj/exception.h>
#include <spdlog/fmt/fmt.h>
#include <spdlog/spdlog.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <boost/asio.hpp>
#include <chrono>
#include <deque>
#include <exception>
#include <future>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <set>
#include <string>
#include <string_view>
#include <thread>
#include <utility>
#include <variant>
#include <vector>

#include "common/checkpoint_registry.h"
#include "common/cluster_map.h"
#include "common/logging.h"
#include "common/wire/coord_codec.h"
#include "server/coordinator.h"
#include "server/coordinator_state.h"

namespace gridsync {
namespace coordinator_engine {

namespace asio = boost::asio;
using tcp = asio::ip::tcp;
using ErrorCode = boost::system::error_code;
// The decoded requests of the control-plane codec (common/wire/coord_codec.h).
using wire::AuthHelloRequest;
using wire::AuthRequest;
using wire::BarrierRequest;
using wire::GetMapRequest;
using wire::HeartbeatRequest;
using wire::KvGetRequest;
using wire::KvSetRequest;
using wire::Request;

// A connection may have this many decoded requests waiting behind a
// deferred one before the coordinator stops reading from it (their bytes
// are bounded separately: QueuedShare()).
inline constexpr size_t kMaxQueuedRequests = 64;

// A request read while an earlier one on its connection waits, with the
// bytes of the frame it came in (what it counts against max_pending_bytes:
// its decoded strings are no larger).
struct QueuedRequest {
  Request request;
  uint64_t bytes = 0;
};

inline std::string Seconds(uint64_t ms) {
  return fmt::format("{:.1f} s", static_cast<double>(ms) / 1000.0);
}

inline std::string MemberName(Role role, uint32_t rank) {
  return fmt::format("{}-{}", RoleName(role), rank);
}

inline std::string DescribeMember(const MemberInfo& m) {
  return fmt::format("{} {} (node '{}', pid {})", RoleName(m.role), m.rank, m.node, m.pid);
}

inline std::string Join(const std::vector<std::string>& items, const char* sep = ", ") {
  std::string out;
  for (size_t i = 0; i < items.size(); ++i) {
    if (i > 0) out += sep;
    out += items[i];
  }
  return out;
}

inline std::string QuoteJoin(const std::vector<std::string>& items) {
  std::vector<std::string> quoted;
  quoted.reserve(items.size());
  for (const auto& s : items) quoted.push_back("'" + s + "'");
  return Join(quoted);
}

inline std::string TableSize(const TableInfo& t) { return fmt::format("{} x {}", t.rows, t.width); }

// ---- Connections and deferred replies ----

struct Connection;

// A request whose reply waits for something (members, barrier peers, keys).
struct Waiter {
  enum class Kind { kMap, kBarrier, kKv };
  Waiter(asio::io_context& io, Kind k) : kind(k), timer(io) {}
  Kind kind;
  std::weak_ptr<Connection> conn;
  uint64_t request_id = 0;
  uint32_t timeout_ms = 0;
  asio::steady_timer timer;
  bool done = false;
  // kBarrier
  std::string barrier;
  std::string member;
  std::optional<Role> member_role;  // from the connection's registration
  // kKv
  std::vector<std::string> keys;
};

struct Connection {
  Connection(tcp::socket s, uint64_t connection_id) : socket(std::move(s)), id(connection_id) {}
  tcp::socket socket;
  uint64_t id;
  std::string peer;
  std::array<uint8_t, wire::kFramePrefixBytes> header{};
  // The message's words: capnp::word itself cannot be copied or moved, which
  // clang holds against vector::resize, so they are kept as their integers.
  std::vector<uint64_t> body;
  size_t body_length = 0;    // bytes the current message announced
  size_t body_received = 0;  // bytes of it received so far
  uint64_t pending = 0;      // this connection's share of pending_bytes_
  // The message being read came before the connection registered or proved
  // a key: its bytes count in stranger_pending_bytes_ too.
  bool stranger_message = false;
  // When it connected or last sent a whole message: at max_connections the
  // stranger idle longest makes room for a new connection.
  std::chrono::steady_clock::time_point last_heard = std::chrono::steady_clock::now();
  bool heard = false;  // it sent a whole message
  std::deque<std::vector<uint8_t>> outbox;
  uint64_t outbox_bytes = 0;
  std::string challenge;                           // security: the outstanding authHello challenge
  std::optional<wire::ControlSession> session;     // security: every frame sealed after the proof
  std::optional<Role> authenticated;               // security: the role this connection proved
  std::unique_ptr<asio::steady_timer> read_timer;  // a started message must finish
  // security: the key proof must complete within read_timeout of the
  // connect, or the slot goes (a silent authHello would hold it forever).
  std::unique_ptr<asio::steady_timer> auth_timer;
  bool writing = false;
  bool reading = false;
  bool closing = false;  // no more requests; close once the outbox is written
  bool closed = false;
  bool cleaned = false;
  std::deque<QueuedRequest> queued;  // read while a deferred request was pending
  uint64_t queued_bytes = 0;         // their frames' bytes (its share of queued_bytes_)
  std::shared_ptr<Waiter> waiter;    // the deferred request in progress, if any
  std::optional<MemberInfo> member;  // a shard or worker registered here
  bool observer = false;
  // Lingering close after a refusal or at shutdown: see
  // CoordinatorImpl::Linger(). Why it closes, for the log.
  std::string linger_reason = "closed after a refused message";
  std::unique_ptr<asio::steady_timer> linger_timer;
  std::vector<uint8_t> discard;
  size_t discarded = 0;
};
using ConnPtr = std::shared_ptr<Connection>;

// A barrier with members waiting. It is erased once none waits (the round
// completed, or its members timed out or left): a name is reusable, and the
// next arrival starts a new round, as before; only live barriers are held.
struct BarrierState {
  uint32_t count = 0;
  std::vector<std::shared_ptr<Waiter>> waiters;  // arrival order, never empty
};

class CoordinatorImpl final : public Coordinator {
 public:
  explicit CoordinatorImpl(const CoordinatorOptions& options)
      : options_(options),
        acceptor_(io_),
        accept_retry_(io_),
        heartbeat_timer_(io_),
        stop_timer_(io_) {
    map_.expected_shards = options.expected_shards;
    map_.expected_workers = options.expected_workers;
    ResetSharedSettings();
  }
  ~CoordinatorImpl() override {
    Stop();
    if (lock_fd_ >= 0) ::close(lock_fd_);  // releases the state file's lock
  }

  // Locks options_.state_file (one coordinator per file) and loads it
  // (unless fresh_state) into the job, before the serving thread starts; a
  // file that does not decode, or is another coordinator's, fails Start.
  Status Restore();
  Status Listen();
  void Launch();
  // Closes the connection with a Timeout error unless the awaited bytes
  // arrive within options_.read_timeout (cancelled when they do).
  void ArmReadDeadline(const ConnPtr& conn, const char* what);
  void ArmAuthDeadline(const ConnPtr& conn);
  // security: handles authHello/auth and refuses anything else before a
  // connection proved a role key; true when `request` may be dispatched.
  bool Authenticate(const ConnPtr& conn, Request& request);
  uint16_t port() const override { return port_; }
  uint64_t heartbeats() const override { return heartbeats_.load(std::memory_order_relaxed); }
  Result<CoordinatorStats> stats(std::chrono::milliseconds timeout) override;
  void StoreLocally(const std::string& key, const std::string& value) override {
    asio::post(io_, [this, key, value] {
      KvPut(key, value);
      WakeKvWaiters();
    });
  }
  void Stop() override;

 private:
  void Heartbeat();
  // Runs `body` (a handler's work), turning any exception into a closed
  // connection (or a log line when there is none): nothing escapes Asio.
  template <typename F>
  void Guard(const ConnPtr& conn, const char* where, F&& body) noexcept;

  void Accept();
  void ReadHeader(const ConnPtr& conn);
  void ReadBody(const ConnPtr& conn);
  // `bytes`: the frame's, counted against max_pending_bytes while queued.
  void OnRequest(const ConnPtr& conn, Request request, uint64_t bytes);
  // What one connection's queued requests may hold: a quarter of
  // max_pending_bytes, so that no single waiting connection takes the whole
  // budget from the others.
  uint64_t QueuedShare() const { return options_.max_pending_bytes / 4; }
  // Connections that have neither registered as a member nor proved a key
  // (strangers) send small requests: registration, key proofs, the
  // monitor's reads, Gloo's rendezvous keys. A stranger's message is at
  // most kStrangerMessageBytes, and strangers' unfinished messages together
  // take at most half of max_pending_bytes, so that anyone who can
  // connect cannot fill the budget and have the members' next requests
  // refused (a hostile probe: 16 connections each holding 16 MiB of an
  // unfinished message had both workers refused and the job stopped).
  static constexpr uint64_t kStrangerMessageBytes = uint64_t{1} << 20;
  uint64_t StrangerPendingShare() const { return options_.max_pending_bytes / 2; }
  // Whether a reply of `bytes` to `conn` (a stranger) fits the strangers'
  // share of queued replies, once the strangers holding the most unread
  // are closed; false: `conn` itself was closed (coordinator_writes.cc).
  bool StrangersOutboxRoom(const ConnPtr& conn, uint64_t bytes);
  static bool Stranger(const Connection& conn) {
    return !conn.member.has_value() && !conn.authenticated.has_value();
  }
  // What the job's workers alone may do (its barriers, their keys) needs
  // this; Registration says what the connection is instead, for the refusal.
  static bool RegisteredWorker(const Connection& conn) {
    return conn.member && conn.member->role == Role::kWorker;
  }
  static std::string Registration(const Connection& conn) {
    return conn.member ? std::string("a registered ") + RoleName(conn.member->role)
                       : std::string("not registered");
  }
  // At max_connections, a new connection takes the slot of a stranger
  // (closed with an error naming why): one that never sent a whole
  // message, the oldest first, while those are at least as many as the
  // strangers waiting for an answer; else one with no request waiting,
  // heard from longest ago; else the newest of those waiting. It is
  // refused only when every open connection is a member or proved a key.
  // Before, strangers that connected and stayed silent locked every new
  // member out until read_timeout (30 s) closed them, wave after wave, and
  // so did strangers waiting with timeouts of days; silent ones going
  // first keeps `gridsync monitor` (a stranger that speaks) through a
  // flood of them. false: `fresh` was refused.
  bool MakeRoomFor(const ConnPtr& fresh);
  // Keeps the strangers' unfinished messages within their share before
  // `conn` (a stranger's message) reads `want` more bytes: while they would
  // pass it (or the budget for all), the stranger holding the most
  // unfinished bytes, more than `conn` would hold, is closed to make room;
  // `conn` is refused when it would hold the most itself. (Strangers queue
  // nothing behind a waiting request: OnRequest refuses it.) Before, the newcomer was refused: 130
  // strangers each holding 1 MiB of a message they never finished (no key needed) had every
  // worker's registration and every monitor refused until read_timeout closed them, and
  // reconnecting kept it so (a hostile probe). With 512 connections at most, strangers filling
  // their share hold 256 KiB each on average at the default budget, more than a member's first
  // message or a monitor's request, which so find a larger holder to close. false: `conn` was
  // refused.
  bool MakeStrangerRoom(const ConnPtr& conn, uint64_t want);
  // Takes the connection's unfinished message out of the budgets.
  void ReleasePending(Connection& conn) {
    pending_bytes_ -= conn.pending;
    if (conn.stranger_message) stranger_pending_bytes_ -= conn.pending;
    conn.pending = 0;
  }
  // Drops `conn`'s queued requests and their bytes from queued_bytes_.
  void ClearQueue(const ConnPtr& conn);
  void Drain(const ConnPtr& conn);
  void Dispatch(const ConnPtr& conn, Request request);

  void HandleRegister(const ConnPtr& conn, uint64_t id, RegisterInfo info);
  void HandleGetMap(const ConnPtr& conn, uint64_t id, const GetMapRequest& req);
  void HandleBarrier(const ConnPtr& conn, uint64_t id, BarrierRequest req);
  // Why `req` is no barrier to wait at (empty, over-long names, a zero
  // count, one name too many), or nullopt.
  std::optional<Status> BarrierProblem(const BarrierRequest& req) const;
  void HandleKvSet(const ConnPtr& conn, uint64_t id, KvSetRequest req);
  // Why `conn` may not set `key`: metrics/<role>/<rank> names the address
  // the monitor scrapes, so only the connection registered as that member
  // writes it (a stranger could otherwise point the monitor anywhere, or
  // forge a member's figures). nullopt: it may.
  static std::optional<Status> MetricsKeyProblem(const Connection& conn, const std::string& key);
  // The keys the job's workers read as their own (the adaptive split's
  // rates, the collectives' rendezvous under kCollectiveStorePrefix) are
  // written by registered workers only: a stranger's "rates/<step>/<rank>"
  // ended a run (a hostile probe), and one under collective/ could send a
  // worker's Gloo group to its own address.
  static std::optional<Status> WorkersKeyProblem(const Connection& conn, const std::string& key);
  // Why `conn` may not set the cannot-join key `key` (kCannotJoinPrefix):
  // "cannot-join/<shard|worker>/<rank>" of a rank the cluster expects, set
  // by that member's own connection or, before it registered, by one that
  // proved that role's key (any, with security off), at most
  // kMaxCannotJoinBytes. nullopt: it may, or `key` is no such key.
  std::optional<Status> CannotJoinKeyProblem(const Connection& conn, const std::string& key,
                                             size_t value_bytes) const;
  // Why `conn` may not set `key` = `value` under checkpoint/ or
  // checkpoint-run/ (coordinator_checkpoint_keys.cc): each such key is one
  // part's, written by its own connection or, before it registered, one
  // that proved its role's key (any, with security off), holding steps or
  // a hexadecimal identity. nullopt: it may, or `key` is no such key.
  std::optional<Status> CheckpointKeyProblem(const Connection& conn, const std::string& key,
                                             const std::string& value) const;
  // Whether `key` = `value` is a part's checkpoint steps in this job
  // (CheckpointEntryProblem): what the rejoin checks and the state file read.
  bool IsPartEntry(const std::string& key, const std::string& value) const {
    return !CheckpointEntryProblem(map_.job, map_.expected_shards, map_.expected_workers, key,
                                   value);
  }
  // Records why `role` `rank` could not join (a refused registration, or
  // what the process said before exiting) where IncompleteMessage names it;
  // its registration clears it.
  void NoteCannotJoin(Role role, uint32_t rank, std::string why);
  void ClearCannotJoin(Role role, uint32_t rank);
  static constexpr size_t kMaxCannotJoinBytes = 1024;
  void HandleKvGet(const ConnPtr& conn, uint64_t id, KvGetRequest req);

  // The values of `keys` (all present), or an error reply when together
  // they exceed options_.max_reply_bytes.
  std::vector<uint8_t> ValuesFrame(uint64_t request_id, const std::vector<std::string>& keys) const;
  // The adaptive split's rounds of rates (kv keys "rates/<step>/<rank>")
  // older than the one before `key`'s, when `key` is one of them.
  void DropOldRateRounds(const std::string& key);
  // kv_ with kv_bytes_ kept in step.
  void KvPut(const std::string& key, std::string value);
  std::map<std::string, std::string>::iterator KvErase(
      std::map<std::string, std::string>::iterator it);
  std::vector<std::string> MissingKeys(const std::vector<std::string>& keys) const;
  // The member registered as `role` `rank`, or null.
  const MemberInfo* Holder(Role role, uint32_t rank) const;
  std::string IncompleteMessage(uint32_t waited_ms) const;
  // "; shard 0 could not join: <why>" for each of `absent` that said why
  // (NoteCannotJoin), at most a few; empty when none did.
  std::string CannotJoinNotes(const std::vector<std::pair<Role, uint32_t>>& absent) const;
  // Why `step` is no step to roll the job back to (nullopt: it is one).
  std::optional<std::string> CheckRejoinStep(uint64_t step) const;
  // Whether the running job has a step to rejoin from (one CheckRejoinStep
  // accepts: every part that published holds it, every shard published).
  bool JobHasCompleteStep() const;
  std::string BarrierTimeoutMessage(const Waiter& w) const;
  std::optional<std::string> TableMismatch(const RegisterInfo& info) const;

  std::shared_ptr<Waiter> Defer(const ConnPtr& conn, Waiter::Kind kind, uint64_t id,
                                uint32_t timeout_ms);
  void Arm(const std::shared_ptr<Waiter>& w);
  void OnTimeout(const std::shared_ptr<Waiter>& w);
  void Detach(const std::shared_ptr<Waiter>& w);
  void Complete(const std::shared_ptr<Waiter>& w, std::vector<uint8_t> frame);
  void WakeMapWaiters();
  void WakeKvWaiters();

  // The next job: no epoch, no training yet (its workers all left).
  void AdvanceJob();
  // What options_.state_file keeps (server/coordinator_state.h).
  CoordinatorState PersistentState() const;
  // Rewrites options_.state_file when PersistentState() changed; every Send
  // calls it first, so nothing is acknowledged that a restart would forget.
  // A failed write removes the file (a restart then starts as new).
  void Persist();

  // Persist(), then queues `frame`.
  void Send(const ConnPtr& conn, std::vector<uint8_t> frame);
  void WriteNext(const ConnPtr& conn);
  void Fail(const ConnPtr& conn, uint64_t request_id, const Status& status);
  void Linger(const ConnPtr& conn);
  void DiscardInput(const ConnPtr& conn);
  void Cleanup(const ConnPtr& conn, const std::string& reason);
  void Close(const ConnPtr& conn, const std::string& reason);
  void Shutdown();

  const CoordinatorOptions options_;
  // Declared first so that it is destroyed last: sockets and timers below
  // belong to it.
  asio::io_context io_;
  tcp::acceptor acceptor_;
  asio::steady_timer accept_retry_;
  asio::steady_timer heartbeat_timer_;
  // At a stop, what is still open after this is closed: a peer that does
  // not read its last replies holds the stop no longer (Shutdown).
  static constexpr std::chrono::milliseconds kStopLinger{2000};
  asio::steady_timer stop_timer_;
  std::atomic<uint64_t> heartbeats_{0};
  uint16_t port_ = 0;
  std::string address_;

  std::mutex stop_mu_;  // Stop() against Stop()
  std::thread thread_;
  std::promise<void> thread_done_;

  // ---- io thread only ----
  bool shutting_down_ = false;
  uint64_t next_connection_id_ = 0;
  LogBudget refusal_log_{"refused connections"};
  uint64_t pending_bytes_ = 0;  // partially received bodies, all connections
  // The part of pending_bytes_ sent by connections that have neither
  // registered nor proved a key (StrangerPendingShare).
  uint64_t stranger_pending_bytes_ = 0;
  uint64_t queued_bytes_ = 0;      // queued requests' frames, all connections
  bool training_started_ = false;  // the "init" barrier passed: shards hold trained state
  // The workers passed "done": members leaving now are the normal end of the
  // job, not a failure (logged as info, not as a warning).
  bool job_done_ = false;
  std::set<ConnPtr> connections_;
  ClusterMap map_;
  std::optional<std::string> tables_owner_;  // who defined map_.tables
  // The settings every member must share (spec/cluster_settings.h) and who
  // defined them: the first shard or worker, forgotten with the tables; the
  // job's, from its first worker, forgotten when no worker is left.
  std::vector<Setting> shared_settings_;
  std::optional<std::string> shared_settings_owner_;
  // To the options' settings, or to none (the next member defines them).
  void ResetSharedSettings() {
    shared_settings_ = options_.shared_settings;
    shared_settings_owner_.reset();
    if (!shared_settings_.empty()) shared_settings_owner_ = options_.shared_settings_source;
  }
  std::vector<Setting> job_settings_;
  std::optional<std::string> job_settings_owner_;
  std::vector<std::shared_ptr<Waiter>> map_waiters_;
  std::map<std::string, BarrierState> barriers_;
  std::map<std::string, std::string> kv_;
  uint64_t kv_bytes_ = 0;  // keys and values in kv_
  // The keys of kv_ an unregistered connection wrote last, and their bytes
  // (keys and values): held to 1/16 of the store's bounds.
  std::set<std::string> stranger_keys_;
  uint64_t stranger_bytes_ = 0;
  std::vector<std::shared_ptr<Waiter>> kv_waiters_;
  CoordinatorStats counts_;  // the counters of stats(); the rest is read from the state
  std::optional<CoordinatorState> persisted_;  // state_file's contents as last written
  std::optional<CoordinatorState> unsaved_;    // the state whose write failed last
  std::string persist_error_;                  // the last failure to write it, logged once
  int lock_fd_ = -1;                           // flock of state_file + ".lock"
};

template <typename F>
void CoordinatorImpl::Guard(const ConnPtr& conn, const char* where, F&& body) noexcept {
  std::string what;
  try {
    body();
    return;
  } catch (const kj::Exception& e) {
    what = e.getDescription().cStr();
  } catch (const std::exception& e) {
    what = e.what();
  } catch (...) {
    what = "unknown exception";
  }
  try {
    spdlog::error("coordinator: internal error in {}: {}", where, what);
    if (conn) Close(conn, "internal error: " + what);
  } catch (...) {
    // Logging or closing failed too (out of memory); nothing more to do.
  }
}

}  // namespace coordinator_engine
}  // namespace gridsync
