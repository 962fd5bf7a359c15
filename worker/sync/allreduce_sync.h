// gradient_sync "nccl": every worker keeps the whole model, computes the
// gradient of its share of each global batch, and the gradients are summed
// across workers by all-reduce over the Collective seam (NCCL on GPUs, Gloo
// on CPU hosts, LocalCollective in tests), in fixed-order buckets with a
// cross-rank check per bucket. Every worker then runs the same Adam step
// (LocalOptimizer), as DDP does.
//
// Flat: one all-reduce over all workers. Hierarchical (Horovod's scheme): a
// reduce-scatter inside each node, an all-reduce across nodes among the
// local ranks that own the same slice, and an all-gather inside the node.
// Nodes may have different worker counts: the buffer is cut into S slices,
// S = the smallest node's worker count, and local ranks >= S own none.
//
// distributed.model_parallel: Adam's state and update are sharded across
// the workers (sharded_update.h) instead of replicated.
//
// compression.codec fp16 or bf16: the flat all-reduce carries 16-bit floats
// (half_allreduce.h).
//
// Mixed precision: each worker rounds its gradient through fp16 and adds an
// overflow flag to the all-reduce, so every worker sees the same sum and
// skips (or applies) the step alike.
//
// checkpoint.every_steps: each worker writes part worker-<rank> (the model
// and its Adam state, worker/worker_checkpoint.h) after every that many
// steps' update and publishes the steps it holds; started at a step > 0
// (gridsync launch --resume, --start-step) it loads that step's part
// first. There is no live rejoin: a worker lost mid-run fails its peers'
// collectives, and the job resumes whole.
//
// With a rank-ordered reduction (LocalCollective) and an even split, the
// parameters equal a single process with gradient_accumulation = workers bit
// for bit; Gloo's ring and the hierarchical scheme sum in other orders, so
// they match within float rounding.
//
// Thread safety: see gradient_sync.h.
#pragma once

#include <memory>
#include <optional>

#include "common/checkpoint_mac_key.h"
#include "common/checkpoint_registry.h"
#include "common/coordinator_client.h"
#include "common/thread_pool.h"
#include "spec/run_spec.h"
#include "worker/collective/collective.h"
#include "worker/local_optimizer.h"
#include "worker/sync/gradient_sync.h"
#include "worker/sync/half_allreduce.h"
#include "worker/sync/sharded_update.h"
#include "worker/worker_checkpoint.h"

namespace gridsync {

struct AllReduceGroups {
  Collective* flat = nullptr;   // every worker; always required
  Collective* intra = nullptr;  // hierarchical: the workers of this node
  Collective* inter =
      nullptr;  // hierarchical: this local rank across nodes (null if it owns no slice)
};

// The hierarchical sum of `data` (in place) over intra-node then inter-node
// groups, as described above. `slices` = S.
Status HierarchicalAllReduce(Collective& intra, Collective* inter, int slices, float* data,
                             size_t n);

// Every worker's samples per second, given this one's: an all-gather over
// `flat` (GradientSync::GatherRates of the all-reduce syncs).
Result<std::vector<double>> GatherRatesAcross(Collective& flat, double mine);

class AllReduceSync : public GradientSync {
 public:
  // coordinator: watched between steps, and told the checkpoint steps
  // this worker holds, when given (null in in-process tests). start_step >
  // 0: resume there from this worker's checkpoint of that step.
  static Result<std::unique_ptr<AllReduceSync>> Create(const RunSpec& spec, HashGridModel* model,
                                                       int rank, const AllReduceGroups& groups,
                                                       CoordinatorClient* coordinator,
                                                       const BatchSource* source,
                                                       const SplitSchedule* split, ThreadPool* pool,
                                                       uint64_t start_step = 0);

 private:
  AllReduceSync(const RunSpec& spec, HashGridModel* model, int rank, const AllReduceGroups& groups,
                CoordinatorClient* coordinator, const BatchSource* source,
                const SplitSchedule* split, ThreadPool* pool);

 public:
  Result<const StepBatch*> Prepare(uint64_t step) override;
  Result<SyncOutcome> Apply(uint64_t step, ModelGradients* grads, float loss_scale) override;
  Status Finish(uint64_t, TrainReport*) override { return Status::OK(); }
  Result<std::vector<double>> GatherRates(uint64_t done, double mine) override;
  Status CheckPeers() override;
  void FillReport(TrainReport* report) const override;
  SyncTimes times() const override;

 private:
  double BytesPerStep() const;
  Status AllReduce(uint64_t step, std::vector<std::span<float>>& tensors);
  Result<SyncOutcome> ApplyStep(uint64_t step, ModelGradients* grads, float loss_scale);
  // Checkpoints (checkpoint.every_steps): the resume at start_step, or the
  // fresh start's check that no unknown run's files would be replaced;
  // then a part after every that many steps.
  Status StartCheckpoints(uint64_t start_step);
  Status CheckpointIfDue(uint64_t step);
  AllReduceState State();
  void PublishCheckpoints();
  // After a resume at `step`: every rank's restored parameters must be the
  // same replica (see the .cc).
  Status CheckReplicasAgree(uint64_t step);

  const RunSpec& spec_;
  const Config& config_;  // spec_.config
  HashGridModel* model_;
  AllReduceGroups groups_;
  CoordinatorClient* coordinator_;
  const BatchSource* source_;
  const SplitSchedule* split_;
  ThreadPool* pool_;
  std::unique_ptr<LocalOptimizer> optimizer_;  // replicated Adam
  std::unique_ptr<ShardedUpdate> sharded_;     // model_parallel: this worker's slice of Adam
  std::vector<float> flat_;                    // model_parallel: the gradient, flat
  std::unique_ptr<HalfAllReduce> half_;        // codec fp16/bf16: the 16-bit all-reduce
  std::unique_ptr<CheckpointLedger> ledger_;   // checkpoint.every_steps > 0
  // Under CURVE, with ledger_: authenticates its files (common/checkpoint_mac_key.h).
  std::optional<CheckpointMacKey> checkpoint_key_;
  const CheckpointMacKey* key() const { return KeyOrNull(checkpoint_key_); }
  uint64_t job_ = 0;                  // the coordinator's job, with ledger_
  uint64_t checkpoint_failures_ = 0;  // writes that failed (TrainReport)
  bool hierarchical_;
  int slices_ = 0;
  size_t elements_ = 0;        // gradient elements all-reduced per step
  std::vector<float> packed_;  // hierarchical works on one contiguous buffer
  StepBatch batch_;
  double comm_seconds_ = 0;
  uint64_t applies_ = 0;  // Apply calls: each all-reduces the same bytes
};

}  // namespace gridsync
