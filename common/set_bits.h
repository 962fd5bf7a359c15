// The positions of a bitmap's set bits, ascending: how the touched-row
// bitmaps of a step (GridGradient, GridRowSet) become row lists.
//
// Why not the obvious loop (count trailing zeros, clear the lowest bit,
// repeat): its trip count is each word's popcount, which no branch predictor
// learns at a training step's densities (2-25% of a level's rows), so it
// mispredicted once or twice a word. A byte at a time through a table of
// each byte value's bit positions takes no branch per set bit: 588k set bits
// of 8.4M (7%) took 0.54 ms against 1.44 ms, 2.1M (25%) 0.53 against 2.1 ms
// (one core of the 2-core EPYC CI host, AVX2). A word of one or two set
// bits (at 1% density, most words that are not zero) is written with two
// stores instead of eight byte steps: 84k set bits of 8.4M (1%) 0.73-0.77
// ms against 1.16-1.20, 42k (0.5%) 0.52 against 0.69-0.70, 588k (7%) 1.15
// against 1.18, 2.1M (25%) unchanged (one core of the 2-core Xeon host, a
// side-by-side micro-benchmark, medians of 9).
//
// Defined in set_bits.cc, not inline: its body depends on the instruction
// set the translation unit is built for, and an inline one would differ
// between units built with different flags.
//
// Thread safety: pure functions over the caller's memory.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

namespace gridsync {

// Writes first_bit + i for every set bit i of words[0..n) (bit b of word w
// is i = 64 w + b), ascending, from `out`; returns the end of what it wrote.
// `out_end` is the end of the room there: it must hold every set bit, and
// nothing at or past it is written (the fast path stores 8 values a byte,
// so it finishes the last bytes one bit at a time).
uint32_t* WriteSetBits(const uint64_t* words, size_t n, uint32_t first_bit, uint32_t* out,
                       const uint32_t* out_end);

// *rows = the positions (first_bit + i) of the set bits of words[0..n),
// ascending, and those words zeroed: a bitmap taken as a row list.
void TakeSetBits(uint64_t* words, size_t n, uint32_t first_bit, std::vector<uint32_t>* rows);

// Whether WriteSetBits was built with its byte-table path (AVX2), for
// tests to say which path they covered.
bool WriteSetBitsVectorized();

}  // namespace gridsync
