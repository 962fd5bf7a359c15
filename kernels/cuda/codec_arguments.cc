// CheckCodecArguments (codec_kernels.h): plain C++, built with and without
// CUDA, so every build refuses the same arguments with the same words.
//
// Thread safety: a pure function.
#include <string>

#include "kernels/cuda/codec_kernels.h"

namespace gridsync::cuda {

Status CheckCodecArguments(const CodecOptions& options, size_t n) {
  GRIDSYNC_RETURN_IF_ERROR(ValidateCodecOptions(options));
  if (n > kMaxCodecValues) {
    return Status::InvalidArgument("cuda codec " + std::string(CodecName(options.codec)) + ": " +
                                   std::to_string(n) + " values; allowed: <= 4294967295");
  }
  return Status::OK();
}

}  // namespace gridsync::cuda
