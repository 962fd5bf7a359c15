#include "worker/image_precheck.h"

#include <spdlog/fmt/fmt.h>
#include <zlib.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <string>
#include <utility>
#include <vector>

#include "worker/image_data_checks.h"
#include "worker/image_task.h"
#include "worker/jpeg_scan_check.h"

namespace gridsync::image_precheck {
namespace {

constexpr const char* kPngSignature = "\x89PNG\r\n\x1a\n";

bool StartsWith(const uint8_t* data, size_t size, const char* magic, size_t n) {
  return size >= n && std::memcmp(data, magic, n) == 0;
}

// Where a JPEG's segments start (after SOI), or 0 when the bytes are no
// JPEG to stb: its SOI is 0xFF, any number of 0xFF fill bytes, then 0xD8.
size_t JpegStart(const uint8_t* data, size_t size) {
  if (size < 2 || data[0] != 0xFF) return 0;
  size_t at = 1;
  while (at < size && data[at] == 0xFF) ++at;
  return at < size && data[at] == 0xD8 ? at + 1 : 0;
}

using image_data_checks::Be32;
using image_data_checks::Le32;

// JPEG: every marker segment up to the end of the file, skipping
// entropy-coded data (where 0xFF is followed by 0x00 or a restart marker);
// each DHT table's counts must sum to at most 256 and fit its segment.
Status CheckJpeg(const uint8_t* data, size_t size, size_t pos) {
  image_data_checks::JpegFrame frame;
  uint64_t entropy_bytes = 0;  // after each SOS, up to the next marker
  bool in_scan = false;
  // Quantisation tables DQT defined (bit t: table t), and the table each
  // frame component names: one never defined before a scan of it was
  // taken as zeros by stb, and the image trained flat (a hostile probe;
  // libjpeg refuses it, as stb refuses a missing Huffman table).
  uint32_t defined_tables = 0;
  std::vector<std::pair<uint8_t, uint32_t>> component_tables;  // (id, table)
  const size_t start = pos;
  const auto ends = [&] {
    if (frame.marker == 0) return Status::OK();
    GRIDSYNC_RETURN_IF_ERROR(image_data_checks::CheckJpegFrame(frame, entropy_bytes));
    // Every scan's blocks, code by code (sequential and progressive).
    return jpeg_scan_check::CheckScans(data, size, start);
  };
  while (pos + 1 < size) {
    if (data[pos] != 0xFF) {
      ++pos;  // entropy-coded data, or fill
      entropy_bytes += in_scan ? 1 : 0;
      continue;
    }
    const uint8_t marker = data[pos + 1];
    if (marker == 0xFF || marker == 0x00 || (marker >= 0xD0 && marker <= 0xD7) || marker == 0x01) {
      ++pos;  // fill byte, stuffed 0xFF, restart marker, TEM: no length
      continue;
    }
    in_scan = false;
    if (marker == 0xD9) return ends();  // EOI
    if (pos + 4 > size) return ends();  // truncated: stb says so
    const size_t length = size_t{data[pos + 2]} << 8 | data[pos + 3];
    if (length < 2)
      return Status::InvalidArgument("JPEG marker segment of length " + std::to_string(length));
    const size_t begin = pos + 4, end = pos + 2 + length;
    const bool sof =
        marker >= 0xC0 && marker <= 0xCF && marker != 0xC4 && marker != 0xC8 && marker != 0xCC;
    if (sof && frame.marker == 0 && begin + 6 <= std::min(end, size)) {
      frame.marker = marker;
      frame.precision = data[begin];
      frame.height = uint32_t{data[begin + 1]} << 8 | data[begin + 2];
      frame.width = uint32_t{data[begin + 3]} << 8 | data[begin + 4];
      for (size_t c = 0, at = begin + 6; c < data[begin + 5] && at + 3 <= std::min(end, size);
           ++c, at += 3) {
        frame.components.push_back(
            {std::max(1, data[at + 1] >> 4), std::max(1, data[at + 1] & 15)});
        component_tables.push_back({data[at], data[at + 2]});
      }
    }
    if (marker == 0xDB) {  // DQT: (precision/id, 64 or 128 bytes) each
      for (size_t at = begin; at < std::min(end, size);) {
        const uint32_t table = data[at] & 15;
        defined_tables |= table < 32 ? 1u << table : 0;
        at += 1 + ((data[at] >> 4) != 0 ? 128 : 64);
      }
    }
    if (marker == 0xDA && begin < size) {  // SOS: (count, then id and tables each)
      for (size_t k = 0, at = begin + 1; k < data[begin] && at < std::min(end, size);
           ++k, at += 2) {
        for (size_t c = 0; c < component_tables.size(); ++c) {
          const auto [id, table] = component_tables[c];
          if (id != data[at] || (table < 32 && (defined_tables >> table & 1u))) continue;
          return Status::InvalidArgument(
              "JPEG component " + std::to_string(c + 1) + " uses quantization table " +
              std::to_string(table) + ", which no DQT segment before its scan defines (corrupt)");
        }
      }
    }
    in_scan = marker == 0xDA;  // SOS: entropy-coded data follows its header
    if (marker == 0xC4) {      // DHT: tables of (class/id, 16 counts, values)
      size_t at = begin;
      while (at < end && at < size) {
        if (at + 17 > end || at + 17 > size) {
          return Status::InvalidArgument("JPEG Huffman table cut short");
        }
        size_t codes = 0;
        for (int i = 1; i <= 16; ++i) codes += data[at + i];
        if (codes > 256) {
          return Status::InvalidArgument("JPEG Huffman table of " + std::to_string(codes) +
                                         " codes (at most 256)");
        }
        at += 17 + codes;
        if (at > end) return Status::InvalidArgument("JPEG Huffman table past its segment");
      }
    }
    pos = end;
  }
  return ends();
}

}  // namespace

uint64_t PngInflatedBytes(uint64_t width, uint64_t height, uint64_t bits_per_pixel,
                          bool interlaced) {
  const auto rows = [&](uint64_t w, uint64_t h) {
    return w == 0 || h == 0 ? 0 : h * (1 + (w * bits_per_pixel + 7) / 8);
  };
  if (!interlaced) return rows(width, height);
  // Each pass's first column and row, and its steps across and down.
  static constexpr uint64_t kPasses[7][4] = {{0, 0, 8, 8}, {4, 0, 8, 8}, {0, 4, 4, 8}, {2, 0, 4, 4},
                                             {0, 2, 2, 4}, {1, 0, 2, 2}, {0, 1, 1, 2}};
  uint64_t total = 0;
  for (const auto& [x0, y0, dx, dy] : kPasses) {
    total += rows(width > x0 ? (width - x0 + dx - 1) / dx : 0,
                  height > y0 ? (height - y0 + dy - 1) / dy : 0);
  }
  return total;
}

namespace {

// The IDAT chunks' data (`pieces`, in order) inflated, only to count it,
// 64 KiB at a time: stb inflates all of it into memory however far it goes
// past what the header needs (a 1 MB file of 1 x 1 pixels inflated to 1
// GiB, and was taken), so more than `needed` bytes (with a little slack)
// is refused, as is data zlib cannot inflate (stb takes some of that: a
// dynamic block of 287 length codes).
Status CheckPngInflation(const uint8_t* data, const std::vector<std::pair<size_t, size_t>>& pieces,
                         bool zlib_header, uint64_t needed) {
  const uint64_t limit = needed + needed / 64 + (uint64_t{64} << 10);
  z_stream z{};
  if (inflateInit2(&z, zlib_header ? 15 : -15) != Z_OK) {
    return Status::IOError("cannot start zlib to check the PNG's image data");
  }
  std::vector<Bytef> scratch(size_t{64} << 10);
  uint64_t inflated = 0;
  int rc = Z_OK;
  for (const auto& [at, length] : pieces) {
    z.next_in = const_cast<Bytef*>(data + at);
    z.avail_in = static_cast<uInt>(length);
    do {
      z.next_out = scratch.data();
      z.avail_out = static_cast<uInt>(scratch.size());
      rc = inflate(&z, Z_NO_FLUSH);
      inflated += scratch.size() - z.avail_out;
    } while (rc == Z_OK && inflated <= limit && (z.avail_in > 0 || z.avail_out == 0));
    if (rc == Z_BUF_ERROR) rc = Z_OK;  // this piece is used up: on to the next
    if (rc != Z_OK || inflated > limit) break;
  }
  const std::string why = z.msg != nullptr ? z.msg : "";
  inflateEnd(&z);
  if (inflated > limit) {
    return Status::InvalidArgument(
        fmt::format("PNG image data inflating past {} bytes, where its header's size needs {} "
                    "(corrupt, or a decompression bomb)",
                    limit, needed));
  }
  if (rc == Z_DATA_ERROR || rc == Z_NEED_DICT) {
    return Status::InvalidArgument("truncated or corrupt PNG: its image data does not inflate (" +
                                   (why.empty() ? std::string("zlib error") : "zlib: " + why) +
                                   ")");
  }
  return Status::OK();  // ended, or cut short: stb names what is missing
}

// PNG: the chunks after the signature, each within the file; the first
// IHDR's rows within what stb's int sizes hold; the image data inflating
// to what that header needs, not more. (stb takes CgBI chunks before IHDR,
// so IHDR need not be the first chunk; a CgBI file's data has no zlib
// header.)
Status CheckPng(const uint8_t* data, size_t size) {
  size_t pos = 8;
  bool seen_header = false, cgbi = false;
  int palettes = 0;
  uint64_t needed = 0;  // what the image data inflates to; 0: not checked
  std::vector<std::pair<size_t, size_t>> image_data;  // IDAT chunks: data's start, length
  while (pos + 8 <= size) {
    const uint64_t length = Be32(data + pos);
    // Printable, whatever the bytes: a damaged type put NULs and control
    // bytes into the message.
    std::string type;
    for (size_t i = 0; i < 4; ++i) {
      const uint8_t c = data[pos + 4 + i];
      type += c >= 0x20 && c < 0x7F ? std::string(1, static_cast<char>(c))
                                    : fmt::format("\\x{:02X}", c);
    }
    if (length + 12 > size - pos) {
      return Status::InvalidArgument("PNG chunk '" + type + "' claims " + std::to_string(length) +
                                     " bytes, " + std::to_string(size - pos) +
                                     " remain in the file (truncated or corrupt)");
    }
    // stb_image skips the CRCs; a chunk whose bytes do not match its CRC
    // is damaged, and decoding it anyway trains on whatever it now says.
    const uint32_t stored = Be32(data + pos + 8 + length);
    const uLong computed =
        crc32(crc32(0L, Z_NULL, 0), data + pos + 4, static_cast<uInt>(length + 4));
    if (stored != static_cast<uint32_t>(computed)) {
      return Status::InvalidArgument("PNG chunk '" + type + "' at byte " + std::to_string(pos) +
                                     " fails its CRC (corrupt)");
    }
    if (!seen_header && type == "IHDR" && length >= 13) {
      seen_header = true;
      const uint64_t width = Be32(data + pos + 8), height = Be32(data + pos + 12);
      const uint64_t depth = data[pos + 16], color = data[pos + 17];
      // The standard's pairs: stb named a bad depth "invalid width" (a probe).
      const bool pair =
          (color == 0 && (depth == 1 || depth == 2 || depth == 4 || depth == 8 || depth == 16)) ||
          (color == 3 && (depth == 1 || depth == 2 || depth == 4 || depth == 8)) ||
          ((color == 2 || color == 4 || color == 6) && (depth == 8 || depth == 16));
      if (!pair) {
        return Status::InvalidArgument(
            "PNG header of colour type " + std::to_string(color) + " at " + std::to_string(depth) +
            " bits a sample (corrupt); allowed: grey (type 0) at 1, 2, 4, 8 or 16 bits, palette "
            "(3) at 1, 2, 4 or 8, RGB (2), grey + alpha (4) and RGBA (6) at 8 or 16");
      }
      // stb's components before palette expansion: grey 1, RGB 3, palette
      // 1, grey + alpha 2, RGBA 4.
      const uint64_t channels = (color & 2 ? 3 : 1) + (color & 4 ? 1 : 0) - (color == 3 ? 2 : 0);
      // stb's first guess of the inflated size, which it passes as an int:
      // bytes a line per component x rows x components + a filter byte a row.
      const uint64_t raw = (width * depth + 7) / 8 * height * channels + height;
      // Sizes past ImageTask's bounds (2^24 a side, 2^28 pixels) are left to
      // its refusal, which names them.
      const bool sized = width <= ImageTask::kMaxSide && height <= ImageTask::kMaxSide &&
                         width * height <= ImageTask::kMaxPixels;
      if (sized && raw > uint64_t{INT32_MAX}) {
        return Status::InvalidArgument("PNG rows of " + std::to_string(raw) + " raw bytes (" +
                                       std::to_string(depth) + "-bit, " + std::to_string(channels) +
                                       " channels); at most " + std::to_string(INT32_MAX));
      }
      if (sized && width > 0 && height > 0) {
        needed = PngInflatedBytes(width, height, depth * channels, data[pos + 20] != 0);
      }
    }
    if (type == "CgBI" && !seen_header) cgbi = true;
    if (type == "IDAT") image_data.emplace_back(pos + 8, static_cast<size_t>(length));
    // The standard allows one; stb takes the last, and the palette check
    // (image_data_checks::PngWithSentinelPalette) pads each.
    if (type == "PLTE" && ++palettes > 1) {
      return Status::InvalidArgument("PNG with a second PLTE chunk at byte " + std::to_string(pos) +
                                     "; allowed: one palette");
    }
    if (type == "IEND") break;
    pos += 12 + length;
  }
  if (needed > 0) return CheckPngInflation(data, image_data, !cgbi, needed);
  return Status::OK();
}

// PNM (P5, P6): the header as stb reads it (whitespace, # comments, width,
// height, maxval, one whitespace byte), then the data the header promises.
Status CheckPnm(const uint8_t* data, size_t size) {
  size_t pos = 2;
  auto skip = [&] {
    for (;;) {
      while (pos < size && std::strchr(" \t\n\v\f\r", data[pos]) != nullptr && data[pos] != 0)
        ++pos;
      if (pos >= size || data[pos] != '#') return;
      while (pos < size && data[pos] != '\n' && data[pos] != '\r') ++pos;
    }
  };
  auto integer = [&](const char* what, uint64_t max, uint64_t* value) -> Status {
    skip();
    *value = 0;
    size_t digits = 0;
    while (pos < size && data[pos] >= '0' && data[pos] <= '9') {
      *value = *value * 10 + (data[pos] - '0');
      ++pos;
      if (++digits > 9 || *value > max) {
        return Status::InvalidArgument(std::string("PNM ") + what + " over " + std::to_string(max));
      }
    }
    if (digits == 0) {
      // Say what stands there (a probe's width -5 read "width missing").
      if (pos >= size) {
        return Status::InvalidArgument(std::string("PNM ") + what +
                                       " missing: the file ends at byte " + std::to_string(size));
      }
      const uint8_t c = data[pos];
      const std::string shown = c >= 0x20 && c < 0x7F
                                    ? "'" + std::string(1, static_cast<char>(c)) + "'"
                                    : fmt::format("byte 0x{:02X}", c);
      return Status::InvalidArgument(std::string("PNM ") + what + " is not a number: " + shown +
                                     " at byte " + std::to_string(pos) + " (a whole number 0 to " +
                                     std::to_string(max) + " belongs there)");
    }
    return Status::OK();
  };
  uint64_t width = 0, height = 0, maxval = 0;
  GRIDSYNC_RETURN_IF_ERROR(integer("width", ImageTask::kMaxSide, &width));
  GRIDSYNC_RETURN_IF_ERROR(integer("height", ImageTask::kMaxSide, &height));
  GRIDSYNC_RETURN_IF_ERROR(integer("maxval", 65535, &maxval));
  if (maxval == 0) return Status::InvalidArgument("PNM maxval 0, where the format has 1 to 65535");
  const uint64_t channels = data[1] == '5' ? 1 : 3;
  if (channels == 1 && maxval > 255) {
    return Status::InvalidArgument("16-bit grey PNM (P5 with maxval " + std::to_string(maxval) +
                                   ") is not supported");
  }
  const uint64_t need = width * height * channels * (maxval > 255 ? 2 : 1);
  const uint64_t have = pos + 1 <= size ? size - pos - 1 : 0;  // after one whitespace byte
  if (have < need) {
    return Status::InvalidArgument("PNM pixel data of " + std::to_string(have) + " bytes, " +
                                   std::to_string(need) + " needed (truncated)");
  }
  return Status::OK();
}

}  // namespace

const char* RefusedFormat(const uint8_t* data, size_t size) {
  if (StartsWith(data, size, "8BPS", 4)) return "PSD";
  if (StartsWith(data, size, "#?RADIANCE", 10) || StartsWith(data, size, "#?RGBE", 6))
    return "Radiance HDR";
  if (StartsWith(data, size, "\x53\x80\xF6\x34", 4)) return "Softimage PIC";
  // stb reads binary P5 and P6 only.
  if (size >= 3 && data[0] == 'P' && ((data[1] >= '1' && data[1] <= '4') || data[1] == '7') &&
      std::strchr(" \t\n\r#", data[2]) != nullptr && data[2] != 0) {
    if (data[1] == '7') return "PAM (P7)";
    return data[1] == '4' ? "1-bit PNM (P4)" : "ASCII PNM (P1 to P3)";
  }
  if (StartsWith(data, size, "PF\n", 3) || StartsWith(data, size, "Pf\n", 3)) return "PFM";
  // Formats stb does not decode at all, named by their signatures rather
  // than left to "the header of no image format" (a hostile probe).
  if (StartsWith(data, size, "II*\0", 4) || StartsWith(data, size, "MM\0*", 4)) return "TIFF";
  if (size >= 12 && StartsWith(data, size, "RIFF", 4) && std::memcmp(data + 8, "WEBP", 4) == 0)
    return "WebP";
  if (StartsWith(data, size, "\0\0\0\x0CjP  \r\n\x87\n", 12) ||
      StartsWith(data, size, "\xFF\x4F\xFF\x51", 4))
    return "JPEG 2000";
  // stb's BMP decoder takes uncompressed rows (and bit fields) only.
  if (StartsWith(data, size, "BM", 2) && size >= 34 && Le32(data + 14) >= 40) {
    switch (Le32(data + 30)) {
      case 1:
        return "RLE-compressed BMP (BI_RLE8)";
      case 2:
        return "RLE-compressed BMP (BI_RLE4)";
      case 4:
        return "JPEG-compressed BMP";
      case 5:
        return "PNG-compressed BMP";
      default:
        break;
    }
  }
  return nullptr;
}

const char* SignatureFormat(const uint8_t* data, size_t size) {
  if (JpegStart(data, size) > 0) return "JPEG";
  if (StartsWith(data, size, kPngSignature, 8)) return "PNG";
  if (StartsWith(data, size, "GIF8", 4)) return "GIF";
  if (StartsWith(data, size, "BM", 2)) return "BMP";
  if (StartsWith(data, size, "P5", 2) || StartsWith(data, size, "P6", 2)) return "PNM";
  return nullptr;
}

bool MayBeImage(const uint8_t* head, size_t size) {
  if (size < 18 || head[0] == 0xFF) return true;  // judged whole (CheckTga, JpegStart)
  return SignatureFormat(head, size) != nullptr || RefusedFormat(head, size) != nullptr ||
         image_data_checks::IsTgaHeader(head);
}

bool PngDimensions(const uint8_t* data, size_t size, uint32_t* width, uint32_t* height) {
  if (!StartsWith(data, size, kPngSignature, 8)) return false;
  // The chunks walked to the first IHDR (stb takes a CgBI chunk before it).
  for (size_t pos = 8; pos + 16 <= size; pos += 12 + uint64_t{Be32(data + pos)}) {
    if (std::memcmp(data + pos + 4, "IHDR", 4) == 0) {
      *width = Be32(data + pos + 8);
      *height = Be32(data + pos + 12);
      return true;
    }
  }
  return false;
}

Status CheckStructure(const uint8_t* data, size_t size) {
  if (const size_t start = JpegStart(data, size); start > 0) return CheckJpeg(data, size, start);
  if (StartsWith(data, size, kPngSignature, 8)) return CheckPng(data, size);
  if (StartsWith(data, size, "P5", 2) || StartsWith(data, size, "P6", 2))
    return CheckPnm(data, size);
  if (StartsWith(data, size, "BM", 2)) return image_data_checks::CheckBmp(data, size);
  if (StartsWith(data, size, "GIF8", 4)) return image_data_checks::CheckGif(data, size);
  // No signature: stb tries TGA last.
  if (SignatureFormat(data, size) == nullptr && RefusedFormat(data, size) == nullptr)
    return image_data_checks::CheckTga(data, size);
  return Status::OK();
}

uint64_t DecodeBytes(const uint8_t* data, size_t size, uint64_t pixels) {
  // Bytes a pixel at the peak, from stb 2.27's buffers (measured on the
  // fuzz campaign's reproducers) plus the task's 3-byte copy: GIF clears 9
  // and converts to 3; progressive JPEG keeps 2-byte coefficients and a
  // plane per component (up to 4) and the output; PNG up to 8 raw bytes
  // (16-bit RGBA) and its conversions; the rest a 16-bit RGB buffer at most.
  uint64_t per_pixel = 6 + 3;
  if (StartsWith(data, size, "GIF8", 4)) per_pixel = 12 + 3;
  if (JpegStart(data, size) > 0) per_pixel = 16 + 3;
  if (StartsWith(data, size, kPngSignature, 8)) per_pixel = 8 + 4 + 3 + 3;
  return pixels * per_pixel;
}

}  // namespace gridsync::image_precheck
