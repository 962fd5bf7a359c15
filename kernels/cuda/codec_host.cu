// The host convenience API of codec_kernels.h: copy the input to the
// device, run the device codec on the default stream, copy the result back.
// For tests and benchmarks; every call allocates and frees device memory.
//
// Thread safety: may be called from any thread (the default stream orders
// the work).
#include <cuda_runtime.h>

#include <vector>

#include "kernels/cuda/codec_kernels.h"
#include "kernels/cuda/cuda_check.h"
#include "kernels/cuda/device_buffer.h"

namespace gridsync::cuda::host {

Status Encode(const CodecOptions& options, const std::vector<float>& values, uint64_t seed,
              std::vector<uint8_t>* out) {
  if (out == nullptr) return Status::InvalidArgument("cuda::host::Encode: out is null");
  GRIDSYNC_RETURN_IF_ERROR(CheckCodecArguments(options, values.size()));
  const size_t size = EncodedSize(options, values.size());
  DeviceBuffer<float> d_values;
  DeviceBuffer<uint8_t> d_out;
  GRIDSYNC_RETURN_IF_ERROR(d_values.Upload(values));
  GRIDSYNC_RETURN_IF_ERROR(d_out.AllocateZeroed(size));
  GRIDSYNC_RETURN_IF_ERROR(
      ::gridsync::cuda::Encode(options, d_values.get(), values.size(), seed, d_out.get(), nullptr));
  GRIDSYNC_CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(nullptr));
  GRIDSYNC_RETURN_IF_ERROR(d_out.Download(out));  // size bytes
  GRIDSYNC_RETURN_IF_ERROR(d_out.Free());
  GRIDSYNC_RETURN_IF_ERROR(d_values.Free());
  return Status::OK();
}

Status Decode(const CodecOptions& options, const std::vector<uint8_t>& bytes, size_t n,
              uint64_t seed, std::vector<float>* out) {
  if (out == nullptr) return Status::InvalidArgument("cuda::host::Decode: out is null");
  GRIDSYNC_RETURN_IF_ERROR(CheckCodecArguments(options, n));
  DeviceBuffer<uint8_t> d_bytes;
  DeviceBuffer<float> d_out;
  GRIDSYNC_RETURN_IF_ERROR(d_bytes.Upload(bytes));
  GRIDSYNC_RETURN_IF_ERROR(d_out.AllocateZeroed(n));
  GRIDSYNC_RETURN_IF_ERROR(::gridsync::cuda::Decode(options, d_bytes.get(), bytes.size(), n, seed,
                                                    d_out.get(), nullptr));
  GRIDSYNC_RETURN_IF_ERROR(d_out.Download(out));  // n floats
  GRIDSYNC_RETURN_IF_ERROR(d_out.Free());
  GRIDSYNC_RETURN_IF_ERROR(d_bytes.Free());
  return Status::OK();
}

}  // namespace gridsync::cuda::host
