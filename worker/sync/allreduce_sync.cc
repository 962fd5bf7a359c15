#include "worker/sync/allreduce_sync.h"

#include <spdlog/spdlog.h>

#include <algorithm>
#include <chrono>

#include "common/wire/curve.h"
#include "worker/collective/buckets.h"
#include "worker/sync/peer_watch.h"

namespace gridsync {
namespace {

using Clock = std::chrono::steady_clock;

// Slice boundaries of n elements cut into `slices` near-equal parts, as
// counts for `size` ranks (ranks >= slices get none).
std::vector<size_t> SliceCounts(size_t n, int slices, int size) {
  std::vector<size_t> counts(static_cast<size_t>(size), 0);
  for (int s = 0; s < slices; ++s) {
    counts[static_cast<size_t>(s)] =
        n / static_cast<size_t>(slices) +
        (static_cast<size_t>(s) < n % static_cast<size_t>(slices) ? 1 : 0);
  }
  return counts;
}

}  // namespace

Status HierarchicalAllReduce(Collective& intra, Collective* inter, int slices, float* data,
                             size_t n) {
  const auto counts = SliceCounts(n, slices, intra.size());
  const size_t mine = counts[static_cast<size_t>(intra.rank())];
  std::vector<float> slice(mine);
  GRIDSYNC_RETURN_IF_ERROR(intra.ReduceScatterSum(data, slice.data(), counts));
  if (mine > 0) {
    if (inter == nullptr)
      return Status::Internal("hierarchical all-reduce: a slice owner has no inter-node group");
    GRIDSYNC_RETURN_IF_ERROR(inter->AllReduceSum(slice.data(), mine));
  }
  return intra.AllGatherV(slice.data(), counts, data);
}

AllReduceSync::AllReduceSync(const RunSpec& spec, HashGridModel* model, int rank,
                             const AllReduceGroups& groups, CoordinatorClient* coordinator,
                             const BatchSource* source, const SplitSchedule* split,
                             ThreadPool* pool)
    : spec_(spec),
      config_(spec.config),
      model_(model),
      groups_(groups),
      coordinator_(coordinator),
      source_(source),
      split_(split),
      pool_(pool),
      hierarchical_(spec.config.distributed.hierarchical && groups.intra != nullptr) {
  rank_ = static_cast<uint32_t>(rank);
  me_ = "worker-" + std::to_string(rank);
  elements_ = model->grid_params().size() + model->mlp_shape().n_params();
  if (hierarchical_) {
    packed_.resize(elements_ + 1);  // + the overflow flag
    slices_ = spec.sync.hierarchical_slices;
  }
}

Result<std::unique_ptr<AllReduceSync>> AllReduceSync::Create(
    const RunSpec& spec, HashGridModel* model, int rank, const AllReduceGroups& groups,
    CoordinatorClient* coordinator, const BatchSource* source, const SplitSchedule* split,
    ThreadPool* pool, uint64_t start_step) {
  if (groups.flat == nullptr)
    return Status::InvalidArgument("all-reduce training needs the flat group");
  std::unique_ptr<AllReduceSync> sync(
      new AllReduceSync(spec, model, rank, groups, coordinator, source, split, pool));
  if (spec.config.distributed.model_parallel) {
    GRIDSYNC_ASSIGN_OR_RETURN(ShardedUpdate sharded,
                              ShardedUpdate::Make(spec, *model, rank, groups.flat->size()));
    sync->sharded_ = std::make_unique<ShardedUpdate>(std::move(sharded));
    sync->flat_.resize(sync->elements_);
  } else {
    sync->optimizer_ = std::make_unique<LocalOptimizer>(model, spec.model.adam);
  }
  using Format = CompressionSpec::AllReduceFormat;
  const Format format = spec.compression.all_reduce;
  if (format != Format::kFp32) {
    // Config::CheckRunnable refuses 16 bits with hierarchical and
    // model_parallel; this guards the other callers.
    if (sync->hierarchical_ || sync->sharded_)
      return Status::Unsupported(
          "compression.codec=" + spec.config.compression.codec +
          " under gradient_sync nccl: only the flat, replicated all-reduce carries 16 bits");
    sync->half_ = std::make_unique<HalfAllReduce>(
        format == Format::kFp16 ? HalfFormat::kFp16 : HalfFormat::kBf16,
        spec.compression.error_feedback, spec.compression.min_bytes, spec.sync.bucket_bytes);
  } else if (spec.compression.codec.codec != Codec::kNone) {
    return Status::Unsupported("compression.codec=" + spec.config.compression.codec +
                               " under gradient_sync nccl; allowed: none, fp16, bf16");
  }
  GRIDSYNC_RETURN_IF_ERROR(sync->StartCheckpoints(start_step));
  return sync;
}

AllReduceState AllReduceSync::State() { return {model_, optimizer_.get(), sharded_.get()}; }

Status AllReduceSync::StartCheckpoints(uint64_t start_step) {
  const auto& checkpoint = config_.checkpoint;
  if (checkpoint.every_steps <= 0) {
    if (start_step == 0) return Status::OK();
    return Status::InvalidArgument(
        me_ + ": resuming at step " + std::to_string(start_step) +
        " under gradient_sync nccl takes the model and its Adam state from that step's "
        "checkpoint, but checkpoint.every_steps is 0; allowed: start at step 0, or resume a run "
        "that wrote checkpoints");
  }
  // Config::CheckRunnable refuses the rest; this guards the other callers.
  if (half_ && spec_.compression.error_feedback) {
    return Status::Unsupported(
        "checkpoint.every_steps with compression.codec=" + config_.compression.codec +
        " and error feedback under gradient_sync nccl: the residuals are not checkpointed");
  }
  const uint32_t workers = static_cast<uint32_t>(groups_.flat->size());
  GRIDSYNC_ASSIGN_OR_RETURN(checkpoint_key_, wire::CheckpointMacKeyFor(config_, "worker"));
  ledger_ = std::make_unique<CheckpointLedger>(checkpoint.dir, me_);
  ledger_->SetJobParts(CheckpointParts(0, workers));
  // The job this worker publishes its steps under: nccl workers never move
  // to another (no rejoin), so it is asked once.
  if (coordinator_ != nullptr) {
    GRIDSYNC_ASSIGN_OR_RETURN(const JobState job, coordinator_->CurrentJob());
    job_ = job.job;
  }
  if (start_step > 0) {
    GRIDSYNC_RETURN_IF_ERROR(
        LoadAllReduceCheckpoint(spec_, rank_, workers, start_step, State(), key())
            .WithContext(me_ + " resuming at step " + std::to_string(start_step)));
    ledger_->RolledBack(start_step);  // later steps are another history's
    PublishCheckpoints();
    return CheckReplicasAgree(start_step);
  }
  if (coordinator_ == nullptr) return Status::OK();
  // Starting afresh: the first checkpoint must not delete the files of a
  // run the coordinator does not know (common/checkpoint_registry.h).
  CoordinatorStore registry(coordinator_);
  const Status fresh =
      CheckFreshStartAgainst(registry, job_, checkpoint.dir, me_, CheckpointParts(0, workers));
  if (fresh.code() == StatusCode::kCheckpointsHeld)
    ReportCannotJoin(*coordinator_, Role::kWorker, rank_, fresh);
  return fresh;
}

Status AllReduceSync::CheckpointIfDue(uint64_t step) {
  const uint64_t every = static_cast<uint64_t>(std::max(0, config_.checkpoint.every_steps));
  if (!ledger_ || every == 0 || (step + 1) % every != 0) return Status::OK();
  const auto start = Clock::now();
  // What the coordinator last acknowledged stays on disk (WriteCheckpointPart).
  // A failed write is logged and training goes on, as on the shards: the
  // previous complete step stays (MustKeep), and a full disk never stops a run.
  if (coordinator_ != nullptr) {
    CoordinatorStore registry(coordinator_);
    ledger_->RefreshCommon(registry, job_);  // the newest step every part holds now
  }
  if (Status written =
          WriteAllReduceCheckpoint(spec_, rank_, static_cast<uint32_t>(groups_.flat->size()),
                                   step + 1, State(), ledger_->MustKeep(), key());
      !written.ok()) {
    spdlog::error("{}: checkpoint at step {} not written: {}", me_, step + 1, written.ToString());
    ++checkpoint_failures_;
    return Status::OK();
  }
  ledger_->Wrote(step + 1);
  PublishCheckpoints();
  spdlog::info("{}: checkpoint at step {} written in {:.0f} ms", me_, step + 1,
               std::chrono::duration<double, std::milli>(Clock::now() - start).count());
  return Status::OK();
}

// Every rank all-reduces the same gradient from here on, so replicas that
// start apart never meet again, and nothing else would say so (a hostile
// probe: another step's model in worker 1's file of step 150, checksum and
// shape intact, resumed with exit 0 and a diverged result). Each rank
// publishes a checksum of its parameters and compares every rank's.
Status AllReduceSync::CheckReplicasAgree(uint64_t step) {
  if (coordinator_ == nullptr) return Status::OK();
  uint64_t h = Fnv1a64(std::string_view(reinterpret_cast<const char*>(model_->grid_params().data()),
                                        model_->grid_params().size() * sizeof(float)));
  for (const auto& m : model_->mlp_weights()) {
    h = Fnv1a64(std::string_view(reinterpret_cast<const char*>(m.data()),
                                 static_cast<size_t>(m.size()) * sizeof(float)),
                h);
  }
  CoordinatorStore registry(coordinator_);
  const std::string prefix = fmt::format("checkpoint/job-{}/restored-{}/", job_, step);
  GRIDSYNC_RETURN_IF_ERROR(registry.Set(prefix + me_, fmt::format("{:016x}", h)));
  const uint32_t workers = static_cast<uint32_t>(groups_.flat->size());
  std::vector<std::string> keys;
  for (uint32_t r = 0; r < workers; ++r) keys.push_back(prefix + "worker-" + std::to_string(r));
  GRIDSYNC_ASSIGN_OR_RETURN(const auto sums, registry.Get(keys, spec_.sync.timeout));
  std::string apart;
  uint32_t first = 0;  // the first rank apart
  for (uint32_t r = workers; r-- > 1;) {
    if (sums[r] == sums[0]) continue;
    apart = std::to_string(r) + (apart.empty() ? "" : ", ") + apart;
    first = r;
  }
  if (apart.empty()) return Status::OK();
  return Status::InvalidArgument(fmt::format(
      "{}: resuming at step {}, the parameters restored by workers [{}] differ from worker 0's "
      "(checksums {} against {}): their checkpoint files in {} are not one replica of one run "
      "(another run's or another step's); allowed: every worker's files of step {} as that run "
      "wrote them",
      me_, step, apart, sums[first], sums[0], config_.checkpoint.dir, step));
}

void AllReduceSync::PublishCheckpoints() {
  if (!ledger_ || coordinator_ == nullptr) return;
  CoordinatorStore registry(coordinator_);
  const Status published = ledger_->Publish(registry, job_);
  if (!published.ok()) {
    spdlog::warn("{}: the checkpoint steps it holds were not published: {}", me_,
                 published.ToString());
  }
}

Result<const StepBatch*> AllReduceSync::Prepare(uint64_t step) {
  const BatchSplit& split = split_->At(step);
  source_->Fill(step, split.begin(static_cast<int>(rank_)), split.count(static_cast<int>(rank_)),
                &batch_);
  return &batch_;
}

Status AllReduceSync::AllReduce(uint64_t step, std::vector<std::span<float>>& tensors) {
  if (!hierarchical_) {
    BucketOptions buckets;
    buckets.bucket_bytes = spec_.sync.bucket_bytes;
    return BucketedAllReduceSum(*groups_.flat, tensors, step, buckets);
  }
  size_t total = 0;
  for (const auto& span : tensors) {
    std::copy(span.begin(), span.end(), packed_.begin() + static_cast<std::ptrdiff_t>(total));
    total += span.size();
  }
  // Bucket by bucket, so the scratch of each phase stays bounded.
  const size_t chunk = spec_.sync.bucket_bytes / sizeof(float);
  for (size_t off = 0; off < total; off += chunk) {
    GRIDSYNC_RETURN_IF_ERROR(HierarchicalAllReduce(*groups_.intra, groups_.inter, slices_,
                                                   packed_.data() + off,
                                                   std::min(chunk, total - off)));
  }
  total = 0;
  for (auto& span : tensors) {
    std::copy(packed_.begin() + static_cast<std::ptrdiff_t>(total),
              packed_.begin() + static_cast<std::ptrdiff_t>(total + span.size()), span.begin());
    total += span.size();
  }
  return Status::OK();
}

Result<SyncOutcome> AllReduceSync::Apply(uint64_t step, ModelGradients* grads, float loss_scale) {
  GRIDSYNC_ASSIGN_OR_RETURN(const SyncOutcome outcome, ApplyStep(step, grads, loss_scale));
  // After the update: the part holds the model and Adam's state at step + 1.
  GRIDSYNC_RETURN_IF_ERROR(CheckpointIfDue(step));
  return outcome;
}

Result<SyncOutcome> AllReduceSync::ApplyStep(uint64_t step, ModelGradients* grads,
                                             float loss_scale) {
  ++applies_;
  const bool mixed = config_.training.mixed_precision;
  SyncOutcome outcome;
  std::vector<std::span<float>> tensors = {grads->grid.dense_span()};
  for (auto& m : grads->mlp) tensors.emplace_back(m.data(), static_cast<size_t>(m.size()));
  float overflow = 0.0f;  // summed: the number of workers that overflowed
  if (mixed) {
    bool fits = true;
    for (auto& span : tensors) fits = RoundToHalfChecked(span.data(), span.size()) && fits;
    overflow = fits ? 0.0f : 1.0f;
    // The 16-bit path carries the flag in its own header.
    if (!half_) tensors.emplace_back(&overflow, 1);
  }
  const auto start = Clock::now();
  auto clear = [&] {
    std::fill(grads->grid.dense_span().begin(), grads->grid.dense_span().end(), 0.0f);
    grads->grid.ForgetTouched();
    for (auto& m : grads->mlp) m.setZero();
  };
  if (sharded_) {
    for (uint32_t l = 0; l < model_->layout().n_levels(); ++l)
      outcome.grid_rows += grads->grid.TouchedRows(l);
    // The gradient is summed by the sharded update itself (a reduce-scatter)
    // unless hierarchical, whose all-reduce sums it first.
    if (hierarchical_) {
      GRIDSYNC_RETURN_IF_ERROR(AllReduce(step, tensors));
    } else if (mixed) {
      GRIDSYNC_RETURN_IF_ERROR(groups_.flat->AllReduceSum(&overflow, 1));
    }
    outcome.finite = overflow == 0.0f;
    if (outcome.finite) {
      size_t at = 0;
      for (size_t i = 0; i + (mixed ? 1 : 0) < tensors.size(); ++i) {
        std::copy(tensors[i].begin(), tensors[i].end(),
                  flat_.begin() + static_cast<std::ptrdiff_t>(at));
        at += tensors[i].size();
      }
      GRIDSYNC_RETURN_IF_ERROR(
          sharded_->Step(*groups_.flat, hierarchical_, 1.0f / loss_scale, &flat_, model_));
    }
    clear();
    comm_seconds_ += std::chrono::duration<double>(Clock::now() - start).count();
    return outcome;
  }
  if (half_) {
    GRIDSYNC_ASSIGN_OR_RETURN(
        outcome.finite, half_->Run(*groups_.flat, tensors, overflow != 0.0f, loss_scale, pool_));
  } else {
    GRIDSYNC_RETURN_IF_ERROR(AllReduce(step, tensors));
    outcome.finite = overflow == 0.0f;
  }
  comm_seconds_ += std::chrono::duration<double>(Clock::now() - start).count();
  if (!outcome.finite) {
    clear();
    return outcome;
  }
  // Every worker holds the same summed gradient and takes the same step.
  outcome.grid_rows =
      optimizer_->ApplyDense(grads->grid.mutable_dense(), &grads->mlp, 1.0f / loss_scale, pool_);
  grads->grid.ForgetTouched();
  return outcome;
}

Result<std::vector<double>> GatherRatesAcross(Collective& flat, double mine) {
  const float rate = static_cast<float>(mine);
  std::vector<float> rates(static_cast<size_t>(flat.size()));
  GRIDSYNC_RETURN_IF_ERROR(flat.AllGather(&rate, 1, rates.data()));
  return std::vector<double>(rates.begin(), rates.end());
}

Result<std::vector<double>> AllReduceSync::GatherRates(uint64_t, double mine) {
  return GatherRatesAcross(*groups_.flat, mine);
}

Status AllReduceSync::CheckPeers() {
  return coordinator_ ? CheckClusterPeers(*coordinator_) : Status::OK();
}

double AllReduceSync::BytesPerStep() const {
  return half_ ? static_cast<double>(half_->bytes_per_step())
               : static_cast<double>(elements_ * sizeof(float));
}

SyncTimes AllReduceSync::times() const {
  SyncTimes t;
  t.allreduce_seconds = comm_seconds_;
  t.bytes_sent = t.bytes_received = BytesPerStep() * static_cast<double>(applies_);
  return t;
}

void AllReduceSync::FillReport(TrainReport* report) const {
  // All-reduced bytes per step.
  report->bytes_pushed_per_step = BytesPerStep();
  report->bytes_pulled_per_step = 0;
  report->comm_seconds = comm_seconds_;
  report->checkpoint_failures = checkpoint_failures_;
}

}  // namespace gridsync
