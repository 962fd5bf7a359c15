// gridsync-bench pushpull's correctness check (tools/bench_pushpull.cc):
// the rows each payload size uses, the table's known initial values and the
// known gradients pushed, and the counts of pulled values that differ from a
// reference Adam step (kernels/adam_math.h) or from the untouched neighbours'
// initial values. Apart from the timing, so that what the bench measures and
// what it checks can be read each on its own.
//
// Thread safety: free functions; Poison writes the table it is given.
#pragma once

#include <cstdint>
#include <vector>

#include "kernels/adam_math.h"

namespace gridsync::bench::pushpull {

constexpr uint32_t kWidth = 2;   // floats per row: one hash-grid level
constexpr uint32_t kStride = 3;  // a batch touches every 3rd row of its region

// One payload size and the rows it uses: rows base + kStride * i (pushed and
// pulled), base + kStride * i + 1 (never pushed: the neighbours checked).
struct SizePlan {
  uint64_t bytes = 0;  // nominal; the push payload is n * 12 bytes
  uint32_t n = 0;
  uint32_t base = 0;
  int iters = 0;
};

// Deterministic, distinct per element, so a value written to the wrong row or
// column shows.
float InitialValue(uint32_t row, uint32_t col);

// Never zero: a zero gradient leaves a row where it was and would let a
// dropped push pass the check.
float Gradient(uint32_t row, uint32_t col);

// Values of the pushed rows in `table` (the pull destination) that differ
// from the reference after `steps` pushes.
uint64_t CountWrongPushed(const SizePlan& plan, const std::vector<float>& table,
                          const AdamHyper& hyper, const std::vector<float>& step_size, int steps);

// Values of the neighbour rows that differ from their initial values; these
// are copied, never computed, so they must match exactly.
uint64_t CountWrongNeighbours(const SizePlan& plan, const std::vector<float>& table);

// A pull that silently left a value alone must not pass for one that wrote
// the right value, so the destination is poisoned before checked pulls.
void Poison(const std::vector<uint32_t>& rows, std::vector<float>* table);

}  // namespace gridsync::bench::pushpull
