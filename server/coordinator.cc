// The coordinator engine: one Boost.Asio io_context on its own thread.
//
// Every piece of state below (members, barriers, KV, waiters, connections)
// is touched only from that thread, so it needs no locks; Stop() posts the
// shutdown to it and joins.
//
// Per connection: reads continue while a deferred request (getMap with
// waitComplete, barrier, kvGet) is pending, so that a peer that disconnects
// while waiting is noticed and removed at once. Requests read meanwhile are
// queued and handled in order once the deferred reply has gone out.
//
// The bytes are common/wire/coord_codec.h's, shared with the client: its
// frame format, its decode boundary wire::DecodeRequest() (one frame into
// plain C++ values; every Cap'n Proto exception becomes a Corruption Status)
// and its reply encoders. Handlers work on validated values only. Framing and
// decoding errors get an error reply and close that connection; semantic
// errors (rank taken, tables differ) get an error reply and the connection
// stays open.
#include "server/coordinator.h"

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
#include "common/wire/coord_codec.h"

namespace gridsync {
namespace {

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
// deferred one before the coordinator stops reading from it.
constexpr size_t kMaxQueuedRequests = 64;

std::string Seconds(uint64_t ms) {
  return fmt::format("{:.1f} s", static_cast<double>(ms) / 1000.0);
}

std::string MemberName(Role role, uint32_t rank) {
  return fmt::format("{}-{}", RoleName(role), rank);
}

std::string DescribeMember(const MemberInfo& m) {
  return fmt::format("{} {} (node '{}', pid {})", RoleName(m.role), m.rank, m.node, m.pid);
}

std::string RankList(const std::vector<uint32_t>& ranks) {
  std::string out = "[";
  for (size_t i = 0; i < ranks.size(); ++i) {
    if (i > 0) out += ", ";
    out += std::to_string(ranks[i]);
  }
  return out + "]";
}

std::string Join(const std::vector<std::string>& items, const char* sep = ", ") {
  std::string out;
  for (size_t i = 0; i < items.size(); ++i) {
    if (i > 0) out += sep;
    out += items[i];
  }
  return out;
}

std::string QuoteJoin(const std::vector<std::string>& items) {
  std::vector<std::string> quoted;
  quoted.reserve(items.size());
  for (const auto& s : items) quoted.push_back("'" + s + "'");
  return Join(quoted);
}

std::string TableSize(const TableInfo& t) { return fmt::format("{} x {}", t.rows, t.width); }

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
  std::vector<capnp::word> body;
  size_t body_length = 0;    // bytes the current message announced
  size_t body_received = 0;  // bytes of it received so far
  uint64_t pending = 0;      // this connection's share of pending_bytes_
  std::deque<std::vector<uint8_t>> outbox;
  uint64_t outbox_bytes = 0;
  bool seen_request = false;                       // a first request arrived (the idle check)
  std::string challenge;                           // security: the outstanding authHello challenge
  std::optional<wire::ControlSession> session;     // security: every frame sealed after the proof
  std::optional<Role> authenticated;               // security: the role this connection proved
  std::unique_ptr<asio::steady_timer> read_timer;  // a started message must finish
  bool writing = false;
  bool reading = false;
  bool closing = false;  // no more requests; close once the outbox is written
  bool closed = false;
  bool cleaned = false;
  std::deque<Request> queued;        // read while a deferred request was pending
  std::shared_ptr<Waiter> waiter;    // the deferred request in progress, if any
  std::optional<MemberInfo> member;  // a shard or worker registered here
  bool observer = false;
  // Lingering close after a refusal: see CoordinatorImpl::Linger().
  std::unique_ptr<asio::steady_timer> linger_timer;
  std::vector<uint8_t> discard;
  size_t discarded = 0;
};
using ConnPtr = std::shared_ptr<Connection>;

struct BarrierState {
  uint64_t round = 0;  // completed rounds: a name is reusable
  uint32_t count = 0;
  std::vector<std::shared_ptr<Waiter>> waiters;  // arrival order
};

class CoordinatorImpl final : public Coordinator {
 public:
  explicit CoordinatorImpl(const CoordinatorOptions& options)
      : options_(options), acceptor_(io_), accept_retry_(io_), heartbeat_timer_(io_) {
    map_.expected_shards = options.expected_shards;
    map_.expected_workers = options.expected_workers;
  }
  ~CoordinatorImpl() override { Stop(); }

