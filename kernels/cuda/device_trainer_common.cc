// What the device trainer's interface shares in every build, with or
// without nvcc (kernels/cuda/device_trainer.h).
//
// Thread safety: stateless; any thread.
#include <string>
#include <utility>
#include <vector>

#include "kernels/cuda/device_trainer.h"

namespace gridsync::cuda {

std::vector<std::vector<std::span<float>>> CutGradientBuckets(
    const HashGridLayout& layout, const std::vector<std::span<float>>& buffers, size_t bucket_bytes,
    std::vector<std::pair<uint32_t, uint32_t>>* level_groups) {
  std::vector<std::vector<std::span<float>>> buckets(1);
  for (size_t i = 1; i < buffers.size(); ++i) buckets[0].push_back(buffers[i]);
  level_groups->clear();
  const size_t F = layout.features();
  const std::span<float> grid = buffers.empty() ? std::span<float>() : buffers[0];
  auto level_floats = [&](uint32_t l) { return size_t{layout.level(l).rows} * F; };
  uint32_t end = layout.n_levels();
  while (end > 0) {
    uint32_t begin = end;
    size_t floats = 0;
    while (begin > 0 && (floats == 0 || floats * sizeof(float) < bucket_bytes))
      floats += level_floats(--begin);
    const size_t offset = size_t{layout.level(begin).row_offset} * F;
    buckets.push_back({grid.subspan(offset, floats)});
    level_groups->emplace_back(begin, end);
    end = begin;
  }
  return buckets;
}

Status CheckBufferShapes(const std::vector<std::span<float>>& host,
                         const std::vector<std::span<float>>& buffers, const char* what) {
  if (host.size() != buffers.size()) {
    return Status::InvalidArgument(std::string(what) + ": " + std::to_string(host.size()) +
                                   " buffers; the trainer has " + std::to_string(buffers.size()));
  }
  for (size_t i = 0; i < host.size(); ++i) {
    if (host[i].size() != buffers[i].size()) {
      return Status::InvalidArgument(std::string(what) + ": buffer " + std::to_string(i) +
                                     " holds " + std::to_string(host[i].size()) +
                                     " floats; the trainer's holds " +
                                     std::to_string(buffers[i].size()));
    }
  }
  return Status::OK();
}

Status CheckPushBlock(const HashGridLayout& layout, const DeviceTrainer::PushBlock& block) {
  if (block.level >= layout.n_levels() || block.width == 0 ||
      uint64_t{block.col_begin} + block.width > layout.features()) {
    return Status::InvalidArgument("push block of level " + std::to_string(block.level) +
                                   ", columns [" + std::to_string(block.col_begin) + ", +" +
                                   std::to_string(block.width) +
                                   "); allowed: " + std::to_string(layout.n_levels()) +
                                   " levels of " + std::to_string(layout.features()) + " columns");
  }
  const uint32_t rows = layout.level(block.level).rows;
  for (size_t i = 0; i < block.n; ++i) {
    if (block.rows[i] >= rows || (i > 0 && block.rows[i] <= block.rows[i - 1])) {
      return Status::InvalidArgument("push block of level " + std::to_string(block.level) +
                                     ": row " + std::to_string(block.rows[i]) + " at " +
                                     std::to_string(i) + "; allowed: ascending, below " +
                                     std::to_string(rows));
    }
  }
  return Status::OK();
}

Status CheckResiduals(const HashGridLayout& layout, const cpu::ErrorFeedback& residuals) {
  for (uint64_t key : residuals.Keys()) {
    const uint64_t level = key >> 32, col = key & 0xffffffffu;
    const uint32_t width = residuals.Width(key);
    if (level >= layout.n_levels() || col + width > layout.features()) {
      return Status::InvalidArgument("residuals of table " + std::to_string(level) + ", columns [" +
                                     std::to_string(col) + ", +" + std::to_string(width) +
                                     "); allowed: the grid's " + std::to_string(layout.n_levels()) +
                                     " levels of " + std::to_string(layout.features()) +
                                     " columns (a state saved with another model?)");
    }
    const std::vector<uint32_t> rows = residuals.Rows(key);
    const uint32_t level_rows = layout.level(static_cast<uint32_t>(level)).rows;
    if (!rows.empty() && rows.back() >= level_rows) {
      return Status::InvalidArgument("residuals of table " + std::to_string(level) + ": row " +
                                     std::to_string(rows.back()) + "; allowed: below " +
                                     std::to_string(level_rows));
    }
  }
  return Status::OK();
}

Status CheckTrainerInputs(const HashGridLayout& layout, const MlpShape& mlp,
                          const std::vector<float>& grid,
                          const std::vector<std::vector<float>>& mlp_weights, size_t max_batch) {
  if (grid.size() != layout.total_params()) {
    return Status::InvalidArgument("DeviceTrainer: grid has " + std::to_string(grid.size()) +
                                   " parameters; the layout has " +
                                   std::to_string(layout.total_params()));
  }
  if (mlp.input_width != static_cast<int>(layout.output_width())) {
    return Status::InvalidArgument("DeviceTrainer: MLP input width " +
                                   std::to_string(mlp.input_width) + ", encoding output width " +
                                   std::to_string(layout.output_width()));
  }
  if (mlp_weights.size() != static_cast<size_t>(mlp.n_matrices())) {
    return Status::InvalidArgument("DeviceTrainer: " + std::to_string(mlp_weights.size()) +
                                   " MLP matrices; expected " + std::to_string(mlp.n_matrices()));
  }
  for (int i = 0; i < mlp.n_matrices(); ++i) {
    const size_t want = static_cast<size_t>(mlp.rows(i)) * static_cast<size_t>(mlp.cols(i));
    if (mlp_weights[static_cast<size_t>(i)].size() != want) {
      return Status::InvalidArgument("DeviceTrainer: MLP matrix " + std::to_string(i) + " has " +
                                     std::to_string(mlp_weights[static_cast<size_t>(i)].size()) +
                                     " weights; expected " + std::to_string(want));
    }
  }
  if (max_batch == 0 || max_batch > (size_t{1} << 28)) {
    return Status::InvalidArgument("DeviceTrainer: max_batch " + std::to_string(max_batch) +
                                   "; allowed: 1..2^28");
  }
  return Status::OK();
}

}  // namespace gridsync::cuda
