// CUDA twins of kernels/cpu/hash_encoding.cc: forward (fp32 and fp16
// parameters) and backward of the multiresolution hash encoding.
//
// One thread per (sample, level): blockIdx.y is the level, so every thread of
// a block reads the same GridLevelInfo (passed by value with the launch, a
// uniform constant-bank load) and the x dimension strides over samples. The
// index maths is kernels/hash_grid_math.h, shared with the CPU kernel, so the
// corner rows and weights are the CPU's bit for bit; only the summation
// (fused multiply-adds here, atomics in backward) differs within rounding.
//
// Thread safety: the entry points may be called from any thread; work on one
// stream is ordered by the stream.
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <string>

#include "kernels/cuda/cuda_check.h"
#include "kernels/cuda/cuda_kernels.h"
#include "kernels/hash_grid_math.h"

namespace gridsync::cuda {
namespace {

constexpr uint32_t kBlockSize = 256;
// Enough blocks to fill any current GPU many times over; larger batches are
// covered by the grid-stride loop.
constexpr size_t kMaxBlocksX = 65535;

// Every level's lookup parameters, small enough (768 bytes) to travel as a
// kernel argument, so concurrent calls with different layouts need no
// shared __constant__ state.
struct GridLevels {
  GridLevelInfo level[kMaxGridLevels];
};

GridLevels PackLevels(const HashGridLayout& layout) {
  GridLevels levels{};
  for (uint32_t l = 0; l < layout.n_levels(); ++l) levels.level[l] = layout.level(l);
  return levels;
}

// Bytes a row of F parameters of type P is loaded in at once; rows start at
// multiples of F elements, so a table aligned to this is aligned for every row.
template <uint32_t F, typename P>
constexpr size_t RowAlignment() {
  return std::min<size_t>(F * sizeof(P), 16);
}

// Loads the F parameters of one row as floats, with vector loads.
template <uint32_t F>
__device__ __forceinline__ void LoadRow(const float* __restrict__ p, float* out) {
  if constexpr (F == 1) {
    out[0] = __ldg(p);
  } else if constexpr (F == 2) {
    const float2 x = __ldg(reinterpret_cast<const float2*>(p));
    out[0] = x.x;
    out[1] = x.y;
  } else {
#pragma unroll
    for (uint32_t j = 0; j < F / 4; ++j) {
      const float4 x = __ldg(reinterpret_cast<const float4*>(p) + j);
      out[4 * j + 0] = x.x;
      out[4 * j + 1] = x.y;
      out[4 * j + 2] = x.z;
      out[4 * j + 3] = x.w;
    }
  }
}

// Two fp16 values packed little-endian in one 32-bit word.
__device__ __forceinline__ void UnpackHalves(uint32_t word, float* out) {
  out[0] = __half2float(__ushort_as_half(static_cast<unsigned short>(word & 0xFFFFu)));
  out[1] = __half2float(__ushort_as_half(static_cast<unsigned short>(word >> 16)));
}

template <uint32_t F>
__device__ __forceinline__ void LoadRow(const __half* __restrict__ p, float* out) {
  if constexpr (F == 1) {
    out[0] = __half2float(__ldg(p));
  } else if constexpr (F == 2) {
    UnpackHalves(__ldg(reinterpret_cast<const unsigned int*>(p)), out);
  } else if constexpr (F == 4) {
    const uint2 x = __ldg(reinterpret_cast<const uint2*>(p));
    UnpackHalves(x.x, out);
    UnpackHalves(x.y, out + 2);
  } else {
#pragma unroll
    for (uint32_t j = 0; j < F / 8; ++j) {
      const uint4 x = __ldg(reinterpret_cast<const uint4*>(p) + j);
      UnpackHalves(x.x, out + 8 * j + 0);
      UnpackHalves(x.y, out + 8 * j + 2);
      UnpackHalves(x.z, out + 8 * j + 4);
      UnpackHalves(x.w, out + 8 * j + 6);
    }
  }
}

// grad[f] += val[f], atomically per element. Hopper has vector float atomics,
// which halve or quarter the atomic traffic of the backward pass.
template <uint32_t F>
__device__ __forceinline__ void AtomicAddRow(float* grad, const float* val) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  if constexpr (F == 2) {
    atomicAdd(reinterpret_cast<float2*>(grad), make_float2(val[0], val[1]));
  } else if constexpr (F % 4 == 0) {
#pragma unroll
    for (uint32_t j = 0; j < F / 4; ++j) {
      atomicAdd(reinterpret_cast<float4*>(grad) + j,
                make_float4(val[4 * j + 0], val[4 * j + 1], val[4 * j + 2], val[4 * j + 3]));
    }
  } else {
    atomicAdd(grad, val[0]);
  }
#else
#pragma unroll
  for (uint32_t f = 0; f < F; ++f) atomicAdd(grad + f, val[f]);
#endif
}

// features[i * n_levels * F + level * F + f]; levels >= active_levels get zeros.
template <uint32_t D, uint32_t F, typename P>
__global__ void __launch_bounds__(kBlockSize)
    ForwardKernel(const GridLevels levels, const float* __restrict__ positions, size_t n,
                  uint32_t n_levels, uint32_t active_levels, const P* __restrict__ params,
                  float* __restrict__ features) {
  const uint32_t level = blockIdx.y;
  const size_t width = size_t{n_levels} * F;
  const size_t stride = size_t{gridDim.x} * blockDim.x;
  float* out = features + size_t{level} * F;
  if (level >= active_levels) {
    for (size_t i = size_t{blockIdx.x} * blockDim.x + threadIdx.x; i < n; i += stride) {
#pragma unroll
      for (uint32_t f = 0; f < F; ++f) out[i * width + f] = 0.0f;
    }
    return;
  }
  const GridLevelInfo info = levels.level[level];
  const P* table = params + info.row_offset * F;
  for (size_t i = size_t{blockIdx.x} * blockDim.x + threadIdx.x; i < n; i += stride) {
    float pos[D];
#pragma unroll
    for (uint32_t d = 0; d < D; ++d) pos[d] = positions[i * D + d];
    GridCorners<D> corners;
    GridLookup<D>(info, pos, &corners);
    float acc[F] = {};
#pragma unroll
    for (uint32_t k = 0; k < (1u << D); ++k) {
      float row[F];
      LoadRow<F>(table + size_t{corners.row[k]} * F, row);
#pragma unroll
      for (uint32_t f = 0; f < F; ++f) acc[f] += corners.weight[k] * row[f];
    }
#pragma unroll
    for (uint32_t f = 0; f < F; ++f) out[i * width + f] = acc[f];
  }
}

// Launched with gridDim.y = the levels of [level_begin, active levels) to
// compute: switched-off levels get no gradient.
template <uint32_t D, uint32_t F>
__global__ void __launch_bounds__(kBlockSize)
    BackwardKernel(const GridLevels levels, const float* __restrict__ positions, size_t n,
                   uint32_t n_levels, uint32_t level_begin, const float* __restrict__ d_features,
                   float* __restrict__ grad) {
  const uint32_t level = level_begin + blockIdx.y;
  const size_t width = size_t{n_levels} * F;
  const size_t stride = size_t{gridDim.x} * blockDim.x;
  const GridLevelInfo info = levels.level[level];
  float* table = grad + info.row_offset * F;
  const float* d_in = d_features + size_t{level} * F;
  for (size_t i = size_t{blockIdx.x} * blockDim.x + threadIdx.x; i < n; i += stride) {
    float pos[D];
#pragma unroll
    for (uint32_t d = 0; d < D; ++d) pos[d] = positions[i * D + d];
    float d_out[F];
#pragma unroll
    for (uint32_t f = 0; f < F; ++f) d_out[f] = d_in[i * width + f];
    GridCorners<D> corners;
    GridLookup<D>(info, pos, &corners);
#pragma unroll
    for (uint32_t k = 0; k < (1u << D); ++k) {
      float val[F];
#pragma unroll
      for (uint32_t f = 0; f < F; ++f) val[f] = corners.weight[k] * d_out[f];
      AtomicAddRow<F>(table + size_t{corners.row[k]} * F, val);
    }
  }
}

// Calls fn.template operator()<D, F>() for the layout's dims and features.
template <uint32_t D, typename Fn>
bool DispatchFeatures(uint32_t features, Fn& fn) {
  switch (features) {
    case 1: fn.template operator()<D, 1>(); return true;
    case 2: fn.template operator()<D, 2>(); return true;
    case 4: fn.template operator()<D, 4>(); return true;
    case 8: fn.template operator()<D, 8>(); return true;
    default: return false;
  }
}

template <typename Fn>
bool DispatchShape(uint32_t dims, uint32_t features, Fn&& fn) {
  if (dims == 2) return DispatchFeatures<2>(features, fn);
  if (dims == 3) return DispatchFeatures<3>(features, fn);
  return false;
}

Status UnsupportedShape(const char* name, const HashGridLayout& layout) {
  return Status::InvalidArgument(
      std::string(name) + ": dims " + std::to_string(layout.spec().dims) + ", features " +
      std::to_string(layout.features()) + "; allowed: dims 2 or 3, features 1, 2, 4 or 8");
}

Status CheckPointer(const char* name, const char* what, const void* ptr, size_t alignment) {
  if (ptr == nullptr) return Status::InvalidArgument(std::string(name) + ": " + what + " is null");
  if (reinterpret_cast<uintptr_t>(ptr) % alignment != 0) {
    return Status::InvalidArgument(std::string(name) + ": " + what + " must be aligned to " +
                                   std::to_string(alignment) + " bytes (cudaMalloc memory is)");
  }
  return Status::OK();
}

dim3 GridFor(size_t n, uint32_t levels) {
  const size_t blocks = std::min((n + kBlockSize - 1) / kBlockSize, kMaxBlocksX);
  return dim3(static_cast<unsigned>(blocks), levels);
}

template <typename P>
Status LaunchForward(const char* name, const HashGridLayout& layout, const float* positions,
                     size_t n, uint32_t active_levels, const P* params, float* features,
                     cudaStream_t stream) {
  if (n == 0) return Status::OK();
  GRIDSYNC_RETURN_IF_ERROR(CheckPointer(name, "positions", positions, alignof(float)));
  GRIDSYNC_RETURN_IF_ERROR(CheckPointer(name, "features", features, alignof(float)));
  const GridLevels levels = PackLevels(layout);
  const uint32_t n_levels = layout.n_levels();
  const uint32_t active = std::min(active_levels, n_levels);
  Status status;
  const bool dispatched =
      DispatchShape(layout.spec().dims, layout.features(), [&]<uint32_t D, uint32_t F>() {
        status = CheckPointer(name, "params", params, RowAlignment<F, P>());
        if (!status.ok()) return;
        ForwardKernel<D, F, P><<<GridFor(n, n_levels), kBlockSize, 0, stream>>>(
            levels, positions, n, n_levels, active, params, features);
      });
  if (!dispatched) return UnsupportedShape(name, layout);
  GRIDSYNC_RETURN_IF_ERROR(status);
  GRIDSYNC_CUDA_RETURN_IF_LAUNCH_ERROR();
  return Status::OK();
}

}  // namespace

