// NCCL's entry points, loaded at run time, and the checked-call helpers the
// NCCL backend (nccl_collective.cc) is written with: a failed CUDA or NCCL
// call becomes a Status naming the expression, the error and file:line, in
// the manner of NCCL's own CUDACHECK/NCCLCHECK.
//
// NCCL is loaded when a collective first needs it rather than linked: every
// binary links the collectives, and a CPU host (or a coordinator, a shard)
// should not need NVIDIA's library to start.
//
// Private to gridsync_collective, and only where GRIDSYNC_HAVE_NCCL is 1.
//
// Thread safety: LoadNccl is safe to call from any thread (std::call_once);
// the rest are reentrant.
#pragma once

#include <cuda_runtime_api.h>
#include <nccl.h>

#include <chrono>
#include <string>

#include "common/status.h"

namespace gridsync::nccl_internal {

using Clock = std::chrono::steady_clock;

struct NcclApi {
  decltype(&ncclAllGather) AllGather = nullptr;
  decltype(&ncclAllReduce) AllReduce = nullptr;
  decltype(&ncclBroadcast) Broadcast = nullptr;
  decltype(&ncclCommAbort) CommAbort = nullptr;
  decltype(&ncclCommDestroy) CommDestroy = nullptr;
  decltype(&ncclCommFinalize) CommFinalize = nullptr;
  decltype(&ncclCommGetAsyncError) CommGetAsyncError = nullptr;
  decltype(&ncclCommInitRankConfig) CommInitRankConfig = nullptr;
  decltype(&ncclGetErrorString) GetErrorString = nullptr;
  decltype(&ncclGetLastError) GetLastError = nullptr;
  decltype(&ncclGetUniqueId) GetUniqueId = nullptr;
  decltype(&ncclGroupEnd) GroupEnd = nullptr;
  decltype(&ncclGroupStart) GroupStart = nullptr;
  decltype(&ncclReduce) Reduce = nullptr;
  decltype(&ncclReduceScatter) ReduceScatter = nullptr;
};

// The library's entry points, loaded once; Unsupported naming why not.
Result<const NcclApi*> LoadNccl();

// After a successful LoadNccl (NcclAvailable and NewNcclCollective check it).
const NcclApi& Nccl();

// cudaGetLastError() is cleared, so that the next unrelated check does not
// report the same error again.
Status CudaFailure(cudaError_t error, const char* expr, const char* file, int line);

// A peer's failure (ncclRemoteError) or the network (ncclSystemError) is an
// I/O error; invalid arguments or usage are InvalidArgument; everything
// else is internal.
Status NcclFailure(ncclResult_t result, ncclComm_t comm, const char* expr, const char* file,
                   int line);

#define GRIDSYNC_NCCL_CUDA_CHECK(expr)                                                     \
  do {                                                                                     \
    const cudaError_t gridsync_cuda_error_ = (expr);                                       \
    if (gridsync_cuda_error_ != cudaSuccess)                                               \
      return ::gridsync::nccl_internal::CudaFailure(gridsync_cuda_error_, #expr, __FILE__, \
                                                    __LINE__);                             \
  } while (0)

// For a non-blocking communicator, ncclInProgress means "enqueued, not yet
// done": the caller then waits with WaitComm.
#define GRIDSYNC_NCCL_CHECK(comm, expr)                                                   \
  do {                                                                                    \
    const ncclResult_t gridsync_nccl_result_ = (expr);                                    \
    if (gridsync_nccl_result_ != ncclSuccess && gridsync_nccl_result_ != ncclInProgress)  \
      return ::gridsync::nccl_internal::NcclFailure(gridsync_nccl_result_, (comm), #expr, \
                                                    __FILE__, __LINE__);                  \
  } while (0)

// Spins briefly, then sleeps up to 1 ms: operations are usually short.
void Backoff(int* round);

// Waits until the communicator is no longer ncclInProgress (initialisation,
// or a call that returned ncclInProgress). Returns Timeout at `deadline`.
Status WaitComm(ncclComm_t comm, Clock::time_point deadline, const std::string& what,
                std::chrono::milliseconds timeout);

// Device (or managed) memory, as opposed to host memory.
bool IsDevicePointer(const void* ptr);

}  // namespace gridsync::nccl_internal
