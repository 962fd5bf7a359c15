// DeviceTrainer (device_trainer.h): the hash-grid model trained on one
// CUDA device; here its setup and training passes (device_trainer_impl.h). Layouts follow the CPU
// model: features are n x input_width floats, sample-major, which is the MLP's input matrix
// (input_width x n, column-major) without a copy; every activation is width x n column-major.
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
#include "kernels/cuda/device_trainer_impl.h"
#include "kernels/cuda/node_sum.h"
#include "kernels/cuda/push_blocks.h"
#include "kernels/cuda/trainer_kernels.h"

namespace gridsync::cuda {

DeviceTrainerImpl::~DeviceTrainerImpl() {
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

Status DeviceTrainerImpl::Init(const std::vector<float>& grid,
                               const std::vector<std::vector<float>>& mlp) {
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
  node_sum_ = NodeSum::Create(layout_, device_, grid_grad_.get(), grid_.get(), mlp_grads, stream_);
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

Status DeviceTrainerImpl::BeginGradients(const float* positions, const float* targets, size_t n,
                                         size_t global_batch, uint32_t active_levels,
                                         float loss_scale, bool round_to_half) {
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
                                          n * static_cast<size_t>(out), delta_[0].get(), sse_.get(),
                                          stream_));
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
    GRIDSYNC_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(
        overflow_host_.get(), overflow_.get(), sizeof(unsigned), cudaMemcpyDeviceToHost, stream_));
  return Status::OK();
}

Status DeviceTrainerImpl::CopyBucket(size_t b, const std::vector<std::span<float>>& host,
                                     bool to_device) {
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

Result<DeviceTrainer::Finished> DeviceTrainerImpl::FinishGradients() {
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

Result<bool> DeviceTrainerImpl::RoundGradientsToHalf() {
  GRIDSYNC_CUDA_RETURN_IF_ERROR(cudaSetDevice(device_));
  GRIDSYNC_CUDA_RETURN_IF_ERROR(cudaMemsetAsync(overflow_.get(), 0, sizeof(unsigned), stream_));
  for (const auto& buffer : GradientBuffers())
    GRIDSYNC_RETURN_IF_ERROR(
        RoundThroughHalf(buffer.data(), buffer.size(), overflow_.get(), stream_));
  GRIDSYNC_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(overflow_host_.get(), overflow_.get(),
                                                sizeof(unsigned), cudaMemcpyDeviceToHost, stream_));
  GRIDSYNC_CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(stream_));
  return *overflow_host_.get() == 0;
}

Status DeviceTrainerImpl::ApplyGradients(float loss_scale) {
  GRIDSYNC_CUDA_RETURN_IF_ERROR(cudaSetDevice(device_));
  const float grad_scale = 1.0f / loss_scale;
  const uint32_t width = layout_.features();
  const size_t rows = layout_.total_params() / width;
  GRIDSYNC_CUDA_RETURN_IF_ERROR(cudaEventRecord(events_[3], stream_));
  GRIDSYNC_RETURN_IF_ERROR(GridAdam(hyper_, width, rows, grad_scale, grid_grad_.get(), grid_.get(),
                                    grid_m_.get(), grid_v_.get(), grid_steps_.get(), stream_));
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

Status DeviceTrainerImpl::ClearGradients() {
  GRIDSYNC_CUDA_RETURN_IF_ERROR(cudaSetDevice(device_));
  for (const auto& buffer : GradientBuffers())
    GRIDSYNC_CUDA_RETURN_IF_ERROR(cudaMemsetAsync(buffer.data(), 0, buffer.size_bytes(), stream_));
  GRIDSYNC_CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(stream_));
  return Status::OK();
}

Status DeviceTrainerImpl::RefreshWorkingCopy() {
  if (!mixed_) return Status::OK();
  GRIDSYNC_RETURN_IF_ERROR(ToHalfBits(grid_.get(), grid_.size(), grid_half_.get(), stream_));
  for (size_t i = 0; i < mlp_.size(); ++i)
    GRIDSYNC_RETURN_IF_ERROR(
        ToHalfValues(mlp_[i].get(), mlp_[i].size(), mlp_work_[i].get(), stream_));
  return Status::OK();
}

Status DeviceTrainerImpl::UploadBatch(const float* positions, const float* targets, size_t n) {
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

Status DeviceTrainerImpl::Forward(size_t n, uint32_t active_levels) {
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

Status DeviceTrainerImpl::SetBuckets(size_t bucket_bytes) {
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

Status DeviceTrainerImpl::Backward(size_t n) {
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
    GRIDSYNC_RETURN_IF_ERROR(Gemm(CUBLAS_OP_T, CUBLAS_OP_N, inner, cols, rows, Weights(index), rows,
                                  delta_[current].get(), rows, 0.0f, below, inner));
    if (i > 0) {
      GRIDSYNC_RETURN_IF_ERROR(
          ReluBackward(activation, below, static_cast<size_t>(inner) * n, stream_));
      current = 1 - current;
    }
  }
  return Status::OK();
}

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
