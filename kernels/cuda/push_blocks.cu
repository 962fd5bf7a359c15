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
#include "kernels/cuda/grid_stride.h"
#include "kernels/cuda/push_blocks.h"

namespace gridsync::cuda {
namespace {

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

// WorkerAdam::UpdateRows on the device: one thread per row; kept[i] says
// whether row i stepped (its gradient was not all zero).
__global__ void WorkerAdamKernel(const AdamHyper hyper, const uint32_t* __restrict__ rows, size_t n,
                                 uint32_t width, float* __restrict__ grad, float* __restrict__ m,
                                 float* __restrict__ v, uint32_t* __restrict__ steps,
                                 uint8_t* __restrict__ kept) {
  GRIDSYNC_FOR_EACH(i, n) {
    const uint32_t row = rows[i];
    float* g = grad + size_t{row} * width;
    if (!RowHasGradient(g, width)) {
      kept[i] = 0;
      continue;
    }
    const uint32_t t = steps[row] + 1;
    steps[row] = t;
    const float lr = AdamStepSize(hyper, t);
    for (uint32_t f = 0; f < width; ++f) {
      const size_t at = size_t{row} * width + f;
      g[f] = -AdamStep(hyper, lr, g[f], &m[at], &v[at]);
    }
    kept[i] = 1;
  }
}

// WorkerAdam::MaskMomentum: m = 0 where the payload delivered a value.
__global__ void MaskMomentumKernel(const uint32_t* __restrict__ rows, size_t n, uint32_t features,
                                   uint32_t col_begin, uint32_t width,
                                   const float* __restrict__ decoded, float* __restrict__ m) {
  GRIDSYNC_FOR_EACH(i, n * width) {
    if (decoded[i] != 0.0f) m[size_t{rows[i / width]} * features + col_begin + i % width] = 0.0f;
  }
}

// params += residual for the rows (level-local ids, of one level and
// column slice) holding an entry; the fp16 copy follows.
__global__ void AddResidualRowsKernel(const uint32_t* __restrict__ rows, size_t n,
                                      uint32_t features, uint32_t col_begin, uint32_t width,
                                      const float* __restrict__ residual,
                                      const uint8_t* __restrict__ present,
                                      float* __restrict__ params, uint16_t* __restrict__ half) {
  GRIDSYNC_FOR_EACH(i, n * width) {
    const uint32_t row = rows[i / width];
    if (present[row] == 0) continue;
    const uint32_t c = static_cast<uint32_t>(i % width);
    const size_t at = size_t{row} * features + col_begin + c;
    params[at] += residual[size_t{row} * width + c];
    if (half != nullptr) half[at] = __half_as_ushort(__float2half_rn(params[at]));
  }
}

__global__ void ZeroRowsKernel(const uint32_t* __restrict__ rows, size_t n, uint32_t width,
                               float* __restrict__ grad) {
  GRIDSYNC_FOR_EACH(i, n * width) grad[size_t{rows[i / width]} * width + i % width] = 0.0f;
}

class DevicePushBlocks : public PushBlocks {
 public:
  DevicePushBlocks(const HashGridLayout& layout, const AdamHyper& hyper, int device,
                   const Grid& grid, cudaStream_t stream)
      : layout_(layout),
        hyper_(hyper),
        device_(device),
        grid_(grid),
        grad_(grid.grad),
        stream_(stream) {}

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
    GRIDSYNC_CUDA_RETURN_IF_ERROR(cudaSetDevice(device_));
    GRIDSYNC_RETURN_IF_ERROR(CheckPushBlock(layout_, block));
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
                         uint64_t seed, bool feedback, bool mask_momentum,
                         uint8_t* payload) override {
    std::lock_guard<std::mutex> lock(mu_);
    // The pool's threads call this: the device first, before Table allocates.
    GRIDSYNC_CUDA_RETURN_IF_ERROR(cudaSetDevice(device_));
    GRIDSYNC_RETURN_IF_ERROR(CheckPushBlock(layout_, block));
    Residuals* table = nullptr;
    if (feedback) {
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
      if (mask_momentum) {
        const uint32_t F = layout_.features();
        MaskMomentumKernel<<<Blocks(count), kBlockSize, 0, stream_>>>(
            rows_.get(), block.n, F, block.col_begin, block.width, decoded_.get(),
            grid_.m + layout_.level(block.level).row_offset * F);
        GRIDSYNC_CUDA_RETURN_IF_LAUNCH_ERROR();
      }
    }
    GRIDSYNC_CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(stream_));
    return Status::OK();
  }

