// Adam on scattered rows, vectorised across rows.
//
// A hash-grid row is 1 to 8 floats, so a row-at-a-time loop issues one
// scalar sqrt and one scalar divide per value, and those two, not memory,
// bound sparse Adam (perf: ~45% of the shard's apply on the dependent
// vsqrtss/vdivss). AdamRowBatch copies rows into lanes that stay in L1,
// runs AdamUpdate over all lanes in one loop the compiler vectorises (8
// lanes per sqrt and divide with AVX2), and copies the rows back.
//
// Element by element the arithmetic is AdamUpdate's, in the same order, so
// the results are bit-identical to the row-at-a-time loops (adam_test checks
// it against AdamUpdateRow). Lanes left over after the last row hold earlier
// rows' values or zeros: finite inputs whose results are never copied back.
//
// Thread safety: one batch per thread. A batch holds pointers into the rows
// it queued until Flush(); the caller must not touch those rows meanwhile
// (each row may be queued once per batch) and must Flush() before reading.
#pragma once

#include <cstdint>

#include "kernels/adam_math.h"

namespace gridsync::cpu {

template <uint32_t W>
class AdamRowBatch {
  static_assert(W == 1 || W == 2 || W == 4 || W == 8, "hash-grid widths");

 public:
  static constexpr uint32_t kLanes = 32;
  static constexpr uint32_t kRows = kLanes / W;

  explicit AdamRowBatch(const AdamHyper& hyper) : hyper_(hyper) {}
  AdamRowBatch(const AdamRowBatch&) = delete;
  AdamRowBatch& operator=(const AdamRowBatch&) = delete;

  // Queues one row: W gradient values g (each times grad_scale, as the
  // row-at-a-time loops pass them), its step size, and where its parameters
  // and moments live. Updates the queued rows once kRows are queued.
  void Add(const float* g, float grad_scale, float step_size, float* w, float* m, float* v) {
    const uint32_t base = rows_ * W;
    for (uint32_t f = 0; f < W; ++f) {
      g_[base + f] = g[f] * grad_scale;
      lr_[base + f] = step_size;
      w_[base + f] = w[f];
      m_[base + f] = m[f];
      v_[base + f] = v[f];
    }
    out_[rows_] = {w, m, v};
    if (++rows_ == kRows) Flush();
  }

  // Updates the queued rows and writes them back.
  void Flush() {
    if (rows_ == 0) return;
    for (uint32_t i = 0; i < kLanes; ++i) AdamUpdate(hyper_, lr_[i], g_[i], &w_[i], &m_[i], &v_[i]);
    for (uint32_t r = 0; r < rows_; ++r) {
      for (uint32_t f = 0; f < W; ++f) {
        out_[r].w[f] = w_[r * W + f];
        out_[r].m[f] = m_[r * W + f];
        out_[r].v[f] = v_[r * W + f];
      }
    }
    rows_ = 0;
  }

 private:
  struct Row {
    float* w;
    float* m;
    float* v;
  };

  const AdamHyper hyper_;
  uint32_t rows_ = 0;
  alignas(64) float g_[kLanes] = {};
  alignas(64) float lr_[kLanes] = {};
  alignas(64) float w_[kLanes] = {};
  alignas(64) float m_[kLanes] = {};
  alignas(64) float v_[kLanes] = {};
  Row out_[kRows] = {};
};

}  // namespace gridsync::cpu
