// distributed.model_parallel under gradient_sync "nccl": the optimizer is
// model-parallel. Every worker owns a slice of every table, cut by the same
// Partition the PS shards use (common/sharding.h: mp_dim row, column or
// both; a column cut gives each worker some of every row's features, as
// the seed's parallelize_model does), and keeps Adam's state (m, v, step
// counts: two thirds of the training state) for that slice only, so the
// optimizer memory per worker falls by the worker count, as in ZeRO stage 2.
// A step: the summed gradient of its slice reaches each worker (a
// reduce-scatter, or, with distributed.hierarchical, the hierarchical
// all-reduce and then its slice taken), the worker runs Adam on its slice,
// and an all-gather gives every worker the updated parameters. The bytes on
// the wire equal one all-reduce's.
//
// Thread safety: one per worker, used from one thread.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "common/sharding.h"
#include "common/status.h"
#include "kernels/cpu/adam.h"
#include "spec/run_spec.h"
#include "worker/collective/collective.h"
#include "worker/model.h"
#include "worker/sync/row_space.h"

namespace gridsync {

class ShardedUpdate {
 public:
  static Result<ShardedUpdate> Make(const RunSpec& spec, const HashGridModel& model, int rank,
                                    int workers);

  // `flat`: the model's gradient laid out as FlattenParams lays out
  // parameters (grid, then MLP matrices), times loss scale. `summed`: it
  // already holds the sum over workers (hierarchical); else this reduces
  // it. Applies Adam to this worker's slice, all-gathers the parameters
  // into the model, and zeroes `flat`.
  Status Step(Collective& flat_group, bool summed, float grad_scale, std::vector<float>* flat,
              HashGridModel* model);

  // This worker's slice of Adam's state as checkpoint bytes, and back, as
  // LocalOptimizer's (sizes from the partition, step counts at most `step`);
  // RestoreState takes the slice's parameters from `model`, restored first.
  void AppendState(std::string* out) const;
  Status RestoreState(std::string_view* in, uint64_t step, const HashGridModel& model);
  uint64_t StateBytes() const;

  // Elements of Adam state this worker holds (for reports and tests).
  uint64_t owned_elements() const { return counts_[static_cast<size_t>(rank_)]; }

 private:
  // A contiguous run of flat elements belonging to one owner.
  struct Run {
    uint64_t flat_offset;
    uint32_t length;
  };
  struct LocalTable {
    uint64_t offset = 0;  // in this worker's slice
    uint64_t rows = 0;    // owned pieces (one per owned row)
    uint32_t width = 0;   // owned columns
    bool sparse = true;   // grid levels skip rows without gradient; MLP tables always step
    cpu::AdamTable adam;
  };
  ShardedUpdate() = default;
  // params_ = this worker's slice of the model's parameters.
  void SliceParams(const HashGridModel& model);

  int rank_ = 0;
  std::vector<std::vector<Run>> runs_;   // by owner, in slice order
  std::vector<size_t> counts_;           // slice elements by owner
  std::vector<LocalTable> tables_;       // this worker's slice, by table
  std::vector<uint32_t> identity_;       // 0..max local rows
  std::vector<uint64_t> tensor_starts_;  // flat offset of the grid and each MLP matrix
  AdamHyper hyper_;
  std::vector<float> packed_;  // every owner's slice, owner-major
  std::vector<float> grad_;    // this worker's slice of the gradient
  std::vector<float> params_;  // this worker's slice of the parameters
};

}  // namespace gridsync