  Status GridWorkerAdam(uint32_t level, const uint32_t* rows, size_t n,
                        std::vector<uint32_t>* kept) override {
    std::lock_guard<std::mutex> lock(mu_);
    GRIDSYNC_CUDA_RETURN_IF_ERROR(cudaSetDevice(device_));
    const uint32_t F = layout_.features();
    GRIDSYNC_RETURN_IF_ERROR(CheckPushBlock(layout_, {level, 0, F, rows, n}));
    kept->clear();
    if (n == 0) return Status::OK();
    GRIDSYNC_RETURN_IF_ERROR(StageRows(rows, n));
    GRIDSYNC_RETURN_IF_ERROR(Grow(&kept_, n));
    const size_t offset = layout_.level(level).row_offset;
    WorkerAdamKernel<<<Blocks(n), kBlockSize, 0, stream_>>>(
        hyper_, rows_.get(), n, F, grad_ + offset * F, grid_.m + offset * F, grid_.v + offset * F,
        grid_.steps + offset, kept_.get());
    GRIDSYNC_CUDA_RETURN_IF_LAUNCH_ERROR();
    std::vector<uint8_t> flags(n);
    GRIDSYNC_CUDA_RETURN_IF_ERROR(
        cudaMemcpyAsync(flags.data(), kept_.get(), n, cudaMemcpyDeviceToHost, stream_));
    GRIDSYNC_CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(stream_));
    for (size_t i = 0; i < n; ++i)
      if (flags[i] != 0) kept->push_back(rows[i]);
    return Status::OK();
  }

  Status AddResidualsToGridRows(const uint32_t* rows, size_t n) override {
    std::lock_guard<std::mutex> lock(mu_);
    GRIDSYNC_CUDA_RETURN_IF_ERROR(cudaSetDevice(device_));
    GRIDSYNC_RETURN_IF_ERROR(CheckGlobalRows(rows, n));
    if (n == 0 || tables_.empty()) return Status::OK();
    // Level-local ids, level by level (rows may come in any order).
    const uint32_t F = layout_.features();
    std::vector<std::vector<uint32_t>> by_level(layout_.n_levels());
    for (size_t i = 0; i < n; ++i) {
      uint32_t l = 0;
      while (l + 1 < layout_.n_levels() && rows[i] >= layout_.level(l + 1).row_offset) ++l;
      by_level[l].push_back(static_cast<uint32_t>(rows[i] - layout_.level(l).row_offset));
    }
    for (const auto& [key, table] : tables_) {
      const uint32_t level = static_cast<uint32_t>(key >> 32);
      const uint32_t col = static_cast<uint32_t>(key & 0xffffffffu);
      const auto& local = by_level[level];
      if (local.empty()) continue;
      GRIDSYNC_RETURN_IF_ERROR(StageRows(local.data(), local.size()));
      const size_t offset = layout_.level(level).row_offset * F;
      AddResidualRowsKernel<<<Blocks(local.size() * table.width), kBlockSize, 0, stream_>>>(
          rows_.get(), local.size(), F, col, table.width, table.values.get(), table.present.get(),
          grid_.params + offset, grid_.half != nullptr ? grid_.half + offset : nullptr);
      GRIDSYNC_CUDA_RETURN_IF_LAUNCH_ERROR();
    }
    GRIDSYNC_CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(stream_));
    return Status::OK();
  }

  Status CopyGridAdamState(uint32_t level, float* m, float* v, uint32_t* steps) override {
    std::lock_guard<std::mutex> lock(mu_);
    GRIDSYNC_CUDA_RETURN_IF_ERROR(cudaSetDevice(device_));
    GRIDSYNC_RETURN_IF_ERROR(CheckLevel(level));
    GRIDSYNC_CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(stream_));
    const size_t rows = layout_.level(level).rows, offset = layout_.level(level).row_offset;
    const size_t F = layout_.features();
    GRIDSYNC_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(m, grid_.m + offset * F, rows * F * sizeof(float),
                                                  cudaMemcpyDeviceToHost, stream_));
    GRIDSYNC_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(v, grid_.v + offset * F, rows * F * sizeof(float),
                                                  cudaMemcpyDeviceToHost, stream_));
    GRIDSYNC_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(
        steps, grid_.steps + offset, rows * sizeof(uint32_t), cudaMemcpyDeviceToHost, stream_));
    GRIDSYNC_CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(stream_));
    return Status::OK();
  }

  Status LoadGridAdamState(uint32_t level, const float* m, const float* v,
                           const uint32_t* steps) override {
    std::lock_guard<std::mutex> lock(mu_);
    GRIDSYNC_CUDA_RETURN_IF_ERROR(cudaSetDevice(device_));
    GRIDSYNC_RETURN_IF_ERROR(CheckLevel(level));
    GRIDSYNC_CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(stream_));
    const size_t rows = layout_.level(level).rows, offset = layout_.level(level).row_offset;
    const size_t F = layout_.features();
    if (m == nullptr) {
      GRIDSYNC_CUDA_RETURN_IF_ERROR(
          cudaMemsetAsync(grid_.m + offset * F, 0, rows * F * sizeof(float), stream_));
      GRIDSYNC_CUDA_RETURN_IF_ERROR(
          cudaMemsetAsync(grid_.v + offset * F, 0, rows * F * sizeof(float), stream_));
      GRIDSYNC_CUDA_RETURN_IF_ERROR(
          cudaMemsetAsync(grid_.steps + offset, 0, rows * sizeof(uint32_t), stream_));
      GRIDSYNC_CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(stream_));
      return Status::OK();
    }
    GRIDSYNC_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(grid_.m + offset * F, m, rows * F * sizeof(float),
                                                  cudaMemcpyHostToDevice, stream_));
    GRIDSYNC_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(grid_.v + offset * F, v, rows * F * sizeof(float),
                                                  cudaMemcpyHostToDevice, stream_));
    GRIDSYNC_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(
        grid_.steps + offset, steps, rows * sizeof(uint32_t), cudaMemcpyHostToDevice, stream_));
    // The copies read host memory the caller may free on return.
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
          cudaMemsetAsync(table.values.get(), 0, table.values.size() * sizeof(float), stream_));
      GRIDSYNC_CUDA_RETURN_IF_ERROR(
          cudaMemsetAsync(table.present.get(), 0, table.present.size(), stream_));
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
      GRIDSYNC_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(
          table->present.get(), present.data(), present.size(), cudaMemcpyHostToDevice, stream_));
      GRIDSYNC_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(table->values.get(), values.data(),
                                                    values.size() * sizeof(float),
                                                    cudaMemcpyHostToDevice, stream_));
      // The host vectors go at the end of this iteration.
      GRIDSYNC_CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(stream_));
    }
    GRIDSYNC_CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(stream_));
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
  // block's rows are staged in rows_. The caller set the device and checked
  // the block.
  Status Gather(const DeviceTrainer::PushBlock& block, const Residuals* table) {
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

  Status CheckLevel(uint32_t level) const {
    if (level < layout_.n_levels()) return Status::OK();
    return Status::InvalidArgument("grid level " + std::to_string(level) + "; allowed: below " +
                                   std::to_string(layout_.n_levels()));
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
  Status StageRows(const uint32_t* rows, size_t n) { return rows_.Stage(rows, n, stream_); }

  template <typename T>
  Status Grow(DeviceBuffer<T>* buffer, size_t n) {
    return GrowBuffer(buffer, n, stream_);
  }

  const HashGridLayout layout_;
  const AdamHyper hyper_;
  const int device_;
  const Grid grid_;
  float* const grad_;
  const cudaStream_t stream_;
  std::mutex mu_;
  std::map<uint64_t, Residuals> tables_;
  StagedRows rows_;
  DeviceBuffer<float> values_, decoded_;
  DeviceBuffer<uint8_t> payload_;
  DeviceBuffer<unsigned> overflow_;
  DeviceBuffer<uint8_t> kept_;
};

}  // namespace

std::unique_ptr<PushBlocks> PushBlocks::Create(const HashGridLayout& layout, const AdamHyper& hyper,
                                               int device, const Grid& grid, cudaStream_t stream) {
  return std::make_unique<DevicePushBlocks>(layout, hyper, device, grid, stream);
}

}  // namespace gridsync::cuda
