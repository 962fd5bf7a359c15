// The byte layout of saved training state (checkpoints): plain values and
// arrays of trivially copyable elements, appended to a string and taken
// back from the front of a string_view. Take* never read past the end: they
// return false, and leave the view alone, when too few bytes remain.
//
// Thread safety: pure functions on the caller's buffers.
#pragma once

#include <cstddef>
#include <cstring>
#include <string>
#include <string_view>
#include <type_traits>
#include <vector>

namespace gridsync {

template <typename T>
void AppendValue(std::string* out, T v) {
  static_assert(std::is_trivially_copyable_v<T>);
  out->append(reinterpret_cast<const char*>(&v), sizeof(T));
}

template <typename T>
bool TakeValue(std::string_view* in, T* v) {
  static_assert(std::is_trivially_copyable_v<T>);
  if (in->size() < sizeof(T)) return false;
  std::memcpy(v, in->data(), sizeof(T));
  in->remove_prefix(sizeof(T));
  return true;
}

// The elements of `v`, without their count (the reader knows it).
template <typename T, typename A>
void AppendArray(std::string* out, const std::vector<T, A>& v) {
  static_assert(std::is_trivially_copyable_v<T>);
  out->append(reinterpret_cast<const char*>(v.data()), v.size() * sizeof(T));
}

// Fills `v` (already sized) from the front of `in`. An empty `v` (a table
// of which a shard owns no rows) takes nothing: its data() may be null,
// which memcpy must never be given, even for no bytes.
template <typename T, typename A>
bool TakeArray(std::string_view* in, std::vector<T, A>* v) {
  static_assert(std::is_trivially_copyable_v<T>);
  const size_t bytes = v->size() * sizeof(T);
  if (in->size() < bytes) return false;
  if (bytes == 0) return true;
  std::memcpy(v->data(), in->data(), bytes);
  in->remove_prefix(bytes);
  return true;
}

// Resizes `v` to n elements taken from the front of `in` (n checked against
// what remains before anything is allocated).
template <typename T, typename A>
bool TakeArray(std::string_view* in, size_t n, std::vector<T, A>* v) {
  if (n > in->size() / sizeof(T)) return false;
  v->resize(n);
  return TakeArray(in, v);
}

}  // namespace gridsync
