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

// Allocations of at least one huge page are 2 MiB-aligned and their whole
// huge pages advised before use; smaller ones come from std::allocator.
// The block is rounded up to whole huge pages (aligned_alloc wants a
// multiple of the alignment), but the part past the last whole page is not
// advised: it stays on small pages, so a table uses the memory of its size
// (what memory checks such as ShardStore::BytesFor count), not up to 2 MiB
// more.
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
    const size_t rounded = (bytes + kHugePageBytes - 1) / kHugePageBytes * kHugePageBytes;
    void* p = std::aligned_alloc(kHugePageBytes, rounded);
    if (p == nullptr) throw std::bad_alloc();
    AdviseHugePages(p, bytes);
    return static_cast<T*>(p);
  }
  void deallocate(T* p, size_t n) noexcept {
    if (n * sizeof(T) < kHugePageBytes) return std::allocator<T>().deallocate(p, n);
    std::free(p);
  }
  template <typename U>
  bool operator==(const HugePageAllocator<U>&) const noexcept {
    return true;
  }
};

template <typename T>
using HugePageVector = std::vector<T, HugePageAllocator<T>>;

}  // namespace gridsync
