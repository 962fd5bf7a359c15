// Checks that an image file holds the pixels its header promises, run by
// image_precheck::CheckStructure before stb_image 2.27 decodes it. stb
// reads past the end of its input as zeros and indexes its palettes
// without a bound, so without these a hostile probe found:
// - a BMP, TGA or GIF cut short, or a 54-byte BMP header alone, trained on
//   as a black image; 154 bytes of top-down BMP or 48 of RLE TGA claiming
//   16000 x 16000 pixels decoded into gigabytes of zeros;
// - a JPEG whose frame header was patched to 8000 x 8000 or 16000 x 16000
//   pixels decoded its 100 KB of data and zeros for the rest;
// - a BMP or PNG pixel indexing past the palette's entries read stb's
//   uninitialised stack (pal[256][4] in both decoders): a different image
//   every run, and stack bytes in the reconstruction.
// Each check reads the format as stb 2.27 does (where the pixel data
// starts, how rows are padded, how RLE packets count), so what it passes
// stb decodes from the file's own bytes.
//
// Thread safety: pure functions.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

#include "common/status.h"

namespace gridsync::image_data_checks {

// Integers as image files store them (the checks here and image_precheck.cc).
inline uint32_t Le16(const uint8_t* p) { return uint32_t{p[0]} | uint32_t{p[1]} << 8; }
inline uint32_t Le32(const uint8_t* p) { return Le16(p) | Le16(p + 2) << 16; }
inline uint32_t Be32(const uint8_t* p) {
  return uint32_t{p[0]} << 24 | uint32_t{p[1]} << 16 | uint32_t{p[2]} << 8 | uint32_t{p[3]};
}

// BMP (stb's: uncompressed or bitfields; 1, 4, 8, 16, 24 or 32 bits): the
// rows within the file, and for 1 to 8 bits every index below the number
// of palette entries stb reads.
Status CheckBmp(const uint8_t* data, size_t size);

// TGA, when the bytes pass stb's TGA test (TGA has no signature; stb tries
// it last): the palette and the pixels, raw or as RLE packets, within the
// file.
Status CheckTga(const uint8_t* data, size_t size);
// Whether 18 bytes of header pass stb's TGA test (stbi__tga_test): the
// colour map, image type and depths it takes, and a width and height of at
// least 1. (TGA has no signature: this is all that tells one apart.)
bool IsTgaHeader(const uint8_t* header18);

// GIF: the blocks up to and through the first image's data (the frame stb
// decodes), each within the file; then that frame's LZW codes
// (gif_raster_check.h): every index within its colour table, and every
// pixel of the frame coded.
Status CheckGif(const uint8_t* data, size_t size);

// JPEG, given the frame header and the bytes of entropy-coded data: a
// process stb decodes (baseline, extended or progressive Huffman, 8-bit),
// and data enough for the frame, at least one bit a block of every
// component (each block codes a DC difference, of a Huffman code of at
// least one bit).
struct JpegFrame {
  uint8_t marker = 0;  // SOFn: 0xC0..0xCF, not DHT, JPG or DAC
  int precision = 0;
  uint32_t width = 0, height = 0;
  struct Component {
    int h = 1, v = 1;  // sampling factors
  };
  std::vector<Component> components;
};
Status CheckJpegFrame(const JpegFrame& frame, uint64_t entropy_bytes);

// A palette PNG (colour type 3) with each PLTE padded to 256 entries of
// `sentinel`, a colour none of its PLTEs holds, and its CRC made anew: stb
// then expands an index past the real entries to `sentinel`, so a decoded
// pixel of that colour is such an index. Empty for any other PNG, and for
// one whose tRNS has more entries than its PLTE (stb refuses it; padded,
// it would pass).
std::vector<uint8_t> PngWithSentinelPalette(const uint8_t* data, size_t size, uint8_t sentinel[3],
                                            uint32_t* entries);

}  // namespace gridsync::image_data_checks
