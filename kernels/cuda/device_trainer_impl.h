// DeviceTrainerImpl, the DeviceTrainer (device_trainer.h) that
// DeviceTrainer::Create makes, declared for its two source files:
// device_trainer.cu (setup and the training passes: forward, backward,
// buckets, Adam) and device_trainer_rows.cu (rows, MLP weights and
// predictions copied between the host and the device). CUDA sources only.
//
// Thread safety: see device_trainer.h.
#pragma once

#include <cublas_v2.h>
#include <cuda_runtime.h>

#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "kernels/cuda/block_codec.h"
#include "kernels/cuda/cublas_api.h"
#include "kernels/cuda/cuda_check.h"
#include "kernels/cuda/device_buffer.h"
#include "kernels/cuda/device_trainer.h"
#include "kernels/cuda/node_sum.h"
#include "kernels/cuda/push_blocks.h"

namespace gridsync::cuda {

class DeviceTrainerImpl : public DeviceTrainer {
 public:
  DeviceTrainerImpl(const HashGridLayout& layout, const MlpShape& dims, const AdamHyper& hyper,
                    int device, size_t max_batch, bool mixed_precision)
      : layout_(layout),
        dims_(dims),
        hyper_(hyper),
        device_(device),
        max_batch_(max_batch),
        mixed_(mixed_precision) {}

  ~DeviceTrainerImpl() override;
  Status Init(const std::vector<float>& grid, const std::vector<std::vector<float>>& mlp);
  Result<double> ComputeGradients(const float* positions, const float* targets, size_t n,
                                  size_t global_batch, uint32_t active_levels,
                                  float loss_scale) override {
    GRIDSYNC_RETURN_IF_ERROR(BeginGradients(positions, targets, n, global_batch, active_levels,
                                            loss_scale, /*round_to_half=*/false));
    GRIDSYNC_ASSIGN_OR_RETURN(const Finished finished, FinishGradients());
    return finished.sse;
  }

  std::vector<std::vector<std::span<float>>> CutBuckets(size_t bucket_bytes) override {
    // Fails only when the device cannot make an event; BeginGradients then
    // reports it.
    if (!SetBuckets(bucket_bytes).ok()) return {};
    return buckets_;
  }

  Status BeginGradients(const float* positions, const float* targets, size_t n, size_t global_batch,
                        uint32_t active_levels, float loss_scale, bool round_to_half) override;

  void* BucketReady(size_t b) override {
    return b < bucket_events_.size() ? static_cast<void*>(bucket_events_[b]) : nullptr;
  }

  Status CopyBucket(size_t b, const std::vector<std::span<float>>& host, bool to_device) override;
  Result<Finished> FinishGradients() override;
  Result<bool> RoundGradientsToHalf() override;
  std::vector<std::span<float>> GradientBuffers() override {
    std::vector<std::span<float>> buffers = {{grid_grad_.get(), grid_grad_.size()}};
    for (auto& g : mlp_grad_) buffers.emplace_back(g.get(), g.size());
    return buffers;
  }
  bool gradients_on_device() const override { return true; }

  Status ApplyGradients(float loss_scale) override;
  Status ClearGradients() override;
  Status UploadGridRows(const uint32_t* rows, size_t n, const float* values) override;
  Status TakeGridGradientRows(const uint32_t* rows, size_t n, float* values) override;
  Status UploadMlp(const std::vector<std::span<const float>>& weights) override;
  Status TakeMlpGradients(const std::vector<std::span<float>>& grads) override;
  Status EncodeBlock(const CodecOptions& options, const float* values, size_t n, uint64_t seed,
                     uint8_t* payload, float* decoded) override {
    return block_codec_->Encode(options, values, n, seed, payload, decoded);
  }

