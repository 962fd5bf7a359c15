// LogBudget (common/logging.h): a peer refused in a tight loop gets `burst`
// lines a window, the rest counted, and a new window opens the budget again.
#include <gtest/gtest.h>

#include <chrono>
#include <thread>

#include "common/logging.h"

namespace gridsync {
namespace {

TEST(LogBudgetTest, AllowsABurstAWindowThenCounts) {
  LogBudget budget("refusals", /*burst=*/3, std::chrono::milliseconds(200));
  int allowed = 0;
  for (int i = 0; i < 1000; ++i) allowed += budget.Allow() ? 1 : 0;
  EXPECT_EQ(allowed, 3);
  std::this_thread::sleep_for(std::chrono::milliseconds(250));
  EXPECT_TRUE(budget.Allow()) << "a new window";
  EXPECT_TRUE(budget.Allow());
  EXPECT_TRUE(budget.Allow());
  EXPECT_FALSE(budget.Allow());
}

}  // namespace
}  // namespace gridsync
