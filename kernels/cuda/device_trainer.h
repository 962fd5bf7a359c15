// Training the hash-grid model on one CUDA device (training.device: cuda).
// The whole model lives in device memory: the grid and MLP parameters, their
// gradients and Adam's m, v and step counts. The batch comes in through
// pinned host memory on the trainer's own stream; everything else runs
// there: the encoding forward (kernels/cuda/hash_encoding.cu), the MLP
// through cuBLAS, the mean squared error and its gradient, the MLP and
// encoding backward passes, and Adam (grid rows whose gradient is not all
// zero, each with its own step count; MLP matrices every step).
//
// A step is phases, so that each sync mode composes the ones it needs:
//   standalone:  ComputeGradients, [RoundGradientsToHalf], ApplyGradients
//   nccl:        BeginGradients (the last micro-batch), all-reduce each
//                bucket in place as it is final (device pointers: NCCL reads
//                them directly, its stream waiting on BucketReady),
//                FinishGradients, ApplyGradients
//   ps, hybrid:  UploadGridRows/UploadMlp (what the host pulled), Compute...,
//                TakeGridGradientRows/TakeMlpGradients (only the rows the
//                batch touched, staged through pinned memory) for the host
//                sync to push; or, in ps with a codec, PrepareGridPush and
//                the push's blocks encoded here (EncodePushBlock), so that
//                only payloads are copied
//
// Mixed precision (training.mixed_precision) as worker/model.cc does it:
// fp32 master parameters, the forward and backward passes read a working
// copy rounded to fp16 values, and gradients, computed at the loss scale,
// are rounded through fp16 with an overflow check (RoundGradientsToHalf).
//
// The maths is worker/model.cc's and worker/local_optimizer.cc's in fp32
// (kernels/adam_math.h is shared), so a run ends within rounding of the CPU
// run: the encoding's backward pass sums with atomics and cuBLAS orders its
// sums its own way. worker/host_trainer.h is the CPU twin of this interface,
// which the tests drive through every sync mode.
//
// This header needs no nvcc. Without CUDA in the build, or without a device,
// Create fails saying which.
//
// Thread safety: one trainer per thread; it owns its stream and cuBLAS
// handle. Exceptions: EncodeBlock, FetchPushBlock and EncodePushBlock may be
// called from several threads at once (see each).
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "common/status.h"
#include "kernels/adam_math.h"
#include "kernels/cpu/codec.h"
#include "kernels/cpu/error_feedback.h"
#include "kernels/hash_grid_layout.h"
#include "kernels/mlp_shape.h"

namespace gridsync::cuda {

class DeviceTrainer {
 public:
  // `grid`: layout.total_params() floats; `mlp_weights`: one column-major
  // matrix per layer. `device`: the CUDA device (after CUDA_VISIBLE_DEVICES);
  // `max_batch`: the most samples a Step or Predict call takes.
  // `mixed_precision`: see the file comment.
  static Result<std::unique_ptr<DeviceTrainer>> Create(
      const HashGridLayout& layout, const MlpShape& mlp, const AdamHyper& hyper,
      const std::vector<float>& grid, const std::vector<std::vector<float>>& mlp_weights,
      int device, size_t max_batch, bool mixed_precision);
  virtual ~DeviceTrainer() = default;

  // Adds the gradient of the mean squared error of n samples (positions n x
  // dims, targets n x output_width, host memory) of a global batch of
  // `global_batch`, times `loss_scale`, to the gradient buffers. Returns the
  // sum of squared errors of the n samples.
  virtual Result<double> ComputeGradients(const float* positions, const float* targets, size_t n,
                                          size_t global_batch, uint32_t active_levels,
                                          float loss_scale) = 0;

  // Mixed precision: rounds every gradient through fp16; returns whether
  // all of them fit (no inf, NaN or magnitude above 65504).
  virtual Result<bool> RoundGradientsToHalf() = 0;

  // The gradient buffers, the grid's (total_params floats) then each MLP
  // matrix's, for in-place collectives; device memory when
  // gradients_on_device(). Valid for the trainer's life.
  virtual std::vector<std::span<float>> GradientBuffers() = 0;
  virtual bool gradients_on_device() const = 0;

