#include "worker/worker_adam.h"

#include <algorithm>
#include <bit>
#include <utility>

#include "common/prefetch.h"
#include "common/state_bytes.h"
#include "kernels/cpu/adam_batch.h"

namespace gridsync {

WorkerAdam::WorkerAdam(const Partition& partition, const AdamHyper& hyper)
    : partition_(partition),
      hyper_(hyper),
      state_(partition.n_tables()),
      out_(partition.n_tables()) {}

std::vector<TableRowsRef> WorkerAdam::ToUpdates(const std::vector<TableRowsRef>& gradients,
                                                ThreadPool* pool) {
  // Tables are independent (each has its own state and output buffer), so
  // they run in parallel; a table listed twice would share them, so then
  // everything runs on this thread.
  std::vector<bool> seen(state_.size(), false);
  bool distinct = true;
  for (const TableRowsRef& ref : gradients) {
    distinct = distinct && !seen[ref.table];
    seen[ref.table] = true;
  }
  std::vector<size_t> kept(gradients.size(), 0);
  // A table listed again overwrites the table's output buffer, so then each
  // listing's output is moved to a buffer of its own before the next runs.
  repeated_.clear();
  if (!distinct) repeated_.resize(gradients.size());
  auto update = [&](size_t i) {
    kept[i] = gradients[i].on_device ? gradients[i].row_count : UpdateTable(gradients[i]);
    if (!distinct && !gradients[i].on_device) std::swap(repeated_[i], out_[gradients[i].table]);
  };
  ParallelForOn(distinct ? pool : nullptr, gradients.size(), update);
  std::vector<TableRowsRef> updates;
  updates.reserve(gradients.size());
  for (size_t i = 0; i < gradients.size(); ++i) {
    const TableRowsRef& ref = gradients[i];
    if (!ref.dense && kept[i] == 0) continue;
    if (ref.on_device) {
      updates.push_back(ref);
      continue;
    }
    Table& out = distinct ? out_[ref.table] : repeated_[i];
    // The client may take the buffers (zero copy): UpdateTable sizes them
    // afresh every call.
    updates.push_back({ref.table, ref.dense, out.rows.data(), ref.dense ? 0 : kept[i],
                       out.values.data(), false, ref.dense ? nullptr : &out.rows, &out.values});
  }
  return updates;
}

namespace {

// Rows this far ahead have their Adam state prefetched: a sparse table's
// rows are scattered over state far larger than the caches.
constexpr size_t kPrefetchDistance = 96;

// UpdateTable's loop, with the width known at compile time (W > 0: the
// compiler unrolls the row) or at run time (W = 0: `width`).
template <uint32_t W>
size_t UpdateRows(const AdamHyper& hyper, const TableRowsRef& ref, size_t n, uint32_t width,
                  cpu::AdamTable* state, float* updates, std::vector<uint32_t>* kept_rows) {
  const uint32_t w = W > 0 ? W : width;
  float* m = state->m.data();
  float* v = state->v.data();
  uint32_t* steps = state->step.data();
  // W = 0 (any width) keeps the row-at-a-time loop; the batch needs W.
  cpu::AdamRowBatch<(W > 0 ? W : 1), cpu::AdamBatchOut::kNegatedStep> batch(hyper, updates, m, v);
  size_t kept = 0;
  for (size_t i = 0; i < n; ++i) {
    if (!ref.dense && i + kPrefetchDistance < n) {
      const uint32_t ahead = ref.rows[i + kPrefetchDistance];
      PrefetchRow(&m[size_t{ahead} * w]);
      PrefetchRow(&v[size_t{ahead} * w]);
      PrefetchRow(&steps[ahead]);
    }
    const float* g = ref.values + i * w;
    if (!ref.dense && !RowHasGradient(g, w)) continue;
    const uint32_t row = ref.dense ? static_cast<uint32_t>(i) : ref.rows[i];
    const float lr = state->StepSize(hyper, ++steps[row]);
    if constexpr (W > 0) {
      batch.Add(g, 1.0f, lr, row, kept * W);
    } else {
      float* u = updates + kept * w;
      for (uint32_t f = 0; f < w; ++f) {
        const size_t at = size_t{row} * w + f;
        u[f] = -AdamStep(hyper, lr, g[f], &m[at], &v[at]);
      }
    }
    if (!ref.dense) kept_rows->push_back(row);
    ++kept;
  }
  if constexpr (W > 0) batch.Flush();
  return kept;
}

}  // namespace

size_t WorkerAdam::UpdateTable(const TableRowsRef& ref) {
  const auto& info = partition_.table(ref.table);
  const uint32_t w = info.width;
  cpu::AdamTable& state = state_[ref.table];
  if (state.step.empty()) state.Resize(info.rows, w);
  Table& out = out_[ref.table];
  out.rows.clear();
  const size_t n = ref.dense ? info.rows : ref.row_count;
  out.values.resize(n * w);
  if (!ref.dense) out.rows.reserve(n);
  float* u = out.values.data();
  switch (w) {
    case 1:
      return UpdateRows<1>(hyper_, ref, n, w, &state, u, &out.rows);
    case 2:
      return UpdateRows<2>(hyper_, ref, n, w, &state, u, &out.rows);
    case 4:
      return UpdateRows<4>(hyper_, ref, n, w, &state, u, &out.rows);
    case 8:
      return UpdateRows<8>(hyper_, ref, n, w, &state, u, &out.rows);
    default:
      return UpdateRows<0>(hyper_, ref, n, w, &state, u, &out.rows);
  }
}

cpu::AdamTable* WorkerAdam::State(uint32_t t) {
  cpu::AdamTable& state = state_[t];
  if (state.step.empty()) state.Resize(partition_.table(t).rows, partition_.table(t).width);
  return &state;
}

void WorkerAdam::MaskMomentum(uint32_t table, const uint32_t* rows, size_t n, uint32_t col,
                              uint32_t cw, const float* delivered) {
  cpu::AdamTable& state = state_[table];
  if (state.m.empty()) return;
  MaskMomentumRows(state.m.data(), partition_.table(table).width, rows, n, col, cw, delivered);
}

void MaskMomentumRows(float* m, size_t stride, const uint32_t* rows, size_t n, uint32_t col,
                      uint32_t cw, const float* delivered) {
  // A sparsifying codec delivers ~1% of the values, so the scan is the cost:
  // each chunk of 32 values becomes a mask of the delivered ones (x != 0.0f
  // exactly when x's bits without the sign are not 0, NaN included; the
  // loop vectorises), and only set bits are visited.
  constexpr size_t kChunk = 32;
  const size_t total = n * cw;
  for (size_t begin = 0; begin < total; begin += kChunk) {
    const size_t count = std::min(total - begin, kChunk);
    uint32_t mask = 0;
    if (count == kChunk) {
      for (uint32_t j = 0; j < kChunk; ++j)
        mask |= static_cast<uint32_t>(
                    (std::bit_cast<uint32_t>(delivered[begin + j]) & 0x7FFFFFFFu) != 0)
                << j;
    } else {
      for (uint32_t j = 0; j < count; ++j)
        mask |= static_cast<uint32_t>(
                    (std::bit_cast<uint32_t>(delivered[begin + j]) & 0x7FFFFFFFu) != 0)
                << j;
    }
    for (; mask != 0; mask &= mask - 1) {
      const size_t j = begin + static_cast<size_t>(std::countr_zero(mask));
      m[size_t{rows[j / cw]} * stride + col + j % cw] = 0.0f;
    }
  }
}

void WorkerAdam::AppendState(std::string* out) const {
  for (const auto& s : state_) {
    out->push_back(s.step.empty() ? '\0' : '\1');
    if (s.step.empty()) continue;
    AppendArray(out, s.m);
    AppendArray(out, s.v);
    AppendArray(out, s.step);
  }
}

Status WorkerAdam::RestoreState(std::string_view* in, uint64_t step) {
  for (uint32_t t = 0; t < state_.size(); ++t) {
    cpu::AdamTable& s = state_[t];
    s = cpu::AdamTable{};
    if (in->empty() || (in->front() != '\0' && in->front() != '\1'))
      return Status::Corruption("worker Adam: no state flag for table " + std::to_string(t));
    const bool has = in->front() == '\1';
    in->remove_prefix(1);
    if (!has) continue;
    const auto& info = partition_.table(t);
    // The bytes first: a state of a few bytes flagging every table must not
    // make the whole model's Adam state before it is refused.
    const uint64_t bytes =
        info.rows * info.width * 2 * sizeof(float) + info.rows * sizeof(uint32_t);
    if (in->size() < bytes)
      return Status::Corruption("worker Adam: the state of table " + std::to_string(t) +
                                " is shorter than its " + std::to_string(info.rows) + " rows (" +
                                std::to_string(in->size()) +
                                " bytes left; allowed: " + std::to_string(bytes) + ")");
    s.Resize(info.rows, info.width);
    if (!TakeArray(in, &s.m) || !TakeArray(in, &s.v) || !TakeArray(in, &s.step))
      return Status::Internal("worker Adam: table " + std::to_string(t) + " was sized wrong");
    const std::string what = "worker Adam: table " + std::to_string(t);
    GRIDSYNC_RETURN_IF_ERROR(cpu::CheckStepCounts(s, step, what));
    GRIDSYNC_RETURN_IF_ERROR(cpu::CheckMoments(s, what));
  }
  return Status::OK();
}

size_t WorkerAdam::StateBytes() const {
  size_t bytes = 0;
  for (const auto& s : state_) {
    bytes += (s.m.size() + s.v.size()) * sizeof(float) + s.step.size() * sizeof(uint32_t);
  }
  return bytes;
}

}  // namespace gridsync
