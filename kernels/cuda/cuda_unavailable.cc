// The API of cuda_kernels.h for builds without nvcc: Available() says why
// there is no GPU path and every kernel returns kUnsupported with the same
// text, so callers and tests compile and fail cleanly everywhere.
//
// Thread safety: stateless; any thread.
#include <string>

#include "kernels/cuda/cuda_kernels.h"

namespace gridsync::cuda {
namespace {

constexpr char kWithoutCuda[] =
    "gridsync was built without CUDA (nvcc not found at configure time)";

Status Unsupported() { return Status::Unsupported(kWithoutCuda); }

}  // namespace

bool Available(std::string* reason) {
  if (reason != nullptr) *reason = kWithoutCuda;
  return false;
}

Status HashGridForward(const HashGridLayout& /*layout*/, const float* /*positions*/, size_t /*n*/,
                       uint32_t /*active_levels*/, const float* /*params*/, float* /*features*/,
                       cudaStream_t /*stream*/) {
  return Unsupported();
}

Status HashGridForwardHalf(const HashGridLayout& /*layout*/, const float* /*positions*/,
                           size_t /*n*/, uint32_t /*active_levels*/,
                           const uint16_t* /*params_half*/, float* /*features*/,
                           cudaStream_t /*stream*/) {
  return Unsupported();
}

Status HashGridBackward(const HashGridLayout& /*layout*/, const float* /*positions*/, size_t /*n*/,
                        uint32_t /*active_levels*/, const float* /*d_features*/, float* /*grad*/,
                        cudaStream_t /*stream*/) {
  return Unsupported();
}

Status HashGridBackwardLevels(const HashGridLayout& /*layout*/, const float* /*positions*/,
                              size_t /*n*/, uint32_t /*level_begin*/, uint32_t /*level_end*/,
                              uint32_t /*active_levels*/, const float* /*d_features*/,
                              float* /*grad*/, cudaStream_t /*stream*/) {
  return Unsupported();
}

Status AdamUpdateRows(const AdamHyper& /*hyper*/, uint32_t /*width*/, const uint32_t* /*rows*/,
                      size_t /*n_rows*/, const float* /*values*/, float /*grad_scale*/,
                      float* /*params*/, float* /*m*/, float* /*v*/, uint32_t* /*steps*/,
                      cudaStream_t /*stream*/) {
  return Unsupported();
}

namespace host {

Status HashGridForward(const HashGridLayout& /*layout*/, const std::vector<float>& /*positions*/,
                       uint32_t /*active_levels*/, const std::vector<float>& /*params*/,
                       std::vector<float>* /*features*/) {
  return Unsupported();
}

Status HashGridForwardHalf(const HashGridLayout& /*layout*/,
                           const std::vector<float>& /*positions*/, uint32_t /*active_levels*/,
                           const std::vector<uint16_t>& /*params_half*/,
                           std::vector<float>* /*features*/) {
  return Unsupported();
}

Status HashGridBackward(const HashGridLayout& /*layout*/, const std::vector<float>& /*positions*/,
                        uint32_t /*active_levels*/, const std::vector<float>& /*d_features*/,
                        std::vector<float>* /*grad*/) {
  return Unsupported();
}

Status AdamUpdateRows(const AdamHyper& /*hyper*/, const SparseRows& /*grad*/, float /*grad_scale*/,
                      std::vector<float>* /*params*/, std::vector<float>* /*m*/,
                      std::vector<float>* /*v*/, std::vector<uint32_t>* /*steps*/) {
  return Unsupported();
}

}  // namespace host
}  // namespace gridsync::cuda
