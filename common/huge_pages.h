// Transparent huge pages for large tables read and written at random rows.
//
// The hash grid's finest levels, their gradients and their Adam moments
// are tables of many MiB touched at scattered rows: with 4 KiB pages
// nearly every touched row is also a TLB miss and a page walk. Linux backs
// memory with 2 MiB pages where a process asks for them (madvise
// MADV_HUGEPAGE), which the common THP setting "madvise" requires.
// Measured in `gridsync-bench train` (one thread, bf16 MLP, 3 alternating
// runs, 2026-12-02, THP "madvise", an AMD EPYC): median 23.65 ms a step on
// small pages, 21.36 ms with the grid, its gradient and its Adam state on
// huge pages.
//
// Two ways in: HugePageVector for tables made for it (2 MiB-aligned, so
// the whole table is covered, advised before the first write), and
// AdviseHugePages for an existing vector's storage (its 2 MiB-aligned
// interior, collapsed in place with MADV_COLLAPSE, Linux 6.1+, rather than
// left to khugepaged, which scans a few MiB every 10 s).
//
// Best effort: where the kernel refuses (older kernels, THP "never", no
// memory for huge pages) the memory stays on small pages and nothing else
// changes.
//
// Thread safety: safe from any thread; a range advised must stay
// allocated during the call.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <memory>
#include <new>
#include <vector>

namespace gridsync {

inline constexpr size_t kHugePageBytes = size_t{2} << 20;

// Advises huge pages for the 2 MiB-aligned part of [data, data + bytes)
// and collapses what is already present. Returns the bytes advised (0 for
// a range without a whole aligned huge page, or when the kernel refused).
size_t AdviseHugePages(void* data, size_t bytes);

// Maps `bytes` (at least one huge page) at a 2 MiB boundary, straight from
// the kernel, and advises its whole huge pages; throws std::bad_alloc when
// the kernel refuses. UnmapHugeBlock returns it.
//
// Why not malloc: where the block comes from would then follow malloc's
// thresholds. A process that raises glibc's mmap threshold for its wire
// messages (common/message_heap.h) got these tables from the heap, as
// memory already written on small pages, and its trainer slowed by some
// 8-10% (`gridsync-bench train`, GLIBC_TUNABLES with the same thresholds,
// alternated runs, 2026-12-03). A fresh mapping is faulted in on huge pages
// from its first write, whatever the heap does.
void* MapHugeBlock(size_t bytes);
void UnmapHugeBlock(void* block, size_t bytes) noexcept;

// Allocations of at least one huge page are 2 MiB-aligned mappings of
// their own (MapHugeBlock), whole huge pages advised before use; smaller
// ones come from std::allocator. The mapping covers the block's size
// rounded to small pages, and the part past the last whole huge page stays
// on small pages, so a table uses the memory of its size (what memory
// checks such as ShardMemoryBytes count), not up to 2 MiB more.
template <typename T>
struct HugePageAllocator {
  using value_type = T;
  HugePageAllocator() noexcept = default;
  template <typename U>
  HugePageAllocator(const HugePageAllocator<U>&) noexcept {}

  T* allocate(size_t n) {
    if (n > (SIZE_MAX - kHugePageBytes) / sizeof(T)) throw std::bad_array_new_length();
    const size_t bytes = n * sizeof(T);
    if (bytes < kHugePageBytes) return std::allocator<T>().allocate(n);
    return static_cast<T*>(MapHugeBlock(bytes));
  }
  void deallocate(T* p, size_t n) noexcept {
    if (n * sizeof(T) < kHugePageBytes) return std::allocator<T>().deallocate(p, n);
    UnmapHugeBlock(p, n * sizeof(T));
  }
  template <typename U>
  bool operator==(const HugePageAllocator<U>&) const noexcept {
    return true;
  }
};

template <typename T>
using HugePageVector = std::vector<T, HugePageAllocator<T>>;

}  // namespace gridsync
