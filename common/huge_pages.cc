#include "common/huge_pages.h"

#include <sys/mman.h>

#include <cstdint>

namespace gridsync {

namespace {
constexpr uintptr_t kHugePage = kHugePageBytes;
#ifndef MADV_COLLAPSE
constexpr int MADV_COLLAPSE = 25;  // Linux 6.1; older headers lack it
#endif
}  // namespace

size_t AdviseHugePages(void* data, size_t bytes) {
  const auto begin = reinterpret_cast<uintptr_t>(data);
  const uintptr_t first = (begin + kHugePage - 1) & ~(kHugePage - 1);
  const uintptr_t last = (begin + bytes) & ~(kHugePage - 1);
  if (last <= first) return 0;
  void* at = reinterpret_cast<void*>(first);
  const size_t length = last - first;
  if (madvise(at, length, MADV_HUGEPAGE) != 0) return 0;
  // Pages already present are collapsed now (a range not yet written has
  // none and costs nothing); failure (no free huge pages, an old kernel)
  // leaves them small, which is only slower.
  (void)madvise(at, length, MADV_COLLAPSE);
  return length;
}

}  // namespace gridsync
