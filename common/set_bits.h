// The positions of a bitmap's set bits, ascending: how the touched-row
// bitmaps of a step (GridGradient, GridRowSet, randomk's taken values)
// become row lists.
//
// Why not the obvious loop (count trailing zeros, clear the lowest bit,
// repeat): its trip count is each word's popcount, a branch no predictor
// learns at a training step's densities (2-25% of a level's rows), so it
// mispredicted once or twice a word. A byte at a time through a table of
// each byte value's bit positions has no data-dependent branch: 588k set
// bits of 8.4M (7%) took 0.54 ms against 1.44 ms, 2.1M (25%) 0.53 against
// 2.1 ms (one core of the 2-core EPYC CI host, AVX2).
//
// Thread safety: pure functions over the caller's memory.
#pragma once

#include <array>
#include <bit>
#include <cstddef>
#include <cstdint>

#if defined(__AVX2__)
#include <immintrin.h>
#endif

namespace gridsync {
namespace set_bits_internal {

// For each byte value, the positions of its set bits, ascending, one a byte
// from the lowest (the rest zero).
inline constexpr std::array<uint64_t, 256> kBytePositions = [] {
  std::array<uint64_t, 256> table{};
  for (uint32_t value = 0; value < 256; ++value) {
    uint32_t k = 0;
    for (uint32_t bit = 0; bit < 8; ++bit) {
      if ((value >> bit) & 1u) table[value] |= uint64_t{bit} << (8 * k++);
    }
  }
  return table;
}();

}  // namespace set_bits_internal

// Writes first_bit + i for every set bit i of words[0..n) (bit b of word w
// is i = 64 w + b), ascending, from `out`; returns the end of what it wrote.
// `out_end` is the end of the room there: it must hold every set bit, and
// nothing at or past it is written (the fast path stores 8 values a byte,
// so it finishes the last bytes one bit at a time).
inline uint32_t* WriteSetBits(const uint64_t* words, size_t n, uint32_t first_bit, uint32_t* out,
                              const uint32_t* out_end) {
  uint32_t* o = out;
  for (size_t w = 0; w < n; ++w) {
    const uint64_t word = words[w];
    if (word == 0) continue;  // sparse levels: whole words of nothing
    const uint32_t word_bit = first_bit + static_cast<uint32_t>(w * 64);
#if defined(__AVX2__)
    if (out_end - o >= 64) {
      for (uint32_t b = 0; b < 8; ++b) {
        const uint32_t byte = static_cast<uint32_t>(word >> (8 * b)) & 0xffu;
        const __m256i at = _mm256_cvtepu8_epi32(
            _mm_cvtsi64_si128(static_cast<long long>(set_bits_internal::kBytePositions[byte])));
        const __m256i base = _mm256_set1_epi32(static_cast<int>(word_bit + 8 * b));
        _mm256_storeu_si256(reinterpret_cast<__m256i*>(o), _mm256_add_epi32(at, base));
        o += std::popcount(byte);
      }
      continue;
    }
#endif
    for (uint64_t rest = word; rest != 0; rest &= rest - 1)
      *o++ = word_bit + static_cast<uint32_t>(std::countr_zero(rest));
  }
  return o;
}

}  // namespace gridsync
