// Encoding the PS client's push blocks on a CUDA device (compression.codec
// in ps and hybrid with the model on a GPU): the block's values are copied
// in, encoded by the codec's CUDA twin (codec_kernels.h: byte for byte what
// cpu::Encode writes) and, for error feedback, decoded there as well; the
// payload and the decoded values come back. The device buffers and the
// stream are kept between calls (cuda::host:: allocates per call).
//
// The block's values still come from host memory: error feedback, which
// adds each row's residual before encoding and keeps what the codec did not
// deliver, lives in the PS client on the host, and so does the split of a
// table's rows among shards. What moves to the device is the codec's work:
// top-k's selection, QSGD's and 1-bit's passes, randomk's gather.
//
// This header needs no nvcc. Without CUDA in the build, or without a
// device, Create fails saying which.
//
// Thread safety: Encode may be called from several threads at once; calls
// are serialised.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>

#include "common/status.h"
#include "kernels/cpu/codec.h"

namespace gridsync::cuda {

class BlockCodec {
 public:
  // On CUDA device `device`.
  static Result<std::unique_ptr<BlockCodec>> Create(int device);
  virtual ~BlockCodec() = default;

  // values: n floats (host); payload: EncodedSize(options, n) bytes (host);
  // decoded: n floats (host) or null. As cpu::Encode, then cpu::Decode of
  // the payload into `decoded`, with the same Status when the payload does
  // not decode (values that are not finite).
  virtual Status Encode(const CodecOptions& options, const float* values, size_t n, uint64_t seed,
                        uint8_t* payload, float* decoded) = 0;
};

}  // namespace gridsync::cuda
