#include "worker/image_dimensions.h"

#include <cstring>

#include "worker/image_data_checks.h"
#include "worker/image_precheck.h"

namespace gridsync::image_dimensions {
namespace {

using image_data_checks::Le16;
using image_data_checks::Le32;

uint32_t Be16(const uint8_t* p) { return uint32_t{p[0]} << 8 | p[1]; }

bool StartsWith(const uint8_t* data, size_t size, const char* magic, size_t n) {
  return size >= n && std::memcmp(data, magic, n) == 0;
}

// The first SOF marker's, the segments walked from SOI (0xFF fill allowed).
std::optional<Dimensions> Jpeg(const uint8_t* data, size_t size) {
  size_t pos = 1;
  while (pos < size && data[pos] == 0xFF) ++pos;
  if (pos >= size || data[pos] != 0xD8) return std::nullopt;
  ++pos;
  while (pos + 4 <= size) {
    if (data[pos] != 0xFF) return std::nullopt;
    while (pos + 1 < size && data[pos + 1] == 0xFF) ++pos;  // fill bytes
    if (pos + 4 > size) return std::nullopt;
    const uint8_t marker = data[pos + 1];
    // SOF0-15 but DHT (C4), JPG (C8) and DAC (CC): length, precision,
    // height, width.
    if (marker >= 0xC0 && marker <= 0xCF && marker != 0xC4 && marker != 0xC8 && marker != 0xCC) {
      if (pos + 9 > size) return std::nullopt;
      return Dimensions{Be16(data + pos + 7), Be16(data + pos + 5)};
    }
    // Scan data or the end before a frame header: none to read.
    if (marker == 0xDA || marker == 0xD9) return std::nullopt;
    // Standalone markers carry no length.
    if (marker == 0x01 || (marker >= 0xD0 && marker <= 0xD7)) {
      pos += 2;
      continue;
    }
    pos += 2 + Be16(data + pos + 2);
  }
  return std::nullopt;
}

// P5 or P6: whitespace and # comments, width, height.
std::optional<Dimensions> Pnm(const uint8_t* data, size_t size) {
  size_t pos = 2;
  uint64_t numbers[2] = {};
  for (uint64_t& number : numbers) {
    for (;;) {
      while (pos < size && std::memchr(" \t\n\v\f\r", data[pos], 6) != nullptr) ++pos;
      if (pos >= size || data[pos] != '#') break;
      while (pos < size && data[pos] != '\n' && data[pos] != '\r') ++pos;
    }
    if (pos >= size || data[pos] < '0' || data[pos] > '9') return std::nullopt;
    while (pos < size && data[pos] >= '0' && data[pos] <= '9' && number < (uint64_t{1} << 40))
      number = number * 10 + (data[pos++] - '0');
  }
  return Dimensions{numbers[0], numbers[1]};
}

// |v| of a BMP's signed 32-bit field.
uint64_t Magnitude(uint32_t v) {
  const int64_t s = static_cast<int32_t>(v);
  return static_cast<uint64_t>(s < 0 ? -s : s);
}

}  // namespace

std::optional<Dimensions> HeaderDimensions(const uint8_t* data, size_t size) {
  if (uint32_t width = 0, height = 0; image_precheck::PngDimensions(data, size, &width, &height))
    return Dimensions{width, height};
  if (StartsWith(data, size, "\x89PNG\r\n\x1a\n", 8)) return std::nullopt;  // no IHDR
  if (size >= 2 && data[0] == 0xFF) return Jpeg(data, size);
  if (StartsWith(data, size, "GIF8", 4)) {
    if (size < 10) return std::nullopt;
    return Dimensions{Le16(data + 6), Le16(data + 8)};
  }
  if (StartsWith(data, size, "BM", 2)) {
    if (size < 26) return std::nullopt;
    // OS/2's 12-byte header has 16-bit sizes; the others 32-bit, signed.
    if (Le32(data + 14) == 12) return Dimensions{Le16(data + 18), Le16(data + 20)};
    return Dimensions{Magnitude(Le32(data + 18)), Magnitude(Le32(data + 22))};
  }
  if (StartsWith(data, size, "P5", 2) || StartsWith(data, size, "P6", 2)) return Pnm(data, size);
  // TGA has no signature: its header's sizes, as stb reads them.
  if (size >= 18) return Dimensions{Le16(data + 12), Le16(data + 14)};
  return std::nullopt;
}

}  // namespace gridsync::image_dimensions
