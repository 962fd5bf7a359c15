// nccl_api.h: loading NCCL and the checked-call helpers.
#include "worker/collective/nccl_api.h"

#include <spdlog/fmt/fmt.h>

#include <algorithm>
#include <mutex>
#include <thread>
#include <utility>

#include "common/shared_library.h"
#include "worker/collective/collective.h"

namespace gridsync::nccl_internal {

Result<const NcclApi*> LoadNccl() {
  static NcclApi api;
  static std::string error;
  static std::once_flag once;
  std::call_once(once, [] {
    auto library = SharedLibrary::Open({"libnccl.so.2", "libnccl.so"}, "NCCL");
    if (!library.ok()) {
      error = library.status().message();
      return;
    }
    bool complete = true;
    complete = library->Lookup("ncclAllGather", &api.AllGather) && complete;
    complete = library->Lookup("ncclAllReduce", &api.AllReduce) && complete;
    complete = library->Lookup("ncclBroadcast", &api.Broadcast) && complete;
    complete = library->Lookup("ncclCommAbort", &api.CommAbort) && complete;
    complete = library->Lookup("ncclCommDestroy", &api.CommDestroy) && complete;
    complete = library->Lookup("ncclCommFinalize", &api.CommFinalize) && complete;
    complete = library->Lookup("ncclCommGetAsyncError", &api.CommGetAsyncError) && complete;
    complete = library->Lookup("ncclCommInitRankConfig", &api.CommInitRankConfig) && complete;
    complete = library->Lookup("ncclGetErrorString", &api.GetErrorString) && complete;
    complete = library->Lookup("ncclGetLastError", &api.GetLastError) && complete;
    complete = library->Lookup("ncclGetUniqueId", &api.GetUniqueId) && complete;
    complete = library->Lookup("ncclGroupEnd", &api.GroupEnd) && complete;
    complete = library->Lookup("ncclGroupStart", &api.GroupStart) && complete;
    complete = library->Lookup("ncclReduce", &api.Reduce) && complete;
    complete = library->Lookup("ncclReduceScatter", &api.ReduceScatter) && complete;
    if (!complete)
      error = "the NCCL library found lacks a function gridsync needs (NCCL 2.18 or newer)";
  });
  if (!error.empty()) return Status::Unsupported(error);
  return &api;
}

const NcclApi& Nccl() { return **LoadNccl(); }

Status CudaFailure(cudaError_t error, const char* expr, const char* file, int line) {
  (void)cudaGetLastError();
  return Status::Internal(fmt::format("{} failed: {}: {} at {}:{}", expr, cudaGetErrorName(error),
                                      cudaGetErrorString(error), file, line));
}

Status NcclFailure(ncclResult_t result, ncclComm_t comm, const char* expr, const char* file,
                   int line) {
  const char* last = Nccl().GetLastError(comm);
  std::string message =
      fmt::format("{} failed: {} ({}){} at {}:{}", expr, Nccl().GetErrorString(result),
                  static_cast<int>(result),
                  (last != nullptr && *last != '\0') ? fmt::format(": {}", last) : "", file, line);
  if (result == ncclRemoteError || result == ncclSystemError)
    return Status::IOError(std::move(message));
  if (result == ncclInvalidArgument || result == ncclInvalidUsage)
    return Status::InvalidArgument(std::move(message));
  return Status::Internal(std::move(message));
}

void Backoff(int* round) {
  if (*round < 64) {
    std::this_thread::yield();
  } else {
    std::this_thread::sleep_for(std::chrono::microseconds(std::min(1000, 10 * (*round - 63))));
  }
  ++*round;
}

Status WaitComm(ncclComm_t comm, Clock::time_point deadline, const std::string& what,
                std::chrono::milliseconds timeout) {
  int round = 0;
  for (;;) {
    ncclResult_t state = ncclSuccess;
    GRIDSYNC_NCCL_CHECK(comm, Nccl().CommGetAsyncError(comm, &state));
    if (state == ncclSuccess) return Status::OK();
    if (state != ncclInProgress) {
      return NcclFailure(state, comm, "Nccl().CommGetAsyncError(comm, &state)", __FILE__, __LINE__)
          .WithContext(what);
    }
    if (Clock::now() >= deadline) {
      return Status::Timeout(
          fmt::format("{}: NCCL did not finish within {}", what, FormatSeconds(timeout)));
    }
    Backoff(&round);
  }
}

bool IsDevicePointer(const void* ptr) {
  if (ptr == nullptr) return false;
  cudaPointerAttributes attributes{};
  if (cudaPointerGetAttributes(&attributes, ptr) != cudaSuccess) {
    (void)cudaGetLastError();  // unregistered host memory on old runtimes
    return false;
  }
  return attributes.type == cudaMemoryTypeDevice || attributes.type == cudaMemoryTypeManaged;
}

}  // namespace gridsync::nccl_internal
