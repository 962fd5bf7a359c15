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

}  // namespace gridsync::cuda
