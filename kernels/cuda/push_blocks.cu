// PushBlocks (push_blocks.h) on a CUDA device.
//
// Thread safety: see push_blocks.h.
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cstring>
#include <map>
#include <mutex>
#include <string>
#include <vector>

#include "kernels/cuda/codec_kernels.h"
#include "kernels/cuda/cuda_check.h"
#include "kernels/cuda/device_buffer.h"
#include "kernels/cuda/push_blocks.h"

namespace gridsync::cuda {
namespace {

constexpr uint32_t kBlockSize = 256;
constexpr size_t kMaxBlocks = 65535;

unsigned Blocks(size_t n) {
  return static_cast<unsigned>(
      std::max<size_t>(1, std::min((n + kBlockSize - 1) / kBlockSize, kMaxBlocks)));
}

#define GRIDSYNC_FOR_EACH(i, n)                                           \
  for (size_t i = size_t{blockIdx.x} * blockDim.x + threadIdx.x; i < (n); \
       i += size_t{gridDim.x} * blockDim.x)

// The CPU's order (PsSync::Apply after TakeGradients): round through fp16
// with the overflow check on the value before rounding, then scale.
__global__ void PrepareRowsKernel(const uint32_t* __restrict__ rows, size_t n, uint32_t width,
                                  bool round_to_half, float scale, float* __restrict__ grad,
                                  unsigned* __restrict__ overflow) {
  bool bad = false;
  GRIDSYNC_FOR_EACH(i, n * width) {
    const size_t at = size_t{rows[i / width]} * width + i % width;
    float g = grad[at];
    if (round_to_half) {
      bad = bad || !(isfinite(g) && fabsf(g) <= 65504.0f);
      g = __half2float(__float2half_rn(g));
    }
    grad[at] = scale != 1.0f ? g * scale : g;
  }
  if (bad) atomicOr(overflow, 1u);
}

// out (n x width) = the block's gradient values, plus each entry's residual
// (cpu::ErrorFeedback::AddResidual: one add, only where a row has an entry).
__global__ void GatherBlockKernel(const float* __restrict__ grad, uint32_t features,
                                  uint32_t col_begin, uint32_t width,
                                  const uint32_t* __restrict__ rows, size_t n,
                                  const float* __restrict__ residual,
                                  const uint8_t* __restrict__ present, float* __restrict__ out) {
  GRIDSYNC_FOR_EACH(i, n * width) {
    const uint32_t row = rows[i / width];
    const uint32_t c = static_cast<uint32_t>(i % width);
    float v = grad[size_t{row} * features + col_begin + c];
    if (residual != nullptr && present[row] != 0) v += residual[size_t{row} * width + c];
    out[i] = v;
  }
}

// cpu::ErrorFeedback::StoreResidual: one thread per row (rows are distinct).
__global__ void StoreResidualKernel(const uint32_t* __restrict__ rows, size_t n, uint32_t width,
                                    const float* __restrict__ corrected,
                                    const float* __restrict__ decoded, float* __restrict__ residual,
                                    uint8_t* __restrict__ present) {
  GRIDSYNC_FOR_EACH(r, n) {
    const uint32_t row = rows[r];
    const float* c = corrected + r * width;
    const float* d = decoded + r * width;
    if (present[row] == 0) {
      bool zero = true;
      for (uint32_t f = 0; f < width; ++f) zero &= (c[f] - d[f]) == 0.0f;
      if (zero) continue;
      present[row] = 1;
    }
    float* out = residual + size_t{row} * width;
    for (uint32_t f = 0; f < width; ++f) out[f] = c[f] - d[f];
  }
}

__global__ void ZeroRowsKernel(const uint32_t* __restrict__ rows, size_t n, uint32_t width,
                               float* __restrict__ grad) {
  GRIDSYNC_FOR_EACH(i, n * width) grad[size_t{rows[i / width]} * width + i % width] = 0.0f;
}

#undef GRIDSYNC_FOR_EACH

class DevicePushBlocks : public PushBlocks {
 public:
  DevicePushBlocks(const HashGridLayout& layout, int device, float* grad, cudaStream_t stream)
      : layout_(layout), device_(device), grad_(grad), stream_(stream) {}

