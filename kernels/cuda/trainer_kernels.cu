// The device trainer's element-wise kernels (trainer_kernels.h): grid-stride
// loops, one thread per element (or per row for the row-wise ones).
//
// Thread safety: see trainer_kernels.h.
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <algorithm>

#include "kernels/cuda/cuda_check.h"
#include "kernels/cuda/grid_stride.h"
#include "kernels/cuda/trainer_kernels.h"

namespace gridsync::cuda {
namespace {

__global__ void ReluKernel(float* __restrict__ x, size_t n) {
  GRIDSYNC_FOR_EACH(i, n) x[i] = fmaxf(x[i], 0.0f);
}

__global__ void ReluBackwardKernel(const float* __restrict__ activation, float* __restrict__ delta,
                                   size_t n) {
  GRIDSYNC_FOR_EACH(i, n) delta[i] = activation[i] > 0.0f ? delta[i] : 0.0f;
}

// A block's partial sum in shared memory, one atomic per block.
__global__ void __launch_bounds__(kBlockSize)
    SquaredErrorKernel(const float* __restrict__ y, const float* __restrict__ t, float dy_scale,
                       size_t n, float* __restrict__ dy, double* __restrict__ sse) {
  __shared__ double partial[kBlockSize];
  double mine = 0.0;
  GRIDSYNC_FOR_EACH(i, n) {
    const float d = y[i] - t[i];
    mine += static_cast<double>(d) * d;
    dy[i] = d * dy_scale;
  }
  partial[threadIdx.x] = mine;
  __syncthreads();
  for (uint32_t s = kBlockSize / 2; s > 0; s /= 2) {
    if (threadIdx.x < s) partial[threadIdx.x] += partial[threadIdx.x + s];
    __syncthreads();
  }
  if (threadIdx.x == 0) atomicAdd(sse, partial[0]);
}

__global__ void __launch_bounds__(kBlockSize)
    GridAdamKernel(const AdamHyper hyper, uint32_t width, size_t rows, float grad_scale,
                   float* __restrict__ grad, float* __restrict__ params, float* __restrict__ m,
                   float* __restrict__ v, uint32_t* __restrict__ steps) {
  GRIDSYNC_FOR_EACH(row, rows) {
    const size_t base = row * width;
    float* g = grad + base;
    // A row steps when its gradient scaled by grad_scale is not all +-0,
    // as the CPU twin decides (LocalOptimizer::ApplyDense scales the row,
    // then AdamUpdateIndexed skips it): a tiny value that the scale rounds
    // to zero takes no step there, so none here either.
    if (!RowHasGradient(g, width)) continue;  // untouched: already zero
    bool scaled_nonzero = false;
    for (uint32_t f = 0; f < width; ++f) scaled_nonzero |= g[f] * grad_scale != 0.0f;
    if (scaled_nonzero)
      AdamUpdateRow(hyper, width, g, grad_scale, params + base, m + base, v + base, steps + row);
    for (uint32_t f = 0; f < width; ++f) g[f] = 0.0f;
  }
}

__global__ void DenseAdamKernel(const AdamHyper hyper, float step_size, float grad_scale, size_t n,
                                float* __restrict__ grad, float* __restrict__ params,
                                float* __restrict__ m, float* __restrict__ v) {
  GRIDSYNC_FOR_EACH(i, n) {
    AdamUpdate(hyper, step_size, grad[i] * grad_scale, &params[i], &m[i], &v[i]);
    grad[i] = 0.0f;
  }
}

__global__ void RoundThroughHalfKernel(float* __restrict__ x, size_t n,
                                       unsigned* __restrict__ overflow) {
  bool bad = false;
  GRIDSYNC_FOR_EACH(i, n) {
    // The CPU's check (gradient_sync.cc): the value before rounding.
    const float g = x[i];
    bad = bad || !(isfinite(g) && fabsf(g) <= 65504.0f);
    x[i] = __half2float(__float2half_rn(g));
  }
  if (bad) atomicOr(overflow, 1u);
}

__global__ void ToHalfBitsKernel(const float* __restrict__ x, size_t n,
                                 uint16_t* __restrict__ out) {
  GRIDSYNC_FOR_EACH(i, n) out[i] = __half_as_ushort(__float2half_rn(x[i]));
}

__global__ void ToHalfValuesKernel(const float* __restrict__ x, size_t n, float* __restrict__ out) {
  GRIDSYNC_FOR_EACH(i, n) out[i] = __half2float(__float2half_rn(x[i]));
}

__global__ void ScatterRowsKernel(const uint32_t* __restrict__ rows, size_t n, uint32_t width,
                                  const float* __restrict__ values, float* __restrict__ params,
                                  uint16_t* __restrict__ half) {
  GRIDSYNC_FOR_EACH(i, n * width) {
    const size_t at = size_t{rows[i / width]} * width + i % width;
    params[at] = values[i];
    if (half != nullptr) half[at] = __half_as_ushort(__float2half_rn(values[i]));
  }
}

__global__ void TakeRowsKernel(const uint32_t* __restrict__ rows, size_t n, uint32_t width,
                               float* __restrict__ grad, float* __restrict__ values) {
  GRIDSYNC_FOR_EACH(i, n * width) {
    const size_t at = size_t{rows[i / width]} * width + i % width;
    values[i] = grad[at];
    grad[at] = 0.0f;
  }
}

__global__ void GatherRowsKernel(const uint32_t* __restrict__ rows, size_t n, uint32_t width,
                                 const float* __restrict__ src, float* __restrict__ values) {
  GRIDSYNC_FOR_EACH(i, n * width) values[i] = src[size_t{rows[i / width]} * width + i % width];
}

__global__ void RowsWithGradientKernel(const uint32_t* __restrict__ rows, size_t n, uint32_t width,
                                       const float* __restrict__ grad, uint8_t* __restrict__ has) {
  GRIDSYNC_FOR_EACH(i, n) has[i] = RowHasGradient(grad + size_t{rows[i]} * width, width) ? 1 : 0;
}

}  // namespace

Status GatherRows(const uint32_t* rows, size_t n, uint32_t width, const float* src, float* values,
                  cudaStream_t stream) {
  if (n == 0) return Status::OK();
  GatherRowsKernel<<<Blocks(n * width), kBlockSize, 0, stream>>>(rows, n, width, src, values);
  GRIDSYNC_CUDA_RETURN_IF_LAUNCH_ERROR();
  return Status::OK();
}

Status RowsWithGradient(const uint32_t* rows, size_t n, uint32_t width, const float* grad,
                        uint8_t* has, cudaStream_t stream) {
  if (n == 0) return Status::OK();
  RowsWithGradientKernel<<<Blocks(n), kBlockSize, 0, stream>>>(rows, n, width, grad, has);
  GRIDSYNC_CUDA_RETURN_IF_LAUNCH_ERROR();
  return Status::OK();
}

Status Relu(float* x, size_t n, cudaStream_t stream) {
  if (n == 0) return Status::OK();
  ReluKernel<<<Blocks(n), kBlockSize, 0, stream>>>(x, n);
  GRIDSYNC_CUDA_RETURN_IF_LAUNCH_ERROR();
  return Status::OK();
}

Status ReluBackward(const float* activation, float* delta, size_t n, cudaStream_t stream) {
  if (n == 0) return Status::OK();
  ReluBackwardKernel<<<Blocks(n), kBlockSize, 0, stream>>>(activation, delta, n);
  GRIDSYNC_CUDA_RETURN_IF_LAUNCH_ERROR();
  return Status::OK();
}

Status SquaredError(const float* y, const float* t, float dy_scale, size_t n, float* dy,
                    double* sse, cudaStream_t stream) {
  if (n == 0) return Status::OK();
  SquaredErrorKernel<<<Blocks(n), kBlockSize, 0, stream>>>(y, t, dy_scale, n, dy, sse);
  GRIDSYNC_CUDA_RETURN_IF_LAUNCH_ERROR();
  return Status::OK();
}

Status GridAdam(const AdamHyper& hyper, uint32_t width, size_t rows, float grad_scale, float* grad,
                float* params, float* m, float* v, uint32_t* steps, cudaStream_t stream) {
  if (rows == 0) return Status::OK();
  GridAdamKernel<<<Blocks(rows), kBlockSize, 0, stream>>>(hyper, width, rows, grad_scale, grad,
                                                          params, m, v, steps);
  GRIDSYNC_CUDA_RETURN_IF_LAUNCH_ERROR();
  return Status::OK();
}

Status DenseAdam(const AdamHyper& hyper, float step_size, float grad_scale, size_t n, float* grad,
                 float* params, float* m, float* v, cudaStream_t stream) {
  if (n == 0) return Status::OK();
  DenseAdamKernel<<<Blocks(n), kBlockSize, 0, stream>>>(hyper, step_size, grad_scale, n, grad,
                                                        params, m, v);
  GRIDSYNC_CUDA_RETURN_IF_LAUNCH_ERROR();
  return Status::OK();
}

Status RoundThroughHalf(float* x, size_t n, unsigned* overflow, cudaStream_t stream) {
  if (n == 0) return Status::OK();
  RoundThroughHalfKernel<<<Blocks(n), kBlockSize, 0, stream>>>(x, n, overflow);
  GRIDSYNC_CUDA_RETURN_IF_LAUNCH_ERROR();
  return Status::OK();
}

Status ToHalfBits(const float* x, size_t n, uint16_t* half_out, cudaStream_t stream) {
  if (n == 0) return Status::OK();
  ToHalfBitsKernel<<<Blocks(n), kBlockSize, 0, stream>>>(x, n, half_out);
  GRIDSYNC_CUDA_RETURN_IF_LAUNCH_ERROR();
  return Status::OK();
}

Status ToHalfValues(const float* x, size_t n, float* rounded_out, cudaStream_t stream) {
  if (n == 0) return Status::OK();
  ToHalfValuesKernel<<<Blocks(n), kBlockSize, 0, stream>>>(x, n, rounded_out);
  GRIDSYNC_CUDA_RETURN_IF_LAUNCH_ERROR();
  return Status::OK();
}

Status ScatterRows(const uint32_t* rows, size_t n, uint32_t width, const float* values,
                   float* params, uint16_t* half, cudaStream_t stream) {
  if (n == 0) return Status::OK();
  ScatterRowsKernel<<<Blocks(n * width), kBlockSize, 0, stream>>>(rows, n, width, values, params,
                                                                  half);
  GRIDSYNC_CUDA_RETURN_IF_LAUNCH_ERROR();
  return Status::OK();
}

Status TakeRows(const uint32_t* rows, size_t n, uint32_t width, float* grad, float* values,
                cudaStream_t stream) {
  if (n == 0) return Status::OK();
  TakeRowsKernel<<<Blocks(n * width), kBlockSize, 0, stream>>>(rows, n, width, grad, values);
  GRIDSYNC_CUDA_RETURN_IF_LAUNCH_ERROR();
  return Status::OK();
}

}  // namespace gridsync::cuda
