// cuBLAS for the device trainer's MLP, loaded when a trainer is made rather
// than linked: every binary links the kernels, and a CPU host need not have
// NVIDIA's BLAS (linked, it also broke the metrics server's start in the
// worker, when that was civetweb). CUDA sources only (it needs cublas_v2.h).
//
//   GRIDSYNC_RETURN_IF_ERROR(LoadCublas().status());
//   GRIDSYNC_CUBLAS_RETURN_IF_ERROR(Cublas().sgemm(handle, ...));
//
// Thread safety: LoadCublas may be called from any thread (once); the table
// is immutable afterwards.
#pragma once

#include <cublas_v2.h>

#include <string>

#include "common/status.h"

namespace gridsync::cuda {

// The functions the trainer calls.
struct CublasApi {
  decltype(&cublasCreate_v2) create = nullptr;
  decltype(&cublasDestroy_v2) destroy = nullptr;
  decltype(&cublasSetStream_v2) set_stream = nullptr;
  decltype(&cublasSetMathMode) set_math_mode = nullptr;
  decltype(&cublasSgemm_v2) sgemm = nullptr;
  decltype(&cublasGetStatusString) status_string = nullptr;
};

// Loads the library once; Unsupported naming why when it is missing or
// incomplete.
Result<const CublasApi*> LoadCublas();
// The table, after a successful LoadCublas.
const CublasApi& Cublas();
// Internal naming the call and cuBLAS's message, unless `status` is success.
Status CublasStatus(cublasStatus_t status, const char* expr);

}  // namespace gridsync::cuda

#define GRIDSYNC_CUBLAS_RETURN_IF_ERROR(expr) \
  GRIDSYNC_RETURN_IF_ERROR(::gridsync::cuda::CublasStatus((expr), #expr))