  // ---- A backward pass overlapped with its all-reduce (nccl mode) ----
  // Cuts the gradient buffers into buckets in the order a backward pass
  // finishes them (CutGradientBuckets below: the MLP's matrices, then the
  // grid's levels finest first, about `bucket_bytes` each) and returns them;
  // BeginGradients cuts its passes there from then on (one grid bucket
  // until the first call).
  virtual std::vector<std::vector<std::span<float>>> CutBuckets(size_t bucket_bytes) = 0;
  // ComputeGradients for the last (or only) micro-batch of a step that
  // returns once the pass is enqueued: bucket b's gradients are final when
  // BucketReady(b) fires, while the pass goes on with the next bucket. With
  // `round_to_half`, each bucket is rounded through fp16 before it is final
  // (what RoundGradientsToHalf does to all). FinishGradients must follow.
  virtual Status BeginGradients(const float* positions, const float* targets, size_t n,
                                size_t global_batch, uint32_t active_levels, float loss_scale,
                                bool round_to_half) = 0;
  // A cudaEvent_t recorded when bucket b is final, for a collective's
  // stream to wait on; null when it is final already (the CPU twin).
  virtual void* BucketReady(size_t b) = 0;
  // Copies bucket b into `host` (spans of the bucket's sizes, host memory)
  // once it is final; with `to_device`, back from it, and later phases
  // (ApplyGradients) wait for that copy. Staging for a collective that
  // reads host memory (Gloo); the copies run beside the pass.
  virtual Status CopyBucket(size_t b, const std::vector<std::span<float>>& host,
                            bool to_device) = 0;
  struct Finished {
    double sse = 0;    // of the micro-batch begun
    bool fits = true;  // with round_to_half: whether every gradient fit fp16
  };
  // Waits for the pass begun.
  virtual Result<Finished> FinishGradients() = 0;

  // Adam on the gradient divided by `loss_scale`; the gradients are zeroed.
  virtual Status ApplyGradients(float loss_scale) = 0;
  // Zeroes the gradients (a skipped step).
  virtual Status ClearGradients() = 0;

  // Staging for the PS modes. Rows are global row ids (the layout's
  // row_offset of the level plus the level-local id), n of them, each
  // `features` floats in `values` (host memory).
  // Overwrites those parameter rows (and their fp16 working copy).
  virtual Status UploadGridRows(const uint32_t* rows, size_t n, const float* values) = 0;
  // Copies those gradient rows out, then zeroes them.
  virtual Status TakeGridGradientRows(const uint32_t* rows, size_t n, float* values) = 0;
  // Overwrites the MLP weights (one column-major matrix per layer).
  virtual Status UploadMlp(const std::vector<std::span<const float>>& weights) = 0;
  // Copies the MLP weight gradients out (same shapes), then zeroes them.
  virtual Status TakeMlpGradients(const std::vector<std::span<float>>& grads) = 0;

  // Encodes one block of a PS push (compression.codec in ps and hybrid) on
  // this trainer's device, with the codec's CUDA twin (block_codec.h):
  // values (n floats, host) into payload (EncodedSize(options, n) bytes),
  // and into `decoded` (n floats, or null) what the payload decodes to. The
  // CPU twin runs cpu::Encode and cpu::Decode. Unlike the other calls, this
  // one may come from several threads at once (the client's training
  // threads), between steps.
  virtual Status EncodeBlock(const CodecOptions& options, const float* values, size_t n,
                             uint64_t seed, uint8_t* payload, float* decoded) = 0;