  Result<bool> PrepareGridPush(const uint32_t* rows, size_t n, bool round_to_half,
                               float scale) override {
    return push_blocks_->PrepareGridPush(rows, n, round_to_half, scale);
  }
  Status FetchPushBlock(const PushBlock& block, float* values) override {
    return push_blocks_->FetchPushBlock(block, values);
  }
  Status EncodePushBlock(const PushBlock& block, const CodecOptions& options, uint64_t seed,
                         bool feedback, bool mask_momentum, uint8_t* payload) override {
    return push_blocks_->EncodePushBlock(block, options, seed, feedback, mask_momentum, payload);
  }
  Status GridWorkerAdam(uint32_t level, const uint32_t* rows, size_t n,
                        std::vector<uint32_t>* kept) override {
    return push_blocks_->GridWorkerAdam(level, rows, n, kept);
  }
  Status AddResidualsToGridRows(const uint32_t* rows, size_t n) override {
    return push_blocks_->AddResidualsToGridRows(rows, n);
  }
  Status CopyGridAdamState(uint32_t level, float* m, float* v, uint32_t* steps) override {
    return push_blocks_->CopyGridAdamState(level, m, v, steps);
  }
  Status LoadGridAdamState(uint32_t level, const float* m, const float* v,
                           const uint32_t* steps) override {
    return push_blocks_->LoadGridAdamState(level, m, v, steps);
  }
  Status ZeroGridGradientRows(const uint32_t* rows, size_t n) override {
    return push_blocks_->ZeroGridGradientRows(rows, n);
  }
  Status CopyResidualsTo(cpu::ErrorFeedback* into) override {
    return push_blocks_->CopyResidualsTo(into);
  }
  Status LoadResiduals(const cpu::ErrorFeedback& from) override {
    return push_blocks_->LoadResiduals(from);
  }

  Result<NodeExchange> PackNodeGradients(const uint32_t* rows, size_t n, size_t slice_floats,
                                         bool round_to_half, bool host) override {
    return node_sum_->PackNodeGradients(rows, n, slice_floats, round_to_half, host);
  }
  Status UnpackNodeSlice(const uint32_t* rows, size_t n, float* mlp_values,
                         size_t mlp_floats) override {
    return node_sum_->UnpackNodeSlice(rows, n, mlp_values, mlp_floats);
  }
  Status GridRowsWithGradient(const uint32_t* rows, size_t n, uint8_t* has) override {
    return node_sum_->GridRowsWithGradient(rows, n, has);
  }
  Status DownloadGridRows(const uint32_t* rows, size_t n, float* values) override {
    return node_sum_->DownloadGridRows(rows, n, values);
  }

  Status Predict(const float* positions, size_t n, uint32_t active_levels, float* out) override;
  Status Download(std::vector<float>* grid, std::vector<std::vector<float>>* mlp) override;
  std::string device_name() const override { return name_; }
  Traffic traffic() const override {
    Traffic traffic = traffic_;  // the stages' sum, kept once
    traffic.seconds =
        traffic.forward_seconds + traffic.grid_backward_seconds + traffic.grid_adam_seconds;
    return traffic;
  }

 private:
  Status CheckBatch(size_t n, const char* what) const {
    if (n <= max_batch_) return Status::OK();
    return Status::InvalidArgument(std::string("DeviceTrainer::") + what + ": " +
                                   std::to_string(n) + " samples; allowed: at most " +
                                   std::to_string(max_batch_) + " (the batch it was made for)");
  }

  template <typename SizeOf>
  Status CheckMlpShapes(size_t count, SizeOf size_of) const {
    if (count != mlp_.size()) {
      return Status::InvalidArgument("DeviceTrainer: " + std::to_string(count) +
                                     " MLP matrices; the model has " + std::to_string(mlp_.size()));
    }
    for (size_t i = 0; i < count; ++i) {
      if (size_of(i) != mlp_[i].size()) {
        return Status::InvalidArgument("DeviceTrainer: MLP matrix " + std::to_string(i) + " has " +
                                       std::to_string(size_of(i)) + " values; the model's has " +
                                       std::to_string(mlp_[i].size()));
      }
    }
    return Status::OK();
  }

  // Copies n row ids to the device (rows_), growing the staging buffers to
  // hold n rows; ids past the grid are refused.
  Status StageRows(const uint32_t* rows, size_t n);

