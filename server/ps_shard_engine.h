// The parameter-server shard's engine (server/ps_shard.h is its
// interface): the received-request record and the PsShardImpl class. Its
// lifecycle, serving loop and job admission are defined in
// server/ps_shard_engine.cc; the handling of pushes (bsp, ssp, async) is
// server/ps_shard_requests.cc, of pulls, with the pulls that wait for a
// version, server/ps_shard_pulls.cc. The replies (Send, ReplyError, Ack), the
// stage timing and the accessors stay inline here, beside the handlers that
// call them on every message. Internal to the shard library.
//
// Thread safety: see server/ps_shard.h; all state is the I/O thread's but
// what is marked otherwise.
#pragma once

#include <spdlog/spdlog.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <map>
#include <mutex>
#include <optional>
#include <thread>
#include <utility>
#include <vector>

#include "common/check.h"
#include "common/logging.h"
#include "common/thread_pool.h"
#include "common/uninit_vector.h"
#include "common/wire/connection_cap.h"
#include "kernels/cpu/codec.h"
#include "server/job_gate.h"
#include "server/ps_shard.h"
#include "server/reply_backlog.h"
#include "server/shard_checkpoint.h"
#include "server/shard_store.h"
#include "server/stale_reads.h"

namespace gridsync {
namespace ps_shard_engine {

using Clock = std::chrono::steady_clock;

// A received request: the frames own the bytes the decoded message refers to,
// so they live together (moving the vector keeps frame addresses stable).
struct Request {
  zmq::message_t identity;
  std::vector<zmq::message_t> frames;
  wire::Message message;
  // Compressed blocks' values: Decode writes every one, so they are not
  // zeroed first (a pass over a push's worth of memory on the serving
  // thread).
  std::vector<UninitVector<float>> decoded;
  bool counted = false;                       // its bytes are in the stats (held and handled again)
  Clock::time_point received = Clock::now();  // judged against the coordinator's answers (JobGate)
  std::string role;  // under CURVE, the role the sender's key proved (ZAP's User-Id)
  int fd = -1;       // the connection it came on (ZMQ_SRCFD), to name an unreadable one's peer
};

class PsShardImpl : public PsShard {
 public:
  PsShardImpl(const Partition& partition, const ShardOptions& options);

  // The partition's state as before any job: zero parameters and moments.
  void NewStore();

  // A long-running shard serves job after job, and a job survives a
  // shard's restart by rolling back (server/job_gate.h): a newer job's first
  // message clears the job before; a newer epoch's reloads the checkpoint
  // the job went back to. false: refused.
  // A claim the coordinator cannot be asked about yet is set aside
  // (Defer) and the request left empty: false then too.
  bool AdmitJob(std::unique_ptr<Request>& owned);

  void Hold(std::unique_ptr<Request> request);

  // Requests whose claim waits for the coordinator's next answer; handled
  // again once it may be asked (AdmitDeferred), without holding up the rest.
  void Defer(std::unique_ptr<Request> request, Clock::time_point retry_at);

  void AdmitDeferred();

  // How long the serving loop may wait for a message: until a deferred
  // claim may be asked about, at most 50 ms.
  int ReceiveTimeoutMs() const;

  // Once the gate opened: what was held, in arrival order.
  void AdmitHeld();

  // Replies to the pulls held for a version and forgets the pushes held
  // for a step: what they belonged to is gone.
  void DropInFlight(const std::string& why);

  void ResetVersion(uint64_t version);

  // A shard restarted and rejoined from its checkpoint of `step`: this one
  // goes back to the same step, and so does every worker.
  void RollBack(uint64_t step);

  ~PsShardImpl() override { Stop(); }

  Status Bind();

