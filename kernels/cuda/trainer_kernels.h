// The device trainer's element-wise kernels (device_trainer.cu): ReLU and
// its backward pass, the squared error and its gradient, Adam over the grid
// (row-wise, the CPU's rule) and over a dense matrix, the fp16 rounding of
// mixed precision, and the row scatter/gather that stages touched rows for
// the PS modes. Each launcher enqueues on `stream` and returns the launch
// error, if any. All pointers are device memory.
//
// Thread safety: any thread; calls on one stream are ordered by it.
#pragma once

#include <cstddef>
#include <cstdint>

#include "common/status.h"
#include "kernels/adam_math.h"

typedef struct CUstream_st* cudaStream_t;  // NOLINT: matches cuda_runtime_api.h

namespace gridsync::cuda {

// x = max(x, 0).
Status Relu(float* x, size_t n, cudaStream_t stream);
// delta *= (activation > 0).
Status ReluBackward(const float* activation, float* delta, size_t n, cudaStream_t stream);
// dy = (y - t) * dy_scale; *sse += sum (y - t)^2.
Status SquaredError(const float* y, const float* t, float dy_scale, size_t n, float* dy,
                    double* sse, cudaStream_t stream);
// Adam on every grid row whose gradient is not all zero, with the gradient
// times grad_scale, each row with its own step count; those gradient rows
// are zeroed.
Status GridAdam(const AdamHyper& hyper, uint32_t width, size_t rows, float grad_scale, float* grad,
                float* params, float* m, float* v, uint32_t* steps, cudaStream_t stream);
// Adam on every element (one step size for the matrix); gradient zeroed.
Status DenseAdam(const AdamHyper& hyper, float step_size, float grad_scale, size_t n, float* grad,
                 float* params, float* m, float* v, cudaStream_t stream);
// x = fp16(x) for n values; *overflow becomes 1 if any value was not
// finite or beyond fp16's largest, 65504 (the CPU's RoundToHalfChecked).
Status RoundThroughHalf(float* x, size_t n, unsigned* overflow, cudaStream_t stream);
// half_out[i] = fp16 bits of x[i] (the grid's working copy), or, with
// half_out null, rounded_out[i] = fp16(x[i]) as a float (the MLP's).
Status ToHalfBits(const float* x, size_t n, uint16_t* half_out, cudaStream_t stream);
Status ToHalfValues(const float* x, size_t n, float* rounded_out, cudaStream_t stream);
// params[rows[i]] = values[i] (rows of `width` floats); the fp16 working
// copy of those rows too when `half` is not null.
Status ScatterRows(const uint32_t* rows, size_t n, uint32_t width, const float* values,
                   float* params, uint16_t* half, cudaStream_t stream);
// values[i] = grad[rows[i]], then grad[rows[i]] = 0.
Status TakeRows(const uint32_t* rows, size_t n, uint32_t width, float* grad, float* values,
                cudaStream_t stream);
// values[i] = src[rows[i]].
Status GatherRows(const uint32_t* rows, size_t n, uint32_t width, const float* src, float* values,
                  cudaStream_t stream);
// has[i] = whether grad[rows[i]] is not all zero (RowHasGradient).
Status RowsWithGradient(const uint32_t* rows, size_t n, uint32_t width, const float* grad,
                        uint8_t* has, cudaStream_t stream);

}  // namespace gridsync::cuda