Status HashGridForward(const HashGridLayout& layout, const float* positions, size_t n,
                       uint32_t active_levels, const float* params, float* features,
                       cudaStream_t stream) {
  return LaunchForward("cuda::HashGridForward", layout, positions, n, active_levels, params,
                       features, stream);
}

Status HashGridForwardHalf(const HashGridLayout& layout, const float* positions, size_t n,
                           uint32_t active_levels, const uint16_t* params_half, float* features,
                           cudaStream_t stream) {
  // uint16_t holds IEEE fp16 bits (kernels/cpu/half.h), the layout of __half.
  static_assert(sizeof(__half) == sizeof(uint16_t));
  return LaunchForward("cuda::HashGridForwardHalf", layout, positions, n, active_levels,
                       reinterpret_cast<const __half*>(params_half), features, stream);
}

Status HashGridBackward(const HashGridLayout& layout, const float* positions, size_t n,
                        uint32_t active_levels, const float* d_features, float* grad,
                        cudaStream_t stream) {
  return HashGridBackwardLevels(layout, positions, n, 0, layout.n_levels(), active_levels,
                                d_features, grad, stream);
}

Status HashGridBackwardLevels(const HashGridLayout& layout, const float* positions, size_t n,
                              uint32_t level_begin, uint32_t level_end, uint32_t active_levels,
                              const float* d_features, float* grad, cudaStream_t stream) {
  const char* name = "cuda::HashGridBackward";
  const uint32_t end = std::min({level_end, active_levels, layout.n_levels()});
  if (n == 0 || level_begin >= end) return Status::OK();
  GRIDSYNC_RETURN_IF_ERROR(CheckPointer(name, "positions", positions, alignof(float)));
  GRIDSYNC_RETURN_IF_ERROR(CheckPointer(name, "d_features", d_features, alignof(float)));
  const GridLevels levels = PackLevels(layout);
  const uint32_t n_levels = layout.n_levels();
  Status status;
  const bool dispatched =
      DispatchShape(layout.spec().dims, layout.features(), [&]<uint32_t D, uint32_t F>() {
        status = CheckPointer(name, "grad", grad, RowAlignment<F, float>());
        if (!status.ok()) return;
        BackwardKernel<D, F><<<GridFor(n, end - level_begin), kBlockSize, 0, stream>>>(
            levels, positions, n, n_levels, level_begin, d_features, grad);
      });
  if (!dispatched) return UnsupportedShape(name, layout);
  GRIDSYNC_RETURN_IF_ERROR(status);
  GRIDSYNC_CUDA_RETURN_IF_LAUNCH_ERROR();
  return Status::OK();
}

}  // namespace gridsync::cuda