  std::string endpoint() const override { return endpoint_; }
  uint64_t refused_connections() const override {
    return (zap_ ? zap_->refused() : 0) + (capped_ ? capped_->refused() : 0);
  }
  uint32_t open_connections() const override { return capped_ ? capped_->open() : 0; }
  uint64_t largest_unread_bytes() const override { return capped_ ? capped_->largest_unread() : 0; }
  uint64_t heartbeats() const override { return heartbeats_.load(std::memory_order_relaxed); }
  void SetControl(ShardControl control) override {
    job_gate_.SetSource(std::move(control.job_state));
    checkpoints_.SetRegistry(control.checkpoint_registry);
  }
  Status CheckStartRun(Store& registry, uint64_t job) override {
    if (options_.resume_step == 0) return Status::OK();
    return checkpoints_.CheckStartRun(registry, job, options_.resume_step, options_.rejoining);
  }
  void NoteCoordinatorState(const JobState& state, Clock::time_point asked) override {
    std::lock_guard<std::mutex> lock(coordinator_state_mu_);
    coordinator_state_ = state;
    coordinator_state_at_ = asked;
  }
  void Joined(uint64_t job, uint32_t epoch) override {
    if (options_.resume_step > 0) {
      checkpoints_.StartedFrom(options_.resume_step, job);
    } else {
      checkpoints_.JobStarted(job);
    }
    if (options_.rejoining || options_.join_first) job_gate_.Open(job, epoch);
  }

  wire::ShardStats stats() const override {
    std::lock_guard<std::mutex> lock(stats_mu_);
    wire::ShardStats copy = stats_;
    copy.applied_steps = applied_.load();
    return copy;
  }

  // options_.connections, with the unread-byte bounds it leaves at 0
  // derived from the largest message a worker sends this shard (init: every
  // row it owns, ids and values): a worker has at most two messages in
  // flight, and all of them together one more each.
  wire::ConnectionLimits ConnectionCaps() const;

  void Stop() override {
    stop_ = true;
    if (thread_.joinable()) thread_.join();
  }

 private:
  void Loop();

  // At Stop: every request still owed a reply (a pull waiting for its
  // version, a message held before a rejoin was admitted or set aside for
  // the coordinator's answer) gets one saying the shard stops, so that its
  // worker learns why at once (and, with checkpoints, waits for the
  // restarted shard to rejoin) instead of at its timeout. The replies get
  // a bounded linger to leave before the socket closes.
  void RefuseOutstanding();

  // Handle, with the last line of defence: an allocation that fails (a
  // request asking for more than this host holds) or any other exception
  // becomes an error reply to its sender, and the shard keeps serving
  // instead of terminating on one message.
  void HandleGuarded(std::unique_ptr<Request> request);

  void CountError() {
    std::lock_guard<std::mutex> lock(stats_mu_);
    ++stats_.errors;
  }

  ServingStats serving_stats() const override;

  enum Stage { kDecode, kApply, kGather, kEncode, kSend, kStages };
  void AddStage(Stage stage, Clock::time_point since) {
    stage_ns_[stage].fetch_add(
        static_cast<uint64_t>(
            std::chrono::duration_cast<std::chrono::nanoseconds>(Clock::now() - since).count()),
        std::memory_order_relaxed);
  }
  const LatencyHistogram& apply_latency() const override { return apply_latency_; }

  void Send(zmq::message_t& identity, std::vector<zmq::message_t> frames) {
    const auto start = Clock::now();
    uint64_t bytes = 0;
    for (const auto& f : frames) bytes += f.size();
    std::vector<zmq::message_t> all;
    all.reserve(frames.size() + 1);
    all.emplace_back(identity.data(), identity.size());
    for (auto& f : frames) all.push_back(std::move(f));
    if (auto status = wire::SendMultipart(socket_, all); !status.ok()) {
      spdlog::warn("shard {}: reply not sent: {}", options_.shard, status.ToString());
    }
    AddStage(kSend, start);
    std::lock_guard<std::mutex> lock(stats_mu_);
    stats_.bytes_out += bytes;
  }

  // readable: the message decoded, so its kind and sender can be named.
  void ReplyError(Request& request, const Status& error, bool readable = true) {
    {
      std::lock_guard<std::mutex> lock(stats_mu_);
      ++refusals_[readable ? std::string(StatusCodeName(error.code())) : "unreadable"];
    }
    // Every refusal is counted (refusals_, the metrics); the budget bounds
    // the lines.
    if (refusal_log_.Allow()) {
      if (readable) {
        spdlog::warn("shard {}: refused {} from worker {} (request {}): {}", options_.shard,
                     wire::KindName(request.message.kind), request.message.worker_rank,
                     request.message.request_id, error.ToString());
      } else {
        // Named by its connection: nothing it sent can be trusted to say who
        // it is. The descriptor is still the sender's (an unreadable message
        // is refused as it arrives, never held).
        spdlog::warn("shard {}: refused an unreadable message from {} (request {}): {}",
                     options_.shard, wire::PeerOfConnection(request.fd), request.message.request_id,
                     error.ToString());
      }
    }
    CountError();
    SendSmall(request.identity,
              wire::EncodeError(request.message.request_id, options_.shard, error));
  }

