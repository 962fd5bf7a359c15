// HugePageVector and AdviseHugePages (common/huge_pages.h): large tables
// come 2 MiB-aligned and behave as any vector; small ranges are left alone.

#include "common/huge_pages.h"

#include <gtest/gtest.h>

#include <cstdint>
#include <fstream>
#include <numeric>
#include <string>
#include <vector>

namespace gridsync {
namespace {

bool HugeAligned(const void* p) { return reinterpret_cast<uintptr_t>(p) % kHugePageBytes == 0; }

TEST(HugePages, LargeTablesAreAlignedAndBehaveAsVectors) {
  const size_t n = (3 * kHugePageBytes) / sizeof(float) + 5;  // not whole huge pages
  HugePageVector<float> table(n, 1.5f);
  EXPECT_TRUE(HugeAligned(table.data()));
  EXPECT_EQ(table.size(), n);
  EXPECT_EQ(table.back(), 1.5f);
  std::iota(table.begin(), table.end(), 0.0f);
  HugePageVector<float> copy = table;  // a copy is a table of its own
  EXPECT_TRUE(HugeAligned(copy.data()));
  EXPECT_NE(copy.data(), table.data());
  EXPECT_TRUE(copy == table);
  copy.resize(2 * n, -1.0f);  // regrows through the allocator, keeping the values
  EXPECT_TRUE(HugeAligned(copy.data()));
  EXPECT_EQ(copy[n - 1], table[n - 1]);
  EXPECT_EQ(copy[2 * n - 1], -1.0f);
}

TEST(HugePages, SmallTablesComeFromTheUsualAllocator) {
  HugePageVector<uint32_t> small(1000, 7u);
  EXPECT_EQ(small[999], 7u);
  small.assign(kHugePageBytes / sizeof(uint32_t), 3u);  // exactly one huge page: aligned
  EXPECT_TRUE(HugeAligned(small.data()));
  small.clear();
  small.shrink_to_fit();
  small.push_back(9u);
  EXPECT_EQ(small[0], 9u);
}

TEST(HugePages, AdviceCoversOnlyWholeAlignedHugePages) {
  std::vector<char> tiny(4096);
  EXPECT_EQ(AdviseHugePages(tiny.data(), tiny.size()), 0u);
  HugePageVector<char> buffer(3 * kHugePageBytes);
  // From one byte in: the two whole huge pages after the first boundary.
  const size_t advised = AdviseHugePages(buffer.data() + 1, buffer.size() - 1);
  // MADV_HUGEPAGE fails only on a kernel built without THP, which has no
  // sysfs entry for it (the setting "never" still takes the advice).
  if (!std::ifstream("/sys/kernel/mm/transparent_hugepage/enabled")) {
    GTEST_SKIP() << "this kernel has no transparent huge pages: madvise refuses, which leaves "
                    "the tables on small pages";
  }
  EXPECT_EQ(advised, 2 * kHugePageBytes);
  // The part past the last whole huge page is not advised (it would cost up
  // to 2 MiB more than the table's size).
  EXPECT_EQ(AdviseHugePages(buffer.data(), 2 * kHugePageBytes + 4096), 2 * kHugePageBytes);
}

}  // namespace
}  // namespace gridsync
