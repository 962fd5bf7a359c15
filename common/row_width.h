// Hash-grid rows are 1, 2, 4 or 8 floats wide, and loops over scattered
// rows run markedly faster when the width is a compile-time constant: the
// compiler unrolls the row into a couple of moves instead of a counted loop
// with its branch per row (ShardStore::Gather was ~5 ns a row with the
// width read at run time).
//
// WithRowWidth(width, fn) calls fn(std::integral_constant<uint32_t, W>{})
// with W = width for those widths and W = 0 for any other, meaning "read
// the width at run time": RowWidth(W, width) gives the width either way.
//
// Thread safety: pure functions.
#pragma once

#include <cstdint>
#include <type_traits>
#include <utility>

namespace gridsync {

template <uint32_t W>
using RowWidthConstant = std::integral_constant<uint32_t, W>;

template <typename Fn>
decltype(auto) WithRowWidth(uint32_t width, Fn&& fn) {
  switch (width) {
    case 1:
      return std::forward<Fn>(fn)(RowWidthConstant<1>{});
    case 2:
      return std::forward<Fn>(fn)(RowWidthConstant<2>{});
    case 4:
      return std::forward<Fn>(fn)(RowWidthConstant<4>{});
    case 8:
      return std::forward<Fn>(fn)(RowWidthConstant<8>{});
    default:
      return std::forward<Fn>(fn)(RowWidthConstant<0>{});
  }
}

// The width inside fn: the constant where there is one, else `width`.
constexpr uint32_t RowWidth(uint32_t constant, uint32_t width) {
  return constant > 0 ? constant : width;
}

}  // namespace gridsync
