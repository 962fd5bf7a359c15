// The memory floor of a push + pull iteration (bench_memory_floor.h).
#include "tools/bench_memory_floor.h"

#include <algorithm>
#include <chrono>
#include <cstddef>
#include <vector>

#include "common/check.h"
#include "common/row_width.h"
#include "common/thread_pool.h"
#include "tools/bench_stats.h"

namespace gridsync::bench {
namespace {

using Clock = std::chrono::steady_clock;

// Rows per pool index: the shard's apply chunk (ps_shard_requests.cc), so
// the floor splits the work as finely as the shard does.
constexpr size_t kChunkRows = 8192;

double MicrosSince(Clock::time_point start) {
  return std::chrono::duration<double, std::micro>(Clock::now() - start).count();
}

}  // namespace

MemoryFloor MeasureMemoryFloor(uint32_t n, uint32_t stride, uint32_t width, int threads,
                               int iters) {
  GRIDSYNC_CHECK_GE(n, 1u);
  GRIDSYNC_CHECK_GE(stride, 1u);
  GRIDSYNC_CHECK_GE(width, 1u);
  GRIDSYNC_CHECK_GE(iters, 1);
  const size_t region = size_t{n} * stride * width;
  // The shard's parameters and moments, the worker's table: values that
  // stay finite and normal over any number of iterations.
  std::vector<float> params(region, 0.5f), m(region, 0.0f), v(region, 0.0f), table(region, 0.0f);
  std::vector<float> grad(size_t{n} * width, 1e-3f), reply(size_t{n} * width, 0.0f);
  std::vector<uint32_t> rows(n);
  for (uint32_t i = 0; i < n; ++i) rows[i] = i * stride;
  ThreadPool pool(std::max(threads, 1));
  const size_t chunks = (size_t{n} + kChunkRows - 1) / kChunkRows;
  auto over_rows = [&](auto&& row_fn) {
    pool.ParallelFor(chunks, [&](size_t c) {
      const size_t end = std::min<size_t>(n, (c + 1) * kChunkRows);
      for (size_t i = c * kChunkRows; i < end; ++i) row_fn(i);
    });
  };

  std::vector<double> apply, gather, scatter, total;
  for (int it = 0; it <= iters; ++it) {
    WithRowWidth(width, [&](auto constant) {
      const uint32_t w = RowWidth(constant, width);
      const auto start = Clock::now();
      over_rows([&](size_t i) {
        const float* g = grad.data() + i * w;
        const size_t at = size_t{rows[i]} * w;
        for (uint32_t c = 0; c < w; ++c) {
          m[at + c] += g[c];
          v[at + c] += g[c] * g[c];
          params[at + c] -= 1e-6f * g[c];
        }
      });
      const auto applied = Clock::now();
      over_rows([&](size_t i) {
        const size_t at = size_t{rows[i]} * w;
        for (uint32_t c = 0; c < w; ++c) reply[i * w + c] = params[at + c];
      });
      const auto gathered = Clock::now();
      over_rows([&](size_t i) {
        const size_t at = size_t{rows[i]} * w;
        for (uint32_t c = 0; c < w; ++c) table[at + c] = reply[i * w + c];
      });
      if (it == 0) return;  // untimed: faults the pages in, warms the caches
      auto us = [](Clock::time_point a, Clock::time_point b) {
        return std::chrono::duration<double, std::micro>(b - a).count();
      };
      apply.push_back(us(start, applied));
      gather.push_back(us(applied, gathered));
      scatter.push_back(MicrosSince(gathered));
      total.push_back(MicrosSince(start));
    });
  }
  // The table's values depend on every phase: the work cannot be dropped.
  GRIDSYNC_CHECK(table[0] == params[0]);
  return {Median(apply), Median(gather), Median(scatter), Median(total)};
}

}  // namespace gridsync::bench