  // ---- ps pushes encoded on the device, before the copy ----
  // With a codec in ps (optimizer on the shards), a push's grid rows stay
  // here until they are encoded: only payloads cross to the host, and the
  // error-feedback residuals live here (the PS client's copy is brought up
  // to date by CopyResidualsTo before anything reads it). DeviceStagedSync
  // calls PrepareGridPush after the pass, the PS client's
  // PsClient::DevicePushSource calls Fetch/EncodePushBlock per block, and
  // ZeroGridGradientRows ends the step.
  //
  // One block of a push: rows (level-local ids, ascending, host memory) of
  // grid level `level`, the columns [col_begin, col_begin + width). Its
  // residuals are kept under key (level << 32) | col_begin, the PS client's
  // key for that slice of table `level` (PushBlockKey).
  struct PushBlock {
    uint32_t level = 0;
    uint32_t col_begin = 0;
    uint32_t width = 0;
    const uint32_t* rows = nullptr;
    size_t n = 0;
  };
  static uint64_t PushBlockKey(uint32_t level, uint32_t col_begin) {
    return (uint64_t{level} << 32) | col_begin;
  }
  // Turns the gradient rows (global ids) into what the push carries: with
  // `round_to_half` each value is rounded through fp16 (returns whether all
  // fit, as RoundGradientsToHalf), then all are multiplied by `scale` (the
  // loss scale's inverse, a power of two: exact).
  virtual Result<bool> PrepareGridPush(const uint32_t* rows, size_t n, bool round_to_half,
                                       float scale) = 0;
  // The block's values (n x width floats, host memory): a block the client
  // sends uncompressed.
  virtual Status FetchPushBlock(const PushBlock& block, float* values) = 0;
  // Encodes the block's values into payload (EncodedSize(options, n x
  // width) bytes, host memory) as cpu::Encode does; with `feedback`, first
  // adds each row's residual under its key and afterwards keeps what the
  // payload did not deliver, exactly as cpu::ErrorFeedback's AddResidual and
  // StoreResidual (a Corruption when the payload does not decode: values
  // that are not finite). With `mask_momentum` (and feedback), worker
  // Adam's m is zeroed where the payload delivered a value
  // (WorkerAdam::MaskMomentum, DGC's momentum factor masking).
  virtual Status EncodePushBlock(const PushBlock& block, const CodecOptions& options, uint64_t seed,
                                 bool feedback, bool mask_momentum, uint8_t* payload) = 0;
  // Adam on the worker (ps.optimizer worker) for the grid, WorkerAdam's
  // rule with this trainer's m, v and per-row step counts: the prepared
  // gradient rows of `level` (level-local ids, ascending) become updates,
  // -(Adam step), in place; a row whose gradient is all zero does not step
  // and is left out. *kept = the rows that stepped, ascending.
  virtual Status GridWorkerAdam(uint32_t level, const uint32_t* rows, size_t n,
                                std::vector<uint32_t>* kept) = 0;
  // Adds each residual entry to those parameter rows (global ids) and
  // their fp16 working copy: the updates this worker has not delivered
  // yet, on freshly uploaded rows (PsClient::GatherPendingUpdates' rule).
  virtual Status AddResidualsToGridRows(const uint32_t* rows, size_t n) = 0;
  // Worker Adam's state of `level`: m and v (the level's rows x features)
  // and the step counts (its rows), copied out; and in (null: zeros).
  virtual Status CopyGridAdamState(uint32_t level, float* m, float* v, uint32_t* steps) = 0;
  virtual Status LoadGridAdamState(uint32_t level, const float* m, const float* v,
                                   const uint32_t* steps) = 0;
  // Zeroes those gradient rows (global ids): the push is done.
  virtual Status ZeroGridGradientRows(const uint32_t* rows, size_t n) = 0;
  // The residuals EncodePushBlock keeps, copied into *into (replacing what
  // it held: the same keys and entries, cpu::ErrorFeedback's Reserve for a
  // key with none), and the reverse, replacing everything held here.
  virtual Status CopyResidualsTo(cpu::ErrorFeedback* into) = 0;
  virtual Status LoadResiduals(const cpu::ErrorFeedback& from) = 0;
  // Fetch/EncodePushBlock may come from several threads at once (the PS
  // client's pool), with distinct keys; the other calls from the trainer's.