  Result<bool> PrepareGridPush(const uint32_t* rows, size_t n, bool round_to_half,
                               float scale) override {
    std::lock_guard<std::mutex> lock(mu_);
    GRIDSYNC_CUDA_RETURN_IF_ERROR(cudaSetDevice(device_));
    GRIDSYNC_RETURN_IF_ERROR(CheckGlobalRows(rows, n));
    if (n == 0) return true;
    GRIDSYNC_RETURN_IF_ERROR(StageRows(rows, n));
    GRIDSYNC_RETURN_IF_ERROR(Grow(&overflow_, 1));
    GRIDSYNC_CUDA_RETURN_IF_ERROR(cudaMemsetAsync(overflow_.get(), 0, sizeof(unsigned), stream_));
    const uint32_t F = layout_.features();
    PrepareRowsKernel<<<Blocks(n * F), kBlockSize, 0, stream_>>>(rows_.get(), n, F, round_to_half,
                                                                 scale, grad_, overflow_.get());
    GRIDSYNC_CUDA_RETURN_IF_LAUNCH_ERROR();
    unsigned overflow = 0;
    GRIDSYNC_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(&overflow, overflow_.get(), sizeof(unsigned),
                                                  cudaMemcpyDeviceToHost, stream_));
    GRIDSYNC_CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(stream_));
    return overflow == 0;
  }

