// The CUDA codec's host-side support (codec.cu): the scratch memory its
// encoders and decoders take on the caller's stream, randomk's indices
// drawn on the host and uploaded, and the Status for a payload the device
// flagged, which cpu::Decode names. Host code only, kept apart so that
// codec.cu holds the kernels and their launches. For the .cu files of
// kernels/cuda only (cuda_check.h pulls in cuda_runtime.h).
//
// Thread safety: a Scratch belongs to one call on one stream; the functions
// may be called from any thread, work on one stream ordered by the stream.
#pragma once

#include <cuda_runtime.h>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "common/status.h"
#include "kernels/cpu/codec.h"
#include "kernels/cuda/cuda_check.h"

namespace gridsync::cuda::codec_support {

// Scratch memory ordered on one stream. Release() frees it with checked
// calls; the destructor frees whatever an error path left behind.
class Scratch {
 public:
  explicit Scratch(cudaStream_t stream) : stream_(stream) {}
  Scratch(const Scratch&) = delete;
  Scratch& operator=(const Scratch&) = delete;
  ~Scratch() {
    for (void* ptr : ptrs_) (void)cudaFreeAsync(ptr, stream_);
    if (!ptrs_.empty()) (void)cudaGetLastError();  // a Status is already on its way out
  }

  template <typename T>
  Status Allocate(size_t count, T** out) {
    void* ptr = nullptr;
    GRIDSYNC_CUDA_RETURN_IF_ERROR(
        cudaMallocAsync(&ptr, std::max<size_t>(count, 1) * sizeof(T), stream_));
    ptrs_.push_back(ptr);
    *out = static_cast<T*>(ptr);
    return Status::OK();
  }

  Status Release() {
    while (!ptrs_.empty()) {
      void* ptr = ptrs_.back();
      ptrs_.pop_back();
      GRIDSYNC_CUDA_RETURN_IF_ERROR(cudaFreeAsync(ptr, stream_));
    }
    return Status::OK();
  }

 private:
  cudaStream_t stream_;
  std::vector<void*> ptrs_;
};

// "cuda codec NAME: ", which starts the device codec's own messages.
std::string Prefix(const CodecOptions& options);

// randomk's indices, drawn on the host and copied to scratch memory. The
// copy is from pageable memory, so it has consumed the vector on return.
Status UploadRandomkIndices(uint64_t seed, size_t n, uint32_t k, uint32_t** indices,
                            Scratch* scratch, cudaStream_t stream);

// randomk's decoding factor, n / k, as cpu::Decode computes it.
float RandomkFactor(size_t n, uint32_t k);

// The device flagged the payload: cpu::Decode on a host copy names the
// problem (and must agree that there is one).
Status ExplainBadPayload(const CodecOptions& options, const uint8_t* bytes, size_t size, size_t n,
                         uint64_t seed);

}  // namespace gridsync::cuda::codec_support
