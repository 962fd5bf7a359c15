// ImageTask: images kept as bytes read exactly as the floats they were
// converted to, sampling and evaluation by ranges agree with the whole, and
// images that cannot be trained on are refused, naming why.
#include "worker/image_task.h"

#include <gtest/gtest.h>
#include <stb_image.h>
#include <stb_image_write.h>
#include <sys/stat.h>
#include <unistd.h>
#include <zlib.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>
#include <vector>

#include "common/config.h"
#include "common/counter_rng.h"
#include "tests/file_size_limit.h"

namespace gridsync {
namespace {

std::string TempPath(const std::string& name) {
  return (std::filesystem::temp_directory_path() /
          ("gridsync-image-test-" + std::to_string(::getpid()) + "-" + name))
      .string();
}

std::string Be32(uint32_t v) {
  return std::string{char(v >> 24), char(v >> 16), char(v >> 8), char(v)};
}

// A PNG chunk: length, type, data and the CRC of type and data.
std::string PngChunk(const std::string& type, const std::string& data) {
  const std::string body = type + data;
  const uLong crc = crc32(crc32(0L, Z_NULL, 0), reinterpret_cast<const Bytef*>(body.data()),
                          static_cast<uInt>(body.size()));
  return Be32(static_cast<uint32_t>(data.size())) + body + Be32(static_cast<uint32_t>(crc));
}

// A PNG whose header claims width x height pixels and holds no pixel data:
// the dimensions are all a refusal needs to read.
std::string HeaderOnlyPng(uint32_t width, uint32_t height, uint8_t depth = 8, uint8_t color = 2) {
  return "\x89PNG\r\n\x1a\n" +
         PngChunk("IHDR", Be32(width) + Be32(height) +
                              std::string{char(depth), char(color), '\0', '\0', '\0'});
}

void WriteFile(const std::string& path, const std::string& bytes) {
  std::ofstream out(path, std::ios::binary);
  out << bytes;
}

TEST(ImageTaskTest, LoadedChannelsAreTheBytesOver255) {
  auto image = ImageTask::Load(kDefaultImagePath);
  ASSERT_TRUE(image.ok()) << image.status().ToString();
  // What decoding took at the peak (CheckMachineMemory counts it for
  // workers starting together): a JPEG's coefficients and planes, more
  // than the 3 bytes a pixel kept.
  EXPECT_GT(image->decode_peak_bytes(), image->memory_bytes());
  EXPECT_EQ(ImageTask::FromPixels(1, 1, {0, 0, 0}).decode_peak_bytes(), 0u);
  int w = 0, h = 0, channels = 0;
  unsigned char* data = stbi_load(kDefaultImagePath, &w, &h, &channels, 3);
  ASSERT_NE(data, nullptr);
  ASSERT_EQ(image->width(), w);
  ASSERT_EQ(image->height(), h);
  EXPECT_EQ(image->memory_bytes(), uint64_t(w) * h * 3);  // a quarter of floats
  const std::vector<float> floats = image->Floats();
  ASSERT_EQ(floats.size(), size_t(w) * h * 3);
  size_t wrong = 0;
  for (size_t i = 0; i < floats.size(); ++i) {
    const float want = static_cast<float>(data[i]) / 255.0f;
    const float channel = image->Channel(i);
    wrong += std::memcmp(&floats[i], &want, sizeof(float)) != 0;
    wrong += std::memcmp(&channel, &want, sizeof(float)) != 0;
  }
  stbi_image_free(data);
  EXPECT_EQ(wrong, 0u);
}

// The batch's targets are Target() of its positions, bit for bit, for an
// image of bytes and for the same image as floats; the positions are the
// counter-based draws.
TEST(ImageTaskTest, SampleBatchIsTargetAtTheDrawnPositions) {
  auto loaded = ImageTask::Load(kDefaultImagePath);
  ASSERT_TRUE(loaded.ok()) << loaded.status().ToString();
  const ImageTask as_floats =
      ImageTask::FromPixels(loaded->width(), loaded->height(), loaded->Floats());
  for (const ImageTask* image : std::vector<const ImageTask*>{&*loaded, &as_floats}) {
    const size_t n = 5000;
    std::vector<float> positions(n * 2), targets(n * 3);
    image->SampleBatch(7, 3, 1000, n, positions.data(), targets.data());
    size_t wrong = 0;
    for (size_t i = 0; i < n; ++i) {
      float u, v, rgb[3];
      CounterUniform2(7, 3, 1000 + i, &u, &v);
      wrong += positions[2 * i] != u || positions[2 * i + 1] != v;
      image->Target(u, v, rgb);
      wrong += std::memcmp(rgb, &targets[3 * i], sizeof(rgb)) != 0;
    }
    EXPECT_EQ(wrong, 0u);
  }
  // Both kinds give the same targets.
  std::vector<float> p1(200), t1(300), p2(200), t2(300);
  loaded->SampleBatch(1, 2, 0, 100, p1.data(), t1.data());
  as_floats.SampleBatch(1, 2, 0, 100, p2.data(), t2.data());
  EXPECT_EQ(t1, t2);
}

// Edges clamp: a 2 x 1 image sampled at its corners and past its centres.
TEST(ImageTaskTest, TargetClampsAtTheEdges) {
  const ImageTask image = ImageTask::FromPixels(2, 1, {0, 0, 0, 1, 0.5f, 0.25f});
  float rgb[3];
  image.Target(0.0f, 0.0f, rgb);
  EXPECT_EQ(rgb[0], 0.0f);
  image.Target(0.999f, 0.999f, rgb);
  EXPECT_EQ(rgb[0], 1.0f);
  EXPECT_EQ(rgb[1], 0.5f);
  image.Target(0.5f, 0.5f, rgb);  // halfway between the two centres
  EXPECT_FLOAT_EQ(rgb[0], 0.5f);
  EXPECT_FLOAT_EQ(rgb[2], 0.125f);
}

// A loaded (byte) image clamps at its edges as the same image in floats.
TEST(ImageTaskTest, ByteImageEdgesAreTheFloatImages) {
  const unsigned char px[] = {0, 10, 20, 255, 128, 64, 7, 7, 7, 200, 100, 50};  // 2 x 2
  const std::string path = TempPath("edges.png");
  ASSERT_NE(stbi_write_png(path.c_str(), 2, 2, 3, px, 6), 0);
  auto bytes = ImageTask::Load(path);
  std::filesystem::remove(path);
  ASSERT_TRUE(bytes.ok()) << bytes.status().ToString();
  const ImageTask floats = ImageTask::FromPixels(2, 2, bytes->Floats());
  for (float u : {0.0f, 1e-7f, 0.25f, 0.5f, 0.75f, 0.99999994f}) {
    for (float v : {0.0f, 0.3f, 0.99999994f}) {
      float a[3], b[3];
      bytes->Target(u, v, a);
      floats.Target(u, v, b);
      EXPECT_EQ(std::memcmp(a, b, sizeof(a)), 0) << u << ", " << v;
    }
  }
  float corner[3];
  bytes->Target(0.0f, 0.0f, corner);
  EXPECT_EQ(corner[1], 10 / 255.0f);
  bytes->Target(0.99999994f, 0.99999994f, corner);
  EXPECT_EQ(corner[0], 200 / 255.0f);
}

Result<ImageTask> DecodeString(const std::string& bytes) {
  return ImageTask::Decode(reinterpret_cast<const uint8_t*>(bytes.data()), bytes.size(), "x");
}

// What stb_image 2.27 gets wrong on a few bytes (found by image_decode_fuzz;
// fuzz/corpus/image_decode_fuzz/regress-*) is refused before stb reads it.
TEST(ImageTaskTest, RefusesTheFilesStbMishandles) {
  const auto refused = [](const std::string& bytes, const std::string& why) {
    auto image = DecodeString(bytes);
    ASSERT_FALSE(image.ok()) << why;
    EXPECT_NE(image.status().message().find(why), std::string::npos) << image.status().message();
    EXPECT_NE(image.status().message().find("allowed:"), std::string::npos);
  };
  // JPEG: a Huffman table of 16 x 19 = 304 codes (stb writes past 256),
  // also behind fill bytes before SOI, which stb skips.
  const std::string dht = "\xFF\xC4" + std::string("\x01\x33\x00", 3) + std::string(16, '\x13') +
                          std::string(304, '\x01') + "\xFF\xD9";
  refused("\xFF\xD8" + dht, "JPEG Huffman table of 304 codes (at most 256)");
  refused("\xFF\xFF\xFF\xD8" + dht, "JPEG Huffman table of 304 codes");
  refused(std::string("\xFF\xD8\xFF\xC4\x00\x10\x00\xFF\xD9", 9), "JPEG Huffman table cut short");
  // PNM: 16-bit grey (stb reads twice its buffer), data shorter than the
  // header says (stb keeps the rest uninitialised), integers stb overflows.
  refused(std::string("P5 3 1 1023\n") + std::string(6, '\x01'), "16-bit grey PNM");
  refused("P6\n4 4\n255\n\x01\x02\x03", "PNM pixel data of 3 bytes, 48 needed (truncated)");
  refused("P5 99999999999 1 255\n", "PNM width over 16777216");
  // PNG: a chunk longer than the file (stb grows its buffer to the claim
  // first), and rows past stb's 2^30 raw bytes (its int sizes overflow).
  std::string idat = HeaderOnlyPng(1, 1);
  idat += std::string("\x40\x00\x00\x01IDAT", 8) + "tiny";
  refused(idat, "PNG chunk 'IDAT' claims 1073741825 bytes");
  const std::string rgba16 = HeaderOnlyPng(16384, 16384, /*depth=*/16, /*color=*/6);
  refused(rgba16, "PNG rows of 2147500032 raw bytes");
  // The same behind an (iPhone) CgBI chunk, which stb takes before IHDR.
  refused(rgba16.substr(0, 8) + PngChunk("CgBI", "") + rgba16.substr(8),
          "PNG rows of 2147500032 raw bytes");
  // stb skips the CRCs: a damaged chunk would be decoded as it now reads.
  std::string damaged = HeaderOnlyPng(1, 1);
  damaged[20] ^= 1;  // a bit of the width
  refused(damaged, "PNG chunk 'IHDR' at byte 8 fails its CRC");
  // PNM: maxval 0 (the format allows 1 to 65535; stb divides by it).
  refused("P6\n1 1\n0\n\x01\x02\x03", "PNM maxval 0");
  // 8-bit RGBA at the pixel limit fits stb's sizes (2^30 + a byte a row):
  // not refused here (the header-only file then fails as truncated).
  const std::string rgba8 = HeaderOnlyPng(16384, 16384, 8, 6);
  auto at_limit = DecodeString(rgba8);
  ASSERT_FALSE(at_limit.ok());
  EXPECT_EQ(at_limit.status().message().find("PNG rows"), std::string::npos)
      << at_limit.status().message();
  // What is well formed still decodes: a P6 with its data, 16-bit too.
  auto pnm = DecodeString("P6\n1 1\n255\n\x10\x20\x30");
  ASSERT_TRUE(pnm.ok()) << pnm.status().ToString();
  EXPECT_EQ(pnm->Channel(2), 0x30 / 255.0f);
  pnm = DecodeString(std::string("P6 1 1 65535\n\x10\x00\x20\x00\x30\x00", 19));
  ASSERT_TRUE(pnm.ok()) << pnm.status().ToString();
}

// A top-down BMP (negative height in its header) loads the right way up.
TEST(ImageTaskTest, TopDownBmpLoads) {
  const auto le32 = [](int32_t v) {
    return std::string{char(v), char(v >> 8), char(v >> 16), char(v >> 24)};
  };
  std::string bmp = "BM" + le32(54 + 16) + le32(0) + le32(54);
  bmp += le32(40) + le32(2) + le32(-2) + std::string("\x01\x00\x18\x00", 4) + le32(0) + le32(16) +
         le32(2835) + le32(2835) + le32(0) + le32(0);
  // Rows top first, pixels as B, G, R, each row padded to 8 bytes.
  bmp += std::string("\x01\x02\x03\x04\x05\x06\x00\x00", 8);
  bmp += std::string("\x07\x08\x09\x0a\x0b\x0c\x00\x00", 8);
  auto image = DecodeString(bmp);
  ASSERT_TRUE(image.ok()) << image.status().ToString();
  EXPECT_EQ(image->width(), 2);
  EXPECT_EQ(image->height(), 2);
  EXPECT_EQ(image->Channel(0), 3 / 255.0f);  // top-left red
  EXPECT_EQ(image->Channel(6), 9 / 255.0f);  // bottom-left red
}

TEST(ImageTaskTest, CentresAndErrorsByRangeAgreeWithTheWhole) {
  const int w = 7, h = 5;
  std::vector<float> rgb(size_t(w) * h * 3);
  for (size_t i = 0; i < rgb.size(); ++i) rgb[i] = static_cast<float>(i % 11) / 10.0f;
  const ImageTask image = ImageTask::FromPixels(w, h, rgb);
  ASSERT_EQ(image.pixel_count(), uint64_t(w) * h);
  std::vector<float> all(size_t(w) * h * 2);
  image.PixelCentres(0, w * h, all.data());
  for (int y = 0; y < h; ++y) {
    for (int x = 0; x < w; ++x) {
      const size_t i = size_t(y) * w + x;
      EXPECT_EQ(all[2 * i], (static_cast<float>(x) + 0.5f) / w);
      EXPECT_EQ(all[2 * i + 1], (static_cast<float>(y) + 0.5f) / h);
    }
  }
  // A range crossing rows equals that part of the whole.
  std::vector<float> part(2 * 9);
  image.PixelCentres(5, 9, part.data());
  EXPECT_TRUE(std::equal(part.begin(), part.end(), all.begin() + 10));

  // Predictions out of [0, 1] are clamped; ranges add up to the whole.
  std::vector<float> prediction(rgb.size());
  for (size_t i = 0; i < prediction.size(); ++i)
    prediction[i] = static_cast<float>(i % 7) / 4.0f - 0.3f;
  double whole = 0;
  for (size_t i = 0; i < rgb.size(); ++i) {
    const double d = std::clamp(prediction[i], 0.0f, 1.0f) - rgb[i];
    whole += d * d;
  }
  EXPECT_EQ(image.AddSquaredError(0, 0, w * h, prediction.data()), whole);
  const double split = image.AddSquaredError(0, 0, 12, prediction.data());
  EXPECT_EQ(image.AddSquaredError(split, 12, w * h - 12, prediction.data() + 36), whole);
  EXPECT_EQ(image.AddSquaredError(1.5, 0, 0, prediction.data()), 1.5);  // nothing added
  EXPECT_EQ(image.PsnrOf(whole), -10.0 * std::log10(whole / (w * h * 3)));
  EXPECT_EQ(image.PsnrOf(0), 99.0);  // a perfect fit
  // A model whose outputs are NaN scores NaN, not a perfect fit.
  EXPECT_TRUE(std::isnan(image.PsnrOf(std::nan(""))));
}

TEST(ImageTaskTest, OtherPixelFormatsLoadAsRgb) {
  // Grey, grey + alpha and RGBA: three 8-bit channels each, alpha dropped.
  const int w = 3, h = 2;
  for (int comp : {1, 2, 4}) {
    std::vector<unsigned char> px(size_t(w) * h * comp);
    for (size_t i = 0; i < px.size(); ++i) px[i] = static_cast<unsigned char>(40 * i + 3);
    const std::string path = TempPath("fmt" + std::to_string(comp) + ".png");
    ASSERT_NE(stbi_write_png(path.c_str(), w, h, comp, px.data(), w * comp), 0);
    auto image = ImageTask::Load(path);
    std::filesystem::remove(path);
    ASSERT_TRUE(image.ok()) << comp << ": " << image.status().ToString();
    EXPECT_EQ(image->width(), w);
    EXPECT_EQ(image->height(), h);
    const size_t p = 4;  // pixel (1, 1)
    const int grey = comp == 1 || comp == 2;
    EXPECT_EQ(image->Channel(p * 3), px[p * comp] / 255.0f) << comp;
    EXPECT_EQ(image->Channel(p * 3 + 2), px[p * comp + (grey ? 0 : 2)] / 255.0f) << comp;
  }
}

TEST(ImageTaskTest, RefusesWhatCannotBeTrainedOn) {
  // A few hundred bytes claiming more pixels than a worker may hold: refused
  // from the header, naming the size and the limit, before any decoding.
  const std::string huge = TempPath("huge.png");
  WriteFile(huge, HeaderOnlyPng(1u << 15, (1u << 13) + 1));
  auto image = ImageTask::Load(huge);
  ASSERT_FALSE(image.ok());
  EXPECT_EQ(image.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(image.status().message().find("32768 x 8193 pixels"), std::string::npos)
      << image.status().message();
  EXPECT_NE(image.status().message().find("at most 268435456 pixels"), std::string::npos)
      << image.status().message();

  // Far over stb_image's own PNG limit (2^30 decoded bytes), which it
  // reports as an unknown type: the size is named all the same.
  WriteFile(huge, HeaderOnlyPng(60000, 60000));
  image = ImageTask::Load(huge);
  ASSERT_FALSE(image.ok());
  EXPECT_NE(image.status().message().find("60000 x 60000 pixels"), std::string::npos)
      << image.status().message();

  // A side over stb_image's 2^24, however few pixels in all.
  WriteFile(huge, HeaderOnlyPng(1u << 25, 2));
  image = ImageTask::Load(huge);
  ASSERT_FALSE(image.ok());
  EXPECT_NE(image.status().message().find("33554432 x 2 pixels"), std::string::npos)
      << image.status().message();
  EXPECT_NE(image.status().message().find("16777216 pixels a side"), std::string::npos);

  // At the limit the header passes, and the missing pixel data is refused.
  WriteFile(huge, HeaderOnlyPng(1u << 15, 1u << 13));
  image = ImageTask::Load(huge);
  ASSERT_FALSE(image.ok());
  EXPECT_EQ(image.status().code(), StatusCode::kIOError);
  // stb gives no reason for this damage; the message still says one.
  EXPECT_NE(image.status().message().find(
                "': truncated or corrupt PNG (its data does not decode); allowed:"),
            std::string::npos)
      << image.status().message();
  std::filesystem::remove(huge);

  // Formats stb decodes but the task does not take, by their signatures.
  for (const auto& [bytes, format] : std::vector<std::pair<std::string, std::string>>{
           {"8BPS\x00\x01rest", "PSD"},
           {"#?RADIANCE\n", "Radiance HDR"},
           {"#?RGBE\n", "Radiance HDR"},
           {"\x53\x80\xF6\x34rest", "Softimage PIC"}}) {
    image = ImageTask::Decode(reinterpret_cast<const uint8_t*>(bytes.data()), bytes.size(), "x");
    ASSERT_FALSE(image.ok()) << format;
    EXPECT_NE(image.status().message().find(format + " is not supported"), std::string::npos)
        << image.status().message();
  }

  for (const std::string& bytes : {std::string(), std::string("not an image at all"),
                                   HeaderOnlyPng(0, 5), std::string("\x89PNG\r\n\x1a\n")}) {
    const std::string path = TempPath("bad.png");
    WriteFile(path, bytes);
    image = ImageTask::Load(path);
    std::filesystem::remove(path);
    ASSERT_FALSE(image.ok()) << bytes.size();
    EXPECT_NE(image.status().message().find("allowed:"), std::string::npos)
        << image.status().message();
  }
  image = ImageTask::Load(TempPath("missing.png"));
  ASSERT_FALSE(image.ok());
  EXPECT_NE(image.status().message().find("cannot load image"), std::string::npos);
}

// A damaged file of a format stb knows is named by its format, not by
// stb's last guess ("unknown image type").
TEST(ImageTaskTest, ADamagedFileIsNamedByItsFormat) {
  const std::string path = TempPath("cut.jpg");
  {
    std::ifstream in(kDefaultImagePath, std::ios::binary);
    std::string head(200, '\0');
    in.read(head.data(), static_cast<std::streamsize>(head.size()));
    WriteFile(path, head);
  }
  auto image = ImageTask::Load(path);
  std::filesystem::remove(path);
  ASSERT_FALSE(image.ok());
  EXPECT_NE(image.status().message().find(
                "truncated, corrupt or unsupported JPEG: stb_image's decoder refuses its header "
                "(no SOF)"),
            std::string::npos)
      << image.status().message();
  // A hostile probe: headers stb refuses (valid kinds it does not take, as
  // an RLE BMP, or invalid ones, here a PNG of colour type 5) were all
  // called truncated or corrupt, from stb's last guess; the decoder of
  // their format says why.
  const std::string ctype5 = HeaderOnlyPng(4, 4, 8, 5);
  auto unsupported =
      ImageTask::Decode(reinterpret_cast<const uint8_t*>(ctype5.data()), ctype5.size(), "c5");
  ASSERT_FALSE(unsupported.ok());
  EXPECT_NE(unsupported.status().message().find(
                "PNG header of colour type 5 at 8 bits a sample (corrupt); allowed: grey (type 0) "
                "at 1, 2, 4, 8 or 16 bits"),
            std::string::npos)
      << unsupported.status().message();
  // RGB at 4 bits, which stb called "invalid width" (a later probe).
  const std::string rgb4 = HeaderOnlyPng(4, 4, 4, 2);
  auto depth =
      ImageTask::Decode(reinterpret_cast<const uint8_t*>(rgb4.data()), rgb4.size(), "rgb4");
  ASSERT_FALSE(depth.ok());
  EXPECT_NE(depth.status().message().find("PNG header of colour type 2 at 4 bits a sample"),
            std::string::npos)
      << depth.status().message();
  // A PNG whose compressed data is garbage (CRCs right): stb set no reason
  // of its own, and the JPEG decoder's "no SOI" was reported.
  const std::string garbage = TempPath("garbage.png");
  WriteFile(garbage, HeaderOnlyPng(64, 64) +
                         PngChunk("IDAT", "\x78\x9c" + std::string(500, '\xff')) +
                         PngChunk("IEND", ""));
  image = ImageTask::Load(garbage);
  ASSERT_FALSE(image.ok());
  EXPECT_NE(image.status().message().find("truncated or corrupt PNG: its image data does not "
                                          "inflate (zlib: "),
            std::string::npos)
      << image.status().message();
  // What stands where a PNM number belongs is named (width -5 read "width
  // missing"); a BMP palette is named as stb sizes it, and a reason that
  // says what is allowed is not followed by a second "allowed:".
  WriteFile(garbage, "P6\n-5 4\n255\n");
  image = ImageTask::Load(garbage);
  ASSERT_FALSE(image.ok());
  EXPECT_NE(image.status().message().find("PNM width is not a number: '-' at byte 3"),
            std::string::npos)
      << image.status().message();
  std::string bmp = "BM" + std::string(52, '\0');
  const auto le32 = [&bmp](size_t at, uint32_t v) {
    for (int i = 0; i < 4; ++i) bmp[at + i] = static_cast<char>(v >> (8 * i));
  };
  le32(2, 54 + 64);       // file size
  le32(10, 54);           // pixel data right after the header: no room for a palette
  le32(14, 40);           // BITMAPINFOHEADER
  le32(18, 4);            // width
  le32(22, 4);            // height
  bmp[26] = 1;            // planes
  bmp[28] = 8;            // bits a pixel: a palette is needed
  le32(46, 0xFFFFFFFFu);  // colour count, which stb does not read
  WriteFile(garbage, bmp + std::string(64, '\0'));
  image = ImageTask::Load(garbage);
  ASSERT_FALSE(image.ok());
  const std::string bmp_message = image.status().message();
  EXPECT_NE(bmp_message.find("room for 0 palette entries"), std::string::npos) << bmp_message;
  EXPECT_EQ(bmp_message.find("allowed:"), bmp_message.rfind("allowed:")) << bmp_message;
  // A damaged chunk type is printed readably (its NUL bytes went raw into
  // the message).
  WriteFile(garbage, HeaderOnlyPng(64, 64).substr(0, 8) + std::string(40, '\0'));
  image = ImageTask::Load(garbage);
  std::filesystem::remove(garbage);
  ASSERT_FALSE(image.ok());
  EXPECT_NE(image.status().message().find("PNG chunk '\\x00\\x00\\x00\\x00' at byte 8"),
            std::string::npos)
      << image.status().message();
}

// Only a regular file is opened: a FIFO would wait for a writer forever and
// a device would be read without end (both seen by a hostile probe: the
// worker and check-config hung on a FIFO, /dev/zero took 2 GiB first).
TEST(ImageTaskTest, RefusesWhatIsNoRegularFileWithoutOpeningIt) {
  const std::string fifo = TempPath("image.fifo");
  ASSERT_EQ(::mkfifo(fifo.c_str(), 0600), 0) << std::strerror(errno);
  const auto start = std::chrono::steady_clock::now();
  auto image = ImageTask::Load(fifo);
  std::filesystem::remove(fifo);
  ASSERT_FALSE(image.ok());
  EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::seconds(5));
  EXPECT_NE(image.status().message().find("is a FIFO; allowed: a regular"), std::string::npos)
      << image.status().message();
  for (const auto& [path, what] : std::vector<std::pair<std::string, std::string>>{
           {"/dev/zero", "a character device"},
           {std::filesystem::temp_directory_path().string(), "a folder"}}) {
    image = ImageTask::Load(path);
    ASSERT_FALSE(image.ok()) << path;
    EXPECT_NE(image.status().message().find("is " + what + "; allowed:"), std::string::npos)
        << image.status().message();
  }
}

// A large file whose first bytes are no format's header is refused from
// them (a probe's 1.9 GB of zeros was read whole first: 1.96 GB, 12 s). A
// sparse file: nothing of it is on disk.
TEST(ImageTaskTest, AFileOfNoFormatIsRefusedFromItsFirstBytes) {
  const std::string path = TempPath("zeros.png");
  {
    std::FILE* f = std::fopen(path.c_str(), "wb");
    ASSERT_NE(f, nullptr);
    ASSERT_EQ(::ftruncate(::fileno(f), int64_t{1} << 30), 0) << std::strerror(errno);
    std::fclose(f);
  }
  auto image = ImageTask::Load(path);
  std::filesystem::remove(path);
  ASSERT_FALSE(image.ok());
  EXPECT_NE(image.status().message().find(
                "its first bytes are the header of no image format stb decodes"),
            std::string::npos)
      << image.status().message();
  // Files too short for the first check are judged whole, in the same
  // words (they read as stb's bare "unknown image type").
  for (const std::string& bytes : {std::string(1, 'x'), std::string(17, '\0')}) {
    auto small =
        ImageTask::Decode(reinterpret_cast<const uint8_t*>(bytes.data()), bytes.size(), "small");
    ASSERT_FALSE(small.ok()) << bytes.size() << " bytes";
    EXPECT_NE(small.status().message().find(
                  "its first bytes are the header of no image format stb decodes"),
              std::string::npos)
        << small.status().message();
  }
}

// Formats stb does not decode are refused by name, and what is allowed
// names the kinds of the listed formats it does decode (a hostile probe:
// "ASCII PNM is not supported; allowed: ... PNM", and TIFF or WebP as "the
// header of no image format").
TEST(ImageTaskTest, FormatsStbDoesNotDecodeAreNamed) {
  std::string bmp_rle8(54, '\0');
  bmp_rle8.replace(0, 2, "BM");
  bmp_rle8[14] = 40;  // info header size
  bmp_rle8[30] = 1;   // BI_RLE8
  const std::pair<std::string, std::string> cases[] = {
      {std::string("II*\0", 4) + std::string(60, '\0'), "TIFF is not supported"},
      {std::string("MM\0*", 4) + std::string(60, '\0'), "TIFF is not supported"},
      {std::string("RIFF\x10\0\0\0WEBPVP8 ", 16) + std::string(40, '\0'), "WebP is not supported"},
      {std::string("\0\0\0\x0CjP  \r\n\x87\n", 12) + std::string(40, '\0'),
       "JPEG 2000 is not supported"},
      {"P7\nWIDTH 2\nHEIGHT 2\nDEPTH 3\nMAXVAL 255\nENDHDR\n" + std::string(12, 'x'),
       "PAM (P7) is not supported"},
      {"PF\n2 2\n-1.0\n" + std::string(48, '\0'), "PFM is not supported"},
      {bmp_rle8, "RLE-compressed BMP (BI_RLE8) is not supported"},
      {"P2\n2 1\n255\n0 255\n", "ASCII PNM (P1 to P3) is not supported"},
  };
  for (const auto& [bytes, why] : cases) {
    auto image =
        ImageTask::Decode(reinterpret_cast<const uint8_t*>(bytes.data()), bytes.size(), "x");
    ASSERT_FALSE(image.ok()) << why;
    const std::string& message = image.status().message();
    EXPECT_NE(message.find(why), std::string::npos) << message;
    EXPECT_NE(message.find("allowed: JPEG (8-bit, baseline, extended or progressive), PNG, BMP "
                           "(uncompressed), TGA, GIF or binary PNM (P5, P6) files"),
              std::string::npos)
        << message;
  }
}

// The reconstruction is written whole or not at all, and a failed write is
// an error naming why (stb's own writer checked nothing: /dev/full, a full
// disk, ended "done" with no file).
TEST(ImageTaskTest, WritePngIsWholeOrAnErrorNamingWhy) {
  const std::string path = TempPath("written.png");
  const std::vector<uint8_t> rgb = {255, 0, 0, 0, 255, 0, 0, 0, 255, 10, 20, 30};
  ASSERT_TRUE(ImageTask::WritePng(path, 2, 2, rgb).ok());
  auto back = ImageTask::Load(path);
  ASSERT_TRUE(back.ok()) << back.status().ToString();
  EXPECT_EQ(back->width(), 2);
  EXPECT_EQ(back->Channel(9), 10.0f / 255.0f);
  // A write that fails as on a full disk: an error naming why, no file, and
  // no temporary file left beside it.
  std::filesystem::remove(path);
  Status full;
  {
    const ScopedFileSizeLimit no_room(0);
    full = ImageTask::WritePng(path, 2, 2, rgb);
  }
  ASSERT_FALSE(full.ok());
  EXPECT_NE(full.message().find(std::strerror(EFBIG)), std::string::npos) << full.ToString();
  EXPECT_FALSE(std::filesystem::exists(path));
  for (const auto& entry :
       std::filesystem::directory_iterator(std::filesystem::path(path).parent_path()))
    EXPECT_EQ(entry.path().filename().string().find("written.png.tmp"), std::string::npos)
        << "left behind: " << entry.path();
  // A link planted where the temporary file once went (path + ".tmp") is
  // not written through: the file it points to keeps its bytes.
  const std::string victim = TempPath("victim.txt");
  std::ofstream(victim) << "keep me";
  std::filesystem::create_symlink(victim, path + ".tmp");
  const Status linked = ImageTask::WritePng(path, 2, 2, rgb);
  std::filesystem::remove(path + ".tmp");
  ASSERT_TRUE(linked.ok()) << linked.ToString();
  std::ifstream kept(victim);
  EXPECT_EQ(std::string(std::istreambuf_iterator<char>(kept), {}), "keep me");
  ASSERT_TRUE(ImageTask::Load(path).ok());
  std::filesystem::remove(path);
  std::filesystem::remove(victim);
  // A folder where the file goes.
  std::filesystem::create_directory(path);
  const Status folder = ImageTask::WritePng(path, 2, 2, rgb);
  std::filesystem::remove(path);
  ASSERT_FALSE(folder.ok());
  EXPECT_NE(folder.message().find("it is a folder"), std::string::npos) << folder.ToString();
}

}  // namespace
}  // namespace gridsync
