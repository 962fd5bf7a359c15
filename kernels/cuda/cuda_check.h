// Checked CUDA runtime calls for the .cu files of kernels/cuda (never
// included by host-only code: it pulls in cuda_runtime.h).
//
// In the manner of NCCL's CUDACHECK: a failed call turns into
// Status::Internal naming the expression, the CUDA error and file:line, and
// cudaGetLastError() is called so that the failure is not reported a second
// time by the next unrelated check. (Sticky errors such as an illegal address
// cannot be cleared; they keep failing every later call, each with its own
// message, which is what a caller needs to see.)
//
//   GRIDSYNC_CUDA_RETURN_IF_ERROR(cudaMalloc(&ptr, bytes));
//   Kernel<<<grid, block, 0, stream>>>(...);
//   GRIDSYNC_CUDA_RETURN_IF_LAUNCH_ERROR();
//
// Thread safety: the macros may be used from any thread.
#pragma once

#include <cuda_runtime.h>

#include <string>

#include "common/status.h"

namespace gridsync::cuda::internal {

inline Status CudaErrorStatus(cudaError_t error, const char* expr, const char* file, int line) {
  (void)cudaGetLastError();  // clears the recorded error (see above)
  return Status::Internal(std::string(expr) + " failed: " + cudaGetErrorName(error) + ": " +
                          cudaGetErrorString(error) + " at " + file + ":" + std::to_string(line));
}

}  // namespace gridsync::cuda::internal

// Returns Status::Internal from the enclosing function when `expr` (a
// cudaError_t) is not cudaSuccess.
#define GRIDSYNC_CUDA_RETURN_IF_ERROR(expr)                                                     \
  do {                                                                                          \
    const cudaError_t gridsync_cuda_error_ = (expr);                                            \
    if (gridsync_cuda_error_ != cudaSuccess)                                                    \
      return ::gridsync::cuda::internal::CudaErrorStatus(gridsync_cuda_error_, #expr, __FILE__, \
                                                         __LINE__);                             \
  } while (0)

// After a <<<...>>> launch: reports a bad configuration or a missing kernel
// image. Errors inside the kernel surface at the next synchronizing call.
#define GRIDSYNC_CUDA_RETURN_IF_LAUNCH_ERROR() GRIDSYNC_CUDA_RETURN_IF_ERROR(cudaGetLastError())
