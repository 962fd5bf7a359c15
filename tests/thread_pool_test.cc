#include <atomic>
#include <vector>

#include <gtest/gtest.h>

#include "common/thread_pool.h"

namespace gridsync {
namespace {

TEST(ThreadPoolTest, RunsEveryIndexExactlyOnceManyTimes) {
  ThreadPool pool(3);
  EXPECT_EQ(pool.size(), 3);
  for (int round = 0; round < 200; ++round) {
    const size_t n = 1 + round % 37;
    std::vector<std::atomic<int>> hits(n);
    pool.ParallelFor(n, [&](size_t i) { hits[i].fetch_add(1); });
    for (size_t i = 0; i < n; ++i) ASSERT_EQ(hits[i].load(), 1) << "round " << round << " index " << i;
  }
}

TEST(ThreadPoolTest, SingleThreadRunsInline) {
  ThreadPool pool(1);
  EXPECT_EQ(pool.size(), 1);
  std::vector<size_t> order;
  pool.ParallelFor(5, [&](size_t i) { order.push_back(i); });
  EXPECT_EQ(order, (std::vector<size_t>{0, 1, 2, 3, 4}));
}

}  // namespace
}  // namespace gridsync
