// The hash-grid model: a multiresolution hash encoding followed by a small
// MLP, with fp32 master parameters and, under mixed precision, an fp16
// working copy that the forward pass reads.
//
// The model computes gradients; applying them is the optimizer's job (local
// Adam here, the PS later), which is why gradients leave as ModelGradients:
// per grid level the touched rows, and the dense MLP weight gradients.
//
// CPU mixed precision: grid parameters are stored and read as real fp16;
// MLP weights are rounded to fp16 values but multiplied in fp32 (the CPU has
// no fast fp16 GEMM). Gradients are rounded through fp16 at the loss scale.
//
// Thread safety: not thread-safe; parallelism is internal via a ThreadPool.
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include "common/status.h"
#include "common/thread_pool.h"
#include "kernels/cpu/hash_encoding.h"
#include "kernels/cpu/mlp.h"
#include "kernels/hash_grid_layout.h"
#include "spec/run_spec.h"
#include "worker/compute_times.h"

namespace gridsync {

struct ModelGradients {
  explicit ModelGradients(const HashGridLayout& layout, const cpu::MlpShape& shape)
      : grid(layout), mlp(cpu::ZeroMlpWeights(shape)) {}
  cpu::GridGradient grid;  // scaled by the loss scale
  cpu::MlpWeights mlp;     // scaled by the loss scale
  // ps with a codec on a GPU (DeviceStagedSync): the grid's gradient values
  // stay on the model's device, already rounded through fp16 (mixed
  // precision) and unscaled, until the push encodes them there; `grid`
  // only marks the touched rows (its values are zeros) and `grid_fits`
  // says whether they all fit fp16.
  bool grid_on_device = false;
  bool grid_fits = true;
  // hybrid with a codec on a GPU (HybridSync::SumOnDevice): the grid's and
  // the MLP's gradients stay on the model's device as computed (at the loss
  // scale) for the node's sum there; `grid` only marks the touched rows.
  bool sums_on_device = false;
  // The grid's gradient goes to GridGradient::AccumulateCompact rather than
  // the dense buffer: set by a caller whose sync applies it so
  // (GradientSync::applies_compact_gradients) and that sums one
  // AccumulateGradients call a step.
  bool compact_grid = false;
  void Clear(ThreadPool* pool);
  // this += other, then other is cleared (see GridGradient::AddFrom).
  void AddFrom(ModelGradients* other, ThreadPool* pool);
};

class HashGridModel {
 public:
  // The model `spec` describes (RunSpec::Resolve). Parameters are
  // initialised from its seed: grid U(+-1e-4), MLP Xavier-uniform.
  static Result<std::unique_ptr<HashGridModel>> Create(const ModelSpec& spec);

  const HashGridLayout& layout() const { return layout_; }
  const cpu::MlpShape& mlp_shape() const { return mlp_shape_; }
  bool mixed_precision() const { return mixed_precision_; }

  std::vector<float>& grid_params() { return grid_; }
  const std::vector<float>& grid_params() const { return grid_; }
  // The grid's fp16 working copy the forward pass reads (mixed precision
  // only; empty otherwise).
  const std::vector<uint16_t>& grid_working_copy() const { return grid_half_; }
  cpu::MlpWeights& mlp_weights() { return mlp_; }
  const cpu::MlpWeights& mlp_weights() const { return mlp_; }
  uint64_t n_params() const { return grid_.size() + mlp_shape_.n_params(); }

  // Active levels at `step` under training.dynamic_resolution (see
  // configs/README.md for the schedule); all levels otherwise.
  uint32_t ActiveLevels(uint64_t step) const;

  // Adds the gradient of the mean squared error over a batch of
  // `global_batch` samples, of which these n are a part, multiplied by
  // `loss_scale`. Returns the sum of squared errors of these n samples.
  double AccumulateGradients(const float* positions, const float* targets, size_t n,
                             size_t global_batch, float loss_scale, uint32_t active_levels,
                             ModelGradients* grads, ThreadPool* pool);

  // Seconds AccumulateGradients has spent in each phase since the model was
  // made (Predict's are not counted).
  const ComputeTimes& compute_times() const { return compute_times_; }

  // Positions Predict encodes at a time, from the first it is given: a
  // caller that predicts in pieces starting at multiples of this gets the
  // same predictions as one call.
  static constexpr size_t kPredictChunk = size_t{1} << 16;
  // Predictions (n x output_width) at positions (n x dims).
  void Predict(const float* positions, size_t n, uint32_t active_levels, float* out,
               ThreadPool* pool);

  // Re-derives the fp16 working copy after the master weights changed:
  // rows[0..n) of `level` (level-local ids), or all MLP weights, or
  // everything. No-ops without mixed precision. Distinct levels may be
  // refreshed from different threads at once.
  void RefreshWorkingCopy(uint32_t level, const uint32_t* rows, size_t n);
  void RefreshMlpWorkingCopy();
  void RefreshWorkingCopyAll();

 private:
  // What a chunk of the batch leaves for the sums after the parallel loop
  // (added in chunk order, so that no thread count changes a bit).
  struct ChunkResult {
    cpu::MlpWeights dw;
    double sse = 0;
  };
  // A thread's scratch for the chunks it runs (ThreadPool slots): one per
  // thread, not per chunk, so every chunk after a thread's first finds its
  // activations' buffers in that core's caches (a step's 8 chunks of 2048
  // samples had 8 workspaces of about 1.1 MiB each: the MLP took 3.3 ms of
  // a 14 ms step on one thread, 2.7-2.85 ms with one).
  struct MlpScratch {
    cpu::MlpWorkspace workspace;
    cpu::Matrix y, dy;
  };

  HashGridModel(HashGridLayout layout, const ModelSpec& spec);
  static uint64_t Mix64Seed(uint64_t seed);
  // Lookup and grid forward of n positions into lookup_ and features_; adds
  // their seconds to *times when given.
  void EncodeBatch(const float* positions, size_t n, uint32_t active_levels, ThreadPool* pool,
                   ComputeTimes* times = nullptr);

  HashGridLayout layout_;
  cpu::MlpShape mlp_shape_;
  bool mixed_precision_;
  cpu::MatmulFormat mlp_format_;  // training.mlp_precision
  bool dynamic_resolution_;
  uint64_t dynamic_resolution_steps_;

  std::vector<float> grid_;          // fp32 master
  std::vector<uint16_t> grid_half_;  // fp16 working copy (mixed precision only)
  cpu::MlpWeights mlp_;              // fp32 master
  cpu::MlpWeights mlp_working_;      // rounded to fp16 (mixed precision only)

  // Scratch reused across calls.
  cpu::GridBatchLookup lookup_;
  std::vector<float> features_;
  std::vector<float> d_features_;
  std::vector<ChunkResult> chunk_results_;
  std::vector<MlpScratch> mlp_scratch_;  // per ThreadPool slot
  ComputeTimes compute_times_;
};

}  // namespace gridsync
