// DeviceTrainer (device_trainer_impl.h): rows, MLP weights and predictions
// copied between the host and the device, through pinned staging buffers
// on the trainer's stream.
//
// Thread safety: see device_trainer.h.
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include "kernels/cuda/cuda_check.h"
#include "kernels/cuda/device_trainer_impl.h"
#include "kernels/cuda/trainer_kernels.h"

namespace gridsync::cuda {

Status DeviceTrainerImpl::UploadGridRows(const uint32_t* rows, size_t n, const float* values) {
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

Status DeviceTrainerImpl::TakeGridGradientRows(const uint32_t* rows, size_t n, float* values) {
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

Status DeviceTrainerImpl::UploadMlp(const std::vector<std::span<const float>>& weights) {
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

Status DeviceTrainerImpl::TakeMlpGradients(const std::vector<std::span<float>>& grads) {
  GRIDSYNC_RETURN_IF_ERROR(CheckMlpShapes(grads.size(), [&](size_t i) { return grads[i].size(); }));
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

Status DeviceTrainerImpl::Predict(const float* positions, size_t n, uint32_t active_levels,
                                  float* out) {
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

Status DeviceTrainerImpl::Download(std::vector<float>* grid, std::vector<std::vector<float>>* mlp) {
  GRIDSYNC_CUDA_RETURN_IF_ERROR(cudaSetDevice(device_));
  GRIDSYNC_CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(stream_));
  GRIDSYNC_RETURN_IF_ERROR(grid_.Download(grid));
  mlp->resize(mlp_.size());
  for (size_t i = 0; i < mlp_.size(); ++i) GRIDSYNC_RETURN_IF_ERROR(mlp_[i].Download(&(*mlp)[i]));
  return Status::OK();
}

Status DeviceTrainerImpl::StageRows(const uint32_t* rows, size_t n) {
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
  GRIDSYNC_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(rows_.get(), rows_host_.get(), n * sizeof(uint32_t),
                                                cudaMemcpyHostToDevice, stream_));
  return Status::OK();
}

}  // namespace gridsync::cuda
