// WriteSetBits (set_bits.h).
//
// Thread safety: see set_bits.h.
#include "common/set_bits.h"

#include <algorithm>
#include <array>
#include <bit>

#if defined(__AVX2__)
#include <immintrin.h>
#endif

namespace gridsync {
namespace {

// For each byte value, the positions of its set bits, ascending, one a byte
// from the lowest (the rest zero).
constexpr std::array<uint64_t, 256> kBytePositions = [] {
  std::array<uint64_t, 256> table{};
  for (uint32_t value = 0; value < 256; ++value) {
    uint32_t k = 0;
    for (uint32_t bit = 0; bit < 8; ++bit) {
      if ((value >> bit) & 1u) table[value] |= uint64_t{bit} << (8 * k++);
    }
  }
  return table;
}();

}  // namespace

uint32_t* WriteSetBits(const uint64_t* words, size_t n, uint32_t first_bit, uint32_t* out,
                       const uint32_t* out_end) {
  uint32_t* o = out;
  for (size_t w = 0; w < n; ++w) {
    const uint64_t word = words[w];
    if (word == 0) continue;  // sparse levels: whole words of nothing
    const uint32_t word_bit = first_bit + static_cast<uint32_t>(w * 64);
    // A word of one or two set bits (most of a sparse level's words) takes
    // two stores and no branch per bit; the byte path below spent its eight
    // byte steps on it. The second store is past the word's bits when it
    // has one, and the next word's overwrite it (or it lies past the end
    // of what is returned, inside the room).
    const int count = std::popcount(word);
    if (count <= 2 && out_end - o >= 2) {
      o[0] = word_bit + static_cast<uint32_t>(std::countr_zero(word));
      const uint64_t rest = (word & (word - 1)) | (uint64_t{1} << 63);
      o[1] = word_bit + static_cast<uint32_t>(std::countr_zero(rest));
      o += count;
      continue;
    }
#if defined(__AVX2__)
    // Byte b's 8 stores end at most 8 past the word's earlier set bits.
    if (out_end - o >= count + 8) {
      for (uint32_t b = 0; b < 8; ++b) {
        const uint32_t byte = static_cast<uint32_t>(word >> (8 * b)) & 0xffu;
        const __m256i at = _mm256_cvtepu8_epi32(
            _mm_loadl_epi64(reinterpret_cast<const __m128i*>(&kBytePositions[byte])));
        const __m256i base = _mm256_set1_epi32(static_cast<int>(word_bit + 8 * b));
        _mm256_storeu_si256(reinterpret_cast<__m256i*>(o), _mm256_add_epi32(at, base));
        o += std::popcount(byte);
      }
      continue;
    }
#else
    (void)out_end;
#endif
    for (uint64_t rest = word; rest != 0; rest &= rest - 1)
      *o++ = word_bit + static_cast<uint32_t>(std::countr_zero(rest));
  }
  return o;
}

void TakeSetBits(uint64_t* words, size_t n, uint32_t first_bit, std::vector<uint32_t>* rows) {
  size_t count = 0;
  for (size_t w = 0; w < n; ++w) count += static_cast<size_t>(std::popcount(words[w]));
  rows->resize(count);
  WriteSetBits(words, n, first_bit, rows->data(), rows->data() + count);
  std::fill(words, words + n, uint64_t{0});
}

bool WriteSetBitsVectorized() {
#if defined(__AVX2__)
  return true;
#else
  return false;
#endif
}

}  // namespace gridsync
