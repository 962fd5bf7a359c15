// Launch shapes shared by the element-wise kernels of kernels/cuda (CUDA
// sources only): 256-thread blocks, at most 65535 of them, and a
// grid-stride loop so that any n runs with that many.
//
//   Kernel<<<Blocks(n), kBlockSize, 0, stream>>>(...);
//   __global__ void Kernel(...) { GRIDSYNC_FOR_EACH(i, n) { ... } }
//
// Thread safety: constants and a pure function.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>

namespace gridsync::cuda {

inline constexpr uint32_t kBlockSize = 256;
inline constexpr size_t kMaxBlocks = 65535;

inline unsigned Blocks(size_t n) {
  return static_cast<unsigned>(
      std::max<size_t>(1, std::min((n + kBlockSize - 1) / kBlockSize, kMaxBlocks)));
}

}  // namespace gridsync::cuda

#define GRIDSYNC_FOR_EACH(i, n)                                           \
  for (size_t i = size_t{blockIdx.x} * blockDim.x + threadIdx.x; i < (n); \
       i += size_t{gridDim.x} * blockDim.x)