  // A small reply (an error, an ack, stats), counted as the peer's unsent
  // bytes; dropped when the peer does not read (ReplyBacklog::AdmitSmall).
  void SendSmall(zmq::message_t& identity, std::vector<zmq::message_t> frames) {
    uint64_t bytes = 0;
    for (const auto& f : frames) bytes += f.size();
    auto unsent = backlog_.AdmitSmall(identity, bytes);
    if (unsent == nullptr) {
      if (unread_log_.Allow()) {
        spdlog::warn(
            "shard {}: a reply dropped: its peer holds {} bytes of small replies unread "
            "(it does not read them), or all peers {}",
            options_.shard, ReplyBacklog::kSmallReplySlack, ReplyBacklog::kSmallRepliesAll);
      }
      return;
    }
    Send(identity, wire::Counted(std::move(frames), unsent));
  }

  // `version`: the version the ack reports (default: the current one).
  void Ack(Request& request, std::optional<uint64_t> version = std::nullopt) {
    wire::OutHeader header;
    header.kind = wire::Kind::kPushAck;
    header.step = version.value_or(applied_);
    header.request_id = request.message.request_id;
    header.shard = options_.shard;
    SendSmall(request.identity, wire::Encode(header, {}));
  }

  void Handle(std::unique_ptr<Request> request);

  // The kinds a shard takes (requests), and the refusal of any other.
  static bool TakesKind(wire::Kind kind);
  static Status RefuseKind(wire::Kind kind);

  void HandleInit(Request& request);

  void HandlePush(std::unique_ptr<Request> request);

  // Stale synchronous parallel (Ho et al. 2013): each worker's push is
  // applied as it arrives (one Adam step at learning rate / workers, so a
  // clock of all workers moves the parameters as far as a bsp step), in the
  // worker's step order, and no worker may run more than `staleness` steps
  // ahead of the slowest. The version is the slowest worker's clock: every
  // push of the steps before it is in. Applying on arrival, rather than
  // holding a step until every worker's push of it came, lets each worker
  // read its own last push and everyone else's as early as possible: the
  // reads are as fresh as the bound allows (measured on configs/local.json:
  // holding steps lost 15 dB at staleness 1).
  void HandleSspPush(std::unique_ptr<Request> request);

  // Sums the pushes in the given (worker-rank) order, one table per task
  // (tables are independent; the order inside a table is fixed), then runs
  // Adam in chunks of rows spread over the pool. A step with a single push
  // (one worker, or async) skips the summing buffer.
  void ApplyStep(const std::vector<const wire::Message*>& pushes);

  void HandlePull(std::unique_ptr<Request> request);

  // false: nothing was sent, the reply waits for room (ReplyBacklog::
  // Admission::wait); the caller parks the request with ParkForRoom.
  bool ReplyPull(Request& request);
  bool ReplyPullUnguarded(Request& request);
  // Refuses the pull instead when parked pulls are over their bounds (those
  // of pulls waiting for a version: MaxWaitingPulls, 4 a connection).
  void ParkForRoom(std::unique_ptr<Request> request);
  // Pulls waiting for a version, and pulls parked for room: each at most
  // max(4096, 4 x workers).
  size_t MaxWaitingPulls() const;
  // The values a pull's reply carries, in bytes (its blocks' rows x width).
  static uint64_t ReplyBytes(const wire::Message& pull);
  // Answers the parked pulls that fit now; refuses those parked for
  // ReplyBacklog::kShedWait.
  void RetryPullsAwaitingRoom();

  void ServeWaitingPulls();

  void ExpireWaitingPulls();