  // ---- hybrid: the node's sum where the gradients are ----
  // With a codec in hybrid (HybridSync::SumOnDevice), a step's node sum:
  // PackNodeGradients, the node's reduce-scatter from `packed` into
  // `slice`, UnpackNodeSlice, GridRowsWithGradient, PrepareGridPush (the
  // unscale), the push's blocks (EncodePushBlock, as in ps), and
  // ZeroGridGradientRows.
  struct NodeExchange {
    float* packed = nullptr;  // packed_floats
    size_t packed_floats = 0;
    float* slice = nullptr;  // the slice_floats asked for
    bool fits = true;        // with round_to_half: whether every value fit fp16
  };
  // Moves gradient rows (global ids, ascending, n) and then every MLP
  // matrix's gradient into `packed` (n x features + the MLP's floats),
  // zeroing them here; with round_to_half rounds the packed values through
  // fp16 (RoundToHalfChecked). Both buffers lie where the gradients do, or,
  // with `host`, in pinned host memory (a collective that reads host
  // memory); valid until the next call.
  virtual Result<NodeExchange> PackNodeGradients(const uint32_t* rows, size_t n,
                                                 size_t slice_floats, bool round_to_half,
                                                 bool host) = 0;
  // The slice (the last PackNodeGradients'): its first n x features floats
  // become those gradient rows (global ids), and the mlp_floats after them
  // are copied to mlp_values (host memory).
  virtual Status UnpackNodeSlice(const uint32_t* rows, size_t n, float* mlp_values,
                                 size_t mlp_floats) = 0;
  // has[i] = 1 when gradient row rows[i] (global id) is not all zero
  // (RowHasGradient), else 0.
  virtual Status GridRowsWithGradient(const uint32_t* rows, size_t n, uint8_t* has) = 0;
  // Copies those parameter rows (global ids) out: n x features floats.
  virtual Status DownloadGridRows(const uint32_t* rows, size_t n, float* values) = 0;

  // Predictions (n x output_width, host memory) at n positions.
  virtual Status Predict(const float* positions, size_t n, uint32_t active_levels, float* out) = 0;

  // The parameters, copied to the host (evaluations, the final model).
  virtual Status Download(std::vector<float>* grid,
                          std::vector<std::vector<float>>* mlp_weights) = 0;

  // Memory traffic of the kernels so far, for the bandwidth report: bytes
  // the encoding and Adam kernels must move (a lower bound: every operand
  // read or written once), the seconds they took (CUDA events), and the
  // device's peak (memory clock x bus width x 2). Zeros on the CPU twin.
  // `seconds` is the sum of its stages, for where a step's device time
  // goes: the forward span (encoding forward, the MLP's forward and
  // backward, the loss), the encoding's backward scatter, and grid Adam.
  struct Traffic {
    double bytes = 0;
    double seconds = 0;
    double peak_bytes_per_second = 0;
    double forward_seconds = 0;
    double grid_backward_seconds = 0;
    double grid_adam_seconds = 0;
  };
  virtual Traffic traffic() const { return {}; }

  // "NVIDIA H200 (device 0)": for logs.
  virtual std::string device_name() const = 0;
};

// The cut of CutBuckets: bucket 0 holds the MLP's matrices (their
// gradients are final first, before the encoding's backward pass), then one
// bucket per group of grid levels, finest first, each group at least
// `bucket_bytes` of gradient (the last may be smaller) so that the bucket
// reduced last, while nothing is left to overlap it, is the smallest.
// `buffers` are GradientBuffers(); `level_groups` receives each grid
// bucket's levels [begin, end).
std::vector<std::vector<std::span<float>>> CutGradientBuckets(
    const HashGridLayout& layout, const std::vector<std::span<float>>& buffers, size_t bucket_bytes,
    std::vector<std::pair<uint32_t, uint32_t>>* level_groups);

// Whether `host` has the shapes of `buffers` (InvalidArgument naming `what`
// and the first mismatch otherwise).
Status CheckBufferShapes(const std::vector<std::span<float>>& host,
                         const std::vector<std::span<float>>& buffers, const char* what);

// What DeviceTrainer::Create checks of its inputs before touching a
// device: the grid's size against the layout, the MLP's input width and
// matrices against its shape, and max_batch within 1..2^28.
Status CheckTrainerInputs(const HashGridLayout& layout, const MlpShape& mlp,
                          const std::vector<float>& grid,
                          const std::vector<std::vector<float>>& mlp_weights, size_t max_batch);

// Whether `block` lies inside the grid (level, columns, rows below the
// level's size and ascending): InvalidArgument naming what is wrong.
Status CheckPushBlock(const HashGridLayout& layout, const DeviceTrainer::PushBlock& block);
// Whether every table of `residuals` (keys (level << 32) | first column)
// lies inside the grid, rows included: LoadResiduals refuses what does not.
Status CheckResiduals(const HashGridLayout& layout, const cpu::ErrorFeedback& residuals);

// The device a worker of local rank `local_rank` uses: local_rank modulo the
// devices this process sees (CUDA_VISIBLE_DEVICES already applied by the
// runtime); an error naming why there is none.
Result<int> DeviceForLocalRank(int local_rank);

}  // namespace gridsync::cuda
