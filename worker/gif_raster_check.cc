#include "worker/gif_raster_check.h"

#include <algorithm>
#include <string>
#include <vector>

namespace gridsync::gif_raster_check {

Status CheckRaster(const uint8_t* data, size_t size, size_t pos, uint32_t table_entries,
                   uint64_t pixels) {
  // stb reads bytes past the end as 0: an LZW size of 0, an empty block.
  auto byte = [&](size_t at) -> uint32_t { return at < size ? data[at] : 0; };
  const uint32_t lzw_cs = byte(pos++);
  if (lzw_cs > 12) return Status::OK();  // stb refuses it
  struct Code {
    uint64_t length;  // of its string of indices
    uint32_t first;   // its first index
    uint32_t max;     // its largest index
  };
  std::vector<Code> codes(8192);
  const int32_t clear = 1 << lzw_cs;
  // stb keeps a code's index in a byte: with a code size over 8 bits, root
  // code c draws index c mod 256.
  for (int32_t c = 0; c < clear; ++c) {
    const uint32_t index = static_cast<uint32_t>(c) & 0xFF;
    codes[static_cast<size_t>(c)] = {1, index, index};
  }
  int32_t codesize = static_cast<int32_t>(lzw_cs) + 1;
  int32_t codemask = (1 << codesize) - 1;
  int32_t avail = clear + 2, oldcode = -1;
  bool first = true;
  uint32_t bits = 0;
  int32_t valid_bits = 0;
  uint32_t len = 0;
  uint64_t drawn = 0;
  const auto count = [&]() -> Status {
    if (drawn >= pixels) return Status::OK();
    return Status::InvalidArgument("GIF frame's data codes " + std::to_string(drawn) + " of its " +
                                   std::to_string(pixels) +
                                   " pixels (cut short; the rest would decode as black)");
  };
  for (;;) {
    if (valid_bits < codesize) {
      if (len == 0) {
        len = byte(pos++);
        if (len == 0) return count();  // the data's terminator
      }
      --len;
      bits |= byte(pos++) << valid_bits;
      valid_bits += 8;
      continue;
    }
    const int32_t code = static_cast<int32_t>(bits & static_cast<uint32_t>(codemask));
    bits >>= codesize;
    valid_bits -= codesize;
    if (code == clear) {
      codesize = static_cast<int32_t>(lzw_cs) + 1;
      codemask = (1 << codesize) - 1;
      avail = clear + 2;
      oldcode = -1;
      first = false;
    } else if (code == clear + 1) {
      return count();  // end of information
    } else if (code <= avail) {
      if (first) return Status::OK();  // stb: "no clear code"
      if (oldcode >= 0) {
        if (avail + 1 > 8192) return Status::OK();  // stb: "too many codes"
        Code& p = codes[static_cast<size_t>(avail)];
        const Code& prefix = codes[static_cast<size_t>(oldcode)];
        // As stb: a code one past the table (KwKwK) ends with its own first.
        const uint32_t suffix =
            code == avail ? prefix.first : codes[static_cast<size_t>(code)].first;
        p = {prefix.length + 1, prefix.first, std::max(prefix.max, suffix)};
        ++avail;
      } else if (code == avail) {
        return Status::OK();  // stb: "illegal code in raster"
      }
      const Code& out = codes[static_cast<size_t>(code)];
      if (out.max >= table_entries) {
        return Status::InvalidArgument(
            "GIF frame indexes entry " + std::to_string(out.max) + " (in pixels " +
            std::to_string(drawn) + " to " + std::to_string(drawn + out.length - 1) +
            ") past its colour table's " + std::to_string(table_entries) + " entries");
      }
      drawn += out.length;
      if ((avail & codemask) == 0 && avail <= 0x0FFF) {
        ++codesize;
        codemask = (1 << codesize) - 1;
      }
      oldcode = code;
    } else {
      return Status::OK();  // stb: "illegal code in raster"
    }
  }
}

}  // namespace gridsync::gif_raster_check
