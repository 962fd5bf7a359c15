#include "common/codec_format.h"

#include <algorithm>
#include <cmath>
#include <ostream>
#include <string>

#include "common/check.h"

namespace gridsync {
namespace {

size_t CeilDiv(size_t a, size_t b) { return (a + b - 1) / b; }

std::string Prefix(const CodecOptions& options) {
  return "codec " + std::string(CodecName(options.codec)) + ": ";
}

}  // namespace

std::string_view CodecName(Codec codec) {
  switch (codec) {
    case Codec::kNone:
      return "none";
    case Codec::kFp16:
      return "fp16";
    case Codec::kBf16:
      return "bf16";
    case Codec::kInt8:
      return "int8";
    case Codec::kQsgd:
      return "qsgd";
    case Codec::kOnebit:
      return "onebit";
    case Codec::kTopk:
      return "topk";
    case Codec::kRandomk:
      return "randomk";
  }
  return "unknown";
}

Result<Codec> ParseCodec(std::string_view name) {
  std::string allowed;
  for (Codec codec : kAllCodecs) {
    if (name == CodecName(codec)) return codec;
    allowed += (allowed.empty() ? "" : ", ") + std::string(CodecName(codec));
  }
  return Status::InvalidArgument("codec \"" + std::string(name) +
                                 "\" unknown; allowed: " + allowed);
}

std::ostream& operator<<(std::ostream& os, Codec codec) { return os << CodecName(codec); }

Status ValidateCodecOptions(const CodecOptions& options) {
  switch (options.codec) {
    case Codec::kNone:
    case Codec::kBf16:
    case Codec::kOnebit:
      return Status::OK();
    case Codec::kFp16:
    case Codec::kInt8:
      if (options.block >= 1) return Status::OK();
      return Status::InvalidArgument(Prefix(options) + "block 0; allowed: >= 1");
    case Codec::kQsgd:
      if (options.bits >= 1 && options.bits <= 8) return Status::OK();
      return Status::InvalidArgument("codec qsgd: bits " + std::to_string(options.bits) +
                                     "; allowed: 1..8");
    case Codec::kTopk:
    case Codec::kRandomk:
      if (std::isfinite(options.ratio) && options.ratio > 0.0 && options.ratio <= 1.0)
        return Status::OK();
      return Status::InvalidArgument(Prefix(options) + "ratio " + std::to_string(options.ratio) +
                                     "; allowed: (0, 1]");
  }
  return Status::InvalidArgument("codec " + std::to_string(static_cast<unsigned>(options.codec)) +
                                 " unknown; allowed: 0..7");
}

uint32_t KeptCount(const CodecOptions& options, size_t n) {
  GRIDSYNC_CHECK_LE(n, kMaxCodecValues);
  if (options.codec != Codec::kTopk && options.codec != Codec::kRandomk)
    return static_cast<uint32_t>(n);
  if (n == 0) return 0;
  const double wanted = std::round(options.ratio * static_cast<double>(n));
  return static_cast<uint32_t>(std::clamp<double>(wanted, 1.0, static_cast<double>(n)));
}

size_t EncodedSize(const CodecOptions& options, size_t n) {
  const Status valid = ValidateCodecOptions(options);
  if (!valid.ok()) internal::CheckFailed(__FILE__, __LINE__, "EncodedSize: " + valid.ToString());
  GRIDSYNC_CHECK_LE(n, kMaxCodecValues);
  switch (options.codec) {
    case Codec::kNone:
      return 4 * n;
    case Codec::kFp16:
      return CeilDiv(n, options.block) * 2 + 2 * n;
    case Codec::kBf16:
      return 2 * n;
    case Codec::kInt8:
      return CeilDiv(n, options.block) * 4 + n;
    case Codec::kQsgd:
      return 4 + CeilDiv(n * (static_cast<size_t>(options.bits) + 1), 8);
    case Codec::kOnebit:
      return 4 + CeilDiv(n, 8);
    case Codec::kTopk:
      return 4 + 8 * size_t{KeptCount(options, n)};
    case Codec::kRandomk:
      return 4 * size_t{KeptCount(options, n)};
  }
  return 0;  // unreachable: validated above
}

Status CheckPayloadSize(const CodecOptions& options, size_t size, size_t n) {
  const size_t expected = EncodedSize(options, n);
  if (size == expected) return Status::OK();
  std::string detail;
  if (options.codec == Codec::kTopk || options.codec == Codec::kRandomk)
    detail = ", k = " + std::to_string(KeptCount(options, n));
  return Status::Corruption(Prefix(options) + "payload has " + std::to_string(size) +
                            " bytes; expected " + std::to_string(expected) +
                            " for n = " + std::to_string(n) + detail);
}

}  // namespace gridsync