  Status FetchPushBlock(const DeviceTrainer::PushBlock& block, float* values) override {
    std::lock_guard<std::mutex> lock(mu_);
    GRIDSYNC_RETURN_IF_ERROR(Gather(block, nullptr));
    const size_t count = block.n * block.width;
    if (count > 0) {
      GRIDSYNC_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(values, values_.get(), count * sizeof(float),
                                                    cudaMemcpyDeviceToHost, stream_));
    }
    GRIDSYNC_CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(stream_));
    return Status::OK();
  }

  Status EncodePushBlock(const DeviceTrainer::PushBlock& block, const CodecOptions& options,
                         uint64_t seed, bool feedback, uint8_t* payload) override {
    std::lock_guard<std::mutex> lock(mu_);
    Residuals* table = nullptr;
    if (feedback) {
      GRIDSYNC_RETURN_IF_ERROR(CheckPushBlock(layout_, block));
      GRIDSYNC_ASSIGN_OR_RETURN(
          table, Table(DeviceTrainer::PushBlockKey(block.level, block.col_begin), block.width));
    }
    GRIDSYNC_RETURN_IF_ERROR(Gather(block, table));
    const size_t count = block.n * block.width;
    const size_t size = EncodedSize(options, count);
    GRIDSYNC_RETURN_IF_ERROR(Grow(&payload_, size));
    GRIDSYNC_RETURN_IF_ERROR(
        cuda::Encode(options, values_.get(), count, seed, payload_.get(), stream_));
    if (size > 0) {
      GRIDSYNC_CUDA_RETURN_IF_ERROR(
          cudaMemcpyAsync(payload, payload_.get(), size, cudaMemcpyDeviceToHost, stream_));
    }
    if (table != nullptr) {
      GRIDSYNC_RETURN_IF_ERROR(Grow(&decoded_, count));
      // Decode synchronises the stream and names a payload that does not
      // decode (values that were not finite) as cpu::Decode would.
      GRIDSYNC_RETURN_IF_ERROR(
          cuda::Decode(options, payload_.get(), size, count, seed, decoded_.get(), stream_));
      StoreResidualKernel<<<Blocks(block.n), kBlockSize, 0, stream_>>>(
          rows_.get(), block.n, block.width, values_.get(), decoded_.get(), table->values.get(),
          table->present.get());
      GRIDSYNC_CUDA_RETURN_IF_LAUNCH_ERROR();
    }
    GRIDSYNC_CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(stream_));
    return Status::OK();
  }

  Status ZeroGridGradientRows(const uint32_t* rows, size_t n) override {
    std::lock_guard<std::mutex> lock(mu_);
    GRIDSYNC_CUDA_RETURN_IF_ERROR(cudaSetDevice(device_));
    GRIDSYNC_RETURN_IF_ERROR(CheckGlobalRows(rows, n));
    if (n == 0) return Status::OK();
    GRIDSYNC_RETURN_IF_ERROR(StageRows(rows, n));
    const uint32_t F = layout_.features();
    ZeroRowsKernel<<<Blocks(n * F), kBlockSize, 0, stream_>>>(rows_.get(), n, F, grad_);
    GRIDSYNC_CUDA_RETURN_IF_LAUNCH_ERROR();
    GRIDSYNC_CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(stream_));
    return Status::OK();
  }

  Status CopyResidualsTo(cpu::ErrorFeedback* into) override {
    std::lock_guard<std::mutex> lock(mu_);
    GRIDSYNC_CUDA_RETURN_IF_ERROR(cudaSetDevice(device_));
    GRIDSYNC_CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(stream_));
    into->Clear();
    for (const auto& [key, table] : tables_) {
      std::vector<uint8_t> present;
      std::vector<float> values;
      GRIDSYNC_RETURN_IF_ERROR(table.present.Download(&present));
      GRIDSYNC_RETURN_IF_ERROR(table.values.Download(&values));
      std::vector<uint32_t> rows;
      std::vector<float> held;
      for (uint32_t r = 0; r < present.size(); ++r) {
        if (present[r] == 0) continue;
        rows.push_back(r);
        held.insert(held.end(), values.begin() + size_t{r} * table.width,
                    values.begin() + size_t{r + 1} * table.width);
      }
      into->Assign(key, table.width, rows.data(), rows.size(), held.data());
    }
    return Status::OK();
  }

  Status LoadResiduals(const cpu::ErrorFeedback& from) override {
    std::lock_guard<std::mutex> lock(mu_);
    GRIDSYNC_CUDA_RETURN_IF_ERROR(cudaSetDevice(device_));
    GRIDSYNC_RETURN_IF_ERROR(CheckResiduals(layout_, from));
    GRIDSYNC_CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(stream_));
    for (auto& [key, table] : tables_) {
      GRIDSYNC_CUDA_RETURN_IF_ERROR(
          cudaMemset(table.values.get(), 0, table.values.size() * sizeof(float)));
      GRIDSYNC_CUDA_RETURN_IF_ERROR(cudaMemset(table.present.get(), 0, table.present.size()));
    }
    for (uint64_t key : from.Keys()) {
      const uint32_t width = from.Width(key);
      GRIDSYNC_ASSIGN_OR_RETURN(Residuals * table, Table(key, width));
      std::vector<uint8_t> present(table->present.size(), 0);
      std::vector<float> values(table->values.size(), 0.0f);
      for (uint32_t row : from.Rows(key)) {
        present[row] = 1;
        std::memcpy(values.data() + size_t{row} * width, from.Residual(key, row),
                    width * sizeof(float));
      }
      GRIDSYNC_CUDA_RETURN_IF_ERROR(
          cudaMemcpy(table->present.get(), present.data(), present.size(), cudaMemcpyHostToDevice));
      GRIDSYNC_CUDA_RETURN_IF_ERROR(cudaMemcpy(table->values.get(), values.data(),
                                               values.size() * sizeof(float),
                                               cudaMemcpyHostToDevice));
    }
    return Status::OK();
  }

 private:
  struct Residuals {
    uint32_t width = 0;
    DeviceBuffer<float> values;     // level rows x width
    DeviceBuffer<uint8_t> present;  // level rows: 1 where a row holds an entry
  };

  // The residual table of `key` (rows of `width` floats), made zeroed.
  Result<Residuals*> Table(uint64_t key, uint32_t width) {
    auto it = tables_.find(key);
    if (it != tables_.end()) {
      if (it->second.width != width) {
        return Status::InvalidArgument("residuals of key " + std::to_string(key) + " are " +
                                       std::to_string(it->second.width) + " wide, not " +
                                       std::to_string(width));
      }
      return &it->second;
    }
    const uint32_t rows = layout_.level(static_cast<uint32_t>(key >> 32)).rows;
    Residuals table;
    table.width = width;
    GRIDSYNC_RETURN_IF_ERROR(table.values.AllocateZeroed(size_t{rows} * width, stream_));
    GRIDSYNC_RETURN_IF_ERROR(table.present.AllocateZeroed(rows, stream_));
    return &tables_.emplace(key, std::move(table)).first->second;
  }

  // values_ = the block's values (plus its residuals when `table`); the
  // block's rows are staged in rows_.
  Status Gather(const DeviceTrainer::PushBlock& block, const Residuals* table) {
    GRIDSYNC_CUDA_RETURN_IF_ERROR(cudaSetDevice(device_));
    GRIDSYNC_RETURN_IF_ERROR(CheckPushBlock(layout_, block));
    const size_t count = block.n * block.width;
    GRIDSYNC_RETURN_IF_ERROR(Grow(&values_, count));
    if (count == 0) return Status::OK();
    GRIDSYNC_RETURN_IF_ERROR(StageRows(block.rows, block.n));
    const uint32_t F = layout_.features();
    const float* level = grad_ + layout_.level(block.level).row_offset * F;
    GatherBlockKernel<<<Blocks(count), kBlockSize, 0, stream_>>>(
        level, F, block.col_begin, block.width, rows_.get(), block.n,
        table != nullptr ? table->values.get() : nullptr,
        table != nullptr ? table->present.get() : nullptr, values_.get());
    GRIDSYNC_CUDA_RETURN_IF_LAUNCH_ERROR();
    return Status::OK();
  }

  Status CheckGlobalRows(const uint32_t* rows, size_t n) const {
    for (size_t i = 0; i < n; ++i) {
      if (rows[i] >= layout_.total_rows()) {
        return Status::InvalidArgument("grid row " + std::to_string(rows[i]) + "; allowed: below " +
                                       std::to_string(layout_.total_rows()));
      }
    }
    return Status::OK();
  }

  // rows_ = rows[0..n), through pinned memory.
  Status StageRows(const uint32_t* rows, size_t n) {
    if (n > staged_rows_) {
      GRIDSYNC_CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(stream_));
      const size_t capacity = n + n / 2;
      GRIDSYNC_RETURN_IF_ERROR(rows_host_.Allocate(capacity));
      GRIDSYNC_RETURN_IF_ERROR(rows_.Free());
      GRIDSYNC_RETURN_IF_ERROR(rows_.AllocateZeroed(capacity, stream_));
      staged_rows_ = capacity;
    }
    // The previous copy out of the pinned rows must be done before they
    // are overwritten.
    GRIDSYNC_CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(stream_));
    std::memcpy(rows_host_.get(), rows, n * sizeof(uint32_t));
    GRIDSYNC_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(
        rows_.get(), rows_host_.get(), n * sizeof(uint32_t), cudaMemcpyHostToDevice, stream_));
    return Status::OK();
  }

  // Grows `buffer` to at least `n` elements (by half again).
  template <typename T>
  Status Grow(DeviceBuffer<T>* buffer, size_t n) {
    if (buffer->size() >= std::max<size_t>(n, 1)) return Status::OK();
    GRIDSYNC_CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(stream_));
    GRIDSYNC_RETURN_IF_ERROR(buffer->Free());
    return buffer->AllocateZeroed(std::max<size_t>(n + n / 2, 1), stream_);
  }

  const HashGridLayout layout_;
  const int device_;
  float* const grad_;
  const cudaStream_t stream_;
  std::mutex mu_;
  std::map<uint64_t, Residuals> tables_;
  size_t staged_rows_ = 0;
  DeviceBuffer<uint32_t> rows_;
  PinnedBuffer<uint32_t> rows_host_;
  DeviceBuffer<float> values_, decoded_;
  DeviceBuffer<uint8_t> payload_;
  DeviceBuffer<unsigned> overflow_;
};

}  // namespace

std::unique_ptr<PushBlocks> PushBlocks::Create(const HashGridLayout& layout, int device,
                                               float* grad, cudaStream_t stream) {
  return std::make_unique<DevicePushBlocks>(layout, device, grad, stream);
}

}  // namespace gridsync::cuda
