// The CUDA codec's host-side support (codec_support.h).
//
// Thread safety: see codec_support.h.
#include <cuda_runtime.h>

#include <string>
#include <vector>

#include "kernels/cuda/codec_support.h"

namespace gridsync::cuda::codec_support {

std::string Prefix(const CodecOptions& options) {
  return "cuda codec " + std::string(CodecName(options.codec)) + ": ";
}

Status UploadRandomkIndices(uint64_t seed, size_t n, uint32_t k, uint32_t** indices,
                            Scratch* scratch, cudaStream_t stream) {
  std::vector<uint32_t> host(k);
  cpu::RandomkIndices(seed, n, k, host.data());
  GRIDSYNC_RETURN_IF_ERROR(scratch->Allocate(k, indices));
  GRIDSYNC_CUDA_RETURN_IF_ERROR(
      cudaMemcpyAsync(*indices, host.data(), k * sizeof(uint32_t), cudaMemcpyHostToDevice, stream));
  // `host` is freed on return, and an asynchronous copy from pageable memory
  // may read it later (CUDA promises only that it "might be synchronous").
  GRIDSYNC_CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(stream));
  return Status::OK();
}

float RandomkFactor(size_t n, uint32_t k) {
  return static_cast<float>(static_cast<double>(n) / static_cast<double>(k));
}

Status ExplainBadPayload(const CodecOptions& options, const uint8_t* bytes, size_t size, size_t n,
                         uint64_t seed) {
  std::vector<uint8_t> host(size);
  GRIDSYNC_CUDA_RETURN_IF_ERROR(cudaMemcpy(host.data(), bytes, size, cudaMemcpyDeviceToHost));
  std::vector<float> scratch(n);
  const Status status = cpu::Decode(options, host.data(), size, n, seed, scratch.data());
  if (!status.ok()) return status;
  return Status::Internal(Prefix(options) +
                          "the device rejected a payload that cpu::Decode accepts (twin mismatch)");
}

}  // namespace gridsync::cuda::codec_support
