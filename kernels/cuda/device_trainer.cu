// DeviceTrainer (device_trainer.h): the hash-grid model trained on one
// CUDA device. Layouts follow the CPU model: features are n x input_width
// floats, sample-major, which is the MLP's input matrix (input_width x n,
// column-major) without a copy; every activation is width x n column-major.
//
// Thread safety: see device_trainer.h.
#include <cublas_v2.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

#include "kernels/adam_math.h"
#include "kernels/cuda/block_codec.h"
#include "kernels/cuda/cublas_api.h"
#include "kernels/cuda/cuda_check.h"
#include "kernels/cuda/cuda_kernels.h"
#include "kernels/cuda/device_buffer.h"
#include "kernels/cuda/device_trainer.h"
#include "kernels/cuda/node_sum.h"
#include "kernels/cuda/push_blocks.h"
#include "kernels/cuda/trainer_kernels.h"

namespace gridsync::cuda {
namespace {

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

  ~DeviceTrainerImpl() override {
    (void)cudaSetDevice(device_);  // the stream, handle and buffers belong to it
    for (cudaEvent_t e : events_)
      if (e != nullptr) (void)cudaEventDestroy(e);
    for (cudaEvent_t e : bucket_events_)
      if (e != nullptr) (void)cudaEventDestroy(e);
    if (copied_ != nullptr) (void)cudaEventDestroy(copied_);
    if (copy_stream_ != nullptr) (void)cudaStreamDestroy(copy_stream_);
    if (cublas_ != nullptr) (void)Cublas().destroy(cublas_);
    if (stream_ != nullptr) (void)cudaStreamDestroy(stream_);
    (void)cudaGetLastError();
  }

  Status Init(const std::vector<float>& grid, const std::vector<std::vector<float>>& mlp) {
    GRIDSYNC_CUDA_RETURN_IF_ERROR(cudaSetDevice(device_));
    cudaDeviceProp props{};
    GRIDSYNC_CUDA_RETURN_IF_ERROR(cudaGetDeviceProperties(&props, device_));
    name_ = std::string(props.name) + " (device " + std::to_string(device_) + ")";
    int clock_khz = 0, bus_bits = 0;
    GRIDSYNC_CUDA_RETURN_IF_ERROR(
        cudaDeviceGetAttribute(&clock_khz, cudaDevAttrMemoryClockRate, device_));
    GRIDSYNC_CUDA_RETURN_IF_ERROR(
        cudaDeviceGetAttribute(&bus_bits, cudaDevAttrGlobalMemoryBusWidth, device_));
    // Double data rate: two transfers per clock.
    traffic_.peak_bytes_per_second = 2.0 * clock_khz * 1e3 * bus_bits / 8.0;
    GRIDSYNC_CUDA_RETURN_IF_ERROR(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking));
    for (cudaEvent_t& e : events_) GRIDSYNC_CUDA_RETURN_IF_ERROR(cudaEventCreate(&e));
    GRIDSYNC_CUDA_RETURN_IF_ERROR(cudaStreamCreateWithFlags(&copy_stream_, cudaStreamNonBlocking));
    GRIDSYNC_CUDA_RETURN_IF_ERROR(cudaEventCreateWithFlags(&copied_, cudaEventDisableTiming));
    GRIDSYNC_CUBLAS_RETURN_IF_ERROR(Cublas().create(&cublas_));
    GRIDSYNC_ASSIGN_OR_RETURN(block_codec_, BlockCodec::Create(device_));
    GRIDSYNC_CUBLAS_RETURN_IF_ERROR(Cublas().set_stream(cublas_, stream_));
    // fp32 as the CPU twin computes it: no TF32 tensor-core rounding.
    GRIDSYNC_CUBLAS_RETURN_IF_ERROR(Cublas().set_math_mode(cublas_, CUBLAS_PEDANTIC_MATH));

