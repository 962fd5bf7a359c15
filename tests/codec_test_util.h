// Helpers the codec and error-feedback tests share: reproducible Gaussian
// values, codec options by name, and an encode into a fresh vector.
//
// Thread safety: pure functions.
#pragma once

#include <cstddef>
#include <cstdint>
#include <random>
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

}  // namespace gridsync::codec_testing
