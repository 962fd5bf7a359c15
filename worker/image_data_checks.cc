#include "worker/image_data_checks.h"

#include <zlib.h>

#include <algorithm>
#include <cstring>
#include <set>
#include <string>

#include "worker/gif_raster_check.h"

namespace gridsync::image_data_checks {
namespace {

// stb's STBI_MAX_DIMENSIONS: past it stb refuses the file itself.
constexpr int64_t kStbMaxSide = int64_t{1} << 24;

Status CutShort(const char* format, const std::string& what, uint64_t need, uint64_t have) {
  return Status::InvalidArgument(std::string(format) + " cut short: " + what + " needs " +
                                 std::to_string(need) + " bytes, the file has " +
                                 std::to_string(have) + " (truncated or corrupt)");
}

// The index of pixel `x` in a row of 1, 4 or 8 bits a pixel, as stb reads
// it: the high bits first.
uint32_t IndexAt(const uint8_t* row, int64_t x, uint32_t bits) {
  if (bits == 8) return row[x];
  if (bits == 4) return x % 2 == 0 ? row[x / 2] >> 4 : row[x / 2] & 15;
  return (row[x / 8] >> (7 - x % 8)) & 1;
}

}  // namespace

Status CheckBmp(const uint8_t* data, size_t size) {
  if (size < 18) return CutShort("BMP", "a file header and info header size", 18, size);
  const int64_t offset = static_cast<int32_t>(Le32(data + 10));
  const uint32_t hsz = Le32(data + 14);
  if (hsz != 12 && hsz != 40 && hsz != 56 && hsz != 108 && hsz != 124) return Status::OK();
  const uint64_t header_end = 14 + uint64_t{hsz};
  if (size < std::max<uint64_t>(header_end, 14 + 12))
    return CutShort("BMP", "a header of " + std::to_string(hsz) + " bytes", header_end, size);
  int64_t width = 0, height = 0;
  uint32_t bits = 0;
  int32_t compression = 0;  // signed, as stb reads it: a negative one passes its checks
  if (hsz == 12) {
    width = Le16(data + 18);
    height = Le16(data + 20);
    bits = Le16(data + 24);
  } else {
    width = Le32(data + 18);  // unsigned to stb
    height = static_cast<int32_t>(Le32(data + 22));
    bits = Le16(data + 28);
    compression = static_cast<int32_t>(Le32(data + 30));
    if (compression == 1 || compression == 2 || compression >= 4) return Status::OK();  // stb: no
  }
  height = height < 0 ? -height : height;  // a top-down BMP's rows are stored negative
  if (width == 0 || height == 0 || width > kStbMaxSide || height > kStbMaxSide) return Status::OK();
  if (bits != 1 && bits != 4 && bits != 8 && bits != 16 && bits != 24 && bits != 32) {
    return Status::InvalidArgument("BMP of " + std::to_string(bits) +
                                   " bits a pixel; allowed: 1, 4, 8, 16, 24 or 32");
  }
  // stb reads three masks after a 40-byte header for bitfields.
  const int64_t extra_read = 14 + (hsz == 40 && compression == 3 ? 12 : 0);
  int64_t entries = 0;
  int64_t pixels_at = offset;
  if (bits <= 8) {
    // stb's palette size, as it computes it (a 12-byte header's from an
    // offset 24 bytes past it), and its skip to the pixels after it.
    const int64_t entry_bytes = hsz == 12 ? 3 : 4;
    entries = hsz == 12 ? (offset - extra_read - 24) / 3 : (offset - extra_read - hsz) >> 2;
    if (entries < 1 || entries > 256) {
      // Sized as stb sizes it, from the room before the pixel data (the
      // header's colour count, which a probe set to 0xFFFFFFFF, is not read).
      return Status::InvalidArgument(
          "BMP of " + std::to_string(bits) + " bits a pixel with room for " +
          std::to_string(std::max<int64_t>(entries, 0)) +
          " palette entries between its header and its pixel data (offset " +
          std::to_string(offset) +
          "; the palette is sized from that room, not from the header's colour count); "
          "allowed: room for 1 to 256 entries");
    }
    const int64_t palette_end = extra_read + hsz + entries * entry_bytes;
    if (palette_end > static_cast<int64_t>(size)) {
      return CutShort("BMP", "a palette of " + std::to_string(entries) + " entries",
                      static_cast<uint64_t>(palette_end), size);
    }
    if (offset < palette_end) {
      return Status::InvalidArgument("BMP pixel data offset " + std::to_string(offset) +
                                     " inside its palette (which ends at " +
                                     std::to_string(palette_end) + ")");
    }
  } else if (offset < extra_read + static_cast<int64_t>(hsz)) {
    return Status::InvalidArgument("BMP pixel data offset " + std::to_string(offset) +
                                   " inside its header");
  }
  const int64_t row_bytes = bits == 1   ? (width + 7) / 8
                            : bits == 4 ? (width + 1) / 2
                                        : width * bits / 8;
  const int64_t stride = (row_bytes + 3) / 4 * 4;
  const uint64_t need = static_cast<uint64_t>(pixels_at + stride * (height - 1) + row_bytes);
  if (need > size) {
    return CutShort("BMP",
                    std::to_string(width) + " x " + std::to_string(height) + " pixels of " +
                        std::to_string(bits) + " bits",
                    need, size);
  }
  if (bits <= 8 && entries < (int64_t{1} << bits)) {
    for (int64_t y = 0; y < height; ++y) {
      const uint8_t* row = data + pixels_at + y * stride;
      for (int64_t x = 0; x < width; ++x) {
        if (const uint32_t index = IndexAt(row, x, bits); index >= entries) {
          return Status::InvalidArgument("BMP pixel " + std::to_string(x) + " of stored row " +
                                         std::to_string(y) + " is palette index " +
                                         std::to_string(index) + ", past the palette's " +
                                         std::to_string(entries) + " entries (corrupt)");
        }
      }
    }
  }
  return Status::OK();
}

bool IsTgaHeader(const uint8_t* header18) {
  const uint8_t* data = header18;
  const uint32_t cmap = data[1], type = data[2], pal_bits = data[7], bits = data[16];
  const auto depth_ok = [](uint32_t b) {
    return b == 8 || b == 15 || b == 16 || b == 24 || b == 32;
  };
  if (cmap > 1) return false;
  if (cmap == 1 && ((type != 1 && type != 9) || !depth_ok(pal_bits))) return false;
  if (cmap == 0 && type != 2 && type != 3 && type != 10 && type != 11) return false;
  if (Le16(data + 12) < 1 || Le16(data + 14) < 1) return false;
  return !((cmap == 1 && bits != 8 && bits != 16) || !depth_ok(bits));
}

Status CheckTga(const uint8_t* data, size_t size) {
  // stb reads past the end as zeros, and its TGA test only bytes 0 to 16:
  // a shorter file is judged on its bytes and zeros, so 17 bytes of header
  // passed as a black image (a hostile probe).
  uint8_t header[18] = {};
  std::memcpy(header, data, std::min<size_t>(size, 18));
  if (size < 18) {
    if (CheckTga(header, 18).ok()) return Status::OK();  // no TGA to stb either way
    return CutShort("TGA", "a header", 18, size);
  }
  // stbi__tga_test: not a TGA to stb, so not ours to check.
  if (!IsTgaHeader(data)) return Status::OK();
  const uint32_t cmap = data[1], type = data[2], pal_bits = data[7], bits = data[16];
  const uint64_t width = Le16(data + 12), height = Le16(data + 14);

  const bool rle = type >= 8;
  // Bytes a palette entry and a pixel take in the file (stbi__tga_get_comp:
  // 15 and 16 bits are 2 bytes of RGB, or grey + alpha for grey).
  const uint64_t entry_bytes = pal_bits == 15 ? 2 : pal_bits / 8;
  const uint64_t pixel_bytes = cmap == 1 ? bits / 8 : (bits == 15 ? 2 : bits / 8);
  uint64_t pos = 18 + uint64_t{data[0]};
  if (cmap == 1) pos += Le16(data + 3) + uint64_t{Le16(data + 5)} * entry_bytes;
  if (pos > size) return CutShort("TGA", "a header, id and palette", pos, size);
  const uint64_t pixels = width * height;
  // A colour-mapped pixel past the map's entries: stb takes entry 0 for it
  // without a word, and the image trained on colours it does not hold (a
  // hostile probe; BMP and PNG refuse the same damage).
  const uint64_t entries = Le16(data + 5);
  const auto index_fits = [&](uint64_t at, uint64_t pixel) -> Status {
    if (cmap != 1) return Status::OK();
    const uint64_t index = pixel_bytes == 2 ? Le16(data + at) : data[at];
    if (index < entries) return Status::OK();
    return Status::InvalidArgument("TGA pixel " + std::to_string(pixel) +
                                   " indexes colour-map entry " + std::to_string(index) +
                                   ", past the map's " + std::to_string(entries) +
                                   " entries (corrupt)");
  };
  if (!rle) {
    const uint64_t need = pos + pixels * pixel_bytes;
    if (need > size) {
      return CutShort("TGA", std::to_string(width) + " x " + std::to_string(height) + " pixels",
                      need, size);
    }
    for (uint64_t i = 0; cmap == 1 && i < pixels; ++i)
      GRIDSYNC_RETURN_IF_ERROR(index_fits(pos + i * pixel_bytes, i));
    return Status::OK();
  }
  // RLE packets: a count byte, then one pixel (a run) or count pixels.
  uint64_t covered = 0;
  while (covered < pixels) {
    if (pos >= size) {
      return CutShort("TGA",
                      "RLE data for " + std::to_string(pixels) + " pixels (" +
                          std::to_string(covered) + " covered)",
                      pos + 1, size);
    }
    const uint8_t packet = data[pos++];
    const uint64_t count = (packet & 127) + 1;
    const uint64_t values = (packet & 128) ? 1 : count;
    if (pos + values * pixel_bytes > size) {
      return CutShort("TGA", "RLE data for " + std::to_string(pixels) + " pixels",
                      pos + values * pixel_bytes, size);
    }
    for (uint64_t v = 0; cmap == 1 && v < values; ++v)
      GRIDSYNC_RETURN_IF_ERROR(index_fits(pos + v * pixel_bytes, covered + v));
    pos += values * pixel_bytes;
    covered += count;
  }
  return Status::OK();
}

Status CheckGif(const uint8_t* data, size_t size) {
  uint64_t pos = 13;  // signature and logical screen descriptor
  if (pos > size) return CutShort("GIF", "a screen descriptor", pos, size);
  const auto table = [](uint8_t flags) -> uint64_t {
    return (flags & 0x80) ? uint64_t{3} << ((flags & 7) + 1) : 0;
  };
  pos += table(data[10]);
  // Sub-blocks up to their empty terminator.
  const auto blocks = [&](const char* what) -> Status {
    for (;;) {
      if (pos >= size) return CutShort("GIF", what, pos + 1, size);
      const uint8_t length = data[pos++];
      if (length == 0) return Status::OK();
      pos += length;
    }
  };
  for (;;) {
    if (pos >= size) return CutShort("GIF", "a block or an image", pos + 1, size);
    const uint8_t kind = data[pos];
    if (kind == 0x21) {  // extension: label, then sub-blocks
      pos += 2;
      GRIDSYNC_RETURN_IF_ERROR(blocks("an extension's data"));
    } else if (kind == 0x2C) {  // image: descriptor, local table, LZW size, data
      if (pos + 10 > size) return CutShort("GIF", "an image descriptor", pos + 10, size);
      const uint8_t* d = data + pos;
      const auto u16 = [](const uint8_t* at) { return static_cast<uint32_t>(at[0] | at[1] << 8); };
      const uint32_t left = u16(d + 1), top = u16(d + 3), width = u16(d + 5), height = u16(d + 7);
      const uint32_t screen_width = u16(data + 6), screen_height = u16(data + 8);
      // stb decodes the logical screen and draws only the first frame; the
      // rest is background (GIF89a allows a smaller first frame: a canvas).
      // A 1x1 frame on a 16384x16384 screen (43 bytes) was 268M pixels of
      // background, all but one: refused where the background outweighs
      // the frame 64 to 1 and is over 2^20 pixels (a frame past the screen
      // stb refuses itself).
      // A frame past the screen: stb refuses it as "bad Image Descriptor",
      // which said neither what was wrong nor what is allowed (a probe).
      if (uint64_t{left} + width > screen_width || uint64_t{top} + height > screen_height) {
        return Status::InvalidArgument(
            "GIF frame of " + std::to_string(width) + "x" + std::to_string(height) +
            " pixels at (" + std::to_string(left) + ", " + std::to_string(top) +
            ") reaches past its " + std::to_string(screen_width) + "x" +
            std::to_string(screen_height) +
            " logical screen; allowed: frames within the screen (stb_image decodes no other)");
      }
      const uint64_t frame_pixels = uint64_t{width} * height;
      const uint64_t screen_pixels = uint64_t{screen_width} * screen_height;
      if (left + width <= screen_width && top + height <= screen_height &&
          screen_pixels - frame_pixels > (uint64_t{1} << 20) &&
          screen_pixels - frame_pixels > 64 * frame_pixels) {
        return Status::InvalidArgument(
            "GIF's first frame covers " + std::to_string(width) + "x" + std::to_string(height) +
            " pixels at (" + std::to_string(left) + ", " + std::to_string(top) + ") of its " +
            std::to_string(screen_width) + "x" + std::to_string(screen_height) +
            " logical screen, the rest " + std::to_string(screen_pixels - frame_pixels) +
            " pixels of background; allowed: a first frame of at least 1/65 of the screen, or "
            "at most 1048576 pixels of background");
      }
      // The frame's table: its own, else the global one (stb refuses none).
      const uint8_t flags = (d[9] & 0x80) ? d[9] : data[10];
      const uint32_t entries = (flags & 0x80) ? 2u << (flags & 7) : 0;
      pos += 10 + table(d[9]);
      const size_t lzw = pos++;
      GRIDSYNC_RETURN_IF_ERROR(blocks("the first image's data"));
      if (entries == 0) return Status::OK();
      return gif_raster_check::CheckRaster(data, size, lzw, entries, frame_pixels);
    } else {
      return Status::OK();  // trailer or unknown: stb refuses a GIF without an image
    }
  }
}

Status CheckJpegFrame(const JpegFrame& frame, uint64_t entropy_bytes) {
  const uint8_t m = frame.marker;
  if (m != 0xC0 && m != 0xC1 && m != 0xC2) {
    const bool arithmetic = m >= 0xC9;
    const bool lossless = m == 0xC3 || m == 0xC7 || m == 0xCB || m == 0xCF;
    const char* process = lossless ? "lossless" : arithmetic ? "arithmetic-coded" : "hierarchical";
    return Status::InvalidArgument(std::string(arithmetic && !lossless ? "an " : "a ") + process +
                                   " JPEG is not supported (only baseline, extended and "
                                   "progressive Huffman-coded ones are)");
  }
  if (frame.precision != 8) {
    return Status::InvalidArgument("a JPEG of " + std::to_string(frame.precision) +
                                   "-bit samples is not supported (only 8-bit ones are)");
  }
  if (frame.width == 0 || frame.height == 0 || frame.components.empty()) return Status::OK();
  int h_max = 1, v_max = 1;
  for (const auto& c : frame.components) {
    h_max = std::max(h_max, c.h);
    v_max = std::max(v_max, c.v);
  }
  uint64_t blocks = 0;
  for (const auto& c : frame.components) {
    const uint64_t w = (uint64_t{frame.width} * c.h + h_max - 1) / h_max;
    const uint64_t h = (uint64_t{frame.height} * c.v + v_max - 1) / v_max;
    blocks = std::max(blocks, ((w + 7) / 8) * ((h + 7) / 8));
  }
  if (entropy_bytes * 8 < blocks) {
    return Status::InvalidArgument(
        "JPEG of " + std::to_string(frame.width) + " x " + std::to_string(frame.height) +
        " pixels holds " + std::to_string(entropy_bytes) + " bytes of coded data, where its " +
        std::to_string(blocks) + " blocks of one component need at least " +
        std::to_string((blocks + 7) / 8) + " (truncated, or its size patched)");
  }
  return Status::OK();
}

std::vector<uint8_t> PngWithSentinelPalette(const uint8_t* data, size_t size, uint8_t sentinel[3],
                                            uint32_t* entries) {
  // The chunks were checked (image_precheck's CheckPng: each within the
  // file, one PLTE at most); the bounds are kept here too. stb takes the
  // first IHDR wherever it is (CgBI chunks may come first).
  std::set<uint32_t> colours;
  int colour_type = -1;
  for (size_t pos = 8; pos + 12 <= size;) {
    const uint32_t length = Be32(data + pos);
    if (length > size - pos - 12) return {};
    const uint8_t* type = data + pos + 4;
    if (std::memcmp(type, "IHDR", 4) == 0 && colour_type < 0 && length >= 13)
      colour_type = data[pos + 8 + 9];
    if (std::memcmp(type, "PLTE", 4) == 0) {
      for (uint32_t i = 0; i + 3 <= length; i += 3) {
        const uint8_t* c = data + pos + 8 + i;
        colours.insert(uint32_t{c[0]} << 16 | uint32_t{c[1]} << 8 | c[2]);
      }
    }
    if (std::memcmp(type, "IEND", 4) == 0) break;
    pos += 12 + size_t{length};
  }
  if (colour_type != 3) return {};
  uint32_t pick = 0x010203;  // at most 256 colours are taken: 256 steps at most
  while (colours.count(pick) != 0) ++pick;
  sentinel[0] = static_cast<uint8_t>(pick >> 16);
  sentinel[1] = static_cast<uint8_t>(pick >> 8);
  sentinel[2] = static_cast<uint8_t>(pick);

  std::vector<uint8_t> out(data, data + 8);
  out.reserve(size + 768);
  uint32_t palette = 0;
  for (size_t pos = 8; pos + 12 <= size;) {
    const uint32_t length = Be32(data + pos);
    const uint8_t* type = data + pos + 4;
    if (std::memcmp(type, "tRNS", 4) == 0 && length > palette) return {};  // stb: "bad tRNS len"
    if (std::memcmp(type, "PLTE", 4) == 0 && length % 3 == 0 && length <= 768) {
      palette = length / 3;
      std::vector<uint8_t> chunk = {0, 0, 3, 0, 'P', 'L', 'T', 'E'};  // 768 bytes
      chunk.insert(chunk.end(), data + pos + 8, data + pos + 8 + length);
      while (chunk.size() < 8 + 768) chunk.insert(chunk.end(), sentinel, sentinel + 3);
      const uLong crc =
          crc32(crc32(0L, Z_NULL, 0), chunk.data() + 4, static_cast<uInt>(chunk.size() - 4));
      for (int shift = 24; shift >= 0; shift -= 8) chunk.push_back(uint8_t(crc >> shift));
      out.insert(out.end(), chunk.begin(), chunk.end());
    } else {
      out.insert(out.end(), data + pos, data + pos + 12 + length);
    }
    if (std::memcmp(type, "IEND", 4) == 0) break;
    pos += 12 + size_t{length};
  }
  *entries = palette;
  return palette > 0 ? out : std::vector<uint8_t>{};
}

}  // namespace gridsync::image_data_checks
