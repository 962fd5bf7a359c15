// The NCCL backend: collectives between GPUs, one rank per device, on
// float32 buffers in device memory (see collective.h for the semantics).
// Host pointers are accepted too and staged through a device buffer, which
// suits small control messages such as the bucket check headers.
//
// The ncclUniqueId travels through our Store seam: rank 0 creates it and sets
// "nccl/<group>/id"; the others get it, waiting up to the timeout. Each rank
// also sets "nccl/<group>/joined/<rank>", so that an initialisation that
// times out can name the ranks that never arrived. As for Gloo, a group name
// must be new for each creation.
//
// Timeouts: the communicator is non-blocking (ncclConfig_t::blocking = 0).
// Every operation is enqueued on the collective's stream and then waited for
// (so a timeout can be enforced), polling ncclCommGetAsyncError and the
// stream; on a timeout or an asynchronous error the communicator is aborted
// with ncclCommAbort and the group is broken. Operations therefore return
// only when their results are in memory.
//
// Builds without CUDA/NCCL (GRIDSYNC_HAVE_NCCL=0) keep this API: NcclAvailable
// says why not and NewNcclCollective returns Unsupported. Without a CUDA
// device, creation fails with Unsupported "no CUDA device: ...".
//
// This header is host-only; its only CUDA type is cudaStream_t, declared
// opaquely as in kernels/cuda/cuda_kernels.h.
//
// Thread safety: see collective.h.
#pragma once

#include <chrono>
#include <memory>
#include <string>

#include "common/status.h"
#include "common/store.h"
#include "worker/collective/collective.h"

typedef struct CUstream_st* cudaStream_t;  // NOLINT: matches cuda_runtime_api.h

namespace gridsync {

struct NcclCollectiveOptions {
  // Bounds the rendezvous, the communicator's initialisation and every
  // operation.
  std::chrono::milliseconds timeout = std::chrono::seconds(30);
  // CUDA device of this rank; -1: the calling thread's current device.
  int device = -1;
  // Stream to run on; nullptr: the collective creates (and owns) a
  // non-blocking stream.
  cudaStream_t stream = nullptr;
};

// True when this build has NCCL, a CUDA device is present and NCCL's library
// loads; otherwise false with *reason (may be null) saying which is missing.
bool NcclAvailable(std::string* reason);

// Loads NCCL's library (libnccl.so.2, once, at run time: no binary links
// it) and every function gridsync calls; Unsupported saying why not.
Status LoadNcclLibrary();

// Joins group `group` as `rank` of `size` on one device; blocks until the
// communicator is initialised on every rank, or the timeout.
Result<std::unique_ptr<Collective>> NewNcclCollective(Store* store, int rank, int size,
                                                      const std::string& group,
                                                      const NcclCollectiveOptions& options);

}  // namespace gridsync
