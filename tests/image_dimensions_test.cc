// The pixels an image file's header claims (worker/image_dimensions.h), and
// the refusal of a file far larger than that image before it is read: a
// 1 x 1 PPM or PNG followed by a gigabyte of anything was read whole by
// every process that loads the image, and trained (a hostile probe).
#include "worker/image_dimensions.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <string>

#include "worker/image_task.h"

namespace gridsync {
namespace {

using image_dimensions::HeaderDimensions;

std::string Be16(uint32_t v) { return std::string{char(v >> 8), char(v)}; }
std::string Be32(uint32_t v) { return Be16(v >> 16) + Be16(v); }
std::string Le16(uint32_t v) { return std::string{char(v), char(v >> 8)}; }
std::string Le32(uint32_t v) { return Le16(v) + Le16(v >> 16); }

void ExpectDimensions(const std::string& bytes, uint64_t width, uint64_t height) {
  const auto got = HeaderDimensions(reinterpret_cast<const uint8_t*>(bytes.data()), bytes.size());
  ASSERT_TRUE(got.has_value()) << "none read";
  EXPECT_EQ(got->width, width);
  EXPECT_EQ(got->height, height);
}

TEST(ImageDimensionsTest, EachFormatsHeaderIsRead) {
  const std::string png = "\x89PNG\r\n\x1a\n";
  const std::string ihdr = Be32(13) + "IHDR" + Be32(640) + Be32(480) + std::string(5, '\0');
  ExpectDimensions(png + ihdr + Be32(0), 640, 480);
  // An iPhone PNG's CgBI chunk comes first.
  ExpectDimensions(png + Be32(4) + "CgBI" + std::string(8, '\0') + ihdr + Be32(0), 640, 480);
  // JPEG: fill bytes, APP0 and a large APP1 before the frame header.
  const std::string app1 = "\xFF\xE1" + Be16(2 + 3000) + std::string(3000, 'x');
  ExpectDimensions("\xFF\xFF\xD8\xFF\xE0" + Be16(16) + std::string(14, '\0') + app1 +
                       "\xFF\xFF\xC2" + Be16(17) + "\x08" + Be16(1080) + Be16(1920) + "\x03",
                   1920, 1080);
  // DHT (C4) is no frame header.
  ExpectDimensions(
      "\xFF\xD8\xFF\xC4" + Be16(4) + "ab\xFF\xC0" + Be16(17) + "\x08" + Be16(5) + Be16(7), 7, 5);
  std::string no_frame = "\xFF\xD8\xFF\xDA" + Be16(4) + "ab";
  EXPECT_FALSE(HeaderDimensions(reinterpret_cast<const uint8_t*>(no_frame.data()), no_frame.size())
                   .has_value());
  ExpectDimensions("GIF89a" + Le16(300) + Le16(200) + std::string(3, '\0'), 300, 200);
  // BMP: a top-down one's negative height, and OS/2's 16-bit sizes.
  ExpectDimensions("BM" + std::string(12, '\0') + Le32(40) + Le32(33) + Le32(uint32_t(-44)), 33,
                   44);
  ExpectDimensions("BM" + std::string(12, '\0') + Le32(12) + Le16(9) + Le16(10) + Le32(0), 9, 10);
  ExpectDimensions("P6 # a comment\n 12\t# another\n34\n255\n", 12, 34);
  ExpectDimensions("P5\n1 1\n255\n\x80", 1, 1);
  ExpectDimensions(std::string(12, '\0') + Le16(70) + Le16(80) + std::string(2, '\0'), 70, 80);
}

class ImageFileSizeTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = ::testing::TempDir() + "/image-size-" + std::to_string(::getpid());
    std::filesystem::create_directories(dir_);
  }
  void TearDown() override { std::filesystem::remove_all(dir_); }
  // A file of `head` made `size` bytes long (sparse: no disk taken).
  std::string Sparse(const std::string& name, const std::string& head, uint64_t size) const {
    const std::string path = dir_ + "/" + name;
    std::ofstream(path, std::ios::binary) << head;
    std::filesystem::resize_file(path, size);
    return path;
  }
  std::string dir_;
};

TEST_F(ImageFileSizeTest, AFileFarLargerThanItsImageIsRefusedUnread) {
  const std::string ppm = Sparse("one.ppm", "P6\n1 1\n255\n\x10\x20\x30", uint64_t{100} << 20);
  auto refused = ImageTask::Load(ppm);
  ASSERT_FALSE(refused.ok());
  EXPECT_NE(refused.status().message().find(
                "is 104857600 bytes for the 1 x 1 pixels its header claims (the rest is no part "
                "of the image: appended, or corrupt); allowed: at most 67108880 bytes for that "
                "size"),
            std::string::npos)
      << refused.status().message();
  // An image as large as its file: loads (4800 x 4800, 66 MiB of pixels).
  const std::string header = "P6\n4800 4800\n255\n";
  const std::string big = Sparse("big.ppm", header, header.size() + uint64_t{4800} * 4800 * 3);
  auto loaded = ImageTask::Load(big);
  ASSERT_TRUE(loaded.ok()) << loaded.status().ToString();
  EXPECT_EQ(loaded->width(), 4800);
}

}  // namespace
}  // namespace gridsync