  // Mixed precision: the fp16 working copies of the whole grid and MLP.
  Status RefreshWorkingCopy();

  // The weights the passes read: the fp16 working copy under mixed precision.
  const float* Weights(size_t i) const { return mixed_ ? mlp_work_[i].get() : mlp_[i].get(); }

  Status UploadBatch(const float* positions, const float* targets, size_t n);

  // C (m x n) = op(A) * op(B) + beta * C, column-major.
  Status Gemm(cublasOperation_t ta, cublasOperation_t tb, int m, int n, int k, const float* a,
              int lda, const float* b, int ldb, float beta, float* c, int ldc) {
    const float one = 1.0f;
    GRIDSYNC_CUBLAS_RETURN_IF_ERROR(
        Cublas().sgemm(cublas_, ta, tb, m, n, k, &one, a, lda, b, ldb, &beta, c, ldc));
    return Status::OK();
  }

  // Encoding, then the MLP: y_ (output_width x n); hidden_ keep the
  // post-ReLU activations for the backward pass.
  Status Forward(size_t n, uint32_t active_levels);

  // Cuts the gradient buffers (CutGradientBuckets), with one event per
  // bucket.
  Status SetBuckets(size_t bucket_bytes);

  // From dy (delta_[0]): the MLP weight gradients (added) and d_features_.
  Status Backward(size_t n);

  const HashGridLayout layout_;
  const MlpShape dims_;
  const AdamHyper hyper_;
  const int device_;
  const size_t max_batch_;
  const bool mixed_;
  std::string name_;
  cudaStream_t stream_ = nullptr;
  cublasHandle_t cublas_ = nullptr;
  // Encoding forward (+MLP), encoding backward, and grid Adam spans.
  cudaEvent_t events_[5] = {};
  // Overlapped passes: the buckets, the levels [begin, end) of each grid
  // bucket, one event per bucket, and the staging copies' stream.
  std::vector<std::vector<std::span<float>>> buckets_;
  std::vector<std::pair<uint32_t, uint32_t>> level_groups_;
  std::vector<cudaEvent_t> bucket_events_;
  cudaStream_t copy_stream_ = nullptr;
  cudaEvent_t copied_ = nullptr;
  std::unique_ptr<BlockCodec> block_codec_;  // the PS pushes' codecs
  std::unique_ptr<PushBlocks> push_blocks_;  // ps pushes encoded before the copy
  std::unique_ptr<NodeSum> node_sum_;        // hybrid's node sum on the device
  struct Begun {
    size_t n = 0;
    uint32_t active_levels = 0;
    bool round_to_half = false;
  } begun_;
  Traffic traffic_;
  uint32_t mlp_step_ = 0;

  DeviceBuffer<float> grid_, grid_m_, grid_v_, grid_grad_;
  DeviceBuffer<uint16_t> grid_half_;  // mixed precision: fp16 working copy
  DeviceBuffer<uint32_t> grid_steps_;
  std::vector<DeviceBuffer<float>> mlp_, mlp_m_, mlp_v_, mlp_grad_;
  std::vector<DeviceBuffer<float>> mlp_work_;  // mixed precision: rounded to fp16 values
  DeviceBuffer<float> positions_, targets_, features_, d_features_, y_;
  std::vector<DeviceBuffer<float>> hidden_;
  DeviceBuffer<float> delta_[2];
  DeviceBuffer<double> sse_;
  DeviceBuffer<unsigned> overflow_;
  PinnedBuffer<float> positions_host_, targets_host_;
  PinnedBuffer<double> sse_host_;
  PinnedBuffer<unsigned> overflow_host_;
  // Row staging for the PS modes, grown on demand.
  size_t staged_capacity_ = 0;
  DeviceBuffer<uint32_t> rows_;
  DeviceBuffer<float> values_;
  PinnedBuffer<uint32_t> rows_host_;
  PinnedBuffer<float> values_host_;
};

}  // namespace gridsync::cuda
