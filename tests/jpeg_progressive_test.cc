// The progressive half of the JPEG scan checks (worker/
// jpeg_progressive_scan.h) on real files: libjpeg's progressive scripts
// (DC first and refinement, AC first and refinement scans, end-of-band
// runs; 4:4:4, 4:2:0 with a restart interval, 4:2:2 with optimised tables,
// grey) decode, and the same files cut short, with an EOI put back, are
// refused wherever the cut falls: inside a scan's data, or between scans.
#include <gtest/gtest.h>

#include <fstream>
#include <iterator>
#include <string>
#include <vector>

#include "worker/image_task.h"

namespace gridsync {
namespace {

const char* const kFiles[] = {
    "fuzz/corpus/image_decode_fuzz/jpeg-progressive-ycc444.jpg",
    "fuzz/corpus/image_decode_fuzz/jpeg-progressive-grey.jpg",
    "fuzz/corpus/image_decode_fuzz/jpeg-progressive-420-restart.jpg",
    "fuzz/corpus/image_decode_fuzz/jpeg-progressive-422-optimized.jpg",
};

std::string ReadFile(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}

Result<ImageTask> Decode(const std::string& bytes) {
  return ImageTask::Decode(reinterpret_cast<const uint8_t*>(bytes.data()), bytes.size(), "x");
}

// Where each scan's header starts (FF DA).
std::vector<size_t> Scans(const std::string& jpeg) {
  std::vector<size_t> at;
  for (size_t p = jpeg.find("\xFF\xDA"); p != std::string::npos; p = jpeg.find("\xFF\xDA", p + 2))
    at.push_back(p);
  return at;
}

// Where the data of the scan whose header starts at `sos` begins, and
// where data starting at `at` ends: the next marker (a DHT between scans,
// the next scan, or EOI), skipping stuffed bytes and restart markers.
size_t DataStart(const std::string& jpeg, size_t sos) {
  return sos + 2 + (size_t{uint8_t(jpeg[sos + 2])} << 8 | uint8_t(jpeg[sos + 3]));
}
size_t DataEnd(const std::string& jpeg, size_t at) {
  while (at + 1 < jpeg.size() &&
         !(uint8_t(jpeg[at]) == 0xFF && jpeg[at + 1] != 0 && uint8_t(jpeg[at + 1]) != 0xFF &&
           (uint8_t(jpeg[at + 1]) < 0xD0 || uint8_t(jpeg[at + 1]) > 0xD7))) {
    ++at;
  }
  return at;
}

TEST(JpegProgressiveTest, EncodersFilesDecode) {
  for (const char* path : kFiles) {
    const std::string jpeg = ReadFile(path);
    ASSERT_FALSE(jpeg.empty()) << path << " (run from the source folder)";
    ASSERT_NE(jpeg.find("\xFF\xC2"), std::string::npos) << path << " is not progressive";
    EXPECT_GE(Scans(jpeg).size(), 2u) << path;
    auto image = Decode(jpeg);
    EXPECT_TRUE(image.ok()) << path << ": " << image.status().ToString();
  }
}

TEST(JpegProgressiveTest, ACutInsideAScanIsRefused) {
  for (const char* path : kFiles) {
    const std::string jpeg = ReadFile(path);
    ASSERT_FALSE(jpeg.empty()) << path;
    const std::vector<size_t> scans = Scans(jpeg);
    // Halfway into each scan's data.
    for (size_t s = 0; s < scans.size(); ++s) {
      const size_t data = DataStart(jpeg, scans[s]);
      const size_t next = DataEnd(jpeg, data);
      if (next <= data + 4) continue;  // too little data to cut into
      const std::string cut = jpeg.substr(0, data + (next - data) / 2) + "\xFF\xD9";
      auto image = Decode(cut);
      ASSERT_FALSE(image.ok()) << path << " cut in scan " << s + 1;
      EXPECT_NE(image.status().message().find("JPEG progressive scan " + std::to_string(s + 1)),
                std::string::npos)
          << path << ": " << image.status().message();
      EXPECT_NE(image.status().message().find("truncated"), std::string::npos)
          << image.status().message();
    }
  }
}

TEST(JpegProgressiveTest, ACutBetweenScansIsRefused) {
  for (const char* path : kFiles) {
    const std::string jpeg = ReadFile(path);
    ASSERT_FALSE(jpeg.empty()) << path;
    const std::vector<size_t> scans = Scans(jpeg);
    // Every whole scan kept, the rest gone: some coefficient never reaches
    // its last bit (the last scan of libjpeg's scripts is a refinement).
    for (size_t kept = 1; kept < scans.size(); ++kept) {
      const std::string cut = jpeg.substr(0, scans[kept]) + "\xFF\xD9";
      auto image = Decode(cut);
      ASSERT_FALSE(image.ok()) << path << " after " << kept << " scans";
      EXPECT_NE(image.status().message().find("progressive JPEG ends before its scans sent"),
                std::string::npos)
          << path << ": " << image.status().message();
    }
  }
}

TEST(JpegProgressiveTest, EveryCutIsRefused) {
  for (const char* path : kFiles) {
    const std::string jpeg = ReadFile(path);
    ASSERT_FALSE(jpeg.empty()) << path;
    const size_t eoi = jpeg.rfind("\xFF\xD9");
    ASSERT_NE(eoi, std::string::npos);
    for (size_t at = 200; at < eoi; at += 37) {
      auto image = Decode(jpeg.substr(0, at) + "\xFF\xD9");
      EXPECT_FALSE(image.ok()) << path << " cut at byte " << at << " of " << jpeg.size();
    }
  }
}

// The bytes of scan s: from the DHT segments just before it (the tables it
// was coded with) to the end of its data.
std::string ScanWithTables(const std::string& jpeg, size_t s) {
  const std::vector<size_t> scans = Scans(jpeg);
  size_t from = scans[s];
  const size_t before = s > 0 ? scans[s - 1] : 0;
  for (size_t p = jpeg.find("\xFF\xC4", before); p != std::string::npos && p < scans[s];
       p = jpeg.find("\xFF\xC4", p + 2)) {
    from = std::min(from, p);
  }
  const size_t end = DataEnd(jpeg, DataStart(jpeg, scans[s]));
  return jpeg.substr(from, end - from);
}

TEST(JpegProgressiveTest, AFirstDcScanAtTheEndClearsWhatCameBefore) {
  // stb clears a block at its first DC scan, AC coefficients included: the
  // first scan again (at full precision) just before EOI decodes an image
  // without detail, and no later scan sends the AC coefficients again.
  for (const char* path : kFiles) {
    const std::string jpeg = ReadFile(path);
    ASSERT_FALSE(jpeg.empty()) << path;
    std::string again = ScanWithTables(jpeg, 0);
    const size_t sos = again.find("\xFF\xDA");
    ASSERT_NE(sos, std::string::npos);
    const size_t n = uint8_t(again[sos + 4]);
    again[sos + 5 + 2 * n + 2] = 0;  // Ah = Al = 0: the DC at full precision at once
    const size_t eoi = jpeg.rfind("\xFF\xD9");
    const std::string attacked = jpeg.substr(0, eoi) + again + jpeg.substr(eoi);
    auto image = Decode(attacked);
    ASSERT_FALSE(image.ok()) << path;
    EXPECT_NE(image.status().message().find("coefficients 1-63 (zig-zag order)"), std::string::npos)
        << path << ": " << image.status().message();
  }
}

TEST(JpegProgressiveTest, ThousandsOfScansAreRefused) {
  // Each scan walks every block; no encoder writes more than a few dozen.
  const std::string jpeg = ReadFile(kFiles[0]);
  ASSERT_FALSE(jpeg.empty());
  // The first DC scan again and again (it reads no earlier scan's state).
  const std::string first = ScanWithTables(jpeg, 0);
  const size_t eoi = jpeg.rfind("\xFF\xD9");
  std::string many = jpeg.substr(0, eoi);
  for (int i = 0; i < 300; ++i) many += first;
  many += jpeg.substr(eoi);
  auto image = Decode(many);
  ASSERT_FALSE(image.ok());
  EXPECT_NE(image.status().message().find("progressive JPEG of more than 256 scans"),
            std::string::npos)
      << image.status().message();
}

// A grey progressive JPEG of `width` x `height` pixels whose every scan is
// end-of-band runs (all coefficients zero): a DC first scan, an AC first
// scan, then `refinements` AC refinement scans, each walking every block.
std::string EndOfBandScans(uint32_t width, uint32_t height, int refinements) {
  const auto u16 = [](uint32_t v) { return std::string{char(v >> 8), char(v & 0xFF)}; };
  const auto segment = [&](uint8_t marker, const std::string& body) {
    return std::string{'\xFF', char(marker)} + u16(uint32_t(body.size()) + 2) + body;
  };
  struct BitWriter {
    std::string out;
    uint32_t acc = 0;
    int n = 0;
    void Put(uint32_t v, int bits) {
      for (int i = bits - 1; i >= 0; --i) {
        acc = acc << 1 | ((v >> i) & 1);
        if (++n == 8) {
          out += char(acc);
          if (acc == 0xFF) out += '\0';  // stuffed
          acc = 0;
          n = 0;
        }
      }
    }
    std::string Flush() {
      if (n > 0) Put((1u << (8 - n)) - 1, 8 - n);
      return out;
    }
  };
  const uint64_t blocks = uint64_t{(width + 7) / 8} * ((height + 7) / 8);
  std::string jpeg = "\xFF\xD8";
  jpeg += segment(0xDB, std::string(1, '\0') + std::string(64, '\x01'));
  jpeg += segment(
      0xC2, std::string(1, '\x08') + u16(height) + u16(width) + std::string("\x01\x01\x11\x00", 4));
  // DC: one code, "0", for category 0; AC: one code, "0", for EOB run
  // class 14, whose 14 extra bits of ones make runs of 32767 blocks.
  jpeg += segment(0xC4, std::string("\x00\x01", 2) + std::string(15, '\0') + '\0');
  jpeg += segment(0xC4, std::string("\x10\x01", 2) + std::string(15, '\0') + '\xE0');
  BitWriter dc;
  for (uint64_t b = 0; b < blocks; ++b) dc.Put(0, 1);
  jpeg += segment(0xDA, std::string("\x01\x01\x00\x00\x00\x00", 6)) + dc.Flush();
  const auto ac_scan = [&](int ah) {
    BitWriter bits;
    for (uint64_t covered = 0; covered < blocks; covered += 32767) {
      bits.Put(0, 1);
      bits.Put((1u << 14) - 1, 14);
    }
    return segment(0xDA, std::string("\x01\x01\x00\x01\x3F", 5) + char(ah << 4)) + bits.Flush();
  };
  jpeg += ac_scan(0);
  for (int r = 0; r < refinements; ++r) jpeg += ac_scan(1);
  return jpeg + "\xFF\xD9";
}

// A hostile probe: 254 refinement scans of one end-of-band run each over a
// 16384 x 16384 grey image (617 KB, under the 256-scan cap) took 36 s to
// check and decode. The scans may walk each block at most 16 times.
TEST(JpegProgressiveTest, ScansWalkingEveryBlockTooOftenAreRefused) {
  // 4096 x 4096: 262144 blocks walked 72 times, 18.9M walks in all.
  auto image = Decode(EndOfBandScans(4096, 4096, 70));
  ASSERT_FALSE(image.ok());
  EXPECT_NE(image.status().message().find("walk its 262144 blocks more than 16 times over"),
            std::string::npos)
      << image.status().message();
  // The same script over a small image is cheap, whatever its scans.
  auto small = Decode(EndOfBandScans(256, 256, 70));
  EXPECT_TRUE(small.ok()) << small.status().ToString();
  // Within 16 walks a block, a large one decodes too.
  auto few = Decode(EndOfBandScans(4096, 4096, 10));
  EXPECT_TRUE(few.ok()) << few.status().ToString();
}

TEST(JpegProgressiveTest, AFlippedBitInAScanIsNotACrash) {
  // Damage inside the data: refused or decoded, never a crash or a hang.
  const std::string jpeg = ReadFile(kFiles[2]);
  ASSERT_FALSE(jpeg.empty());
  const size_t first = Scans(jpeg).front();
  for (size_t at = first + 20; at + 2 < jpeg.size(); at += 29) {
    std::string flipped = jpeg;
    flipped[at] = static_cast<char>(uint8_t(flipped[at]) ^ 0x10);
    (void)Decode(flipped);
  }
}

}  // namespace
}  // namespace gridsync
