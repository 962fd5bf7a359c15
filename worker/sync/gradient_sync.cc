#include "worker/sync/gradient_sync.h"

#include <atomic>
#include <cmath>

#include "kernels/cpu/half.h"

namespace gridsync {

bool RoundToHalfChecked(float* values, size_t n) {
  bool fits = true;
  for (size_t i = 0; i < n; ++i) {
    const float g = values[i];
    fits = fits && std::isfinite(g) && std::fabs(g) <= kHalfMax;
    values[i] = RoundToHalf(g);
  }
  return fits;
}

bool TakeGradients(ModelGradients* grads, bool mixed_precision, std::vector<SparseRows>* rows,
                   ThreadPool* pool) {
  const uint32_t levels = static_cast<uint32_t>(rows->size());
  std::atomic<bool> finite{true};
  pool->ParallelFor(levels, [&](size_t l) {
    SparseRows& r = (*rows)[l];
    r.clear();
    grads->grid.Take(static_cast<uint32_t>(l), &r);
    if (mixed_precision && !RoundToHalfChecked(r.values.data(), r.values.size())) finite = false;
  });
  if (grads->grid.compact()) grads->grid.Clear(pool);  // every row taken: ready for the next
  if (mixed_precision) {
    for (auto& m : grads->mlp) {
      if (!RoundToHalfChecked(m.data(), static_cast<size_t>(m.size()))) finite = false;
    }
  }
  return finite.load();
}

}  // namespace gridsync
