// A counter-based random source: the value for (seed, stream, index) is a
// pure function, so any process can draw any slice of a global batch without
// drawing the rest. That is what lets W workers split one global batch and
// still reproduce the single-process run exactly.
//
// The functions are callable from CUDA kernels too, so the GPU codecs draw
// the same numbers as the CPU.
//
// Thread safety: pure functions.
#pragma once

#include <cstdint>

#if defined(__CUDACC__)
#define GRIDSYNC_RNG_HOST_DEVICE __host__ __device__
#else
#define GRIDSYNC_RNG_HOST_DEVICE
#endif

namespace gridsync {

// SplitMix64 finaliser (Steele et al.): a bijective 64-bit mixer.
GRIDSYNC_RNG_HOST_DEVICE inline uint64_t Mix64(uint64_t x) {
  x += 0x9E3779B97F4A7C15ull;
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
  return x ^ (x >> 31);
}

GRIDSYNC_RNG_HOST_DEVICE inline uint64_t CounterRandom(uint64_t seed, uint64_t stream, uint64_t index) {
  return Mix64(Mix64(seed ^ Mix64(stream)) ^ index);
}

// Two uniform floats in [0, 1) with 24 random bits each.
GRIDSYNC_RNG_HOST_DEVICE inline void CounterUniform2(uint64_t seed, uint64_t stream, uint64_t index, float* a, float* b) {
  const uint64_t r = CounterRandom(seed, stream, index);
  constexpr float kScale = 1.0f / 16777216.0f;
  *a = static_cast<float>(r >> 40) * kScale;
  *b = static_cast<float>((r >> 16) & 0xFFFFFFu) * kScale;
}

}  // namespace gridsync
