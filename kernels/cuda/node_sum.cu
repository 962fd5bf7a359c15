// NodeSum (node_sum.h) on a CUDA device.
//
// Thread safety: see node_sum.h.
#include <cuda_runtime.h>

#include <algorithm>
#include <cstring>
#include <string>
#include <utility>
#include <vector>

#include "kernels/cuda/cuda_check.h"
#include "kernels/cuda/device_buffer.h"
#include "kernels/cuda/node_sum.h"
#include "kernels/cuda/trainer_kernels.h"

namespace gridsync::cuda {
namespace {

// Pinned host memory that grows by half again and keeps its size.
template <typename T>
struct GrowingPinned {
  PinnedBuffer<T> buffer;
  size_t capacity = 0;
  Status Reserve(size_t n) {
    if (n <= capacity && capacity > 0) return Status::OK();
    capacity = 0;  // a failed allocation leaves nothing "in capacity"
    const size_t grown = std::max<size_t>(n + n / 2, 1);
    GRIDSYNC_RETURN_IF_ERROR(buffer.Allocate(grown));
    capacity = grown;
    return Status::OK();
  }
  T* get() const { return buffer.get(); }
};

class NodeSumImpl : public NodeSum {
 public:
  NodeSumImpl(const HashGridLayout& layout, int device, float* grid_grad, const float* grid_params,
              std::vector<std::span<float>> mlp_grads, cudaStream_t stream)
      : layout_(layout),
        device_(device),
        grid_grad_(grid_grad),
        grid_params_(grid_params),
        mlp_grads_(std::move(mlp_grads)),
        stream_(stream) {
    for (const auto& m : mlp_grads_) mlp_floats_ += m.size();
  }

