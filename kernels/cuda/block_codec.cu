// BlockCodec (block_codec.h) on a CUDA device.
//
// Thread safety: see block_codec.h.
#include <cuda_runtime.h>

#include <algorithm>
#include <mutex>
#include <string>

#include "kernels/cuda/block_codec.h"
#include "kernels/cuda/codec_kernels.h"
#include "kernels/cuda/cuda_check.h"
#include "kernels/cuda/device_buffer.h"

namespace gridsync::cuda {
namespace {

class DeviceBlockCodec : public BlockCodec {
 public:
  explicit DeviceBlockCodec(int device) : device_(device) {}
  ~DeviceBlockCodec() override {
    (void)cudaSetDevice(device_);
    if (stream_ != nullptr) (void)cudaStreamDestroy(stream_);
    (void)cudaGetLastError();
  }

  Status Init() {
    GRIDSYNC_CUDA_RETURN_IF_ERROR(cudaSetDevice(device_));
    GRIDSYNC_CUDA_RETURN_IF_ERROR(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking));
    return Status::OK();
  }

  Status Encode(const CodecOptions& options, const float* values, size_t n, uint64_t seed,
                uint8_t* payload, float* decoded) override {
    std::lock_guard<std::mutex> lock(mu_);
    GRIDSYNC_CUDA_RETURN_IF_ERROR(cudaSetDevice(device_));
    const size_t size = EncodedSize(options, n);
    GRIDSYNC_RETURN_IF_ERROR(Grow(&values_, n));
    GRIDSYNC_RETURN_IF_ERROR(Grow(&payload_, size));
    if (n > 0) {
      GRIDSYNC_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(values_.get(), values, n * sizeof(float),
                                                    cudaMemcpyHostToDevice, stream_));
    }
    GRIDSYNC_RETURN_IF_ERROR(
        cuda::Encode(options, values_.get(), n, seed, payload_.get(), stream_));
    if (size > 0) {
      GRIDSYNC_CUDA_RETURN_IF_ERROR(
          cudaMemcpyAsync(payload, payload_.get(), size, cudaMemcpyDeviceToHost, stream_));
    }
    if (decoded != nullptr) {
      // Decode synchronises the stream; the decoded floats reuse the values'
      // buffer, which Encode no longer needs.
      GRIDSYNC_RETURN_IF_ERROR(
          cuda::Decode(options, payload_.get(), size, n, seed, values_.get(), stream_));
      if (n > 0) {
        GRIDSYNC_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(decoded, values_.get(), n * sizeof(float),
                                                      cudaMemcpyDeviceToHost, stream_));
      }
    }
    GRIDSYNC_CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(stream_));
    return Status::OK();
  }

 private:
  template <typename T>
  Status Grow(DeviceBuffer<T>* buffer, size_t n) {
    return GrowBuffer(buffer, n, stream_);
  }

  const int device_;
  std::mutex mu_;
  cudaStream_t stream_ = nullptr;
  DeviceBuffer<float> values_;
  DeviceBuffer<uint8_t> payload_;
};

}  // namespace

Result<std::unique_ptr<BlockCodec>> BlockCodec::Create(int device) {
  std::string reason;
  if (!Available(&reason)) return Status::Unsupported(reason);
  auto codec = std::make_unique<DeviceBlockCodec>(device);
  GRIDSYNC_RETURN_IF_ERROR(codec->Init());
  return std::unique_ptr<BlockCodec>(std::move(codec));
}

}  // namespace gridsync::cuda
