// The parameter-server shard's engine (ps_shard_engine.h): its lifecycle
// and serving loop. Building the store, resuming from a checkpoint and
// binding the socket; the loop that receives, admits and hands each request
// to Handle (ps_shard_requests.cc), guarded so that one bad message never
// ends the shard; admitting a message's job and epoch, with the requests
// held or deferred meanwhile and the rollbacks a rejoin asks for; refusing
// what is still owed a reply at Stop; the serving stats.
//
// Thread safety: the I/O thread only (the one Bind starts), but the
// constructor and Bind, which run on the controlling thread before that
// thread exists, and serving_stats, any thread's: it reads atomics, what
// stats_mu_ guards and accessors that are any thread's.
#include "server/ps_shard_engine.h"

#include <algorithm>
#include <chrono>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "common/tcp_backoff.h"

namespace gridsync {
namespace ps_shard_engine {

PsShardImpl::PsShardImpl(const Partition& partition, const ShardOptions& options)
    : partition_(partition),
      options_(options),
      pool_(options.threads),
      socket_(context_, zmq::socket_type::router),
      backlog_(options.max_unsent_bytes_per_peer, options.max_unsent_bytes, options.workers,
               "shard " + std::to_string(options.shard)),
      stale_reads_(options),
      job_gate_(options.shard, options.rejoining || options.join_first),
      checkpoints_(options.checkpoint_dir, options.shard, options.checkpoint_every,
                   options.checkpoint_parts, options.timeout, options.checkpoint_key) {
  for (uint32_t t = 0; t < partition_.n_tables(); ++t) {
    shapes_.push_back({partition_.table(t).rows, partition_.table(t).width});
  }
  NewStore();
  stats_.rows_owned = store_->owned_rows();
  clock_.assign(options_.workers, 0);
}

void PsShardImpl::NewStore() {
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

bool PsShardImpl::AdmitJob(std::unique_ptr<Request>& owned) {
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

std::optional<Status> PsShardImpl::KeepProblem(const Request& request,
                                               const std::vector<std::unique_ptr<Request>>& kept,
                                               const char* what) const {
  // A few per worker are expected. Bytes are bounded too: each kept message
  // could be a push of whole tables (a review: 4096 of them, unbounded in
  // bytes, before a rejoining shard was admitted). Kept messages are not
  // decoded yet: their frames and row ids are what they hold.
  constexpr size_t kMaxKept = 4096;
  uint64_t bytes = HeldBytes(request);
  if (kept.size() < kMaxKept) {
    for (const auto& other : kept) bytes += HeldBytes(*other);
  }
  // The first is kept whatever its size (a long-running shard's next job
  // may defer rank 0's init, a push of every row it owns).
  if (kept.empty() || (kept.size() < kMaxKept && bytes <= options_.max_waiting_pull_bytes))
    return std::nullopt;
  return Status::IOError(
      "shard " + std::to_string(options_.shard) + " holds " + std::to_string(kept.size()) +
      " messages " + what + " already, and with this one " + std::to_string(bytes) +
      " bytes of them; allowed: at most " + std::to_string(kMaxKept) + " messages and " +
      std::to_string(options_.max_waiting_pull_bytes) + " bytes (retry once it serves)");
}

void PsShardImpl::Hold(std::unique_ptr<Request> request) {
  if (auto refused =
          KeepProblem(*request, held_, "that came before it was admitted to its cluster")) {
    ReplyError(*request, *refused);
    return;
  }
  held_.push_back(std::move(request));
}

void PsShardImpl::Defer(std::unique_ptr<Request> request, Clock::time_point retry_at) {
  if (auto refused =
          KeepProblem(*request, deferred_, "whose job or epoch awaits the coordinator's answer")) {
    ReplyError(*request, *refused);
    return;
  }
  deferred_until_ = deferred_.empty() ? retry_at : std::min(deferred_until_, retry_at);
  deferred_.push_back(std::move(request));
}

void PsShardImpl::AdmitDeferred() {
  if (deferred_.empty() || Clock::now() < deferred_until_) return;
  std::vector<std::unique_ptr<Request>> deferred = std::move(deferred_);
  deferred_.clear();
  for (auto& request : deferred) HandleGuarded(std::move(request));
}

int PsShardImpl::ReceiveTimeoutMs() const {
  // Pulls parked for room are retried as the drops come (within ms).
  if (!awaiting_room_.empty()) return 2;
  if (deferred_.empty()) return 50;
  const auto left =
      std::chrono::ceil<std::chrono::milliseconds>(deferred_until_ - Clock::now()).count();
  return static_cast<int>(std::clamp<int64_t>(left, 1, 50));
}

void PsShardImpl::AdmitHeld() {
  if (held_.empty() || !job_gate_.open()) return;
  std::vector<std::unique_ptr<Request>> held = std::move(held_);
  held_.clear();
  for (auto& request : held) HandleGuarded(std::move(request));
}

void PsShardImpl::DropInFlight(const std::string& why) {
  for (auto& w : waiting_) ReplyError(*w.request, Status::IOError(why));
  for (auto& w : awaiting_room_) ReplyError(*w.request, Status::IOError(why));
  waiting_.clear();
  awaiting_room_.clear();
  pending_.clear();
}

void PsShardImpl::ResetVersion(uint64_t version) {
  applied_ = version;
  clock_.assign(options_.workers, version);
  stale_reads_.Reset();
}

void PsShardImpl::RollBack(uint64_t step) {
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
    if (broken_.code() == StatusCode::kCheckpointsHeld) foreign_rollback_step_ = step;
    return;
  }
  spdlog::warn(
      "shard {}: job {} rolled back to step {} (epoch {}): a restarted process rejoined from its "
      "checkpoint; this one reloaded its own (it was at version {}; {} waiting pulls refused, "
      "{} held steps dropped)",
      options_.shard, job_gate_.job(), step, job_gate_.epoch(), from, dropped_pulls, dropped_steps);
}

Status PsShardImpl::Bind() {
  if (options_.resume_step > 0) {
    std::string run;
    GRIDSYNC_RETURN_IF_ERROR(
        LoadShardCheckpoint(options_.checkpoint_dir, options_.shard, options_.resume_step,
                            store_.get(), &run, KeyOrNull(options_.checkpoint_key))
            .WithContext("shard " + std::to_string(options_.shard) + ": resuming from step " +
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

wire::ConnectionLimits PsShardImpl::ConnectionCaps() const {
  wire::ConnectionLimits limits = options_.connections;
  // As Gloo's pairs are (common/tcp_backoff.h): with the kernel's backoff,
  // a link that flapped (1.5 s down, 1 s up, six times; each outage well
  // under timeout_s 5) left the timer at 6.5 s, and the replies held up
  // came after the workers' waits had ended (a hostile probe).
  if (limits.retransmit_cap.count() == 0)
    limits.retransmit_cap = RetransmitCapFor(options_.timeout);
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

void PsShardImpl::Loop() {
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
      RetryPullsAwaitingRoom();
      // (Deferred pulls admitted here wait too: counted as they are.)
      waiting_count_.store(waiting_.size(), std::memory_order_relaxed);
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
    RetryPullsAwaitingRoom();
    waiting_count_.store(waiting_.size(), std::memory_order_relaxed);
  }
  RefuseOutstanding();
}

void PsShardImpl::RefuseOutstanding() {
  const size_t owed = waiting_.size() + held_.size() + deferred_.size() + awaiting_room_.size();
  if (owed == 0) return;
  // IOError, not Unavailable: that code stays off the wire (common/status.h).
  // Without checkpoints no restart rejoins: said so (a hostile probe read
  // "rejoins the job from its checkpoint" under checkpoint.every_steps 0).
  const Status stopping = Status::IOError(
      "shard " + std::to_string(options_.shard) +
      " is stopping (its process was asked to end) and serves no more; " +
      (options_.checkpoint_every > 0
           ? "a restarted shard rejoins the job from its checkpoint"
           : "it keeps no checkpoints (checkpoint.every_steps is 0), so no restarted shard can "
             "rejoin this job"));
  for (auto& w : waiting_) ReplyError(*w.request, stopping);
  for (auto& w : awaiting_room_) ReplyError(*w.request, stopping);
  for (auto& request : held_) ReplyError(*request, stopping);
  for (auto& request : deferred_) ReplyError(*request, stopping);
  waiting_.clear();
  awaiting_room_.clear();
  held_.clear();
  deferred_.clear();
  waiting_count_.store(0, std::memory_order_relaxed);
  spdlog::info("shard {}: stopping; told the senders of {} outstanding request(s)", options_.shard,
               owed);
  try {
    socket_.set(zmq::sockopt::linger,
                static_cast<int>(std::min<int64_t>(1000, options_.timeout.count())));
  } catch (const zmq::error_t&) {
    // The replies may then be dropped at close: their senders time out.
  }
}

void PsShardImpl::HandleGuarded(std::unique_ptr<Request> request) {
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

ServingStats PsShardImpl::serving_stats() const {
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
  s.foreign_rollback_step = foreign_rollback_step_.load(std::memory_order_relaxed);
  s.unsent_bytes = backlog_.total() + backlog_.small_total();
  s.peers_shed = backlog_.shed();
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

}  // namespace ps_shard_engine
}  // namespace gridsync