  Result<DeviceTrainer::NodeExchange> PackNodeGradients(const uint32_t* rows, size_t n,
                                                        size_t slice_floats, bool round_to_half,
                                                        bool host) override {
    GRIDSYNC_CUDA_RETURN_IF_ERROR(cudaSetDevice(device_));
    const uint32_t F = layout_.features();
    const size_t total = n * F + mlp_floats_;
    GRIDSYNC_RETURN_IF_ERROR(StageRows(rows, n));
    GRIDSYNC_RETURN_IF_ERROR(GrowBuffer(&packed_, total, stream_));
    GRIDSYNC_RETURN_IF_ERROR(GrowBuffer(&slice_, slice_floats, stream_));
    GRIDSYNC_RETURN_IF_ERROR(TakeRows(rows_.get(), n, F, grid_grad_, packed_.get(), stream_));
    size_t at = n * F;
    for (const auto& m : mlp_grads_) {
      GRIDSYNC_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(packed_.get() + at, m.data(), m.size_bytes(),
                                                    cudaMemcpyDeviceToDevice, stream_));
      GRIDSYNC_CUDA_RETURN_IF_ERROR(cudaMemsetAsync(m.data(), 0, m.size_bytes(), stream_));
      at += m.size();
    }
    GRIDSYNC_RETURN_IF_ERROR(GrowBuffer(&overflow_, 1, stream_));
    GRIDSYNC_RETURN_IF_ERROR(overflow_host_.Reserve(1));
    GRIDSYNC_CUDA_RETURN_IF_ERROR(cudaMemsetAsync(overflow_.get(), 0, sizeof(unsigned), stream_));
    if (round_to_half)
      GRIDSYNC_RETURN_IF_ERROR(RoundThroughHalf(packed_.get(), total, overflow_.get(), stream_));
    GRIDSYNC_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(
        overflow_host_.get(), overflow_.get(), sizeof(unsigned), cudaMemcpyDeviceToHost, stream_));
    host_ = host;
    DeviceTrainer::NodeExchange exchange{packed_.get(), total, slice_.get(), true};
    if (host) {
      GRIDSYNC_RETURN_IF_ERROR(packed_host_.Reserve(total));
      GRIDSYNC_RETURN_IF_ERROR(slice_host_.Reserve(slice_floats));
      GRIDSYNC_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(packed_host_.get(), packed_.get(),
                                                    total * sizeof(float), cudaMemcpyDeviceToHost,
                                                    stream_));
      exchange.packed = packed_host_.get();
      exchange.slice = slice_host_.get();
    }
    // The collective reads `packed` on its own stream or on the host.
    GRIDSYNC_CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(stream_));
    exchange.fits = *overflow_host_.get() == 0;
    slice_floats_ = slice_floats;
    return exchange;
  }

  Status UnpackNodeSlice(const uint32_t* rows, size_t n, float* mlp_values,
                         size_t mlp_floats) override {
    GRIDSYNC_CUDA_RETURN_IF_ERROR(cudaSetDevice(device_));
    const uint32_t F = layout_.features();
    if (n * F + mlp_floats != slice_floats_) {
      return Status::InvalidArgument("NodeSum::UnpackNodeSlice: " + std::to_string(n) +
                                     " rows and " + std::to_string(mlp_floats) +
                                     " MLP floats; the slice holds " +
                                     std::to_string(slice_floats_) + " floats");
    }
    GRIDSYNC_RETURN_IF_ERROR(StageRows(rows, n));
    if (host_ && slice_floats_ > 0) {
      GRIDSYNC_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(slice_.get(), slice_host_.get(),
                                                    slice_floats_ * sizeof(float),
                                                    cudaMemcpyHostToDevice, stream_));
    }
    // The gradient rows are written as parameters are (no fp16 copy).
    GRIDSYNC_RETURN_IF_ERROR(ScatterRows(rows_.get(), n, F, slice_.get(), grid_grad_,
                                         /*half=*/nullptr, stream_));
    if (mlp_floats > 0) {
      GRIDSYNC_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(mlp_values, slice_.get() + n * F,
                                                    mlp_floats * sizeof(float),
                                                    cudaMemcpyDeviceToHost, stream_));
    }
    GRIDSYNC_CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(stream_));
    return Status::OK();
  }

  Status GridRowsWithGradient(const uint32_t* rows, size_t n, uint8_t* has) override {
    if (n == 0) return Status::OK();
    GRIDSYNC_CUDA_RETURN_IF_ERROR(cudaSetDevice(device_));
    GRIDSYNC_RETURN_IF_ERROR(StageRows(rows, n));
    GRIDSYNC_RETURN_IF_ERROR(GrowBuffer(&has_, n, stream_));
    GRIDSYNC_RETURN_IF_ERROR(
        RowsWithGradient(rows_.get(), n, layout_.features(), grid_grad_, has_.get(), stream_));
    GRIDSYNC_CUDA_RETURN_IF_ERROR(
        cudaMemcpyAsync(has, has_.get(), n, cudaMemcpyDeviceToHost, stream_));
    GRIDSYNC_CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(stream_));
    return Status::OK();
  }

  Status DownloadGridRows(const uint32_t* rows, size_t n, float* values) override {
    if (n == 0) return Status::OK();
    GRIDSYNC_CUDA_RETURN_IF_ERROR(cudaSetDevice(device_));
    const uint32_t F = layout_.features();
    GRIDSYNC_RETURN_IF_ERROR(StageRows(rows, n));
    GRIDSYNC_RETURN_IF_ERROR(GrowBuffer(&values_, n * F, stream_));
    GRIDSYNC_RETURN_IF_ERROR(GatherRows(rows_.get(), n, F, grid_params_, values_.get(), stream_));
    GRIDSYNC_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(values, values_.get(), n * F * sizeof(float),
                                                  cudaMemcpyDeviceToHost, stream_));
    GRIDSYNC_CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(stream_));
    return Status::OK();
  }

 private:
  // Row ids (global, below the grid's rows) to the device (StagedRows).
  Status StageRows(const uint32_t* rows, size_t n) {
    const uint64_t total_rows = layout_.total_rows();
    for (size_t i = 0; i < n; ++i) {
      if (rows[i] >= total_rows) {
        return Status::InvalidArgument("NodeSum: grid row " + std::to_string(rows[i]) +
                                       "; allowed: below " + std::to_string(total_rows));
      }
    }
    return rows_.Stage(rows, n, stream_);
  }

  const HashGridLayout& layout_;
  const int device_;
  float* grid_grad_;
  const float* grid_params_;
  std::vector<std::span<float>> mlp_grads_;
  size_t mlp_floats_ = 0;
  cudaStream_t stream_;
  StagedRows rows_;
  DeviceBuffer<float> packed_, slice_, values_;
  GrowingPinned<float> packed_host_, slice_host_;
  DeviceBuffer<uint8_t> has_;
  DeviceBuffer<unsigned> overflow_;
  GrowingPinned<unsigned> overflow_host_;
  size_t slice_floats_ = 0;
  bool host_ = false;  // the last pack's buffers are the pinned copies
};

}  // namespace

std::unique_ptr<NodeSum> NodeSum::Create(const HashGridLayout& layout, int device, float* grid_grad,
                                         const float* grid_params,
                                         std::vector<std::span<float>> mlp_grads,
                                         cudaStream_t stream) {
  return std::make_unique<NodeSumImpl>(layout, device, grid_grad, grid_params, std::move(mlp_grads),
                                       stream);
}

}  // namespace gridsync::cuda
