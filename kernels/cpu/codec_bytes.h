// What the CPU codecs' encoders (codec.cc) and decoders (codec_decode.cc)
// share: little-endian loads and stores, sizes, and message text. Not for
// use elsewhere.
//
// Thread safety: pure functions.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <string>

#include "kernels/cpu/codec.h"

namespace gridsync::codec_bytes {

inline void StoreU32(uint8_t* p, uint32_t v) { std::memcpy(p, &v, 4); }
inline void StoreF32(uint8_t* p, float v) { std::memcpy(p, &v, 4); }
inline uint32_t LoadU32(const uint8_t* p) {
  uint32_t v;
  std::memcpy(&v, p, 4);
  return v;
}
inline float LoadF32(const uint8_t* p) {
  float v;
  std::memcpy(&v, p, 4);
  return v;
}

inline size_t CeilDiv(size_t a, size_t b) { return (a + b - 1) / b; }

inline std::string Prefix(const CodecOptions& options) {
  return "codec " + std::string(CodecName(options.codec)) + ": ";
}

inline std::string FloatText(float x) {
  char buf[48];
  std::snprintf(buf, sizeof(buf), "%.9g (bits 0x%08x)", static_cast<double>(x),
                codec_math::FloatBits(x));
  return buf;
}
}  // namespace gridsync::codec_bytes