  Status Listen();
  void Launch();
  // Closes the connection with a Timeout error unless the awaited bytes
  // arrive within options_.read_timeout (cancelled when they do).
  void ArmReadDeadline(const ConnPtr& conn, const char* what);
  // security: handles authHello/auth and refuses anything else before a
  // connection proved a role key; true when `request` may be dispatched.
  bool Authenticate(const ConnPtr& conn, Request& request);
  uint16_t port() const override { return port_; }
  uint64_t heartbeats() const override { return heartbeats_.load(std::memory_order_relaxed); }
  Result<CoordinatorStats> stats(std::chrono::milliseconds timeout) override;
  void StoreLocally(const std::string& key, const std::string& value) override {
    asio::post(io_, [this, key, value] {
      kv_[key] = value;
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
  void OnRequest(const ConnPtr& conn, Request request);
  void Drain(const ConnPtr& conn);
  void Dispatch(const ConnPtr& conn, Request request);

  void HandleRegister(const ConnPtr& conn, uint64_t id, RegisterInfo info);
  void HandleGetMap(const ConnPtr& conn, uint64_t id, const GetMapRequest& req);
  void HandleBarrier(const ConnPtr& conn, uint64_t id, BarrierRequest req);
  void HandleKvSet(const ConnPtr& conn, uint64_t id, KvSetRequest req);
  void HandleKvGet(const ConnPtr& conn, uint64_t id, KvGetRequest req);

  std::vector<uint8_t> ValuesFrame(uint64_t request_id, const std::vector<std::string>& keys) const;
  std::vector<std::string> MissingKeys(const std::vector<std::string>& keys) const;
  std::string IncompleteMessage(uint32_t waited_ms) const;
  // Why `step` is no step to roll the job back to (nullopt: it is one).
  std::optional<std::string> CheckRejoinStep(uint64_t step) const;
  // Whether a part of the running job published a checkpoint step.
  bool JobHasCheckpoints() const;
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
  std::atomic<uint64_t> heartbeats_{0};
  uint16_t port_ = 0;
  std::string address_;

  std::mutex stop_mu_;  // Stop() against Stop()
  std::thread thread_;
  std::promise<void> thread_done_;

  // ---- io thread only ----
  bool shutting_down_ = false;
  uint64_t next_connection_id_ = 0;
  uint64_t pending_bytes_ = 0;     // partially received bodies, all connections
  bool training_started_ = false;  // the "init" barrier passed: shards hold trained state
  // The workers passed "done": members leaving now are the normal end of the
  // job, not a failure (logged as info, not as a warning).
  bool job_done_ = false;
  std::set<ConnPtr> connections_;
  ClusterMap map_;
  std::optional<std::string> tables_owner_;  // who defined map_.tables
  std::vector<std::shared_ptr<Waiter>> map_waiters_;
  std::map<std::string, BarrierState> barriers_;
  std::map<std::string, std::string> kv_;
  std::vector<std::shared_ptr<Waiter>> kv_waiters_;
  CoordinatorStats counts_;  // the counters of stats(); the rest is read from the state
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

Status CoordinatorImpl::Listen() {
  if (options_.max_message_bytes < 8) {
    return Status::InvalidArgument(
        fmt::format("coordinator: max_message_bytes {} is too small; allowed: >= 8",
                    options_.max_message_bytes));
  }
  ErrorCode ec;
  tcp::endpoint endpoint;
  auto address = asio::ip::make_address(options_.bind_host, ec);
  if (!ec) {
    endpoint = tcp::endpoint(address, options_.port);
  } else {
    tcp::resolver resolver(io_);
    auto results = resolver.resolve(options_.bind_host, std::to_string(options_.port), ec);
    if (ec || results.empty()) {
      return Status::IOError(fmt::format("coordinator: cannot resolve bind address '{}': {}",
                                         options_.bind_host, ec ? ec.message() : "no addresses"));
    }
    endpoint = results.begin()->endpoint();
  }
  auto fail = [&](const char* step) {
    return Status::IOError(fmt::format("coordinator: cannot listen on {}:{} ({} failed): {}",
                                       options_.bind_host, options_.port, step, ec.message()));
  };
  if (acceptor_.open(endpoint.protocol(), ec); ec) return fail("open");
  if (acceptor_.set_option(tcp::acceptor::reuse_address(true), ec); ec) return fail("SO_REUSEADDR");
  if (acceptor_.bind(endpoint, ec); ec) return fail("bind");
  if (acceptor_.listen(asio::socket_base::max_listen_connections, ec); ec) return fail("listen");
  auto local = acceptor_.local_endpoint(ec);
  if (ec) return fail("getsockname");
  port_ = local.port();
  address_ = fmt::format("{}:{}", local.address().to_string(), port_);
  return Status::OK();
}

void CoordinatorImpl::Heartbeat() {
  heartbeats_.fetch_add(1, std::memory_order_relaxed);
  heartbeat_timer_.expires_after(std::chrono::milliseconds(250));
  heartbeat_timer_.async_wait([this](const ErrorCode& ec) {
    if (!ec && !shutting_down_) Heartbeat();
  });
}

Result<CoordinatorStats> CoordinatorImpl::stats(std::chrono::milliseconds timeout) {
  auto promise = std::make_shared<std::promise<CoordinatorStats>>();
  auto future = promise->get_future();
  asio::post(io_, [this, promise] {
    CoordinatorStats s = counts_;
    s.generation = map_.generation;
    s.job = map_.job;
    s.epoch = map_.epoch;
    s.shards = static_cast<uint32_t>(map_.shards.size());
    s.workers = static_cast<uint32_t>(map_.workers.size());
    s.expected_shards = map_.expected_shards;
    s.expected_workers = map_.expected_workers;
    s.connections = connections_.size();
    s.barrier_waiting = 0;
    for (const auto& [name, barrier] : barriers_) s.barrier_waiting += barrier.waiters.size();
    promise->set_value(s);
  });
  if (future.wait_for(timeout) != std::future_status::ready) {
    return Status::Timeout("coordinator: its serving thread did not answer within " +
                           std::to_string(timeout.count()) + " ms");
  }
  return future.get();
}

void CoordinatorImpl::Launch() {
  Accept();
  Heartbeat();
  thread_ = std::thread([this] {
    for (;;) {
      try {
        io_.run();
        break;
      } catch (const std::exception& e) {
        // Handlers are guarded; this is a last resort so the server lives on.
        spdlog::error("coordinator: io_context: {}", e.what());
      } catch (...) {
        spdlog::error("coordinator: io_context: unknown exception");
      }
    }
    thread_done_.set_value();
  });
}

void CoordinatorImpl::Stop() {
  std::lock_guard<std::mutex> lock(stop_mu_);
  if (!thread_.joinable()) return;
  asio::post(io_, [this] { Guard(nullptr, "shutdown", [&] { Shutdown(); }); });
  // Shutdown closes every socket and timer, so run() returns by itself once
  // the aborted handlers have run; stop() is the fallback.
  if (thread_done_.get_future().wait_for(std::chrono::seconds(5)) != std::future_status::ready) {
    spdlog::warn("coordinator: handlers still running 5 s after Stop(); stopping the io_context");
    io_.stop();
  }
  thread_.join();
}

void CoordinatorImpl::Shutdown() {
  shutting_down_ = true;
  ErrorCode ignored;
  acceptor_.close(ignored);
  accept_retry_.cancel();
  heartbeat_timer_.cancel();
  auto cancel = [](std::vector<std::shared_ptr<Waiter>>& waiters) {
    for (auto& w : waiters) {
      w->done = true;
      w->timer.cancel();
    }
    waiters.clear();
  };
  cancel(map_waiters_);
  cancel(kv_waiters_);
  for (auto& [name, barrier] : barriers_) cancel(barrier.waiters);
  auto connections = connections_;
  for (const auto& conn : connections) Close(conn, "coordinator stopping");
  connections_.clear();
  spdlog::info("coordinator on {} stopped", address_);
}

// ---- Accepting and reading ----

void CoordinatorImpl::Accept() {
  acceptor_.async_accept([this](ErrorCode ec, tcp::socket socket) {
    Guard(nullptr, "accept", [&] {
      if (shutting_down_ || ec == asio::error::operation_aborted) return;
      if (ec) {
        // For example EMFILE: back off instead of spinning.
        spdlog::warn("coordinator: accept failed: {}; retrying in 100 ms", ec.message());
        accept_retry_.expires_after(std::chrono::milliseconds(100));
        accept_retry_.async_wait([this](ErrorCode timer_ec) {
          Guard(nullptr, "accept retry", [&] {
            if (!timer_ec && !shutting_down_) Accept();
          });
        });
        return;
      }
      auto conn = std::make_shared<Connection>(std::move(socket), ++next_connection_id_);
      ErrorCode opt_ec;
      conn->socket.set_option(tcp::no_delay(true), opt_ec);
      auto remote = conn->socket.remote_endpoint(opt_ec);
      conn->peer = opt_ec ? std::string("unknown peer")
                          : fmt::format("{}:{}", remote.address().to_string(), remote.port());
      connections_.insert(conn);
      conn->read_timer = std::make_unique<asio::steady_timer>(io_);
      if (connections_.size() > options_.max_connections) {
        Fail(conn, 0,
             Status::InvalidArgument(
                 fmt::format("too many connections: {} open; allowed: at most {} (max_connections)",
                             connections_.size() - 1, options_.max_connections)));
        Accept();
        return;
      }
      spdlog::debug("coordinator: connection {} from {}", conn->id, conn->peer);
      ArmReadDeadline(conn, "its first request");
      ReadHeader(conn);
      Accept();
    });
  });
}

void CoordinatorImpl::ReadHeader(const ConnPtr& conn) {
  if (conn->closed || conn->closing || conn->reading || shutting_down_) return;
  if (conn->queued.size() >= kMaxQueuedRequests) return;       // resumed by Drain()
  if (conn->outbox_bytes > options_.max_outbox_bytes) return;  // resumed by WriteNext()
  conn->reading = true;
  asio::async_read(conn->socket, asio::buffer(conn->header), [this, conn](ErrorCode ec, size_t) {
    Guard(conn, "read", [&] {
      conn->reading = false;
      if (conn->closed) return;
      if (ec) {
        Close(conn, ec == asio::error::eof ? std::string("connection closed by the peer")
                                           : "read failed: " + ec.message());
        return;
      }
      const uint32_t length = wire::DecodeFramePrefix(conn->header);
      switch (wire::CheckFrameLength(
          length, wire::FrameLimit(options_.max_message_bytes, conn->session.has_value()))) {
        case wire::FrameLengthCheck::kOk:
          break;
        case wire::FrameLengthCheck::kEmpty:
          Fail(conn, 0,
               Status::InvalidArgument(fmt::format(
                   "empty message (length prefix 0); allowed: a flat Cap'n Proto CoordRequest of 8 "
                   "to {} bytes",
                   options_.max_message_bytes)));
          return;
        case wire::FrameLengthCheck::kTooLong:
          Fail(conn, 0,
               Status::InvalidArgument(fmt::format(
                   "message length {} bytes exceeds the limit of {} bytes (max_message_bytes); "
                   "allowed: 8 to {} bytes, a multiple of 8",
                   length, options_.max_message_bytes, options_.max_message_bytes)));
          return;
        case wire::FrameLengthCheck::kNotWords:
          Fail(conn, 0,
               Status::Corruption(fmt::format(
                   "message length {} bytes is not a multiple of 8; allowed: a flat Cap'n Proto "
                   "message, which is whole 8-byte words",
                   length)));
          return;
      }
      conn->body_length = length;
      conn->body_received = 0;
      conn->body.clear();
      ArmReadDeadline(conn, "the rest of a message");
      ReadBody(conn);
    });
  });
}

void CoordinatorImpl::ReadBody(const ConnPtr& conn) {
  // The body grows as bytes arrive (at most 64 KiB a read), so a length
  // prefix alone reserves nothing; all partial bodies share one budget.
  constexpr size_t kChunk = 64 * 1024;
  const size_t want = std::min(kChunk, conn->body_length - conn->body_received);
  if (pending_bytes_ + want > options_.max_pending_bytes) {
    Fail(conn, 0,
         Status::InvalidArgument(fmt::format(
             "the coordinator holds {} bytes of unfinished messages; allowed: at most {} over all "
             "connections (max_pending_bytes); send whole messages",
             pending_bytes_, options_.max_pending_bytes)));
    return;
  }
  pending_bytes_ += want;
  conn->pending += want;
  conn->body.resize((conn->body_received + want) / 8 + 1);
  conn->reading = true;
  auto* at = reinterpret_cast<uint8_t*>(conn->body.data()) + conn->body_received;
  asio::async_read(conn->socket, asio::buffer(at, want), [this, conn, want](ErrorCode ec, size_t) {
    Guard(conn, "read", [&] {
      conn->reading = false;
      // Refused meanwhile (a deadline): its bytes are being discarded.
      if (conn->closed || conn->closing) return;
      if (ec) {
        Close(conn, ec == asio::error::eof
                        ? std::string("connection closed by the peer in the middle of a message")
                        : "read failed: " + ec.message());
        return;
      }
      conn->body_received += want;
      if (conn->body_received < conn->body_length) {
        ReadBody(conn);
        return;
      }
      conn->read_timer->cancel();
      conn->seen_request = true;
      pending_bytes_ -= conn->pending;  // the message is whole: no longer pending
      conn->pending = 0;
      conn->body.resize(conn->body_length / 8);
      if (conn->session) {
        auto opened = wire::OpenSealedBody(*conn->session, conn->body.data(), conn->body_length);
        if (!opened.ok()) {
          spdlog::warn("coordinator: connection {} ({}): {}", conn->id, conn->peer,
                       opened.status().message());
          Close(conn, "a sealed frame did not open");
          return;
        }
        conn->body = std::move(opened).value();
      }
      uint64_t request_id = 0;
      auto request = wire::DecodeRequest(
          kj::ArrayPtr<const capnp::word>(conn->body.data(), conn->body.size()), &request_id);
      // Shrink big buffers back; keep small ones for the next request.
      if (conn->body.capacity() > 4096) std::vector<capnp::word>().swap(conn->body);
      if (!request.ok()) {
        Fail(conn, request_id, request.status());
        return;
      }
      OnRequest(conn, std::move(request).value());
      ReadHeader(conn);
    });
  });
}

void CoordinatorImpl::ArmReadDeadline(const ConnPtr& conn, const char* what) {
  conn->read_timer->expires_after(options_.read_timeout);
  std::weak_ptr<Connection> weak = conn;
  conn->read_timer->async_wait([this, weak, what](ErrorCode ec) {
    Guard(nullptr, "read deadline", [&] {
      auto c = weak.lock();
      if (ec || !c || c->closed || c->closing) return;
      Fail(c, 0,
           Status::Timeout(fmt::format(
               "{} did not arrive within {} ms (read_timeout); allowed: whole messages, sent "
               "promptly",
               what, options_.read_timeout.count())));
    });
  });
}

void CoordinatorImpl::OnRequest(const ConnPtr& conn, Request request) {
  if (conn->waiter || !conn->queued.empty()) {
    conn->queued.push_back(std::move(request));
    return;
  }
  Dispatch(conn, std::move(request));
}

void CoordinatorImpl::Drain(const ConnPtr& conn) {
  while (!conn->closed && !conn->closing && !conn->waiter && !conn->queued.empty()) {
    Request request = std::move(conn->queued.front());
    conn->queued.pop_front();
    Dispatch(conn, std::move(request));
  }
  ReadHeader(conn);  // resumes reading if the queue had filled up
}

bool CoordinatorImpl::Authenticate(const ConnPtr& conn, Request& request) {
  if (conn->authenticated) {
    if (auto* reg = std::get_if<RegisterInfo>(&request.body);
        reg != nullptr && reg->role != *conn->authenticated) {
      spdlog::warn("coordinator: connection {} ({}) authenticated as {} tried to register as {}",
                   conn->id, conn->peer, RoleName(*conn->authenticated), RoleName(reg->role));
      Send(conn,
           wire::EncodeErrorReply(
               request.id, Status::InvalidArgument(fmt::format(
                               "this connection proved the {} key; allowed: register "
                               "as {} only",
                               RoleName(*conn->authenticated), RoleName(*conn->authenticated)))));
      return false;
    }
    return true;  // a second authHello/auth is refused by Dispatch
  }
  if (std::holds_alternative<AuthHelloRequest>(request.body)) {
    conn->challenge = wire::RandomBytes(32);
    Send(conn, wire::EncodeChallengeReply(request.id, conn->challenge));
    return false;
  }
  if (auto* auth = std::get_if<AuthRequest>(&request.body)) {
    const std::string role = RoleName(auth->role);
    const std::string challenge = conn->challenge;
    Status proof =
        conn->challenge.empty()
            ? Status::InvalidArgument("auth before authHello; allowed: authHello, then auth")
            : wire::OpenChallenge(options_.auth, role, conn->challenge, auth->nonce, auth->box);
    conn->challenge.clear();  // one proof per challenge
    if (!proof.ok()) {
      spdlog::warn("coordinator: connection {} ({}) failed to authenticate as {}: {}", conn->id,
                   conn->peer, role, proof.message());
      Fail(conn, request.id, proof);
      return false;
    }
    auto session = wire::ControlSession::Derive(options_.auth, options_.auth.role_public.at(role),
                                                challenge, /*coordinator_side=*/true);
    if (!session.ok()) {
      Fail(conn, request.id, session.status());
      return false;
    }
    conn->authenticated = auth->role;
    spdlog::debug("coordinator: connection {} ({}) authenticated as {}", conn->id, conn->peer,
                  role);
    Send(conn, wire::EncodeOkReply(request.id));  // the last frame in the clear
    conn->session = std::move(session).value();
    return false;
  }
  spdlog::warn("coordinator: connection {} ({}) sent a request before authenticating", conn->id,
               conn->peer);
  Fail(conn, request.id,
       Status::InvalidArgument("unauthenticated connection; allowed first: authHello, then auth "
                               "with a role key (security.keys_dir)"));
  return false;
}

void CoordinatorImpl::Dispatch(const ConnPtr& conn, Request request) {
  const uint64_t id = request.id;
  if (options_.auth.on && !Authenticate(conn, request)) return;
  std::visit(
      [&](auto& body) {
        using T = std::decay_t<decltype(body)>;
        if constexpr (std::is_same_v<T, RegisterInfo>) {
          HandleRegister(conn, id, std::move(body));
        } else if constexpr (std::is_same_v<T, GetMapRequest>) {
          HandleGetMap(conn, id, body);
        } else if constexpr (std::is_same_v<T, BarrierRequest>) {
          HandleBarrier(conn, id, std::move(body));
        } else if constexpr (std::is_same_v<T, KvSetRequest>) {
          HandleKvSet(conn, id, std::move(body));
        } else if constexpr (std::is_same_v<T, KvGetRequest>) {
          HandleKvGet(conn, id, std::move(body));
        } else if constexpr (std::is_same_v<T, HeartbeatRequest>) {
          Send(conn, wire::EncodeOkReply(id));
        } else {
          // authHello/auth without security, or auth once authenticated.
          Fail(conn, id,
               Status::InvalidArgument(options_.auth.on
                                           ? "this connection is already authenticated"
                                           : "authentication is off on this coordinator "
                                             "(security.curve is false); allowed: any other "
                                             "request"));
        }
      },
      request.body);
}

// ---- Requests ----

std::optional<std::string> CoordinatorImpl::TableMismatch(const RegisterInfo& info) const {
  const auto& mine = info.tables;
  const auto& cluster = map_.tables;
  const std::string owner = tables_owner_.value_or("?");
  const size_t n = std::max(mine.size(), cluster.size());
  for (size_t i = 0; i < n; ++i) {
    if (i >= mine.size()) {
      return fmt::format(
          "table '{}' ({}) of the cluster (defined by {}) is missing: this {} sent {} tables, the "
          "cluster has {}",
          cluster[i].name, TableSize(cluster[i]), owner, RoleName(info.role), mine.size(),
          cluster.size());
    }
    if (i >= cluster.size()) {
      return fmt::format(
          "table '{}' ({}) is not among the cluster's tables (defined by {}): this {} sent {} "
          "tables, "
          "the cluster has {}",
          mine[i].name, TableSize(mine[i]), owner, RoleName(info.role), mine.size(),
          cluster.size());
    }
    if (mine[i] == cluster[i]) continue;
    if (mine[i].name == cluster[i].name) {
      return fmt::format(
          "table '{}' is {} (rows x width) here but {} in the cluster map (defined by {})",
          mine[i].name, TableSize(mine[i]), TableSize(cluster[i]), owner);
    }
    return fmt::format(
        "table {} is '{}' ({}) here but '{}' ({}) in the cluster map (defined by {}); sizes are "
        "rows x "
        "width",
        i, mine[i].name, TableSize(mine[i]), cluster[i].name, TableSize(cluster[i]), owner);
  }
  return std::nullopt;
}

void CoordinatorImpl::HandleRegister(const ConnPtr& conn, uint64_t id, RegisterInfo info) {
  if (conn->member || conn->observer) {
    Send(conn, wire::EncodeErrorReply(
                   id, Status::InvalidArgument(fmt::format(
                           "this connection is already registered as {}; allowed: one "
                           "registration per connection",
                           conn->member ? DescribeMember(*conn->member) : "an observer"))));
    return;
  }
  if (info.role == Role::kObserver) {
    conn->observer = true;
    spdlog::info("observer joined (node '{}', pid {}, from {})", info.node, info.pid, conn->peer);
    Send(conn, wire::EncodeRegisteredReply(id, 0, map_));
    return;
  }
  const bool shard = info.role == Role::kShard;
  auto& members = shard ? map_.shards : map_.workers;
  const uint32_t expected = shard ? map_.expected_shards : map_.expected_workers;
  const char* role = RoleName(info.role);
  const char* key = shard ? "ps.shards" : "distributed.world_size";
  auto holder = [&](uint32_t rank) -> const MemberInfo* {
    for (const auto& m : members) {
      if (m.rank == rank) return &m;
    }
    return nullptr;
  };
  auto refuse = [&](std::string text) {
    ++counts_.registrations_refused;
    spdlog::warn("register refused ({} from node '{}', pid {}, {}): {}", role, info.node, info.pid,
                 conn->peer, text);
    Send(conn, wire::EncodeErrorReply(id, Status::InvalidArgument(std::move(text))));
  };

  // A shard or worker restarted during training rejoins from the job's
  // newest complete checkpoint, and the whole job rolls back to that step (a
  // new epoch). One that starts afresh would silently lose training (a
  // shard at version 0) or wait for peers long past 'init' (a worker):
  // refused.
  const bool rejoining = info.rejoin_step > 0;
  if (rejoining && (!training_started_ || job_done_)) {
    refuse(fmt::format(
        "{} {} asked to rejoin job {} from step {}, but the job's training {}; "
        "allowed: rejoin step 0 (a fresh start){}",
        role, info.requested_rank, map_.job, info.rejoin_step,
        training_started_ ? "ended (its workers passed 'done')" : "has not started",
        training_started_ ? ", or restart the whole job (gridsync launch --resume)" : ""));
    return;
  }
  if (rejoining) {
    // The step must be one every part of the job published (the shards at
    // least): a claim of any other would roll the job to a state nobody
    // holds, or forward.
    if (auto bad = CheckRejoinStep(info.rejoin_step)) {
      refuse(fmt::format("{} {} asked to rejoin job {} from step {}: {}", role, info.requested_rank,
                         map_.job, info.rejoin_step, *bad));
      return;
    }
  }
  if (!rejoining && training_started_ && (shard || !job_done_)) {
    refuse(fmt::format(
        "{} {} joined after training started (the workers passed 'init') with {}, not the "
        "job's; allowed: a {} rejoining from the job's newest complete checkpoint "
        "(checkpoint.every_steps: a restarted process finds it itself once one exists), or "
        "restart the whole job (gridsync launch --resume)",
        role, info.requested_rank, shard ? "fresh parameters" : "a fresh start", role));
    return;
  }
  uint32_t rank = 0;
  if (info.requested_rank < -1) {
    refuse(fmt::format("{} requested rank {}; allowed: -1 (assign the next free rank) or 0..{}",
                       role, info.requested_rank, expected == 0 ? 0 : expected - 1));
    return;
  }
  if (info.requested_rank >= 0) {
    rank = static_cast<uint32_t>(info.requested_rank);
    if (rank >= expected) {
      refuse(expected == 0 ? fmt::format("{} rank {} refused: the cluster expects no {}s ({} = 0)",
                                         role, rank, role, key)
                           : fmt::format("{} rank {} is out of range; allowed: 0..{} ({} = {})",
                                         role, rank, expected - 1, key, expected));
      return;
    }
    if (const MemberInfo* taken = holder(rank)) {
      refuse(fmt::format("{} rank {} is already taken by {}; each rank registers once", role, rank,
                         DescribeMember(*taken)));
      return;
    }
  } else {
    bool found = false;
    for (uint32_t r = 0; r < expected; ++r) {
      if (!holder(r)) {
        rank = r;
        found = true;
        break;
      }
    }
    if (!found) {
      refuse(fmt::format("all {} {} ranks taken ({} = {})", expected, role, key, expected));
      return;
    }
  }
  if (tables_owner_) {
    if (auto mismatch = TableMismatch(info)) {
      refuse("table mismatch: " + *mismatch +
             "; every shard and worker must register the same tables (the same config)");
      return;
    }
  }

  MemberInfo member{info.role, rank, info.node, info.local_rank, info.endpoint, info.pid};
  auto pos = std::lower_bound(members.begin(), members.end(), rank,
                              [](const MemberInfo& m, uint32_t r) { return m.rank < r; });
  members.insert(pos, member);
  conn->member = member;
  if (!tables_owner_) {
    map_.tables = info.tables;
    tables_owner_ = DescribeMember(member);
  }
  ++map_.generation;
  ++counts_.registrations;
  if (rejoining) {
    ++map_.epoch;
    map_.resume_step = info.rejoin_step;
    spdlog::warn(
        "{} rejoined job {} from its checkpoint of step {}: epoch {}; every process of the job "
        "rolls back to step {}",
        DescribeMember(member), map_.job, info.rejoin_step, map_.epoch, info.rejoin_step);
  }
  spdlog::info("{} joined from {}; cluster map generation {}: {}/{} shards, {}/{} workers",
               DescribeMember(member), conn->peer, map_.generation, map_.shards.size(),
               map_.expected_shards, map_.workers.size(), map_.expected_workers);

  Send(conn, wire::EncodeRegisteredReply(id, rank, map_));
  WakeMapWaiters();
}

bool CoordinatorImpl::JobHasCheckpoints() const {
  const std::string prefix = CheckpointKey(map_.job, "");
  for (auto it = kv_.lower_bound(prefix); it != kv_.end() && it->first.rfind(prefix, 0) == 0;
       ++it) {
    if (!it->second.empty()) return true;
  }
  return false;
}

std::optional<std::string> CoordinatorImpl::CheckRejoinStep(uint64_t step) const {
  const std::string prefix = CheckpointKey(map_.job, "");
  uint32_t shards = 0;
  for (auto it = kv_.lower_bound(prefix); it != kv_.end() && it->first.rfind(prefix, 0) == 0;
       ++it) {
    const std::string part = it->first.substr(prefix.size());
    auto held = ParseHeldSteps(it->second, part);
    if (!held.ok()) return held.status().message();
    if (std::find(held->begin(), held->end(), step) == held->end()) {
      return fmt::format(
          "part {} does not hold it (it published [{}]); allowed: a step every "
          "part of the job holds",
          part, it->second);
    }
    if (part.rfind("shard-", 0) == 0) ++shards;
  }
  if (shards < map_.expected_shards) {
    return fmt::format(
        "only {} of {} shards published it; allowed: a step every part of the job "
        "holds",
        shards, map_.expected_shards);
  }
  return std::nullopt;
}

std::string CoordinatorImpl::IncompleteMessage(uint32_t waited_ms) const {
  auto missing = [](const std::vector<MemberInfo>& members, uint32_t expected) {
    std::vector<uint32_t> ranks;
    for (uint32_t r = 0; r < expected; ++r) {
      bool present = std::any_of(members.begin(), members.end(),
                                 [r](const MemberInfo& m) { return m.rank == r; });
      if (!present) ranks.push_back(r);
    }
    return ranks;
  };
  std::vector<std::string> parts;
  auto shards = missing(map_.shards, map_.expected_shards);
  auto workers = missing(map_.workers, map_.expected_workers);
  if (!shards.empty()) parts.push_back("shards " + RankList(shards));
  if (!workers.empty()) parts.push_back("workers " + RankList(workers));
  return fmt::format("cluster incomplete after {}: missing {} (expecting {} shards, {} workers)",
                     Seconds(waited_ms), Join(parts), map_.expected_shards, map_.expected_workers);
}

void CoordinatorImpl::HandleGetMap(const ConnPtr& conn, uint64_t id, const GetMapRequest& req) {
  if (!req.wait_complete || map_.complete()) {
    Send(conn, wire::EncodeMapReply(id, map_));
    return;
  }
  if (req.timeout_ms == 0) {
    Send(conn, wire::EncodeErrorReply(id, Status::Timeout(IncompleteMessage(0))));
    return;
  }
  auto w = Defer(conn, Waiter::Kind::kMap, id, req.timeout_ms);
  map_waiters_.push_back(w);
  Arm(w);
}

std::string CoordinatorImpl::BarrierTimeoutMessage(const Waiter& w) const {
  std::vector<std::string> arrived;
  std::set<std::string> arrived_set;
  std::set<Role> roles;
  uint32_t count = 0;
  uint64_t round = 0;
  auto it = barriers_.find(w.barrier);
  if (it != barriers_.end()) {
    count = it->second.count;
    round = it->second.round;
    for (const auto& other : it->second.waiters) {
      arrived.push_back(other->member);
      arrived_set.insert(other->member);
      if (other->member_role) roles.insert(*other->member_role);
      for (Role r : {Role::kShard, Role::kWorker}) {
        if (other->member.rfind(std::string(RoleName(r)) + "-", 0) == 0) roles.insert(r);
      }
    }
  }
  // Missing: the members of the roles present that have not arrived, named
  // <role>-<rank> like the map's members.
  std::vector<std::string> missing;
  for (Role r : roles) {
    const uint32_t expected = r == Role::kShard ? map_.expected_shards : map_.expected_workers;
    std::set<uint32_t> ranks;
    for (uint32_t i = 0; i < expected; ++i) ranks.insert(i);
    for (const auto& m : r == Role::kShard ? map_.shards : map_.workers) ranks.insert(m.rank);
    for (uint32_t rank : ranks) {
      std::string name = MemberName(r, rank);
      if (!arrived_set.count(name)) missing.push_back(name);
    }
  }
  const size_t short_by = count > arrived.size() ? count - arrived.size() : 0;
  std::string missing_text =
      missing.empty() ? fmt::format("{} more member(s), not known to the cluster map", short_by)
                      : Join(missing);
  return fmt::format("barrier '{}'{} timed out after {}: {} of {} arrived ({}); missing: {}",
                     w.barrier, round > 0 ? fmt::format(" (round {})", round + 1) : std::string(),
                     Seconds(w.timeout_ms), arrived.size(), count, Join(arrived), missing_text);
}

void CoordinatorImpl::HandleBarrier(const ConnPtr& conn, uint64_t id, BarrierRequest req) {
  if (req.name.empty()) {
    Send(conn, wire::EncodeErrorReply(
                   id, Status::InvalidArgument("barrier: empty name; allowed: a non-empty name")));
    return;
  }
  if (req.count == 0) {
    Send(conn, wire::EncodeErrorReply(
                   id, Status::InvalidArgument(fmt::format(
                           "barrier '{}': count 0; allowed: 1 or more participants", req.name))));
    return;
  }
  std::string member = req.member;
  if (member.empty()) {
    member = conn->member ? MemberName(conn->member->role, conn->member->rank)
                          : fmt::format("connection-{} ({})", conn->id, conn->peer);
  }
  auto& barrier = barriers_[req.name];
  if (!barrier.waiters.empty()) {
    if (barrier.count != req.count) {
      Send(conn, wire::EncodeErrorReply(
                     id, Status::InvalidArgument(fmt::format(
                             "barrier '{}': this caller ({}) says {} participants but those "
                             "waiting ({}) said {}; allowed: the same count for everyone",
                             req.name, member, req.count, barrier.waiters.front()->member,
                             barrier.count))));
      return;
    }
    for (const auto& other : barrier.waiters) {
      if (other->member == member) {
        Send(conn, wire::EncodeErrorReply(
                       id, Status::InvalidArgument(
                               fmt::format("barrier '{}': member '{}' is already waiting; allowed: "
                                           "distinct member names",
                                           req.name, member))));
        return;
      }
    }
  }
  barrier.count = req.count;
  auto w = Defer(conn, Waiter::Kind::kBarrier, id, req.timeout_ms);
  w->barrier = req.name;
  w->member = member;
  if (conn->member) w->member_role = conn->member->role;
  barrier.waiters.push_back(w);
  if (barrier.waiters.size() >= barrier.count) {
    auto waiters = std::move(barrier.waiters);
    barrier.waiters.clear();
    ++barrier.round;
    ++counts_.barriers_passed;
    spdlog::debug("barrier '{}' round {} complete ({} members)", req.name, barrier.round,
                  waiters.size());
    // The workers passed "init" (worker/sync/ps_session.h): the shards hold trained
    // state from here on, which a restarted shard would not have.
    if (req.name == "init") training_started_ = true;
    if (req.name == "done") job_done_ = true;
    for (const auto& waiter : waiters) Complete(waiter, wire::EncodeOkReply(waiter->request_id));
    return;
  }
  Arm(w);
}

std::vector<std::string> CoordinatorImpl::MissingKeys(const std::vector<std::string>& keys) const {
  std::vector<std::string> missing;
  for (const auto& key : keys) {
    if (kv_.find(key) == kv_.end()) missing.push_back(key);
  }
  return missing;
}

std::vector<uint8_t> CoordinatorImpl::ValuesFrame(uint64_t request_id,
                                                  const std::vector<std::string>& keys) const {
  std::vector<std::string_view> values;
  values.reserve(keys.size());
  for (const auto& key : keys) values.push_back(kv_.at(key));
  return wire::EncodeValuesReply(request_id, values);
}

void CoordinatorImpl::HandleKvSet(const ConnPtr& conn, uint64_t id, KvSetRequest req) {
  if (req.key.empty()) {
    Send(conn, wire::EncodeErrorReply(
                   id, Status::InvalidArgument("kvSet: empty key; allowed: a non-empty key")));
    return;
  }
  kv_[req.key] = std::move(req.value);
  ++counts_.kv_sets;
  Send(conn, wire::EncodeOkReply(id));
  WakeKvWaiters();
}

void CoordinatorImpl::HandleKvGet(const ConnPtr& conn, uint64_t id, KvGetRequest req) {
  ++counts_.kv_gets;
  auto missing = MissingKeys(req.keys);
  if (missing.empty()) {
    Send(conn, ValuesFrame(id, req.keys));
    return;
  }
  if (req.timeout_ms == 0) {
    Send(conn,
         wire::EncodeErrorReply(id, Status::NotFound(fmt::format(
                                        "kvGet: key{} {} not found (timeout 0 does not wait)",
                                        missing.size() == 1 ? "" : "s", QuoteJoin(missing)))));
    return;
  }
  auto w = Defer(conn, Waiter::Kind::kKv, id, req.timeout_ms);
  w->keys = std::move(req.keys);
  kv_waiters_.push_back(w);
  Arm(w);
}

// ---- Deferred replies ----

std::shared_ptr<Waiter> CoordinatorImpl::Defer(const ConnPtr& conn, Waiter::Kind kind, uint64_t id,
                                               uint32_t timeout_ms) {
  auto w = std::make_shared<Waiter>(io_, kind);
  w->conn = conn;
  w->request_id = id;
  w->timeout_ms = timeout_ms;
  conn->waiter = w;
  return w;
}

void CoordinatorImpl::Arm(const std::shared_ptr<Waiter>& w) {
  w->timer.expires_after(std::chrono::milliseconds(w->timeout_ms));
  w->timer.async_wait([this, w](ErrorCode ec) {
    Guard(w->conn.lock(), "timer", [&] {
      if (ec || w->done || shutting_down_) return;  // cancelled or already answered
      OnTimeout(w);
    });
  });
}

void CoordinatorImpl::OnTimeout(const std::shared_ptr<Waiter>& w) {
  Status status;
  switch (w->kind) {
    case Waiter::Kind::kMap:
      status = Status::Timeout(IncompleteMessage(w->timeout_ms));
      break;
    case Waiter::Kind::kBarrier:
      ++counts_.barrier_timeouts;
      status = Status::Timeout(BarrierTimeoutMessage(*w));  // before Complete() removes it
      break;
    case Waiter::Kind::kKv:
      status =
          Status::Timeout(fmt::format("kvGet timed out after {}; missing keys: {}",
                                      Seconds(w->timeout_ms), QuoteJoin(MissingKeys(w->keys))));
      break;
  }
  spdlog::debug("coordinator: {}", status.message());
  Complete(w, wire::EncodeErrorReply(w->request_id, status));
}

void CoordinatorImpl::Detach(const std::shared_ptr<Waiter>& w) {
  auto erase = [&](std::vector<std::shared_ptr<Waiter>>& list) {
    list.erase(std::remove(list.begin(), list.end(), w), list.end());
  };
  switch (w->kind) {
    case Waiter::Kind::kMap:
      erase(map_waiters_);
      break;
    case Waiter::Kind::kKv:
      erase(kv_waiters_);
      break;
    case Waiter::Kind::kBarrier: {
      auto it = barriers_.find(w->barrier);
      if (it != barriers_.end()) erase(it->second.waiters);
      break;
    }
  }
}

void CoordinatorImpl::Complete(const std::shared_ptr<Waiter>& w, std::vector<uint8_t> frame) {
  if (w->done) return;
  w->done = true;
  w->timer.cancel();
  Detach(w);
  ConnPtr conn = w->conn.lock();
  if (!conn || conn->closed) return;
  if (conn->waiter == w) conn->waiter.reset();
  Send(conn, std::move(frame));
  // Handle requests queued behind this one on a fresh stack.
  asio::post(io_, [this, conn] { Guard(conn, "drain", [&] { Drain(conn); }); });
}

void CoordinatorImpl::WakeMapWaiters() {
  if (!map_.complete()) return;
  auto waiters = map_waiters_;
  for (const auto& w : waiters) Complete(w, wire::EncodeMapReply(w->request_id, map_));
}

void CoordinatorImpl::WakeKvWaiters() {
  auto waiters = kv_waiters_;
  for (const auto& w : waiters) {
    if (MissingKeys(w->keys).empty()) Complete(w, ValuesFrame(w->request_id, w->keys));
  }
}

// ---- Writing and closing ----

void CoordinatorImpl::Send(const ConnPtr& conn, std::vector<uint8_t> frame) {
  if (conn->closed) return;
  if (conn->session) frame = conn->session->Seal(frame);
  conn->outbox_bytes += frame.size();
  conn->outbox.push_back(std::move(frame));
  if (!conn->writing) WriteNext(conn);
}

void CoordinatorImpl::WriteNext(const ConnPtr& conn) {
  if (conn->closed) return;
  if (conn->outbox.empty()) {
    conn->writing = false;
    if (conn->closing) Linger(conn);
    return;
  }
  conn->writing = true;
  asio::async_write(conn->socket, asio::buffer(conn->outbox.front()),
                    [this, conn](ErrorCode ec, size_t) {
                      Guard(conn, "write", [&] {
                        if (conn->closed) return;
                        const bool was_full = conn->outbox_bytes > options_.max_outbox_bytes;
                        conn->outbox_bytes -= conn->outbox.front().size();
                        conn->outbox.pop_front();
                        if (ec) {
                          Close(conn, "write failed: " + ec.message());
                          return;
                        }
                        WriteNext(conn);
                        // Reading paused while the peer did not take its replies.
                        if (was_full && conn->outbox_bytes <= options_.max_outbox_bytes)
                          ReadHeader(conn);
                      });
                    });
}

void CoordinatorImpl::Fail(const ConnPtr& conn, uint64_t request_id, const Status& status) {
  spdlog::warn("coordinator: connection {} ({}): {} ({}); replying with the error and closing it",
               conn->id, conn->peer, status.message(), StatusCodeName(status.code()));
  Cleanup(conn, "sent a message that was refused: " + status.message());
  pending_bytes_ -= conn->pending;  // its unfinished message is dropped
  conn->pending = 0;
  Send(conn, wire::EncodeErrorReply(request_id, status));
  conn->closing = true;
  if (!conn->writing) Linger(conn);
}

// Closing a socket whose receive buffer still holds bytes makes the kernel
// send a reset, and a reset can discard the error reply before the peer
// reads it. So: half-close (the peer reads the reply, then EOF), discard
// what the peer still sends, and close at its EOF, after 500 ms, or after
// 1 MiB, whichever comes first.
void CoordinatorImpl::Linger(const ConnPtr& conn) {
  if (conn->closed || conn->linger_timer) return;
  ErrorCode ignored;
  conn->socket.shutdown(tcp::socket::shutdown_send, ignored);
  conn->linger_timer = std::make_unique<asio::steady_timer>(io_);
  conn->linger_timer->expires_after(std::chrono::milliseconds(500));
  conn->linger_timer->async_wait([this, conn](ErrorCode) {
    Guard(conn, "linger", [&] { Close(conn, "closed after a refused message"); });
  });
  conn->discard.resize(4096);
  DiscardInput(conn);
}

void CoordinatorImpl::DiscardInput(const ConnPtr& conn) {
  if (conn->closed) return;
  conn->socket.async_read_some(asio::buffer(conn->discard), [this, conn](ErrorCode ec, size_t n) {
    Guard(conn, "linger", [&] {
      if (conn->closed) return;
      conn->discarded += n;
      if (ec || conn->discarded > (size_t{1} << 20)) {
        Close(conn, "closed after a refused message");
        return;
      }
      DiscardInput(conn);
    });
  });
}

void CoordinatorImpl::Cleanup(const ConnPtr& conn, const std::string& reason) {
  if (conn->cleaned) return;
  conn->cleaned = true;
  conn->queued.clear();
  if (auto w = conn->waiter) {
    conn->waiter.reset();
    w->done = true;
    w->timer.cancel();
    Detach(w);
    if (w->kind == Waiter::Kind::kBarrier && !shutting_down_) {
      spdlog::info("barrier '{}': {} left while waiting ({})", w->barrier, w->member, reason);
    }
  }
  if (conn->member) {
    const MemberInfo member = *conn->member;
    conn->member.reset();
    auto& members = member.role == Role::kShard ? map_.shards : map_.workers;
    members.erase(std::remove_if(members.begin(), members.end(),
                                 [&](const MemberInfo& m) { return m.rank == member.rank; }),
                  members.end());
    ++map_.generation;
    if (!shutting_down_) {
      spdlog::log(
          job_done_ ? spdlog::level::info : spdlog::level::warn,
          "{} {} left{} (node '{}', pid {}, {}): {}; cluster map generation {}: {}/{} shards, "
          "{}/{} workers",
          RoleName(member.role), member.rank, job_done_ ? " after the job ended" : "", member.node,
          member.pid, conn->peer, reason, map_.generation, map_.shards.size(), map_.expected_shards,
          map_.workers.size(), map_.expected_workers);
    }
    const bool resumable = !job_done_ && JobHasCheckpoints();
    if (map_.workers.empty() && training_started_ && resumable && !shutting_down_) {
      // Every worker died before the end, but the job has checkpoints: it
      // stays open, and workers restarted with the same config rejoin it.
      spdlog::warn(
          "job {}: every worker left before the job finished; it has checkpoints, so it stays "
          "open and restarted workers rejoin it (a fresh job needs a fresh coordinator)",
          map_.job);
    } else if (map_.workers.empty() && training_started_) {
      // The job's last worker left: the next workers start a new job, which
      // long-running shards (systemd units that stay up) serve afresh.
      spdlog::info("job {} {}; the next workers start job {}", map_.job,
                   job_done_ ? "ended" : "ended without finishing", map_.job + 1);
      ++map_.job;
      map_.epoch = 0;
      map_.resume_step = 0;
      training_started_ = false;
      job_done_ = false;
    }
    if (map_.workers.empty()) {
      // Rendezvous state (Gloo's addresses, NCCL's ids, the backend vote)
      // belongs to the workers that wrote it: the next ones, reusing the
      // group names, must not find it (a second nccl-mode job on this
      // coordinator waited for the first job's Gloo peers).
      const std::string prefix = kCollectiveStorePrefix;
      auto it = kv_.lower_bound(prefix);
      while (it != kv_.end() && it->first.rfind(prefix, 0) == 0) it = kv_.erase(it);
    }
    if (map_.shards.empty() && map_.workers.empty() && tables_owner_) {
      // The job is gone; the next one may bring other tables.
      tables_owner_.reset();
      map_.tables.clear();
      if (!shutting_down_)
        spdlog::info("no shards or workers left; the cluster's tables are forgotten");
    }
  }
}

void CoordinatorImpl::Close(const ConnPtr& conn, const std::string& reason) {
  if (conn->closed) return;
  Cleanup(conn, reason);
  conn->closed = true;
  conn->outbox.clear();
  conn->outbox_bytes = 0;
  pending_bytes_ -= conn->pending;
  conn->pending = 0;
  if (conn->linger_timer) conn->linger_timer->cancel();
  if (conn->read_timer) conn->read_timer->cancel();
  ErrorCode ignored;
  conn->socket.shutdown(tcp::socket::shutdown_both, ignored);
  conn->socket.close(ignored);
  connections_.erase(conn);
  spdlog::debug("coordinator: connection {} ({}) closed: {}", conn->id, conn->peer, reason);
}

}  // namespace

Result<std::unique_ptr<Coordinator>> Coordinator::Start(const CoordinatorOptions& options) {
  auto impl = std::make_unique<CoordinatorImpl>(options);
  GRIDSYNC_RETURN_IF_ERROR(impl->Listen());
  impl->Launch();
  return std::unique_ptr<Coordinator>(std::move(impl));
}

}  // namespace gridsync
