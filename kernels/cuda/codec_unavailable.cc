// The API of codec_kernels.h and block_codec.h for builds without nvcc: every call returns
// kUnsupported (Available() comes from cuda_unavailable.cc), so callers and
// tests compile and fail cleanly everywhere.
//
// Thread safety: stateless; any thread.
#include "kernels/cuda/block_codec.h"
#include "kernels/cuda/codec_kernels.h"

namespace gridsync::cuda {
namespace {

Status Unsupported() {
  return Status::Unsupported(
      "CUDA codecs: gridsync was built without CUDA (nvcc not found at configure time)");
}

}  // namespace

Status Encode(const CodecOptions& /*options*/, const float* /*values*/, size_t /*n*/,
              uint64_t /*seed*/, uint8_t* /*out*/, cudaStream_t /*stream*/) {
  return Unsupported();
}

Status Decode(const CodecOptions& /*options*/, const uint8_t* /*bytes*/, size_t /*size*/,
              size_t /*n*/, uint64_t /*seed*/, float* /*out*/, cudaStream_t /*stream*/) {
  return Unsupported();
}

Result<std::unique_ptr<BlockCodec>> BlockCodec::Create(int /*device*/) { return Unsupported(); }

namespace host {

Status Encode(const CodecOptions& /*options*/, const std::vector<float>& /*values*/,
              uint64_t /*seed*/, std::vector<uint8_t>* /*out*/) {
  return Unsupported();
}

Status Decode(const CodecOptions& /*options*/, const std::vector<uint8_t>& /*bytes*/,
              size_t /*n*/, uint64_t /*seed*/, std::vector<float>* /*out*/) {
  return Unsupported();
}

}  // namespace host
}  // namespace gridsync::cuda
