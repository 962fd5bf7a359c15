// The cuBLAS loader (cublas_api.h).
//
// Thread safety: see cublas_api.h.
#include <mutex>
#include <string>

#include "common/shared_library.h"
#include "kernels/cuda/cublas_api.h"

namespace gridsync::cuda {

Result<const CublasApi*> LoadCublas() {
  static CublasApi api;
  static std::string error;
  static std::once_flag once;
  std::call_once(once, [] {
    auto library =
        SharedLibrary::Open({"libcublas.so.13", "libcublas.so.12", "libcublas.so"}, "cuBLAS");
    if (!library.ok()) {
      error = library.status().message();
      return;
    }
    const bool complete = library->Lookup("cublasCreate_v2", &api.create) &&
                          library->Lookup("cublasDestroy_v2", &api.destroy) &&
                          library->Lookup("cublasSetStream_v2", &api.set_stream) &&
                          library->Lookup("cublasSetMathMode", &api.set_math_mode) &&
                          library->Lookup("cublasSgemm_v2", &api.sgemm) &&
                          library->Lookup("cublasGetStatusString", &api.status_string);
    if (!complete) error = "the cuBLAS library found lacks a function the trainer needs";
  });
  if (!error.empty()) return Status::Unsupported(error);
  return &api;
}

const CublasApi& Cublas() { return **LoadCublas(); }  // after a successful LoadCublas

Status CublasStatus(cublasStatus_t status, const char* expr) {
  if (status == CUBLAS_STATUS_SUCCESS) return Status::OK();
  return Status::Internal(std::string(expr) + " failed: " + Cublas().status_string(status));
}

}  // namespace gridsync::cuda
