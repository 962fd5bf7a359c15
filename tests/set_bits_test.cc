// WriteSetBits (common/set_bits.h) against the one-bit-at-a-time loop it
// replaced: every density a training step's bitmaps have, and none; any
// first bit; the room exactly the set bits, with nothing written past it.
#include "common/set_bits.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <bit>
#include <cstdint>
#include <cstdio>
#include <random>
#include <vector>

namespace gridsync {
namespace {

std::vector<uint32_t> Reference(const std::vector<uint64_t>& words, uint32_t first_bit) {
  std::vector<uint32_t> out;
  for (size_t w = 0; w < words.size(); ++w) {
    for (uint32_t b = 0; b < 64; ++b) {
      if ((words[w] >> b) & 1u) out.push_back(first_bit + static_cast<uint32_t>(w * 64 + b));
    }
  }
  return out;
}

TEST(SetBitsTest, EveryDensityAndOffsetMatchesBitByBit) {
  // Which path these cases cover: a build without AVX2 has only the loop.
  std::printf("WriteSetBits: %s\n",
              WriteSetBitsVectorized() ? "byte-table path (AVX2)" : "bit-at-a-time loop only");
  RecordProperty("vectorized", WriteSetBitsVectorized() ? "yes" : "no");
  std::mt19937_64 rng(7);
  constexpr uint32_t kCanary = 0xDEADBEEFu;
  for (double density : {0.0, 0.005, 0.01, 0.03, 0.07, 0.25, 0.5, 0.93, 1.0}) {
    for (size_t n : {size_t{0}, size_t{1}, size_t{2}, size_t{3}, size_t{17}, size_t{1000}}) {
      for (uint32_t first_bit : {0u, 64u, 4096u * 64u}) {
        std::bernoulli_distribution set(density);
        std::vector<uint64_t> words(n, 0);
        for (size_t i = 0; i < n * 64; ++i)
          if (set(rng)) words[i / 64] |= uint64_t{1} << (i % 64);
        const std::vector<uint32_t> want = Reference(words, first_bit);
        // The room is exactly the set bits, then canaries that must stay.
        std::vector<uint32_t> out(want.size() + 72, kCanary);
        const uint32_t* end =
            WriteSetBits(words.data(), n, first_bit, out.data(), out.data() + want.size());
        SCOPED_TRACE(testing::Message()
                     << "density " << density << ", " << n << " words, from " << first_bit);
        ASSERT_EQ(end - out.data(), static_cast<ptrdiff_t>(want.size()));
        EXPECT_TRUE(std::equal(want.begin(), want.end(), out.begin()));
        for (size_t i = want.size(); i < out.size(); ++i)
          ASSERT_EQ(out[i], kCanary) << "written past the room, at " << i;
      }
    }
  }
}

TEST(SetBitsTest, EveryByteValueInEveryPlace) {
  // Each of the 256 byte values in each of a word's 8 bytes, the others
  // set around it: the table of positions is read for all of them.
  for (uint32_t value = 0; value < 256; ++value) {
    for (uint32_t b = 0; b < 8; ++b) {
      std::vector<uint64_t> words = {uint64_t{value} << (8 * b), ~uint64_t{0}, 0,
                                     uint64_t{value} << (8 * (7 - b))};
      const std::vector<uint32_t> want = Reference(words, 5);
      std::vector<uint32_t> out(want.size() + 64, 0);
      // Room for a whole word's stores, then exactly the set bits.
      for (size_t room : {out.size(), want.size()}) {
        std::fill(out.begin(), out.end(), 0u);
        const uint32_t* end =
            WriteSetBits(words.data(), words.size(), 5, out.data(), out.data() + room);
        ASSERT_EQ(end - out.data(), static_cast<ptrdiff_t>(want.size()));
        ASSERT_TRUE(std::equal(want.begin(), want.end(), out.begin()))
            << "byte " << value << " in byte " << b << ", room " << room;
      }
    }
  }
}

TEST(SetBitsTest, WordsOfOneOrTwoBitsEverywhereUpToAnExactRoom) {
  // The two-store path: every bit alone and every pair of bits, each word
  // last in a bitmap whose room is exactly its set bits (its second store
  // must not land past the room when the word has one bit), and first of
  // two (the next word's stores overwrite it).
  constexpr uint32_t kCanary = 0xDEADBEEFu;
  for (uint32_t i = 0; i < 64; ++i) {
    for (uint32_t j = i; j < 64; ++j) {
      const uint64_t word = (uint64_t{1} << i) | (uint64_t{1} << j);
      for (const std::vector<uint64_t>& words :
           {std::vector<uint64_t>{word}, std::vector<uint64_t>{0, word},
            std::vector<uint64_t>{word, uint64_t{1} << 5}, std::vector<uint64_t>{word, word}}) {
        const std::vector<uint32_t> want = Reference(words, 128);
        std::vector<uint32_t> out(want.size() + 16, kCanary);
        const uint32_t* end =
            WriteSetBits(words.data(), words.size(), 128, out.data(), out.data() + want.size());
        ASSERT_EQ(end - out.data(), static_cast<ptrdiff_t>(want.size())) << i << "," << j;
        ASSERT_TRUE(std::equal(want.begin(), want.end(), out.begin())) << i << "," << j;
        for (size_t k = want.size(); k < out.size(); ++k)
          ASSERT_EQ(out[k], kCanary) << "bits " << i << "," << j << ": written past the room";
      }
    }
  }
}

}  // namespace
}  // namespace gridsync
