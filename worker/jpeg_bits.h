// Entropy-coded JPEG data for the scan walkers (jpeg_scan_check.cc,
// jpeg_progressive_scan.cc): Huffman tables as DHT gives them, and a bit
// reader that ends where stb_image would start reading zeros (a marker, or
// the end of the file), so a walker knows when a scan's data ran out.
//
// Thread safety: values; a Bits reads one scan from one thread.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <vector>

namespace gridsync::jpeg_scan_check {

// A Huffman table as JPEG's DHT gives it: for each length, the first code
// and the index of its first symbol.
struct Huffman {
  bool defined = false;
  std::array<int32_t, 17> max_code{};  // the largest code of each length, -1: none
  std::array<int32_t, 17> offset{};    // symbol index = code + offset[length]
  std::vector<uint8_t> symbols;
};

inline Huffman BuildHuffman(const uint8_t* counts, const uint8_t* symbols, size_t n) {
  Huffman h;
  h.defined = true;
  h.symbols.assign(symbols, symbols + n);
  int32_t code = 0;
  int32_t index = 0;
  for (int length = 1; length <= 16; ++length) {
    const int32_t count = counts[length - 1];
    h.offset[length] = index - code;
    h.max_code[length] = count > 0 ? code + count - 1 : -1;
    index += count;
    code = (code + count) << 1;
  }
  return h;
}

// Entropy-coded bits, with 0xFF00 stuffing; a marker ends the data (stb
// then reads zeros, which is what is checked against).
class Bits {
 public:
  Bits(const uint8_t* data, size_t size, size_t pos) : data_(data), size_(size), pos_(pos) {}
  // -1 when the data ended (a marker, or the end of the file).
  int Bit() {
    if (left_ == 0) {
      if (ended_ || pos_ >= size_) return ended_ = true, -1;
      uint8_t byte = data_[pos_];
      if (byte == 0xFF) {
        // Fill bytes (more 0xFF) before the stuffed 0x00, as stb skips them.
        size_t next = pos_ + 1;
        while (next < size_ && data_[next] == 0xFF) ++next;
        if (next < size_ && data_[next] == 0x00) {
          pos_ = next + 1;
        } else {
          ended_ = true;  // a marker: restart, EOI or another segment
          return -1;
        }
      } else {
        ++pos_;
      }
      current_ = byte;
      left_ = 8;
    }
    --left_;
    return (current_ >> left_) & 1;
  }
  // n bits, most significant first, into *value; false when the data ended.
  bool Value(int n, int32_t* value) {
    int32_t v = 0;
    for (int i = 0; i < n; ++i) {
      const int bit = Bit();
      if (bit < 0) return false;
      v = (v << 1) | bit;
    }
    *value = v;
    return true;
  }
  bool Skip(int n) {
    for (int i = 0; i < n; ++i) {
      if (Bit() < 0) return false;
    }
    return true;
  }
  // Decodes one symbol; -1 at the end of the data, -2 for a code the table
  // lacks (stb refuses that itself).
  int Decode(const Huffman& h) {
    int32_t code = 0;
    for (int length = 1; length <= 16; ++length) {
      const int bit = Bit();
      if (bit < 0) return -1;
      code = (code << 1) | bit;
      if (h.max_code[length] >= 0 && code <= h.max_code[length]) {
        const int32_t index = code + h.offset[length];
        if (index < 0 || static_cast<size_t>(index) >= h.symbols.size()) return -2;
        return h.symbols[static_cast<size_t>(index)];
      }
    }
    return -2;
  }
  // At a restart marker: the next byte boundary, past FF Dn.
  // The marker must follow the interval's last block at once (its byte
  // padded): stb reads no further for it, stops decoding when it is not
  // there, and on the way shifted by 32 bits (image_decode_fuzz: an
  // interval of 3 MCUs whose data ran on past them).
  bool Restart() {
    left_ = 0;
    ended_ = false;
    while (pos_ + 1 < size_ && data_[pos_] == 0xFF && data_[pos_ + 1] == 0xFF) ++pos_;  // fill
    if (pos_ + 1 >= size_ || data_[pos_] != 0xFF || data_[pos_ + 1] < 0xD0 ||
        data_[pos_ + 1] > 0xD7) {
      return false;
    }
    pos_ += 2;
    return true;
  }
  size_t pos() const { return pos_; }

 private:
  const uint8_t* data_;
  size_t size_;
  size_t pos_;
  uint8_t current_ = 0;
  int left_ = 0;
  bool ended_ = false;
};

}  // namespace gridsync::jpeg_scan_check
