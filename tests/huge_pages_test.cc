// HugePageVector and AdviseHugePages (common/huge_pages.h): large tables
// come 2 MiB-aligned and behave as any vector; small ranges are left alone.

#include "common/huge_pages.h"

#include <gtest/gtest.h>
#include <sys/mman.h>
#include <unistd.h>

#include <cstdint>
#include <fstream>
#include <numeric>
#include <string>
#include <vector>

#include "common/message_heap.h"

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

// A process tuned for wire messages (common/message_heap.h: gridsync-ps,
// and any process that calls it) keeps freed blocks of many MiB in its
// heap. A table taken from there would start on memory already written on
// small pages; a mapping of its own starts empty and faults in on huge
// pages.
TEST(HugePages, LargeBlocksAreFreshMappingsWhateverTheHeapKeeps) {
  ASSERT_TRUE(TuneHeapForMessages());
  const size_t bytes = 3 * kHugePageBytes;
  {
    std::vector<char> written(bytes + kHugePageBytes, 1);  // freed into the heap, written
    EXPECT_EQ(written.back(), 1);
  }
  HugePageAllocator<char> allocator;
  char* block = allocator.allocate(bytes);
  EXPECT_TRUE(HugeAligned(block));
  const size_t page = static_cast<size_t>(sysconf(_SC_PAGESIZE));
  std::vector<unsigned char> resident((bytes + page - 1) / page);
  ASSERT_EQ(mincore(block, bytes, resident.data()), 0);
  size_t present = 0;
  for (unsigned char r : resident) present += r & 1;
  EXPECT_EQ(present, 0u) << "of " << resident.size()
                         << " pages: the block reused memory the heap kept, written on small "
                            "pages";
  block[bytes - 1] = 7;  // the whole block is usable
  EXPECT_EQ(block[bytes - 1], 7);
  allocator.deallocate(block, bytes);
}

}  // namespace
}  // namespace gridsync
