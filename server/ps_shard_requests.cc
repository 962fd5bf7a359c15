// The parameter-server shard's engine (ps_shard_engine.h): requests.
// Decoding and admitting them; init; pushes under bsp (held until every
// worker's push of the step is in, then applied together), ssp and async
// (applied on arrival, acknowledged first). Pulls: ps_shard_pulls.cc.
//
// Thread safety: the I/O thread only.
#include "server/ps_shard_engine.h"

namespace gridsync {
namespace ps_shard_engine {

bool PsShardImpl::TakesKind(wire::Kind kind) {
  return kind == wire::Kind::kPush || kind == wire::Kind::kPull || kind == wire::Kind::kInit ||
         kind == wire::Kind::kStats;
}

Status PsShardImpl::RefuseKind(wire::Kind kind) {
  return Status::InvalidArgument(std::string("a shard does not accept ") + wire::KindName(kind) +
                                 " messages; allowed: push, pull, init, stats");
}

void PsShardImpl::Handle(std::unique_ptr<Request> request) {
  const auto start = Clock::now();
  auto decoded = wire::Decode(request->frames, shapes_, options_.limits);
  if (!decoded.ok()) {
    const wire::PeekedHeader peeked = wire::PeekHeader(request->frames, options_.limits);
    request->message = wire::Message{};
    request->message.request_id = peeked.request_id;
    // A kind no shard takes is refused as such, whatever else is wrong.
    const bool foreign_kind = peeked.kind && !TakesKind(*peeked.kind);
    ReplyError(*request, foreign_kind ? RefuseKind(*peeked.kind) : decoded.status(),
               /*readable=*/false);
    return;
  }
  request->message = std::move(decoded).value();
  handling_request_id_ = request->message.request_id;
  wire::Message& m = request->message;
  if (!request->counted) {
    request->counted = true;
    std::lock_guard<std::mutex> lock(stats_mu_);
    stats_.bytes_in += m.bytes;
  }
  // The kind first: what a block means depends on it, and only requests
  // reach the checks below.
  if (!TakesKind(m.kind)) {
    ReplyError(*request, RefuseKind(m.kind));
    return;
  }
  // A request for another shard is a client's wrong address (a stale shard
  // map, crossed endpoints): answering it from this shard's rows would hand
  // back a partition the client did not ask for. Stats are anyone's.
  if (m.kind != wire::Kind::kStats && m.shard != options_.shard) {
    ReplyError(*request,
               Status::InvalidArgument(fmt::format(
                   "{} addressed to shard {} reached shard {}; allowed: requests addressed to "
                   "this shard (the shard map gives each shard's endpoint)",
                   wire::KindName(m.kind), m.shard, options_.shard)));
    return;
  }
  // Under CURVE a key proves a role: an observer's (gridsync monitor, on
  // machines that hold no worker key) reads stats and changes nothing.
  if (options_.curve.on && request->role != "worker" && m.kind != wire::Kind::kStats) {
    ReplyError(*request,
               Status::InvalidArgument(
                   std::string(wire::KindName(m.kind)) + " from a client whose key is " +
                   (request->role.empty() ? "of no role" : "the " + request->role + "'s") +
                   "; allowed: push, pull and init from the workers' key, "
                   "stats from any admitted key"));
    return;
  }
  // Blocks of rows this shard does not own are refused first (the
  // partition is the same in every job), never held or set aside below.
  for (const auto& block : m.blocks) {
    if (auto owned = store_->CheckOwnership(block); !owned.ok()) {
      ReplyError(*request, owned);
      return;
    }
  }
  // A rejoining shard holds messages until its registration admitted it:
  // the workers that follow the new epoch already send to it.
  if (m.kind != wire::Kind::kStats && !job_gate_.open()) return Hold(std::move(request));
  // Stats are read-only: anyone may ask, whatever its job.
  if (m.kind != wire::Kind::kStats && !AdmitJob(request)) return;
  // Compressed values are decoded (and validated) before anything changes.
  for (size_t i = 0; i < m.blocks.size(); ++i) {
    wire::Block& block = m.blocks[i];
    if (!block.compressed()) continue;
    const size_t n = size_t{block.row_count} * block.width;
    auto& values = request->decoded.emplace_back(n);
    Status status = cpu::Decode(block.codec, block.payload.data(), block.payload.size(), n,
                                block.codec_seed, values.data());
    // A codec's scale fields can encode any float: bound what they decode to.
    if (status.ok()) status = wire::CheckValueBounds(values, options_.limits, "payload");
    if (!status.ok()) {
      ReplyError(*request, status.WithContext("block " + std::to_string(i) + " (table " +
                                              std::to_string(block.table) + ", codec " +
                                              std::string(CodecName(block.codec.codec)) + ")"));
      return;
    }
    block.values = values;
  }
  AddStage(kDecode, start);
  switch (m.kind) {
    case wire::Kind::kPush:
      return HandlePush(std::move(request));
    case wire::Kind::kPull:
      return HandlePull(std::move(request));
    case wire::Kind::kInit:
      return HandleInit(*request);
    case wire::Kind::kStats: {
      wire::OutHeader header;
      header.kind = wire::Kind::kStatsReply;
      header.request_id = m.request_id;
      header.shard = options_.shard;
      header.step = applied_;
      header.stats = stats();
      SendSmall(request->identity, wire::Encode(header, {}));
      return;
    }
    default:
      return;  // refused above
  }
}

void PsShardImpl::HandleInit(Request& request) {
  // Under ssp the version is the slowest worker's clock: faster workers'
  // pushes are applied while it is still 0 (an init then overwrote them: a
  // review), so any worker's clock counts.
  const bool pushed =
      std::any_of(clock_.begin(), clock_.end(), [](uint64_t clock) { return clock > 0; });
  if (applied_ > 0 || !pending_.empty() || pushed) {
    ReplyError(request, Status::InvalidArgument("init after training started (shard at version " +
                                                std::to_string(applied_) +
                                                "); allowed: init before the first push"));
    return;
  }
  for (const auto& block : request.message.blocks) store_->Assign(block);
  Ack(request);
}

void PsShardImpl::HandlePush(std::unique_ptr<Request> request) {
  const wire::Message& m = request->message;
  if (m.worker_rank >= options_.workers || m.num_workers != options_.workers) {
    ReplyError(*request, Status::InvalidArgument(
                             "push from worker " + std::to_string(m.worker_rank) + " of " +
                             std::to_string(m.num_workers) + "; allowed: workers 0.." +
                             std::to_string(options_.workers - 1) + " of " +
                             std::to_string(options_.workers)));
    return;
  }
  const wire::PushValues expected =
      options_.apply_updates ? wire::PushValues::kUpdates : wire::PushValues::kGradients;
  if (m.push_values != expected) {
    ReplyError(*request, Status::InvalidArgument(std::string("push from worker ") +
                                                 std::to_string(m.worker_rank) + " carries " +
                                                 wire::PushValuesName(m.push_values) +
                                                 "; allowed: " + wire::PushValuesName(expected) +
                                                 " (this shard runs with ps.optimizer on the " +
                                                 (options_.apply_updates ? "workers" : "shards") +
                                                 "; every process must use the same config)"));
    return;
  }
  {
    std::lock_guard<std::mutex> lock(stats_mu_);
    ++stats_.pushes;
  }
  if (options_.consistency == Consistency::kAsync) {
    // Each worker's steps in order, once each, as under ssp but with no
    // bound on how far apart workers run: a push sent twice (a replay by a
    // holder of the workers' key, a client bug) was applied twice.
    const uint64_t next = clock_[m.worker_rank];
    if (m.step != next) {
      ReplyError(*request, Status::InvalidArgument(
                               "push for step " + std::to_string(m.step) + " from worker " +
                               std::to_string(m.worker_rank) + ", whose next step is " +
                               std::to_string(next) +
                               (m.step < next ? " (that step was pushed already)"
                                              : " (the steps between were never pushed)") +
                               "; allowed: step " + std::to_string(next) +
                               " (each worker's steps in order, once each)"));
      return;
    }
    std::vector<const wire::Message*> one = {&m};
    stale_reads_.OnPush(m);
    ++clock_[m.worker_rank];
    // Acknowledged before the apply, with the version the apply makes: the
    // worker builds its next request while the shard applies, and that
    // request is served after this apply (one serving loop), so it still
    // reads its own push.
    Ack(*request, applied_ + 1);
    if (!m.skip_step) ApplyStep(one);
    ++applied_;
    return;
  }
  if (options_.consistency == Consistency::kSsp) return HandleSspPush(std::move(request));
  if (m.step != applied_) {
    ReplyError(*request, Status::InvalidArgument("push for step " + std::to_string(m.step) +
                                                 " while the shard is at version " +
                                                 std::to_string(applied_) + "; allowed: step " +
                                                 std::to_string(applied_)));
    return;
  }
  auto& slot = pending_[m.step];
  if (slot.count(m.worker_rank) != 0) {
    ReplyError(*request,
               Status::InvalidArgument("second push from worker " + std::to_string(m.worker_rank) +
                                       " for step " + std::to_string(m.step) +
                                       "; allowed: one push per worker and step"));
    return;
  }
  Ack(*request);
  slot.emplace(m.worker_rank, std::move(request));
  while (!pending_.empty() && pending_.begin()->first == applied_ &&
         pending_.begin()->second.size() == options_.workers) {
    std::vector<const wire::Message*> ordered;  // std::map: worker-rank order
    bool skip = false;  // a worker overflowed (mixed precision): no push of the step applies
    for (const auto& [rank, held] : pending_.begin()->second) {
      ordered.push_back(&held->message);
      skip = skip || held->message.skip_step;
    }
    if (skip) {
      spdlog::debug("shard {}: step {} skipped (a worker's gradients overflowed)", options_.shard,
                    applied_.load());
    } else {
      ApplyStep(ordered);
    }
    pending_.erase(pending_.begin());
    ++applied_;
    checkpoints_.AfterStep(applied_, job_gate_.job(), *store_);
  }
  ServeWaitingPulls();
}

void PsShardImpl::HandleSspPush(std::unique_ptr<Request> request) {
  const wire::Message& m = request->message;
  const uint64_t clock = clock_[m.worker_rank];
  if (m.step != clock || m.step > applied_ + options_.staleness) {
    ReplyError(*request, Status::InvalidArgument(
                             "push for step " + std::to_string(m.step) + " from worker " +
                             std::to_string(m.worker_rank) + " while the shard is at version " +
                             std::to_string(applied_) + "; allowed: step " + std::to_string(clock) +
                             " (each worker's steps in order, at most " +
                             std::to_string(options_.staleness) + " ahead of the slowest)"));
    return;
  }
  stale_reads_.OnPush(m);
  if (!m.skip_step) {
    std::vector<const wire::Message*> one = {&m};
    ApplyStep(one);
  }
  ++clock_[m.worker_rank];
  applied_ = *std::min_element(clock_.begin(), clock_.end());
  Ack(*request);
  ServeWaitingPulls();
}

void PsShardImpl::ApplyStep(const std::vector<const wire::Message*>& pushes) {
  const auto start = Clock::now();
  store_->ApplyPushes(pushes, &pool_);
  const double seconds = std::chrono::duration<double>(Clock::now() - start).count();
  AddStage(kApply, start);
  apply_latency_.Observe(seconds);
  if (options_.timeline) {
    options_.timeline->Span("apply", start, seconds, 0,
                            {{"version", static_cast<double>(applied_.load())},
                             {"pushes", static_cast<double>(pushes.size())}});
  }
}

}  // namespace ps_shard_engine
}  // namespace gridsync
