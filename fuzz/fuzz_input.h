// Splitting a fuzzer's byte string into the pieces a target needs: a small
// reader that never reads past the end (short input yields zeros).
//
// Thread safety: one reader per input.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <string>

namespace gridsync::fuzz {

class FuzzInput {
 public:
  FuzzInput(const uint8_t* data, size_t size) : data_(data), size_(size) {}

  template <typename T>
  T Take() {
    T value{};
    const size_t n = pos_ + sizeof(T) <= size_ ? sizeof(T) : size_ - pos_;
    std::memcpy(&value, data_ + pos_, n);
    pos_ += n;
    return value;
  }
  // Up to n bytes (fewer at the end).
  std::string Bytes(size_t n) {
    const size_t take = n < size_ - pos_ ? n : size_ - pos_;
    std::string out(reinterpret_cast<const char*>(data_ + pos_), take);
    pos_ += take;
    return out;
  }
  std::string Rest() { return Bytes(size_ - pos_); }
  size_t left() const { return size_ - pos_; }

 private:
  const uint8_t* data_;
  size_t size_;
  size_t pos_ = 0;
};

}  // namespace gridsync::fuzz
