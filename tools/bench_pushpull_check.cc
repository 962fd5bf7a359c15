// gridsync-bench pushpull's correctness check (tools/bench_pushpull_check.h).
//
// Thread safety: see tools/bench_pushpull_check.h.
#include "tools/bench_pushpull_check.h"

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <limits>

namespace gridsync::bench::pushpull {
namespace {

// The reference: Adam as kernels/adam_math.h defines it, run here on a fresh
// row (its own step count from 0, m = v = 0) for `steps` pushes of the same
// gradient. step_size[t] = AdamStepSize(hyper, t).
float Expected(const AdamHyper& hyper, const std::vector<float>& step_size, int steps, float w0,
               float g) {
  float w = w0, m = 0.0f, v = 0.0f;
  for (int t = 1; t <= steps; ++t) AdamUpdate(hyper, step_size[t], g, &w, &m, &v);
  return w;
}

// A tolerance, not equality: the reference is compiled in another
// translation unit, where the compiler may contract or order the float
// operations differently. A missing or extra push moves a value by about the
// learning rate, orders of magnitude more.
bool Close(float got, float want) {
  return std::abs(got - want) <= 1e-5f * std::max(1.0f, std::abs(want));  // false for NaN
}

}  // namespace

float InitialValue(uint32_t row, uint32_t col) {
  const uint32_t h = (row * 2654435761u) ^ (col * 0x9E3779B9u);
  return static_cast<float>(h >> 16) / 65536.0f - 0.5f;
}

float Gradient(uint32_t row, uint32_t col) {
  const float magnitude = static_cast<float>((row * kWidth + col) % 13 + 1) * 0.01f;
  return (row / kStride) % 2 == 0 ? magnitude : -magnitude;
}

uint64_t CountWrongPushed(const SizePlan& plan, const std::vector<float>& table,
                          const AdamHyper& hyper, const std::vector<float>& step_size, int steps) {
  uint64_t wrong = 0;
  for (uint32_t i = 0; i < plan.n; ++i) {
    const uint32_t row = plan.base + kStride * i;
    for (uint32_t c = 0; c < kWidth; ++c) {
      const float want = Expected(hyper, step_size, steps, InitialValue(row, c), Gradient(row, c));
      wrong += Close(table[size_t{row} * kWidth + c], want) ? 0 : 1;
    }
  }
  return wrong;
}

uint64_t CountWrongNeighbours(const SizePlan& plan, const std::vector<float>& table) {
  uint64_t wrong = 0;
  for (uint32_t i = 0; i < plan.n; ++i) {
    const uint32_t row = plan.base + kStride * i + 1;
    for (uint32_t c = 0; c < kWidth; ++c) {
      wrong += table[size_t{row} * kWidth + c] == InitialValue(row, c) ? 0 : 1;
    }
  }
  return wrong;
}

void Poison(const std::vector<uint32_t>& rows, std::vector<float>* table) {
  for (uint32_t row : rows) {
    for (uint32_t c = 0; c < kWidth; ++c) {
      (*table)[size_t{row} * kWidth + c] = std::numeric_limits<float>::quiet_NaN();
    }
  }
}

}  // namespace gridsync::bench::pushpull
