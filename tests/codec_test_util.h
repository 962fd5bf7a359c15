// Helpers the codec and error-feedback tests share: reproducible Gaussian
// values, codec options by name, an encode into a fresh vector, a decode
// into a NaN-filled one, and the payloads' little-endian words.
//
// Thread safety: pure functions.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "kernels/cpu/codec.h"

namespace gridsync::codec_testing {

inline std::vector<float> Gaussian(size_t n, uint64_t seed, float stddev = 1.0f) {
  std::mt19937_64 rng(seed);
  std::normal_distribution<float> dist(0.0f, stddev);
  std::vector<float> out(n);
  for (float& x : out) x = dist(rng);
  return out;
}

inline CodecOptions Options(Codec codec) {
  CodecOptions options;
  options.codec = codec;
  return options;
}

// Pre-filled with 0xAB, so bytes Encode leaves unwritten show.
inline std::vector<uint8_t> EncodeVec(const CodecOptions& options, const std::vector<float>& x,
                                      uint64_t seed) {
  std::vector<uint8_t> out(EncodedSize(options, x.size()), 0xAB);
  cpu::Encode(options, x.data(), x.size(), seed, out.data());
  return out;
}

// Decodes into a vector pre-filled with NaN, so unwritten outputs show:
// round trips check every output finite, and callers of Decode rely on it
// writing every value (they decode into unzeroed buffers).
inline Status DecodeVec(const CodecOptions& options, const std::vector<uint8_t>& bytes, size_t n,
                        uint64_t seed, std::vector<float>* out) {
  out->assign(n, std::numeric_limits<float>::quiet_NaN());
  return cpu::Decode(options, bytes.data(), bytes.size(), n, seed, out->data());
}

inline bool Contains(const std::string& text, const std::string& part) {
  return text.find(part) != std::string::npos;
}

// Little-endian words of a payload.
inline float LoadF32(const uint8_t* p) {
  float v;
  std::memcpy(&v, p, 4);
  return v;
}
inline uint32_t LoadU32(const uint8_t* p) {
  uint32_t v;
  std::memcpy(&v, p, 4);
  return v;
}
inline void StoreF32(uint8_t* p, float v) { std::memcpy(p, &v, 4); }
inline void StoreU32(uint8_t* p, uint32_t v) { std::memcpy(p, &v, 4); }

}  // namespace gridsync::codec_testing
