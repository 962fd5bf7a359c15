// Image files whose data does not hold what their header promises
// (worker/image_data_checks.h): palette indices past the palette, which
// stb 2.27 expands from its uninitialised stack, and files cut short or
// with a patched size, which stb decodes as zeros. Each case was a file of
// a hostile probe that trained; each is refused naming the format and what
// is missing, and its well-formed twin still loads.
#include "worker/image_data_checks.h"

#include <gtest/gtest.h>
#include <stb_image_write.h>
#include <zlib.h>

#include <algorithm>
#include <array>
#include <string>
#include <utility>
#include <vector>

#include "worker/image_precheck.h"
#include "worker/image_task.h"

namespace gridsync {
namespace {

Result<ImageTask> DecodeString(const std::string& bytes) {
  return ImageTask::Decode(reinterpret_cast<const uint8_t*>(bytes.data()), bytes.size(), "x");
}

void ExpectRefused(const std::string& bytes, const std::string& why) {
  auto image = DecodeString(bytes);
  ASSERT_FALSE(image.ok()) << why;
  EXPECT_NE(image.status().message().find(why), std::string::npos) << image.status().message();
}

std::string Be32(uint32_t v) {
  return std::string{char(v >> 24), char(v >> 16), char(v >> 8), char(v)};
}
std::string Le16(uint32_t v) { return std::string{char(v), char(v >> 8)}; }
std::string Le32(uint32_t v) { return Le16(v) + Le16(v >> 16); }

std::string PngChunk(const std::string& type, const std::string& data) {
  const std::string body = type + data;
  const uLong crc = crc32(crc32(0L, Z_NULL, 0), reinterpret_cast<const Bytef*>(body.data()),
                          static_cast<uInt>(body.size()));
  return Be32(static_cast<uint32_t>(data.size())) + body + Be32(static_cast<uint32_t>(crc));
}

// An 8-bit palette PNG of one row holding `indices`, with `palette` (RGB
// triples) as its PLTE.
std::string PalettePng(const std::string& palette, const std::string& indices) {
  const std::string raw = '\0' + indices;  // filter: none
  std::vector<Bytef> packed(compressBound(raw.size()));
  uLongf packed_size = packed.size();
  EXPECT_EQ(
      compress(packed.data(), &packed_size, reinterpret_cast<const Bytef*>(raw.data()), raw.size()),
      Z_OK);
  const std::string header = Be32(static_cast<uint32_t>(indices.size())) + Be32(1) +
                             std::string{8, 3, 0, 0, 0};  // 8-bit, palette
  return "\x89PNG\r\n\x1a\n" + PngChunk("IHDR", header) + PngChunk("PLTE", palette) +
         PngChunk("IDAT", std::string(reinterpret_cast<char*>(packed.data()), packed_size)) +
         PngChunk("IEND", "");
}

// The bytes a PNG's image data holds, counted pixel by pixel: each row of
// each pass (Adam7's seven when interlaced) is a filter byte and its
// samples packed to whole bytes.
size_t RawPngBytes(uint32_t width, uint32_t height, uint32_t bits_per_pixel, bool interlaced) {
  const std::vector<std::array<uint32_t, 4>> passes =
      interlaced ? std::vector<std::array<uint32_t, 4>>{{0, 0, 8, 8}, {4, 0, 8, 8}, {0, 4, 4, 8},
                                                        {2, 0, 4, 4}, {0, 2, 2, 4}, {1, 0, 2, 2},
                                                        {0, 1, 1, 2}}
                 : std::vector<std::array<uint32_t, 4>>{{0, 0, 1, 1}};
  size_t total = 0;
  for (const auto& [x0, y0, dx, dy] : passes) {
    size_t columns = 0, rows = 0;
    for (uint32_t x = x0; x < width; x += dx) ++columns;
    for (uint32_t y = y0; y < height; y += dy) ++rows;
    if (columns > 0) total += rows * (1 + (columns * bits_per_pixel + 7) / 8);
  }
  return total;
}

// A PNG whose image data is `raw_bytes` zeros (filter none, sample 0),
// compressed by zlib as an encoder would and cut into IDAT chunks of 8 KiB.
std::string ZeroPng(uint32_t width, uint32_t height, uint8_t depth, uint8_t color, bool interlaced,
                    size_t raw_bytes) {
  const std::string raw(raw_bytes, '\0');
  std::vector<Bytef> packed(compressBound(raw.size()));
  uLongf packed_size = packed.size();
  EXPECT_EQ(compress2(packed.data(), &packed_size, reinterpret_cast<const Bytef*>(raw.data()),
                      raw.size(), 9),
            Z_OK);
  std::string png =
      "\x89PNG\r\n\x1a\n" +
      PngChunk("IHDR", Be32(width) + Be32(height) +
                           std::string{char(depth), char(color), 0, 0, char(interlaced ? 1 : 0)});
  if (color == 3) png += PngChunk("PLTE", std::string(3, '\x40'));
  for (size_t at = 0; at < packed_size; at += 8192) {
    png += PngChunk("IDAT", std::string(reinterpret_cast<char*>(packed.data()) + at,
                                        std::min<size_t>(8192, packed_size - at)));
  }
  return png + PngChunk("IEND", "");
}

// A PNG's image data inflating past what its header needs was inflated
// whole by stb: a 1 MB file of 1 x 1 pixels took 1 GiB (a hostile probe).
// It is counted in pieces first and refused past the header's size (and a
// little slack); every well-formed size, depth, colour type and Adam7
// interlacing still loads (stb refuses data short of its rows, so a count
// below the true size would fail these).
TEST(ImageDataChecksTest, PngImageDataInflatesToWhatItsHeaderNeedsAndNoFurther) {
  struct Kind {
    uint8_t depth, color;
    uint32_t channels;
  };
  for (const Kind kind : {Kind{8, 2, 3}, Kind{16, 6, 4}, Kind{1, 0, 1}, Kind{2, 3, 1},
                          Kind{4, 3, 1}, Kind{16, 0, 1}, Kind{8, 4, 2}, Kind{8, 3, 1}}) {
    for (const auto& [width, height] : std::vector<std::pair<uint32_t, uint32_t>>{
             {1, 1}, {3, 5}, {8, 8}, {13, 7}, {33, 1}, {1, 17}, {100, 61}}) {
      for (const bool interlaced : {false, true}) {
        const size_t exact = RawPngBytes(width, height, kind.depth * kind.channels, interlaced);
        auto image =
            DecodeString(ZeroPng(width, height, kind.depth, kind.color, interlaced, exact));
        ASSERT_TRUE(image.ok()) << width << " x " << height << ", depth " << int(kind.depth)
                                << ", colour " << int(kind.color) << ", interlaced " << interlaced
                                << ": " << image.status().ToString();
        EXPECT_EQ(image->width(), static_cast<int>(width));
        EXPECT_EQ(image->height(), static_cast<int>(height));
      }
    }
  }
  // The size the check holds the data to, against the count above, for
  // sizes past any slack (the loads above pass within it).
  for (const uint32_t bits : {1u, 2u, 4u, 8u, 16u, 24u, 32u, 48u, 64u}) {
    for (const uint32_t width : {1u, 2u, 3u, 5u, 7u, 8u, 9u, 15u, 16u, 17u, 1000u, 4099u}) {
      for (const uint32_t height : {1u, 2u, 3u, 4u, 5u, 8u, 9u, 13u, 777u, 3001u}) {
        for (const bool interlaced : {false, true}) {
          ASSERT_EQ(image_precheck::PngInflatedBytes(width, height, bits, interlaced),
                    RawPngBytes(width, height, bits, interlaced))
              << width << " x " << height << " at " << bits << " bits, interlaced " << interlaced;
        }
      }
    }
  }
  // A few bytes past (an odd encoder's): taken.
  EXPECT_TRUE(DecodeString(ZeroPng(1, 1, 8, 2, false, 4 + 100)).ok());
  // 16 MiB for one pixel: refused, naming both sizes.
  ExpectRefused(ZeroPng(1, 1, 8, 2, false, size_t{16} << 20),
                "PNG image data inflating past 65540 bytes, where its header's size needs 4 "
                "(corrupt, or a decompression bomb)");
  ExpectRefused(ZeroPng(3, 3, 8, 2, true, size_t{16} << 20), "decompression bomb");
}

// A bottom-up BMP, 40-byte header, `bits` a pixel, the palette (BGRA
// entries) and rows given.
std::string Bmp(int width, int height, int bits, const std::string& palette,
                const std::string& rows) {
  const uint32_t offset = 54 + static_cast<uint32_t>(palette.size());
  return "BM" + Le32(offset + static_cast<uint32_t>(rows.size())) + Le32(0) + Le32(offset) +
         Le32(40) + Le32(width) + Le32(height) + Le16(1) + Le16(bits) + Le32(0) +
         Le32(static_cast<uint32_t>(rows.size())) + Le32(2835) + Le32(2835) + Le32(0) + Le32(0) +
         palette + rows;
}

// An uncompressed (type 2) or RLE (type 10) 24-bit TGA header.
std::string TgaHeader(int type, int width, int height) {
  return std::string{0, 0, char(type), 0, 0, 0, 0, 0, 0, 0, 0, 0} + Le16(width) + Le16(height) +
         std::string{24, 0};
}

TEST(ImageDataChecksTest, APaletteIndexPastThePaletteIsRefused) {
  const std::string two = std::string("\x10\x20\x30\x40\x50\x60", 6);
  // 5 of a 2-entry palette: stb expanded it from its stack, a different
  // colour each run.
  ExpectRefused(PalettePng(two, std::string("\x00\x01\x05\x01", 4)),
                "PNG pixel (2, 0) indexes past the palette's 2 entries (corrupt)");
  auto png = DecodeString(PalettePng(two, std::string("\x00\x01\x01\x00", 4)));
  ASSERT_TRUE(png.ok()) << png.status().ToString();
  EXPECT_EQ(png->Channel(3), 0x40 / 255.0f);  // pixel 1 is entry 1
  // The sentinel the check pads with is a colour the palette does not hold,
  // even when the palette holds the first candidates.
  const std::string crowded = std::string("\x01\x02\x03\x02\x03\x04", 6);
  auto shifted = DecodeString(PalettePng(crowded, std::string("\x01\x00", 2)));
  ASSERT_TRUE(shifted.ok()) << shifted.status().ToString();
  EXPECT_EQ(shifted->Channel(0), 2 / 255.0f);
  ExpectRefused(PalettePng(crowded, std::string("\x01\x02", 2)),
                "PNG pixel (1, 0) indexes past the palette's 2 entries");
  // A second PLTE: the standard allows one.
  std::string twice = PalettePng(two, std::string("\x00", 1));
  twice.insert(twice.find("IDAT") - 4, PngChunk("PLTE", two));
  ExpectRefused(twice, "PNG with a second PLTE chunk");

  // BMP, 8 bits, 2 entries, index 4 at pixel 1 of the stored row.
  const std::string palette = std::string("\x30\x20\x10\x00\x60\x50\x40\x00", 8);
  ExpectRefused(Bmp(2, 1, 8, palette, std::string("\x01\x04\x00\x00", 4)),
                "BMP pixel 1 of stored row 0 is palette index 4, past the palette's 2 entries");
  auto bmp = DecodeString(Bmp(2, 1, 8, palette, std::string("\x01\x00\x00\x00", 4)));
  ASSERT_TRUE(bmp.ok()) << bmp.status().ToString();
  EXPECT_EQ(bmp->Channel(0), 0x40 / 255.0f);  // entry 1's red
  // 4 bits: the low nibble of the first byte is pixel 1.
  ExpectRefused(Bmp(2, 1, 4, palette, std::string("\x13\x00\x00\x00", 4)),
                "BMP pixel 1 of stored row 0 is palette index 3");
  ASSERT_TRUE(DecodeString(Bmp(2, 1, 4, palette, std::string("\x10\x00\x00\x00", 4))).ok());
}

// A colour-mapped TGA (type 1, or 9 with RLE) of 8-bit indices into a map
// of 24-bit entries (stored B, G, R).
std::string ColourMappedTga(int type, int width, const std::string& map, const std::string& data) {
  return std::string{0, 1, char(type), 0, 0} + Le16(static_cast<uint32_t>(map.size() / 3)) +
         std::string{24, 0, 0, 0, 0} + Le16(width) + Le16(1) + std::string{8, 0} + map + data;
}

// A hostile probe: stb takes entry 0 for an index past the colour map,
// without a word, so the image trained on a colour the file never held.
TEST(ImageDataChecksTest, AColourMapIndexPastTheMapIsRefused) {
  const std::string map = std::string("\x10\x20\x30\x40\x50\x60", 6);  // 2 entries
  ExpectRefused(ColourMappedTga(1, 3, map, std::string("\x00\x01\x02", 3)),
                "TGA pixel 2 indexes colour-map entry 2, past the map's 2 entries (corrupt)");
  // RLE: a raw packet of 2 (entries 1 and 0), then a run of 2 of entry 250.
  ExpectRefused(ColourMappedTga(9, 4, map, std::string("\x01\x01\x00\x81\xfa", 5)),
                "TGA pixel 2 indexes colour-map entry 250, past the map's 2 entries (corrupt)");
  auto plain = DecodeString(ColourMappedTga(1, 3, map, std::string("\x00\x01\x01", 3)));
  ASSERT_TRUE(plain.ok()) << plain.status().ToString();
  EXPECT_EQ(plain->Channel(3), 0x60 / 255.0f);  // pixel 1 is entry 1: red 0x60
  auto rle = DecodeString(ColourMappedTga(9, 4, map, std::string("\x01\x01\x00\x81\x01", 5)));
  ASSERT_TRUE(rle.ok()) << rle.status().ToString();
  EXPECT_EQ(rle->Channel(9), 0x60 / 255.0f);  // pixel 3, in the run of entry 1
}

TEST(ImageDataChecksTest, AFileShorterThanItsHeaderSaysIsRefused) {
  // A BMP header alone, and a top-down BMP claiming 16000 x 16000.
  ExpectRefused(Bmp(64, 48, 24, "", ""),
                "BMP cut short: 64 x 48 pixels of 24 bits needs 9270 bytes, the file has 54");
  ExpectRefused(Bmp(16000, -16000, 24, "", std::string(100, '\x01')),
                "BMP cut short: 16000 x 16000 pixels of 24 bits needs 768000054 bytes");
  ExpectRefused(Bmp(2, 1, 12, "", std::string(8, '\x01')), "BMP of 12 bits a pixel");
  // A negative compression field passes stb's checks as uncompressed
  // (image_decode_fuzz: 68 bytes claiming 3329 x 33012 pixels).
  std::string negative = Bmp(3329, -33012, 24, "", std::string(14, '\x01'));
  negative.replace(30, 4, std::string("\xd0\x89\x3d\xf6", 4));
  ExpectRefused(negative, "BMP cut short: 3329 x 33012 pixels of 24 bits");
  // TGA: header only; RLE packets for 4 of 268M pixels.
  ExpectRefused(TgaHeader(2, 64, 48),
                "TGA cut short: 64 x 48 pixels needs 9234 bytes, the file has 18");
  // 17 bytes pass stb's TGA test, which reads bytes 0 to 16 only.
  ExpectRefused(TgaHeader(2, 256, 256).substr(0, 17),
                "TGA cut short: a header needs 18 bytes, the file has 17");
  ExpectRefused(TgaHeader(10, 16384, 16384) + std::string("\x83\x01\x02\x03", 4),
                "TGA cut short: RLE data for 268435456 pixels (4 covered)");
  auto tga = DecodeString(TgaHeader(10, 4, 1) + std::string("\x83\x01\x02\x03", 4));
  ASSERT_TRUE(tga.ok()) << tga.status().ToString();
  EXPECT_EQ(tga->Channel(9), 3 / 255.0f);  // the run's red (stored B, G, R)
  // GIF: the first image's data blocks run past the end.
  const std::string gif = std::string("GIF89a", 6) + Le16(1) + Le16(1) +
                          std::string("\x80\x00\x00", 3) + std::string(6, '\x7f') +
                          std::string("\x2c\x00\x00\x00\x00\x01\x00\x01\x00\x00\x02", 11);
  ExpectRefused(gif + std::string("\x02\x44", 2), "GIF cut short: the first image's data needs");
  // Clear, pixel 0, end: 3-bit codes 4, 0, 5, first bits lowest.
  auto whole = DecodeString(gif + std::string("\x02\x44\x01\x00\x3b", 5));
  ASSERT_TRUE(whole.ok()) << whole.status().ToString();
  // The frame's codes (gif_raster_check.h), 2 x 1 and 3 x 1 pixels, the
  // 2-entry table: clear, 0, 1, end (3-bit codes 4, 0, 1, 5) draws indices 0
  // and 1; clear, 0, 3, end draws index 3, which the table lacks (stb drew
  // it from entries it never loaded: transparent black).
  const auto frame = [](int width, int screen_width = 0, int screen_height = 1) {
    return std::string("GIF89a", 6) + Le16(screen_width > 0 ? screen_width : width) +
           Le16(screen_height) + std::string("\x80\x00\x00", 3) +
           std::string("\x00\x00\x00\xff\xff\xff", 6) + std::string("\x2c\0\0\0\0", 5) +
           Le16(width) + Le16(1) + std::string("\x00\x02", 2);
  };
  ASSERT_TRUE(DecodeString(frame(2) + std::string("\x02\x44\x0a\x00\x3b", 5)).ok());
  ExpectRefused(frame(2) + std::string("\x02\xc4\x0a\x00\x3b", 5),
                "GIF frame indexes entry 3 (in pixels 1 to 1) past its colour table's 2 entries");
  // Cut short with the terminator put back: 2 of 3 pixels coded.
  ExpectRefused(frame(3) + std::string("\x02\x44\x0a\x00\x3b", 5),
                "GIF frame's data codes 2 of its 3 pixels (cut short");
  // A hostile probe: stb decodes the logical screen and draws only the
  // first frame, so a 1 x 1 frame on a 16384 x 16384 screen (43 bytes) was a
  // 268M-pixel image of background. A canvas (a smaller first frame, as
  // GIF89a allows) still decodes; a frame the background outweighs 64 to 1
  // and by over 2^20 pixels is refused.
  ASSERT_TRUE(DecodeString(frame(2, 3) + std::string("\x02\x44\x0a\x00\x3b", 5)).ok());
  // A frame reaching past the screen: stb said "bad Image Descriptor".
  ExpectRefused(frame(3, 2) + std::string("\x02\x44\x0a\x00\x3b", 5),
                "GIF frame of 3x1 pixels at (0, 0) reaches past its 2x1 logical screen; allowed: "
                "frames within the screen");
  ExpectRefused(frame(1, 16384, 16384) + std::string("\x02\x44\x01\x00\x3b", 5),
                "GIF's first frame covers 1x1 pixels at (0, 0) of its 16384x16384 logical screen, "
                "the rest 268435455 pixels of background");

  // JPEG: a real 64 x 64 file, and the same with its frame patched to
  // 8000 x 8000 pixels (stb decoded its data, then zeros).
  std::vector<unsigned char> pixels(64 * 64 * 3);
  for (size_t i = 0; i < pixels.size(); ++i) pixels[i] = static_cast<unsigned char>(i * 7);
  std::string jpeg;
  ASSERT_NE(stbi_write_jpg_to_func(
                [](void* out, void* data, int size) {
                  static_cast<std::string*>(out)->append(static_cast<char*>(data), size);
                },
                &jpeg, 64, 64, 3, pixels.data(), 90),
            0);
  ASSERT_TRUE(DecodeString(jpeg).ok());
  const size_t sof = jpeg.find("\xFF\xC0");
  ASSERT_NE(sof, std::string::npos);
  std::string patched = jpeg;
  patched.replace(sof + 5, 4, std::string("\x1f\x40\x1f\x40", 4));
  ExpectRefused(patched, "JPEG of 8000 x 8000 pixels holds");
  ExpectRefused(patched, "its 1000000 blocks of one component need at least 125000");
  // Cut short with an EOI put back: stb decoded the rest from zero bits,
  // and the bytes still cleared a bit a block; the scan's codes do not.
  const size_t sos = jpeg.find("\xFF\xDA");
  ASSERT_NE(sos, std::string::npos);
  const size_t data_at = sos + 2 + (size_t{uint8_t(jpeg[sos + 2])} << 8 | uint8_t(jpeg[sos + 3]));
  const std::string cut = jpeg.substr(0, data_at + (jpeg.size() - data_at) / 3) + "\xFF\xD9";
  ExpectRefused(cut, "JPEG scan 1 holds");
  ExpectRefused(cut, "of 16 MCUs");  // 4:2:0: 16 x 16 pixels an MCU
  // A restart interval whose markers are missing: stb stops at the first
  // and keeps the rest as allocated.
  std::string no_restarts = jpeg;
  no_restarts.insert(sos, std::string("\xFF\xDD\x00\x04\x00\x01", 6));
  ExpectRefused(no_restarts, "holds 1 of 16 MCUs (no restart marker after MCU 1");
  // A frame component no scan decodes (a fourth, declared in SOF0 only).
  std::string uncovered = jpeg;
  const size_t sof0 = uncovered.find("\xFF\xC0");
  ASSERT_NE(sof0, std::string::npos);
  uncovered[sof0 + 3] = static_cast<char>(uint8_t(uncovered[sof0 + 3]) + 3);  // length
  uncovered[sof0 + 9] = 4;                                                    // Nf
  uncovered.insert(sof0 + 10 + 9, std::string("\x04\x11\x00", 3));
  ExpectRefused(uncovered, "JPEG component 4 of 4 is in no scan");
  // Its Huffman tables gone: stb decoded the scan from zeroed tables (a
  // flat grey image).
  std::string no_tables = jpeg;
  for (size_t dht = no_tables.find("\xFF\xC4"); dht != std::string::npos;
       dht = no_tables.find("\xFF\xC4")) {
    no_tables.erase(dht,
                    2 + (size_t{uint8_t(no_tables[dht + 2])} << 8 | uint8_t(no_tables[dht + 3])));
  }
  ExpectRefused(no_tables, "JPEG scan 1 uses Huffman table DC 0, which no DHT before it defines");
  // Only its end-of-image marker gone: stb said "expected marker".
  ExpectRefused(jpeg.substr(0, jpeg.size() - 2),
                "truncated JPEG: the file ends without its end-of-image marker (FF D9)");
  // A component naming a quantisation table no DQT defines (a hostile
  // probe): stb took it as zeros and the image trained flat. Defined after
  // the scan of it is too late as well.
  std::string undefined_table = jpeg;
  undefined_table[sof0 + 12] = 3;  // component 1's table
  ExpectRefused(undefined_table,
                "JPEG component 1 uses quantization table 3, which no DQT segment before its scan "
                "defines (corrupt)");
  std::string late_tables = jpeg;
  const size_t dqt = late_tables.find("\xFF\xDB");
  ASSERT_NE(dqt, std::string::npos);
  const size_t dqt_bytes =
      2 + (size_t{uint8_t(late_tables[dqt + 2])} << 8 | uint8_t(late_tables[dqt + 3]));
  const std::string tables = late_tables.substr(dqt, dqt_bytes);
  late_tables.erase(dqt, dqt_bytes);
  late_tables.insert(late_tables.size() - 2, tables);  // before the EOI
  ExpectRefused(late_tables, "uses quantization table 0, which no DQT segment before its scan");
  // Processes stb does not decode are named.
  std::string lossless = jpeg;
  lossless[sof + 1] = '\xC3';
  ExpectRefused(lossless, "a lossless JPEG is not supported");
  std::string twelve = jpeg;
  twelve[sof + 4] = 12;
  ExpectRefused(twelve, "a JPEG of 12-bit samples is not supported");
  ExpectRefused("P3\n1 1\n255\n1 2 3\n", "ASCII PNM (P1 to P3) is not supported");
}

}  // namespace
}  // namespace gridsync