    const size_t total = layout_.total_params();
    const uint32_t width = layout_.features();
    GRIDSYNC_RETURN_IF_ERROR(grid_.Upload(grid));
    GRIDSYNC_RETURN_IF_ERROR(grid_m_.AllocateZeroed(total));
    GRIDSYNC_RETURN_IF_ERROR(grid_v_.AllocateZeroed(total));
    GRIDSYNC_RETURN_IF_ERROR(grid_grad_.AllocateZeroed(total));
    GRIDSYNC_RETURN_IF_ERROR(grid_steps_.AllocateZeroed(total / width));
    if (mixed_) GRIDSYNC_RETURN_IF_ERROR(grid_half_.AllocateZeroed(total));
    push_blocks_ =
        PushBlocks::Create(layout_, hyper_, device_,
                           {grid_grad_.get(), grid_.get(), mixed_ ? grid_half_.get() : nullptr,
                            grid_m_.get(), grid_v_.get(), grid_steps_.get()},
                           stream_);
    for (int i = 0; i < dims_.n_matrices(); ++i) {
      const size_t n = static_cast<size_t>(dims_.rows(i)) * static_cast<size_t>(dims_.cols(i));
      mlp_.emplace_back();
      mlp_m_.emplace_back();
      mlp_v_.emplace_back();
      mlp_grad_.emplace_back();
      mlp_work_.emplace_back();
      GRIDSYNC_RETURN_IF_ERROR(mlp_.back().Upload(mlp[static_cast<size_t>(i)]));
      GRIDSYNC_RETURN_IF_ERROR(mlp_m_.back().AllocateZeroed(n));
      GRIDSYNC_RETURN_IF_ERROR(mlp_v_.back().AllocateZeroed(n));
      GRIDSYNC_RETURN_IF_ERROR(mlp_grad_.back().AllocateZeroed(n));
      if (mixed_) GRIDSYNC_RETURN_IF_ERROR(mlp_work_.back().AllocateZeroed(n));
    }
    std::vector<std::span<float>> mlp_grads;
    for (auto& g : mlp_grad_) mlp_grads.emplace_back(g.get(), g.size());
    node_sum_ =
        NodeSum::Create(layout_, device_, grid_grad_.get(), grid_.get(), mlp_grads, stream_);
    const size_t b = max_batch_;
    const size_t dims = layout_.spec().dims;
    const size_t in = static_cast<size_t>(dims_.input_width);
    const size_t hidden = static_cast<size_t>(dims_.hidden_width);
    const size_t out = static_cast<size_t>(dims_.output_width);
    GRIDSYNC_RETURN_IF_ERROR(positions_.AllocateZeroed(b * dims));
    GRIDSYNC_RETURN_IF_ERROR(targets_.AllocateZeroed(b * out));
    GRIDSYNC_RETURN_IF_ERROR(features_.AllocateZeroed(b * in));
    GRIDSYNC_RETURN_IF_ERROR(d_features_.AllocateZeroed(b * in));
    for (int l = 0; l < dims_.hidden_layers; ++l) {
      hidden_.emplace_back();
      GRIDSYNC_RETURN_IF_ERROR(hidden_.back().AllocateZeroed(b * hidden));
    }
    for (auto& d : delta_) GRIDSYNC_RETURN_IF_ERROR(d.AllocateZeroed(b * std::max(hidden, out)));
    GRIDSYNC_RETURN_IF_ERROR(y_.AllocateZeroed(b * out));
    GRIDSYNC_RETURN_IF_ERROR(sse_.AllocateZeroed(1));
    GRIDSYNC_RETURN_IF_ERROR(overflow_.AllocateZeroed(1));
    GRIDSYNC_RETURN_IF_ERROR(positions_host_.Allocate(b * dims));
    GRIDSYNC_RETURN_IF_ERROR(targets_host_.Allocate(b * out));
    GRIDSYNC_RETURN_IF_ERROR(sse_host_.Allocate(1));
    GRIDSYNC_RETURN_IF_ERROR(overflow_host_.Allocate(1));
    // The uploads and zeroing above ran on the legacy default stream, which
    // stream_ (non-blocking) does not wait for.
    GRIDSYNC_CUDA_RETURN_IF_ERROR(cudaDeviceSynchronize());
    GRIDSYNC_RETURN_IF_ERROR(RefreshWorkingCopy());
    GRIDSYNC_CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(stream_));
    return SetBuckets(SIZE_MAX);  // the whole grid in one bucket
  }

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
                        uint32_t active_levels, float loss_scale, bool round_to_half) override {
    GRIDSYNC_RETURN_IF_ERROR(CheckBatch(n, "BeginGradients"));
    if (bucket_events_.size() != buckets_.size())
      return Status::Internal("DeviceTrainer: the buckets' events could not be made");
    GRIDSYNC_CUDA_RETURN_IF_ERROR(cudaSetDevice(device_));
    begun_ = {n, active_levels, round_to_half};
    if (round_to_half)
      GRIDSYNC_CUDA_RETURN_IF_ERROR(cudaMemsetAsync(overflow_.get(), 0, sizeof(unsigned), stream_));
    GRIDSYNC_CUDA_RETURN_IF_ERROR(cudaMemsetAsync(sse_.get(), 0, sizeof(double), stream_));
    if (n > 0) {
      GRIDSYNC_RETURN_IF_ERROR(UploadBatch(positions, targets, n));
      GRIDSYNC_CUDA_RETURN_IF_ERROR(cudaEventRecord(events_[0], stream_));
      GRIDSYNC_RETURN_IF_ERROR(Forward(n, active_levels));
      const int out = dims_.output_width;
      // d(mean squared error)/dy at the loss scale, as worker/model.cc folds it.
      const float dy_scale =
          loss_scale * 2.0f / static_cast<float>(global_batch * static_cast<size_t>(out));
      GRIDSYNC_RETURN_IF_ERROR(SquaredError(y_.get(), targets_.get(), dy_scale,
                                            n * static_cast<size_t>(out), delta_[0].get(),
                                            sse_.get(), stream_));
      GRIDSYNC_RETURN_IF_ERROR(Backward(n));
      GRIDSYNC_CUDA_RETURN_IF_ERROR(cudaEventRecord(events_[1], stream_));
    }
    // The MLP's gradients are final first; then each group of levels.
    if (round_to_half) {
      for (auto& g : mlp_grad_)
        GRIDSYNC_RETURN_IF_ERROR(RoundThroughHalf(g.get(), g.size(), overflow_.get(), stream_));
    }
    GRIDSYNC_CUDA_RETURN_IF_ERROR(cudaEventRecord(bucket_events_[0], stream_));
    for (size_t g = 0; g < level_groups_.size(); ++g) {
      const auto [begin, end] = level_groups_[g];
      if (n > 0) {
        GRIDSYNC_RETURN_IF_ERROR(HashGridBackwardLevels(layout_, positions_.get(), n, begin, end,
                                                        active_levels, d_features_.get(),
                                                        grid_grad_.get(), stream_));
      }
      if (round_to_half) {
        const std::span<float> slice = buckets_[g + 1][0];
        GRIDSYNC_RETURN_IF_ERROR(
            RoundThroughHalf(slice.data(), slice.size(), overflow_.get(), stream_));
      }
      GRIDSYNC_CUDA_RETURN_IF_ERROR(cudaEventRecord(bucket_events_[g + 1], stream_));
    }
    if (n > 0) GRIDSYNC_CUDA_RETURN_IF_ERROR(cudaEventRecord(events_[2], stream_));
    GRIDSYNC_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(sse_host_.get(), sse_.get(), sizeof(double),
                                                  cudaMemcpyDeviceToHost, stream_));
    if (round_to_half)
      GRIDSYNC_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(overflow_host_.get(), overflow_.get(),
                                                    sizeof(unsigned), cudaMemcpyDeviceToHost,
                                                    stream_));
    return Status::OK();
  }

  void* BucketReady(size_t b) override {
    return b < bucket_events_.size() ? static_cast<void*>(bucket_events_[b]) : nullptr;
  }

  Status CopyBucket(size_t b, const std::vector<std::span<float>>& host, bool to_device) override {
    if (b >= bucket_events_.size()) {
      return Status::InvalidArgument("DeviceTrainer::CopyBucket: bucket " + std::to_string(b) +
                                     " of " + std::to_string(bucket_events_.size()));
    }
    GRIDSYNC_RETURN_IF_ERROR(CheckBufferShapes(host, buckets_[b], "DeviceTrainer::CopyBucket"));
    GRIDSYNC_CUDA_RETURN_IF_ERROR(cudaSetDevice(device_));
    // On a stream of their own: the pass goes on with the next bucket.
    if (!to_device)
      GRIDSYNC_CUDA_RETURN_IF_ERROR(cudaStreamWaitEvent(copy_stream_, bucket_events_[b], 0));
    for (size_t i = 0; i < host.size(); ++i) {
      float* device = buckets_[b][i].data();
      GRIDSYNC_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(
          to_device ? static_cast<void*>(device) : host[i].data(),
          to_device ? static_cast<const void*>(host[i].data()) : device, host[i].size_bytes(),
          to_device ? cudaMemcpyHostToDevice : cudaMemcpyDeviceToHost, copy_stream_));
    }
    if (to_device) {
      GRIDSYNC_CUDA_RETURN_IF_ERROR(cudaEventRecord(copied_, copy_stream_));
      GRIDSYNC_CUDA_RETURN_IF_ERROR(cudaStreamWaitEvent(stream_, copied_, 0));
    }
    GRIDSYNC_CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(copy_stream_));
    return Status::OK();
  }

  Result<Finished> FinishGradients() override {
    GRIDSYNC_CUDA_RETURN_IF_ERROR(cudaSetDevice(device_));
    GRIDSYNC_CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(stream_));
    Finished finished;
    finished.sse = *sse_host_.get();
    finished.fits = !begun_.round_to_half || *overflow_host_.get() == 0;
    if (begun_.n == 0) return finished;
    // The encoding's traffic: every corner's features read in the forward
    // pass and read and written (atomically) in the backward pass, plus the
    // positions and the feature matrices.
    const double corners = static_cast<double>(1u << layout_.spec().dims);
    const double per_level = corners * layout_.features() * sizeof(float);
    const double active = std::min<uint32_t>(begun_.active_levels, layout_.n_levels());
    const double features = static_cast<double>(dims_.input_width) * sizeof(float);
    const double samples = static_cast<double>(begun_.n);
    const double position = layout_.spec().dims * sizeof(float);
    float forward_ms = 0, backward_ms = 0;
    GRIDSYNC_CUDA_RETURN_IF_ERROR(cudaEventElapsedTime(&forward_ms, events_[0], events_[1]));
    GRIDSYNC_CUDA_RETURN_IF_ERROR(cudaEventElapsedTime(&backward_ms, events_[1], events_[2]));
    traffic_.bytes += samples * (active * per_level * (mixed_ ? 0.5 : 1.0) + position + features);
    traffic_.bytes += samples * (active * per_level * 2 + position + features);
    // The forward span holds the MLP too, and the backward span the buckets'
    // rounding: counted as encoding time, they understate the bandwidth
    // rather than flatter it.
    traffic_.forward_seconds += forward_ms / 1e3;
    traffic_.grid_backward_seconds += backward_ms / 1e3;
    return finished;
  }

  Result<bool> RoundGradientsToHalf() override {
    GRIDSYNC_CUDA_RETURN_IF_ERROR(cudaSetDevice(device_));
    GRIDSYNC_CUDA_RETURN_IF_ERROR(cudaMemsetAsync(overflow_.get(), 0, sizeof(unsigned), stream_));
    for (const auto& buffer : GradientBuffers())
      GRIDSYNC_RETURN_IF_ERROR(
          RoundThroughHalf(buffer.data(), buffer.size(), overflow_.get(), stream_));
    GRIDSYNC_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(
        overflow_host_.get(), overflow_.get(), sizeof(unsigned), cudaMemcpyDeviceToHost, stream_));
    GRIDSYNC_CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(stream_));
    return *overflow_host_.get() == 0;
  }

  std::vector<std::span<float>> GradientBuffers() override {
    std::vector<std::span<float>> buffers = {{grid_grad_.get(), grid_grad_.size()}};
    for (auto& g : mlp_grad_) buffers.emplace_back(g.get(), g.size());
    return buffers;
  }
  bool gradients_on_device() const override { return true; }

  Status ApplyGradients(float loss_scale) override {
    GRIDSYNC_CUDA_RETURN_IF_ERROR(cudaSetDevice(device_));
    const float grad_scale = 1.0f / loss_scale;
    const uint32_t width = layout_.features();
    const size_t rows = layout_.total_params() / width;
    GRIDSYNC_CUDA_RETURN_IF_ERROR(cudaEventRecord(events_[3], stream_));
    GRIDSYNC_RETURN_IF_ERROR(GridAdam(hyper_, width, rows, grad_scale, grid_grad_.get(),
                                      grid_.get(), grid_m_.get(), grid_v_.get(), grid_steps_.get(),
                                      stream_));
    GRIDSYNC_CUDA_RETURN_IF_ERROR(cudaEventRecord(events_[4], stream_));
    // MLP weights step together: one count, the step size computed here as
    // the CPU's AdamTable does.
    ++mlp_step_;
    const float step_size = AdamStepSize(hyper_, mlp_step_);
    for (size_t i = 0; i < mlp_.size(); ++i) {
      GRIDSYNC_RETURN_IF_ERROR(DenseAdam(hyper_, step_size, grad_scale, mlp_[i].size(),
                                         mlp_grad_[i].get(), mlp_[i].get(), mlp_m_[i].get(),
                                         mlp_v_[i].get(), stream_));
    }
    GRIDSYNC_RETURN_IF_ERROR(RefreshWorkingCopy());
    GRIDSYNC_CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(stream_));
    float adam_ms = 0;
    GRIDSYNC_CUDA_RETURN_IF_ERROR(cudaEventElapsedTime(&adam_ms, events_[3], events_[4]));
    // Grid Adam reads every gradient row and its step count: the lower
    // bound (touched rows also move their parameters, m and v).
    traffic_.bytes += static_cast<double>(layout_.total_params()) * sizeof(float) * 2 +
                      static_cast<double>(rows) * sizeof(uint32_t);
    traffic_.grid_adam_seconds += adam_ms / 1e3;
    return Status::OK();
  }

  Status ClearGradients() override {
    GRIDSYNC_CUDA_RETURN_IF_ERROR(cudaSetDevice(device_));
    for (const auto& buffer : GradientBuffers())
      GRIDSYNC_CUDA_RETURN_IF_ERROR(
          cudaMemsetAsync(buffer.data(), 0, buffer.size_bytes(), stream_));
    GRIDSYNC_CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(stream_));
    return Status::OK();
  }

  Status UploadGridRows(const uint32_t* rows, size_t n, const float* values) override {
    if (n == 0) return Status::OK();
    GRIDSYNC_CUDA_RETURN_IF_ERROR(cudaSetDevice(device_));
    const uint32_t width = layout_.features();
    GRIDSYNC_RETURN_IF_ERROR(StageRows(rows, n));
    std::memcpy(values_host_.get(), values, n * width * sizeof(float));
    GRIDSYNC_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(values_.get(), values_host_.get(),
                                                  n * width * sizeof(float), cudaMemcpyHostToDevice,
                                                  stream_));
    GRIDSYNC_RETURN_IF_ERROR(ScatterRows(rows_.get(), n, width, values_.get(), grid_.get(),
                                         mixed_ ? grid_half_.get() : nullptr, stream_));
    GRIDSYNC_CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(stream_));
    return Status::OK();
  }

  Status TakeGridGradientRows(const uint32_t* rows, size_t n, float* values) override {
    if (n == 0) return Status::OK();
    GRIDSYNC_CUDA_RETURN_IF_ERROR(cudaSetDevice(device_));
    const uint32_t width = layout_.features();
    GRIDSYNC_RETURN_IF_ERROR(StageRows(rows, n));
    GRIDSYNC_RETURN_IF_ERROR(
        TakeRows(rows_.get(), n, width, grid_grad_.get(), values_.get(), stream_));
    GRIDSYNC_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(values_host_.get(), values_.get(),
                                                  n * width * sizeof(float), cudaMemcpyDeviceToHost,
                                                  stream_));
    GRIDSYNC_CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(stream_));
    std::memcpy(values, values_host_.get(), n * width * sizeof(float));
    return Status::OK();
  }

  Status UploadMlp(const std::vector<std::span<const float>>& weights) override {
    GRIDSYNC_RETURN_IF_ERROR(
        CheckMlpShapes(weights.size(), [&](size_t i) { return weights[i].size(); }));
    GRIDSYNC_CUDA_RETURN_IF_ERROR(cudaSetDevice(device_));
    for (size_t i = 0; i < mlp_.size(); ++i) {
      GRIDSYNC_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(mlp_[i].get(), weights[i].data(),
                                                    weights[i].size_bytes(), cudaMemcpyHostToDevice,
                                                    stream_));
      if (mixed_)
        GRIDSYNC_RETURN_IF_ERROR(
            ToHalfValues(mlp_[i].get(), mlp_[i].size(), mlp_work_[i].get(), stream_));
    }
    GRIDSYNC_CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(stream_));
    return Status::OK();
  }

  Status TakeMlpGradients(const std::vector<std::span<float>>& grads) override {
    GRIDSYNC_RETURN_IF_ERROR(
        CheckMlpShapes(grads.size(), [&](size_t i) { return grads[i].size(); }));
    GRIDSYNC_CUDA_RETURN_IF_ERROR(cudaSetDevice(device_));
    for (size_t i = 0; i < mlp_grad_.size(); ++i) {
      GRIDSYNC_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(grads[i].data(), mlp_grad_[i].get(),
                                                    grads[i].size_bytes(), cudaMemcpyDeviceToHost,
                                                    stream_));
      GRIDSYNC_CUDA_RETURN_IF_ERROR(
          cudaMemsetAsync(mlp_grad_[i].get(), 0, grads[i].size_bytes(), stream_));
    }
    GRIDSYNC_CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(stream_));
    return Status::OK();
  }

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

  Status Predict(const float* positions, size_t n, uint32_t active_levels, float* out) override {
    GRIDSYNC_CUDA_RETURN_IF_ERROR(cudaSetDevice(device_));
    const size_t dims = layout_.spec().dims;
    const size_t width = static_cast<size_t>(dims_.output_width);
    for (size_t begin = 0; begin < n; begin += max_batch_) {
      const size_t count = std::min(max_batch_, n - begin);
      std::memcpy(positions_host_.get(), positions + begin * dims, count * dims * sizeof(float));
      GRIDSYNC_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(positions_.get(), positions_host_.get(),
                                                    count * dims * sizeof(float),
                                                    cudaMemcpyHostToDevice, stream_));
      GRIDSYNC_RETURN_IF_ERROR(Forward(count, active_levels));
      GRIDSYNC_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(out + begin * width, y_.get(),
                                                    count * width * sizeof(float),
                                                    cudaMemcpyDeviceToHost, stream_));
      GRIDSYNC_CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(stream_));
    }
    return Status::OK();
  }

  Status Download(std::vector<float>* grid, std::vector<std::vector<float>>* mlp) override {
    GRIDSYNC_CUDA_RETURN_IF_ERROR(cudaSetDevice(device_));
    GRIDSYNC_CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(stream_));
    GRIDSYNC_RETURN_IF_ERROR(grid_.Download(grid));
    mlp->resize(mlp_.size());
    for (size_t i = 0; i < mlp_.size(); ++i) GRIDSYNC_RETURN_IF_ERROR(mlp_[i].Download(&(*mlp)[i]));
    return Status::OK();
  }

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
  Status StageRows(const uint32_t* rows, size_t n) {
    const uint64_t total_rows = layout_.total_rows();
    for (size_t i = 0; i < n; ++i) {
      if (rows[i] >= total_rows) {
        return Status::InvalidArgument("DeviceTrainer: grid row " + std::to_string(rows[i]) +
                                       "; allowed: below " + std::to_string(total_rows));
      }
    }
    const uint32_t width = layout_.features();
    if (n > staged_capacity_) {
      const size_t capacity = std::max(n, staged_capacity_ * 2);
      staged_capacity_ = 0;  // a failed re-allocation leaves nothing "in capacity"
      GRIDSYNC_RETURN_IF_ERROR(rows_.Free());
      GRIDSYNC_RETURN_IF_ERROR(values_.Free());
      // Zeroed on stream_, so the copies enqueued next land after the zeros.
      GRIDSYNC_RETURN_IF_ERROR(rows_.AllocateZeroed(capacity, stream_));
      GRIDSYNC_RETURN_IF_ERROR(values_.AllocateZeroed(capacity * width, stream_));
      GRIDSYNC_RETURN_IF_ERROR(rows_host_.Allocate(capacity));
      GRIDSYNC_RETURN_IF_ERROR(values_host_.Allocate(capacity * width));
      staged_capacity_ = capacity;
    }
    std::memcpy(rows_host_.get(), rows, n * sizeof(uint32_t));
    GRIDSYNC_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(
        rows_.get(), rows_host_.get(), n * sizeof(uint32_t), cudaMemcpyHostToDevice, stream_));
    return Status::OK();
  }

  // Mixed precision: the fp16 working copies of the whole grid and MLP.
  Status RefreshWorkingCopy() {
    if (!mixed_) return Status::OK();
    GRIDSYNC_RETURN_IF_ERROR(ToHalfBits(grid_.get(), grid_.size(), grid_half_.get(), stream_));
    for (size_t i = 0; i < mlp_.size(); ++i)
      GRIDSYNC_RETURN_IF_ERROR(
          ToHalfValues(mlp_[i].get(), mlp_[i].size(), mlp_work_[i].get(), stream_));
    return Status::OK();
  }

  // The weights the passes read: the fp16 working copy under mixed precision.
  const float* Weights(size_t i) const { return mixed_ ? mlp_work_[i].get() : mlp_[i].get(); }

  Status UploadBatch(const float* positions, const float* targets, size_t n) {
    const size_t dims = layout_.spec().dims;
    const size_t out = static_cast<size_t>(dims_.output_width);
    // The previous step synchronised the stream, so the pinned staging is
    // free to overwrite.
    std::memcpy(positions_host_.get(), positions, n * dims * sizeof(float));
    std::memcpy(targets_host_.get(), targets, n * out * sizeof(float));
    GRIDSYNC_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(positions_.get(), positions_host_.get(),
                                                  n * dims * sizeof(float), cudaMemcpyHostToDevice,
                                                  stream_));
    GRIDSYNC_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(targets_.get(), targets_host_.get(),
                                                  n * out * sizeof(float), cudaMemcpyHostToDevice,
                                                  stream_));
    return Status::OK();
  }

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
  Status Forward(size_t n, uint32_t active_levels) {
    if (mixed_) {
      GRIDSYNC_RETURN_IF_ERROR(HashGridForwardHalf(layout_, positions_.get(), n, active_levels,
                                                   grid_half_.get(), features_.get(), stream_));
    } else {
      GRIDSYNC_RETURN_IF_ERROR(HashGridForward(layout_, positions_.get(), n, active_levels,
                                               grid_.get(), features_.get(), stream_));
    }
    const int cols = static_cast<int>(n);
    const float* input = features_.get();
    for (int i = 0; i < dims_.n_matrices(); ++i) {
      const bool last = i == dims_.hidden_layers;
      float* output = last ? y_.get() : hidden_[static_cast<size_t>(i)].get();
      GRIDSYNC_RETURN_IF_ERROR(Gemm(CUBLAS_OP_N, CUBLAS_OP_N, dims_.rows(i), cols, dims_.cols(i),
                                    Weights(static_cast<size_t>(i)), dims_.rows(i), input,
                                    dims_.cols(i), 0.0f, output, dims_.rows(i)));
      if (!last)
        GRIDSYNC_RETURN_IF_ERROR(Relu(output, static_cast<size_t>(dims_.rows(i)) * n, stream_));
      input = output;
    }
    return Status::OK();
  }

  // Cuts the gradient buffers (CutGradientBuckets), with one event per
  // bucket.
  Status SetBuckets(size_t bucket_bytes) {
    GRIDSYNC_CUDA_RETURN_IF_ERROR(cudaSetDevice(device_));
    GRIDSYNC_CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(stream_));
    buckets_ = CutGradientBuckets(layout_, GradientBuffers(), bucket_bytes, &level_groups_);
    while (bucket_events_.size() > buckets_.size()) {
      GRIDSYNC_CUDA_RETURN_IF_ERROR(cudaEventDestroy(bucket_events_.back()));
      bucket_events_.pop_back();
    }
    while (bucket_events_.size() < buckets_.size()) {
      cudaEvent_t event = nullptr;
      GRIDSYNC_CUDA_RETURN_IF_ERROR(cudaEventCreateWithFlags(&event, cudaEventDisableTiming));
      bucket_events_.push_back(event);
    }
    return Status::OK();
  }

  // From dy (delta_[0]): the MLP weight gradients (added) and d_features_.
  Status Backward(size_t n) {
    const int cols = static_cast<int>(n);
    int current = 0;  // delta_[current] holds dLoss/d(pre-activation) of layer i
    for (int i = dims_.hidden_layers; i >= 0; --i) {
      const size_t index = static_cast<size_t>(i);
      const float* activation = i == 0 ? features_.get() : hidden_[index - 1].get();
      const int rows = dims_.rows(i), inner = dims_.cols(i);
      // dW_i += delta_i * a_{i-1}^T
      GRIDSYNC_RETURN_IF_ERROR(Gemm(CUBLAS_OP_N, CUBLAS_OP_T, rows, inner, cols,
                                    delta_[current].get(), rows, activation, inner, 1.0f,
                                    mlp_grad_[index].get(), rows));
      // d a_{i-1} = W_i^T * delta_i
      float* below = i == 0 ? d_features_.get() : delta_[1 - current].get();
      GRIDSYNC_RETURN_IF_ERROR(Gemm(CUBLAS_OP_T, CUBLAS_OP_N, inner, cols, rows, Weights(index),
                                    rows, delta_[current].get(), rows, 0.0f, below, inner));
      if (i > 0) {
        GRIDSYNC_RETURN_IF_ERROR(
            ReluBackward(activation, below, static_cast<size_t>(inner) * n, stream_));
        current = 1 - current;
      }
    }
    return Status::OK();
  }

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

}  // namespace

Result<std::unique_ptr<DeviceTrainer>> DeviceTrainer::Create(
    const HashGridLayout& layout, const MlpShape& mlp, const AdamHyper& hyper,
    const std::vector<float>& grid, const std::vector<std::vector<float>>& mlp_weights, int device,
    size_t max_batch, bool mixed_precision) {
  std::string reason;
  if (!Available(&reason)) return Status::Unsupported("training.device cuda: " + reason);
  GRIDSYNC_RETURN_IF_ERROR(LoadCublas().status().WithContext("training.device cuda"));
  GRIDSYNC_RETURN_IF_ERROR(CheckTrainerInputs(layout, mlp, grid, mlp_weights, max_batch));
  auto trainer =
      std::make_unique<DeviceTrainerImpl>(layout, mlp, hyper, device, max_batch, mixed_precision);
  GRIDSYNC_RETURN_IF_ERROR(
      trainer->Init(grid, mlp_weights)
          .WithContext("training.device cuda: preparing device " + std::to_string(device)));
  return std::unique_ptr<DeviceTrainer>(std::move(trainer));
}

}  // namespace gridsync::cuda
