// The gradient codecs' vocabulary, shared by the wire format
// (common/wire/message.h), the config and the kernels that implement them
// (kernels/cpu/codec.h, whose header describes each codec's byte format):
// which codecs exist, their options, their names, and how many bytes a
// payload of n values takes. Knowing a payload's size needs no kernel, so
// the decode boundary checks it before any codec runs.
//
// Thread safety: reentrant free functions and plain values.
#pragma once

#include <cstddef>
#include <cstdint>
#include <iosfwd>
#include <string_view>

#include "common/status.h"

namespace gridsync {

// The numeric values are stable (they may travel in a message's header).
enum class Codec : uint8_t {
  kNone = 0,
  kFp16 = 1,
  kBf16 = 2,
  kInt8 = 3,
  kQsgd = 4,
  kOnebit = 5,
  kTopk = 6,
  kRandomk = 7,
};

inline constexpr Codec kAllCodecs[] = {Codec::kNone, Codec::kFp16,   Codec::kBf16, Codec::kInt8,
                                       Codec::kQsgd, Codec::kOnebit, Codec::kTopk, Codec::kRandomk};

// "none", "fp16", "bf16", "int8", "qsgd", "onebit", "topk", "randomk";
// "unknown" for a value outside the enum.
std::string_view CodecName(Codec codec);
// The inverse of CodecName; kInvalidArgument listing the allowed names.
Result<Codec> ParseCodec(std::string_view name);
std::ostream& operator<<(std::ostream& os, Codec codec);

struct CodecOptions {
  Codec codec = Codec::kNone;
  double ratio = 0.01;   // topk, randomk: fraction of values kept, in (0, 1]
  int bits = 4;          // qsgd: level bits, 1..8 (s = 2^bits - 1 levels)
  uint32_t block = 256;  // int8, fp16: values per scale, >= 1
};

// Payloads index values with u32 (topk) and draw them by u32 (randomk).
inline constexpr size_t kMaxCodecValues = 0xFFFFFFFFu;

// OK when the fields the codec uses are in range; kInvalidArgument naming
// the field and its allowed range otherwise.
Status ValidateCodecOptions(const CodecOptions& options);

// Values a payload carries: k for topk and randomk (see above), n for the
// others. Options must be valid and n <= kMaxCodecValues.
uint32_t KeptCount(const CodecOptions& options, size_t n);

// fp16, bf16 and int8: every value arrives, rounded (to a few parts in
// 10^3 at worst), rather than held back or dropped.
constexpr bool OnlyRounds(Codec codec) {
  return codec == Codec::kFp16 || codec == Codec::kBf16 || codec == Codec::kInt8;
}
// Of those, the ones with no floor on a value's magnitude: bf16 (fp32's
// exponent), int8 and fp16 (a scale per block, so each rounds a value
// relative to its block's largest, however small that is). Plain halves,
// fp16's format until protocol version 3, flushed values under 6e-8 to
// zero, which a large batch's mean gradient reaches (measured: -0.43 dB
// with Adam on the shards at batch 16384).
constexpr bool KeepsGradientRange(Codec codec) {
  return codec == Codec::kBf16 || codec == Codec::kInt8 || codec == Codec::kFp16;
}

// Exact payload bytes for n values (the table above). Options must be valid
// and n <= kMaxCodecValues.
size_t EncodedSize(const CodecOptions& options, size_t n);

// OK when size == EncodedSize(options, n), else kCorruption naming both (and
// k for topk/randomk). Options must be valid and n <= kMaxCodecValues.
Status CheckPayloadSize(const CodecOptions& options, size_t size, size_t n);

}  // namespace gridsync
