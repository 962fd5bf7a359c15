#include "common/huge_pages.h"

#include <sys/mman.h>
#include <unistd.h>

#include <cstdint>
#include <new>

namespace gridsync {

namespace {
constexpr uintptr_t kHugePage = kHugePageBytes;
#ifndef MADV_COLLAPSE
constexpr int MADV_COLLAPSE = 25;  // Linux 6.1; older headers lack it
#endif

// The small-page size the kernel maps in (4 KiB on x86-64; larger on some
// arm64 kernels, so asked once).
uintptr_t SmallPage() {
  static const uintptr_t page = [] {
    const long got = sysconf(_SC_PAGESIZE);
    return got > 0 ? static_cast<uintptr_t>(got) : uintptr_t{4096};
  }();
  return page;
}

uintptr_t MappedBytes(size_t bytes) { return (bytes + SmallPage() - 1) & ~(SmallPage() - 1); }
}  // namespace

void* MapHugeBlock(size_t bytes) {
  // No host maps half the address space; the sums below cannot wrap.
  if (bytes > SIZE_MAX / 2) throw std::bad_alloc();
  const uintptr_t length = MappedBytes(bytes);
  // Over-map by a huge page, then give back the head before the first
  // 2 MiB boundary and the tail past the block.
  void* raw =
      mmap(nullptr, length + kHugePage, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (raw == MAP_FAILED) throw std::bad_alloc();
  const auto begin = reinterpret_cast<uintptr_t>(raw);
  const uintptr_t aligned = (begin + kHugePage - 1) & ~(kHugePage - 1);
  if (aligned > begin) munmap(raw, aligned - begin);
  const uintptr_t end = begin + length + kHugePage;
  if (end > aligned + length)
    munmap(reinterpret_cast<void*>(aligned + length), end - aligned - length);
  void* block = reinterpret_cast<void*>(aligned);
  AdviseHugePages(block, bytes);
  return block;
}

void UnmapHugeBlock(void* block, size_t bytes) noexcept { munmap(block, MappedBytes(bytes)); }

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
