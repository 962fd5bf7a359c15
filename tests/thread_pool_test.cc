#include "common/thread_pool.h"

#include <gtest/gtest.h>

#include <atomic>
#include <vector>

namespace gridsync {
namespace {

TEST(ThreadPoolTest, RunsEveryIndexExactlyOnceManyTimes) {
  ThreadPool pool(3);
  EXPECT_EQ(pool.size(), 3);
  for (int round = 0; round < 200; ++round) {
    const size_t n = 1 + round % 37;
    std::vector<std::atomic<int>> hits(n);
    pool.ParallelFor(n, [&](size_t i) { hits[i].fetch_add(1); });
    for (size_t i = 0; i < n; ++i)
      ASSERT_EQ(hits[i].load(), 1) << "round " << round << " index " << i;
  }
}

TEST(ThreadPoolTest, SingleThreadRunsInline) {
  ThreadPool pool(1);
  EXPECT_EQ(pool.size(), 1);
  std::vector<size_t> order;
  pool.ParallelFor(5, [&](size_t i) { order.push_back(i); });
  EXPECT_EQ(order, (std::vector<size_t>{0, 1, 2, 3, 4}));
}

// ParallelForSlots' contract: every index once, each slot in [0, size()),
// and no slot held by two calls at once (the scratch a slot names is
// written without a lock); a pool of one runs all on slot 0.
TEST(ThreadPoolTest, SlotsAreInRangeAndNeverShared) {
  for (int threads : {1, 2, 4}) {
    ThreadPool pool(threads);
    std::vector<std::atomic<int>> holders(static_cast<size_t>(pool.size()));
    std::atomic<bool> shared{false}, out_of_range{false};
    std::vector<std::atomic<int>> slot_used(static_cast<size_t>(pool.size()));
    for (int round = 0; round < 100; ++round) {
      const size_t n = 1 + round % 29;
      std::vector<std::atomic<int>> hits(n);
      pool.ParallelForSlots(n, [&](size_t i, int slot) {
        hits[i].fetch_add(1);
        if (slot < 0 || slot >= pool.size()) {
          out_of_range = true;
          return;
        }
        auto s = static_cast<size_t>(slot);
        slot_used[s].fetch_add(1);
        if (holders[s].fetch_add(1) != 0) shared = true;
        // Long enough that another thread would overlap a shared slot.
        for (volatile int spin = 0; spin < 2000; spin = spin + 1) {
        }
        holders[s].fetch_sub(1);
      });
      for (size_t i = 0; i < n; ++i)
        ASSERT_EQ(hits[i].load(), 1) << threads << " threads, round " << round << " index " << i;
    }
    EXPECT_FALSE(out_of_range) << threads << " threads";
    EXPECT_FALSE(shared) << threads << " threads";
    // The caller always works, on slot 0.
    EXPECT_GT(slot_used[0].load(), 0) << threads << " threads";
  }
  ThreadPool one(1);
  std::vector<int> slots;
  one.ParallelForSlots(4, [&](size_t, int slot) { slots.push_back(slot); });
  EXPECT_EQ(slots, (std::vector<int>{0, 0, 0, 0}));
  std::vector<int> inline_slots;
  ParallelForSlotsOn(nullptr, 3, [&](size_t, int slot) { inline_slots.push_back(slot); });
  EXPECT_EQ(inline_slots, (std::vector<int>{0, 0, 0}));
}

}  // namespace
}  // namespace gridsync
