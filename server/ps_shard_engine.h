// The parameter-server shard's engine (server/ps_shard.h is its
// interface): the received-request record and the PsShardImpl class. Its
// serving loop, replies and lifecycle are defined here; the handling of
// pushes (bsp, ssp, async) and pulls, with the pulls that wait for a
// version, is server/ps_shard_requests.cc. Internal to the shard library.
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
  PsShardImpl(const Partition& partition, const ShardOptions& options)
      : partition_(partition),
        options_(options),
        pool_(options.threads),
        socket_(context_, zmq::socket_type::router),
        stale_reads_(options),
        job_gate_(options.shard, options.rejoining || options.join_first),
        checkpoints_(options.checkpoint_dir, options.shard, options.checkpoint_every,
                     options.checkpoint_parts, options.timeout) {
    for (uint32_t t = 0; t < partition_.n_tables(); ++t) {
      shapes_.push_back({partition_.table(t).rows, partition_.table(t).width});
    }
    NewStore();
    stats_.rows_owned = store_->owned_rows();
    clock_.assign(options_.workers, 0);
  }

  // The partition's state as before any job: zero parameters and moments.
  void NewStore() {
    store_.reset();  // the old state goes first: never two partitions in memory
    store_ = std::make_unique<ShardStore>(partition_, options_.shard, PerPushHyper(options_),
                                          options_.apply_updates);
    // ssp and async apply each worker's push as its own Adam step: at
    // learning rate / workers, a round of pushes moves the parameters as far
    // as one bsp step (measured: async at the full rate ended 9 dB lower).
    if (options_.consistency != Consistency::kBsp && options_.workers > 0)
      store_->SetLrScale(1.0f / static_cast<float>(options_.workers));
    if (const uint32_t workers = ReplicaWorkers(options_); workers > 0)
      store_->EnableReplicas(workers);
  }

  // A long-running shard serves job after job, and a job survives a
  // shard's restart by rolling back (server/job_gate.h): a newer job's first
  // message clears the job before; a newer epoch's reloads the checkpoint
  // the job went back to. false: refused.
  // A claim the coordinator cannot be asked about yet is set aside
  // (Defer) and the request left empty: false then too.
  bool AdmitJob(std::unique_ptr<Request>& owned) {
    Request& request = *owned;
    const wire::Message& m = request.message;
    // The gate moves at most once per coordinator answer; a message that
    // finds it moved is admitted again against where it now stands.
    for (int round = 0; round < 3; ++round) {
      const uint64_t before = job_gate_.job();
      auto admitted = job_gate_.Admit(m.job, m.epoch, m.worker_rank, request.received);
      if (!admitted.ok()) {
        ReplyError(request, admitted.status());
        return false;
      }
      switch (admitted->verdict) {
        case JobGate::Verdict::kWait:
          Defer(std::move(owned), admitted->retry_at);
          return false;
        case JobGate::Verdict::kCurrent:
          if (!broken_.ok()) {
            ReplyError(request, broken_);
            return false;
          }
          return true;
        case JobGate::Verdict::kNewJob:
          DropInFlight("job " + std::to_string(before) + " ended: job " +
                       std::to_string(job_gate_.job()) + " began");
          NewStore();
          checkpoints_.NewJob(job_gate_.job());
          spdlog::info(
              "shard {}: job {} begins (job {} ended at version {}); the shard starts afresh",
              options_.shard, job_gate_.job(), before, applied_.load());
          ResetVersion(0);
          broken_ = Status::OK();
          break;
        case JobGate::Verdict::kRollBack:
          RollBack(admitted->resume_step);
          break;
      }
    }
    ReplyError(request, Status::IOError("the job moved three times while admitting this message"));
    return false;
  }

  void Hold(std::unique_ptr<Request> request) {
    constexpr size_t kMaxHeld = 4096;  // a few per worker are expected
    if (held_.size() >= kMaxHeld) {
      ReplyError(*request, Status::IOError("shard " + std::to_string(options_.shard) +
                                           " has not been admitted to its cluster yet and holds " +
                                           std::to_string(kMaxHeld) +
                                           " messages already; allowed: retry once it serves"));
      return;
    }
    held_.push_back(std::move(request));
  }

  // Requests whose claim waits for the coordinator's next answer; handled
  // again once it may be asked (AdmitDeferred), without holding up the rest.
  void Defer(std::unique_ptr<Request> request, Clock::time_point retry_at) {
    constexpr size_t kMaxDeferred = 4096;  // a few per worker at a job's move are expected
    if (deferred_.size() >= kMaxDeferred) {
      ReplyError(*request,
                 Status::IOError("shard " + std::to_string(options_.shard) + " holds " +
                                 std::to_string(kMaxDeferred) +
                                 " messages whose job or epoch awaits the coordinator's answer; "
                                 "allowed: retry, or the job and epoch the shard serves"));
      return;
    }
    deferred_until_ = deferred_.empty() ? retry_at : std::min(deferred_until_, retry_at);
    deferred_.push_back(std::move(request));
  }

  void AdmitDeferred() {
    if (deferred_.empty() || Clock::now() < deferred_until_) return;
    std::vector<std::unique_ptr<Request>> deferred = std::move(deferred_);
    deferred_.clear();
    for (auto& request : deferred) HandleGuarded(std::move(request));
  }

  // How long the serving loop may wait for a message: until a deferred
  // claim may be asked about, at most 50 ms.
  int ReceiveTimeoutMs() const {
    if (deferred_.empty()) return 50;
    const auto left =
        std::chrono::ceil<std::chrono::milliseconds>(deferred_until_ - Clock::now()).count();
    return static_cast<int>(std::clamp<int64_t>(left, 1, 50));
  }

  // Once the gate opened: what was held, in arrival order.
  void AdmitHeld() {
    if (held_.empty() || !job_gate_.open()) return;
    std::vector<std::unique_ptr<Request>> held = std::move(held_);
    held_.clear();
    for (auto& request : held) HandleGuarded(std::move(request));
  }

  // Replies to the pulls held for a version and forgets the pushes held
  // for a step: what they belonged to is gone.
  void DropInFlight(const std::string& why) {
    for (auto& w : waiting_) ReplyError(*w.request, Status::IOError(why));
    waiting_.clear();
    pending_.clear();
  }

  void ResetVersion(uint64_t version) {
    applied_ = version;
    clock_.assign(options_.workers, version);
    stale_reads_.Reset();
  }

  // A shard restarted and rejoined from its checkpoint of `step`: this one
  // goes back to the same step, and so does every worker.
  void RollBack(uint64_t step) {
    const uint64_t from = applied_.load();
    const size_t dropped_pulls = waiting_.size(), dropped_steps = pending_.size();
    DropInFlight("the job rolled back to step " + std::to_string(step) + " (epoch " +
                 std::to_string(job_gate_.epoch()) + ")");
    NewStore();
    ResetVersion(step);
    broken_ = checkpoints_.RollBack(step, job_gate_.job(), store_.get());
    if (!broken_.ok()) {
      broken_ = broken_.WithContext("shard " + std::to_string(options_.shard) +
                                    " cannot roll back to step " + std::to_string(step));
      spdlog::error("{}", broken_.ToString());
      if (broken_.code() == StatusCode::kCorruption) damaged_rollback_step_ = step;
      return;
    }
    spdlog::warn(
        "shard {}: job {} rolled back to step {} (epoch {}): a restarted process rejoined from its "
        "checkpoint; this one reloaded its own (it was at version {}; {} waiting pulls refused, "
        "{} held steps dropped)",
        options_.shard, job_gate_.job(), step, job_gate_.epoch(), from, dropped_pulls,
        dropped_steps);
  }

  ~PsShardImpl() override { Stop(); }

  Status Bind() {
    if (options_.resume_step > 0) {
      std::string run;
      GRIDSYNC_RETURN_IF_ERROR(LoadShardCheckpoint(options_.checkpoint_dir, options_.shard,
                                                   options_.resume_step, store_.get(), &run)
                                   .WithContext("shard " + std::to_string(options_.shard) +
                                                ": resuming from step " +
                                                std::to_string(options_.resume_step)));
      checkpoints_.Loaded(std::move(run));
      applied_ = options_.resume_step;
      clock_.assign(options_.workers, options_.resume_step);
      spdlog::info("shard {}: resumed from the checkpoint of step {} in {}", options_.shard,
                   options_.resume_step, options_.checkpoint_dir);
    }
    if (options_.curve.on) {
      // The ZAP handler must exist before the first peer connects.
      zap_ = std::make_unique<wire::ZapHandler>(context_, options_.curve.allowed_z85,
                                                "shard " + std::to_string(options_.shard));
      GRIDSYNC_RETURN_IF_ERROR(wire::ApplyCurveServer(socket_, options_.curve));
    }
    auto capped = wire::ConnectionCap::Attach(context_, socket_, ConnectionCaps(),
                                              "shard " + std::to_string(options_.shard));
    if (!capped.ok()) return capped.status();
    capped_ = std::move(capped).value();
    try {
      socket_.set(zmq::sockopt::linger, 0);
      socket_.set(zmq::sockopt::maxmsgsize, static_cast<int64_t>(options_.limits.max_frame_bytes));
      socket_.set(zmq::sockopt::rcvhwm, 0);
      socket_.set(zmq::sockopt::sndhwm, 0);
      // IPv6 hosts too (ps.host "::1", a node's IPv6 address): without it
      // ZeroMQ binds IPv4 only, and an IPv6 literal fails with "No such
      // device". IPv4 addresses bind as before.
      socket_.set(zmq::sockopt::ipv6, 1);
      socket_.bind(options_.endpoint);
      endpoint_ = socket_.get(zmq::sockopt::last_endpoint);
    } catch (const zmq::error_t& e) {
      return Status::IOError("shard " + std::to_string(options_.shard) + ": cannot bind " +
                             options_.endpoint + ": " + e.what());
    }
    thread_ = std::thread([this] { Loop(); });
    return Status::OK();
  }

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
  wire::ConnectionLimits ConnectionCaps() const {
    wire::ConnectionLimits limits = options_.connections;
    uint64_t largest = partition_.OwnedValues(options_.shard) * sizeof(float) + (uint64_t{1} << 20);
    for (uint32_t t = 0; t < partition_.n_tables(); ++t) {
      largest += partition_.OwnedRows(options_.shard, t) * sizeof(uint32_t);
    }
    if (limits.max_unread_bytes_per_connection == 0) {
      limits.max_unread_bytes_per_connection = 2 * largest + (uint64_t{64} << 20);
    }
    if (limits.max_unread_bytes == 0) {
      limits.max_unread_bytes =
          (2 * uint64_t{options_.workers} + 2) * largest + (uint64_t{256} << 20);
    }
    return limits;
  }

  void Stop() override {
    stop_ = true;
    if (thread_.joinable()) thread_.join();
  }

 private:
  void Loop() {
    while (!stop_) {
      heartbeats_.fetch_add(1, std::memory_order_relaxed);
      std::vector<zmq::message_t> refused;
      wire::TakenBytes taken{.curve = options_.curve.on};
      auto received = wire::ReceiveMultipart(socket_, ReceiveTimeoutMs(), options_.limits,
                                             /*envelope_frames=*/1, &refused, &taken);
      capped_->Taken(taken.fd, taken.bytes);
      if (!received.ok()) {
        if (received.status().code() != StatusCode::kTimeout) {
          if (!refused.empty()) {
            Request request;
            request.identity = std::move(refused[0]);
            request.fd = taken.fd;
            ReplyError(request, received.status(), /*readable=*/false);
          } else {
            spdlog::warn("shard {}: dropped a message from {}: {}", options_.shard,
                         wire::PeerOfConnection(taken.fd), received.status().ToString());
            CountError();
          }
        }
        AdmitHeld();
        AdmitDeferred();
        ExpireWaitingPulls();
        continue;
      }
      auto request = std::make_unique<Request>();
      std::vector<zmq::message_t>& frames = *received;
      request->identity = std::move(frames[0]);
      request->fd = taken.fd;
      // The peer's metadata rides on the frames its connection delivered,
      // not on the identity ROUTER made up.
      if (options_.curve.on && frames.size() > 1) request->role = wire::CurveRoleOf(frames[1]);
      frames.erase(frames.begin());
      request->frames = std::move(frames);
      HandleGuarded(std::move(request));
      AdmitHeld();
      AdmitDeferred();
      ExpireWaitingPulls();
      waiting_count_.store(waiting_.size(), std::memory_order_relaxed);
    }
    RefuseOutstanding();
  }

  // At Stop: every request still owed a reply (a pull waiting for its
  // version, a message held before a rejoin was admitted or set aside for
  // the coordinator's answer) gets one saying the shard stops, so that its
  // worker learns why at once (and, with checkpoints, waits for the
  // restarted shard to rejoin) instead of at its timeout. The replies get
  // a bounded linger to leave before the socket closes.
  void RefuseOutstanding() {
    const size_t owed = waiting_.size() + held_.size() + deferred_.size();
    if (owed == 0) return;
    // IOError, not Unavailable: that code stays off the wire (common/status.h).
    const Status stopping = Status::IOError(
        "shard " + std::to_string(options_.shard) +
        " is stopping (its process was asked to end) and serves no more; a restarted shard "
        "rejoins the job from its checkpoint");
    for (auto& w : waiting_) ReplyError(*w.request, stopping);
    for (auto& request : held_) ReplyError(*request, stopping);
    for (auto& request : deferred_) ReplyError(*request, stopping);
    waiting_.clear();
    held_.clear();
    deferred_.clear();
    waiting_count_.store(0, std::memory_order_relaxed);
    spdlog::info("shard {}: stopping; told the senders of {} outstanding request(s)",
                 options_.shard, owed);
    try {
      socket_.set(zmq::sockopt::linger,
                  static_cast<int>(std::min<int64_t>(1000, options_.timeout.count())));
    } catch (const zmq::error_t&) {
      // The replies may then be dropped at close: their senders time out.
    }
  }

  // Handle, with the last line of defence: an allocation that fails (a
  // request asking for more than this host holds) or any other exception
  // becomes an error reply to its sender, and the shard keeps serving
  // instead of terminating on one message.
  void HandleGuarded(std::unique_ptr<Request> request) {
    Request reply_to;
    reply_to.identity.copy(request->identity);
    handling_request_id_ = 0;  // Handle sets it once the message decoded
    std::string what;
    try {
      Handle(std::move(request));
      return;
    } catch (const std::bad_alloc&) {
      what = "out of memory serving it (it asked for more than this shard can allocate)";
    } catch (const std::exception& e) {
      what = std::string("an internal error serving it: ") + e.what();
    }
    reply_to.message.request_id = handling_request_id_;
    spdlog::error("shard {}: request {}: {}", options_.shard, reply_to.message.request_id, what);
    try {
      ReplyError(reply_to, Status::Internal("request refused: " + what),
                 /*readable=*/false);
    } catch (const std::exception&) {
      CountError();  // not even the refusal could be built: the sender times out
    }
  }

  void CountError() {
    std::lock_guard<std::mutex> lock(stats_mu_);
    ++stats_.errors;
  }

  ServingStats serving_stats() const override {
    ServingStats s;
    s.waiting_pulls = waiting_count_.load(std::memory_order_relaxed);
    s.job = job_gate_.job();
    s.epoch = job_gate_.epoch();
    s.pulls_in_parts = pulls_in_parts_.load(std::memory_order_relaxed);
    s.reply_parts = reply_parts_.load(std::memory_order_relaxed);
    const ShardCheckpoints::Counts written = checkpoints_.counts();
    s.checkpoints_written = written.written;
    s.checkpoint_failures = written.failed;
    s.checkpoint_step = written.newest_step;
    s.damaged_rollback_step = damaged_rollback_step_.load(std::memory_order_relaxed);
    auto seconds = [](const std::atomic<uint64_t>& ns) {
      return static_cast<double>(ns.load(std::memory_order_relaxed)) * 1e-9;
    };
    s.stages.decode = seconds(stage_ns_[kDecode]);
    s.stages.apply = seconds(stage_ns_[kApply]);
    s.stages.gather = seconds(stage_ns_[kGather]);
    s.stages.encode = seconds(stage_ns_[kEncode]);
    s.stages.send = seconds(stage_ns_[kSend]);
    std::lock_guard<std::mutex> lock(stats_mu_);
    s.refusals = refusals_;
    return s;
  }

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
    Send(request.identity, wire::EncodeError(request.message.request_id, options_.shard, error));
  }

  // `version`: the version the ack reports (default: the current one).
  void Ack(Request& request, std::optional<uint64_t> version = std::nullopt) {
    wire::OutHeader header;
    header.kind = wire::Kind::kPushAck;
    header.step = version.value_or(applied_);
    header.request_id = request.message.request_id;
    header.shard = options_.shard;
    Send(request.identity, wire::Encode(header, {}));
  }

  void Handle(std::unique_ptr<Request> request);

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

  void ApplyPushes(const std::vector<const wire::Message*>& pushes);

  void HandlePull(std::unique_ptr<Request> request);

  void ReplyPull(Request& request);
  void ReplyPullUnguarded(Request& request);

  void ServeWaitingPulls();

  void ExpireWaitingPulls();

  struct Waiting {
    std::unique_ptr<Request> request;
    Clock::time_point deadline;
  };
  // What a held request keeps in memory (ShardOptions::max_waiting_pull_bytes).
  static uint64_t HeldBytes(const Request& request);
  // Peers with replies not yet written to their sockets.
  size_t PeersWithUnsentBytes() const;

  // The counter of replies pending to `identity` (ShardOptions::
  // max_unsent_bytes_per_peer), created on first use.
  std::shared_ptr<wire::UnsentBytes> UnsentTo(const zmq::message_t& identity);

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
  std::shared_ptr<wire::UnsentBytes> unsent_total_ = std::make_shared<wire::UnsentBytes>();
  std::map<std::string, std::shared_ptr<wire::UnsentBytes>> unsent_by_peer_;
  size_t unsent_prune_at_ = 1024;     // UnsentTo prunes the map past this size
  uint64_t handling_request_id_ = 0;  // HandleGuarded: the request Handle decoded last
  std::atomic<uint64_t> applied_{0};  // written by the I/O thread only
  std::vector<uint64_t> clock_;       // ssp, async: pushes per worker (its next step)
  StaleReads stale_reads_;            // ssp, async: the look-ahead's bookkeeping
  std::map<uint64_t, std::map<uint32_t, std::unique_ptr<Request>>> pending_;  // step -> rank
  std::vector<Waiting> waiting_;
  std::vector<std::unique_ptr<Request>> held_;      // arrived before a rejoin was admitted
  std::vector<std::unique_ptr<Request>> deferred_;  // claims awaiting the coordinator (Defer)
  Clock::time_point deferred_until_{};
  JobGate job_gate_;
  ShardCheckpoints checkpoints_;
  Status broken_;  // a rollback that failed: every request is refused with it
  std::atomic<uint64_t> damaged_rollback_step_{0};  // ServingStats::damaged_rollback_step

  mutable std::mutex stats_mu_;
  wire::ShardStats stats_;                    // guarded by stats_mu_
  std::map<std::string, uint64_t> refusals_;  // by reason; guarded by stats_mu_
  LogBudget refusal_log_{"refusals"};         // the serving thread's
  LatencyHistogram apply_latency_;
  std::atomic<uint64_t> stage_ns_[kStages] = {};  // ServingStats::Stages, in nanoseconds
  std::atomic<uint64_t> waiting_count_{0};        // waiting_.size(), for other threads
  std::atomic<uint64_t> pulls_in_parts_{0};       // ServingStats::pulls_in_parts
  std::atomic<uint64_t> reply_parts_{0};          // ServingStats::reply_parts
};

}  // namespace ps_shard_engine
}  // namespace gridsync
