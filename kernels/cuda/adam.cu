// CUDA twin of kernels/cpu/adam.cc's AdamUpdateRows: sparse Adam over the
// rows a batch touched, each row with its own step count.
//
// One thread per row: the thread bumps the row's step, computes the
// bias-corrected step size once and updates the row's `width` elements with
// the shared AdamUpdate (kernels/adam_math.h). A row owned by one thread
// needs no synchronisation, which is why the rows of one call must be
// distinct (SparseRows guarantees ascending ids); the host API checks that,
// the device-pointer API trusts the caller.
//
// Thread safety: may be called from any thread; work on one stream is
// ordered by the stream.
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <string>

#include "kernels/adam_math.h"
#include "kernels/cuda/cuda_check.h"
#include "kernels/cuda/cuda_kernels.h"

namespace gridsync::cuda {
namespace {

constexpr uint32_t kBlockSize = 256;
constexpr size_t kMaxBlocks = 65535;

__global__ void __launch_bounds__(kBlockSize)
    AdamRowsKernel(const AdamHyper hyper, uint32_t width, const uint32_t* __restrict__ rows,
                   size_t n_rows, const float* __restrict__ values, float grad_scale,
                   float* __restrict__ params, float* __restrict__ m, float* __restrict__ v,
                   uint32_t* __restrict__ steps) {
  const size_t stride = size_t{gridDim.x} * blockDim.x;
  for (size_t i = size_t{blockIdx.x} * blockDim.x + threadIdx.x; i < n_rows; i += stride) {
    const size_t row = rows[i];
    const size_t base = row * width;
    AdamUpdateRow(hyper, width, values + i * width, grad_scale, params + base, m + base, v + base,
                  steps + row);
  }
}

Status CheckNotNull(const void* ptr, const char* what) {
  if (ptr != nullptr) return Status::OK();
  return Status::InvalidArgument(std::string("cuda::AdamUpdateRows: ") + what + " is null");
}

}  // namespace

Status AdamUpdateRows(const AdamHyper& hyper, uint32_t width, const uint32_t* rows, size_t n_rows,
                      const float* values, float grad_scale, float* params, float* m, float* v,
                      uint32_t* steps, cudaStream_t stream) {
  if (n_rows == 0) return Status::OK();
  if (width == 0) return Status::InvalidArgument("cuda::AdamUpdateRows: width 0; allowed: >= 1");
  GRIDSYNC_RETURN_IF_ERROR(CheckNotNull(rows, "rows"));
  GRIDSYNC_RETURN_IF_ERROR(CheckNotNull(values, "values"));
  GRIDSYNC_RETURN_IF_ERROR(CheckNotNull(params, "params"));
  GRIDSYNC_RETURN_IF_ERROR(CheckNotNull(m, "m"));
  GRIDSYNC_RETURN_IF_ERROR(CheckNotNull(v, "v"));
  GRIDSYNC_RETURN_IF_ERROR(CheckNotNull(steps, "steps"));
  const size_t blocks = std::min((n_rows + kBlockSize - 1) / kBlockSize, kMaxBlocks);
  AdamRowsKernel<<<static_cast<unsigned>(blocks), kBlockSize, 0, stream>>>(
      hyper, width, rows, n_rows, values, grad_scale, params, m, v, steps);
  GRIDSYNC_CUDA_RETURN_IF_LAUNCH_ERROR();
  return Status::OK();
}

}  // namespace gridsync::cuda
