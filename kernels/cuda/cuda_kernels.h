// Host-only API of the CUDA kernels (hash encoding forward/backward, sparse
// Adam). Nothing here needs nvcc: the only CUDA type is cudaStream_t, which
// is declared opaquely. In a build without CUDA the same functions exist and
// return kUnsupported, so callers and tests compile everywhere.
//
// The kernels compute the same maths as kernels/cpu (shared through
// kernels/hash_grid_math.h and kernels/adam_math.h). The backward pass sums
// with atomics, so its float results match the CPU within rounding, not bit
// for bit.
//
// Contracts the device-pointer API relies on (host:: checks them):
// - parameter and gradient buffers are aligned to the row size, capped at 16
//   bytes (cudaMalloc memory always is); misaligned pointers are refused;
// - AdamUpdateRows gets distinct rows in one call, since one thread owns a
//   row (host:: requires strictly ascending rows inside the table);
// - host::HashGridBackward adds into *grad; an empty *grad is sized to
//   total_params and zeroed, any other size than total_params is refused.
//
// Thread safety: every function may be called from any thread; calls on one
// stream are ordered by the stream.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "common/sparse_rows.h"
#include "common/status.h"
#include "kernels/adam_math.h"
#include "kernels/hash_grid_layout.h"

typedef struct CUstream_st* cudaStream_t;  // NOLINT: matches cuda_runtime_api.h

namespace gridsync::cuda {

// True when this build has CUDA kernels and a device is present; otherwise
// false with *reason saying which of the two is missing.
bool Available(std::string* reason);

// ---- Device-pointer API (all pointers are device memory) ----

// features: n x output_width floats, as the CPU kernel writes them.
Status HashGridForward(const HashGridLayout& layout, const float* positions, size_t n,
                       uint32_t active_levels, const float* params, float* features,
                       cudaStream_t stream);
Status HashGridForwardHalf(const HashGridLayout& layout, const float* positions, size_t n,
                           uint32_t active_levels, const uint16_t* params_half, float* features,
                           cudaStream_t stream);
// Adds into grad (total_params floats, dense).
Status HashGridBackward(const HashGridLayout& layout, const float* positions, size_t n,
                        uint32_t active_levels, const float* d_features, float* grad,
                        cudaStream_t stream);
// The same for levels [level_begin, level_end) only (clipped to the active
// levels): a backward pass cut into buckets, each reduced while the next is
// computed. Levels are disjoint rows of grad, so the cut changes no sum.
Status HashGridBackwardLevels(const HashGridLayout& layout, const float* positions, size_t n,
                              uint32_t level_begin, uint32_t level_end, uint32_t active_levels,
                              const float* d_features, float* grad, cudaStream_t stream);
// Sparse Adam over n_rows rows (values packed n_rows x width).
Status AdamUpdateRows(const AdamHyper& hyper, uint32_t width, const uint32_t* rows, size_t n_rows,
                      const float* values, float grad_scale, float* params, float* m, float* v,
                      uint32_t* steps, cudaStream_t stream);

// ---- Host convenience: copy in, run on the default stream, copy out ----
// For tests and benchmarks; every call allocates and frees device memory.
namespace host {

Status HashGridForward(const HashGridLayout& layout, const std::vector<float>& positions,
                       uint32_t active_levels, const std::vector<float>& params,
                       std::vector<float>* features);
Status HashGridForwardHalf(const HashGridLayout& layout, const std::vector<float>& positions,
                           uint32_t active_levels, const std::vector<uint16_t>& params_half,
                           std::vector<float>* features);
Status HashGridBackward(const HashGridLayout& layout, const std::vector<float>& positions,
                        uint32_t active_levels, const std::vector<float>& d_features,
                        std::vector<float>* grad);
// params/m/v: rows x width; steps: rows.
Status AdamUpdateRows(const AdamHyper& hyper, const SparseRows& grad, float grad_scale,
                      std::vector<float>* params, std::vector<float>* m, std::vector<float>* v,
                      std::vector<uint32_t>* steps);

}  // namespace host
}  // namespace gridsync::cuda