  struct Waiting {
    std::unique_ptr<Request> request;
    Clock::time_point deadline;
    // Held once more at its first timeout, the missing workers being
    // members of the job still (ExpireWaitingPulls).
    bool waited_again = false;
  };
  // Of `list` (waiting_ or awaiting_room_): the pulls of the request's
  // connection, and the bytes held with the request's own (HeldBytes);
  // only the request's when the list is full (the count refuses first).
  struct Load {
    size_t its_own;
    uint64_t held;
  };
  Load LoadOf(const std::vector<Waiting>& list, const Request& request) const;
  // The workers whose push of the step being gathered has not arrived
  // (bsp), or whose clock is behind the version applied (ssp, async).
  std::vector<uint32_t> MissingPushers() const;
  // Whether the coordinator's state, noted at or after `since`, lists every
  // worker of `missing` in the job and epoch this shard serves: a stalled
  // network, not a departed worker.
  bool StillMembers(const std::vector<uint32_t>& missing, Clock::time_point since);
  // "" when the coordinator answered a call made since `since` (or never
  // answered any), else a clause for a refusal naming missing workers: they
  // may be waiting on the coordinator too.
  std::string CoordinatorSilence(Clock::time_point since);
  std::mutex coordinator_state_mu_;
  std::optional<JobState> coordinator_state_;  // NoteCoordinatorState; guarded by the mutex
  Clock::time_point coordinator_state_at_;     // when it was asked; guarded by the mutex
  // The version whose held pulls were last logged as held once more: one
  // line a step, however many workers wait (I/O thread).
  uint64_t held_again_logged_ = UINT64_MAX;
  // What a held request keeps in memory (ShardOptions::max_waiting_pull_bytes).
  static uint64_t HeldBytes(const Request& request);
  // Why `request` may not join `kept` (held_ or deferred_, what names them):
  // at most 4096 messages and max_waiting_pull_bytes of them. nullopt: it may.
  std::optional<Status> KeepProblem(const Request& request,
                                    const std::vector<std::unique_ptr<Request>>& kept,
                                    const char* what) const;

  const Partition& partition_;
  ShardOptions options_;
  std::unique_ptr<ShardStore> store_;  // replaced whole when a new job begins
  ThreadPool pool_;
  std::vector<wire::TableShape> shapes_;
  zmq::context_t context_{1};
  std::unique_ptr<wire::ZapHandler> zap_;        // before socket_: destroyed after it
  std::unique_ptr<wire::ConnectionCap> capped_;  // likewise
  zmq::socket_t socket_;
  std::string endpoint_;
  std::thread thread_;
  std::atomic<bool> stop_{false};
  std::atomic<uint64_t> heartbeats_{0};

  // Owned by the I/O thread.
  ReplyBacklog backlog_;              // replies not yet written to peers' sockets
  uint64_t handling_request_id_ = 0;  // HandleGuarded: the request Handle decoded last
  std::atomic<uint64_t> applied_{0};  // written by the I/O thread only
  std::vector<uint64_t> clock_;       // ssp, async: pushes per worker (its next step)
  StaleReads stale_reads_;            // ssp, async: the look-ahead's bookkeeping
  std::map<uint64_t, std::map<uint32_t, std::unique_ptr<Request>>> pending_;  // step -> rank
  std::vector<Waiting> waiting_;
  std::vector<Waiting> awaiting_room_;              // pulls parked by ReplyPull, deadline kShedWait
  std::vector<std::unique_ptr<Request>> held_;      // arrived before a rejoin was admitted
  std::vector<std::unique_ptr<Request>> deferred_;  // claims awaiting the coordinator (Defer)
  Clock::time_point deferred_until_{};
  JobGate job_gate_;
  ShardCheckpoints checkpoints_;
  Status broken_;  // a rollback that failed: every request is refused with it
  std::atomic<uint64_t> damaged_rollback_step_{0};  // ServingStats::damaged_rollback_step
  std::atomic<uint64_t> foreign_rollback_step_{0};  // ServingStats::foreign_rollback_step

  mutable std::mutex stats_mu_;
  wire::ShardStats stats_;                    // guarded by stats_mu_
  std::map<std::string, uint64_t> refusals_;  // by reason; guarded by stats_mu_
  LogBudget refusal_log_{"refusals"};         // the serving thread's
  LogBudget unread_log_{"replies dropped for peers that do not read"};  // the serving thread's
  LatencyHistogram apply_latency_;
  std::atomic<uint64_t> stage_ns_[kStages] = {};  // ServingStats::Stages, in nanoseconds
  std::atomic<uint64_t> waiting_count_{0};        // waiting_.size(), for other threads
  std::atomic<uint64_t> pulls_in_parts_{0};       // ServingStats::pulls_in_parts
  std::atomic<uint64_t> reply_parts_{0};          // ServingStats::reply_parts
};

}  // namespace ps_shard_engine
}  // namespace gridsync
