// UninitVector<T>: a std::vector whose resize and sized constructor leave
// new elements of trivial types uninitialised, for buffers that are written
// whole right after they are made (decoded row ids, frames). Zero-filling
// them first was a second pass over memory as large as the message: at a
// 16 MiB push, 1.5 ms of the shard's serving thread (perf) before any
// decoding began.
//
// Thread safety: as std::vector.
#pragma once

#include <memory>
#include <type_traits>
#include <utility>
#include <vector>

namespace gridsync {

// std::allocator, except that value-initialisation (construct(p) with no
// arguments) default-initialises: nothing for trivial types. Construction
// with arguments is unchanged.
template <typename T>
struct DefaultInitAllocator : std::allocator<T> {
  using value_type = T;
  template <typename U>
  struct rebind {
    using other = DefaultInitAllocator<U>;
  };
  DefaultInitAllocator() noexcept = default;
  template <typename U>
  DefaultInitAllocator(const DefaultInitAllocator<U>&) noexcept {}

  template <typename U>
  void construct(U* p) noexcept(std::is_nothrow_default_constructible_v<U>) {
    ::new (static_cast<void*>(p)) U;
  }
  template <typename U, typename... Args>
  void construct(U* p, Args&&... args) {
    std::allocator_traits<std::allocator<T>>::construct(static_cast<std::allocator<T>&>(*this), p,
                                                        std::forward<Args>(args)...);
  }
};

template <typename T, typename U>
bool operator==(const DefaultInitAllocator<T>&, const DefaultInitAllocator<U>&) noexcept {
  return true;
}

template <typename T>
using UninitVector = std::vector<T, DefaultInitAllocator<T>>;

}  // namespace gridsync
