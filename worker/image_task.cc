#include "worker/image_task.h"

#include <stb_image.h>
#include <stb_image_write.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <cerrno>
#include <climits>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <optional>
#include <vector>

#include "common/checkpoint_files.h"
#include "common/counter_rng.h"
#include "common/file_bytes.h"
#include "common/host_memory.h"
#include "worker/image_data_checks.h"
#include "worker/image_dimensions.h"
#include "worker/image_precheck.h"
#include "worker/stb_header_refusal.h"

namespace gridsync {
namespace {

// What a file of no format stb knows is told, whatever its size (a file of
// under 18 bytes, judged whole, read as stb's bare "unknown image type").
constexpr const char* kNoFormat =
    "its first bytes are the header of no image format stb decodes (unknown image type)";

constexpr std::array<float, 256> MakeByteValues() {
  std::array<float, 256> values{};
  for (int i = 0; i < 256; ++i) values[i] = static_cast<float>(i) / 255.0f;
  return values;
}

constexpr std::array<float, 256> kByteValues = MakeByteValues();

inline float Value(float c) { return c; }
inline float Value(uint8_t c) { return kByteValues[c]; }

// Samples ahead whose pixels are prefetched: a batch's positions are
// uniform over the image, so its pixel rows are as scattered as the grid's.
constexpr size_t kPrefetchSamples = 8;

constexpr const char* kAllowedFormats =
    "JPEG (8-bit, baseline, extended or progressive), PNG, BMP (uncompressed), TGA, GIF or binary "
    "PNM "
    "(P5, P6)";

// The bilinear lookup at (u, v), clamped at the edges: one definition for
// Target and the batches, which must agree bit for bit.
template <typename T>
inline void Bilinear(const T* channels, int width, int height, float u, float v, float* rgb) {
  const float x = u * static_cast<float>(width) - 0.5f;
  const float y = v * static_cast<float>(height) - 0.5f;
  const float fx = std::floor(x);
  const float fy = std::floor(y);
  const float ax = x - fx;
  const float ay = y - fy;
  const int x0 = std::clamp(static_cast<int>(fx), 0, width - 1);
  const int x1 = std::clamp(static_cast<int>(fx) + 1, 0, width - 1);
  const int y0 = std::clamp(static_cast<int>(fy), 0, height - 1);
  const int y1 = std::clamp(static_cast<int>(fy) + 1, 0, height - 1);
  const T* p00 = &channels[(static_cast<size_t>(y0) * width + x0) * 3];
  const T* p01 = &channels[(static_cast<size_t>(y0) * width + x1) * 3];
  const T* p10 = &channels[(static_cast<size_t>(y1) * width + x0) * 3];
  const T* p11 = &channels[(static_cast<size_t>(y1) * width + x1) * 3];
  for (int c = 0; c < 3; ++c) {
    const float c00 = Value(p00[c]), c01 = Value(p01[c]);
    const float c10 = Value(p10[c]), c11 = Value(p11[c]);
    const float top = c00 + (c01 - c00) * ax;
    const float bottom = c10 + (c11 - c10) * ax;
    rgb[c] = top + (bottom - top) * ay;
  }
}

}  // namespace

std::string ImageTask::Digest() const {
  const std::string_view pixels =
      bytes_.empty()
          ? std::string_view(reinterpret_cast<const char*>(floats_.data()),
                             floats_.size() * sizeof(float))
          : std::string_view(reinterpret_cast<const char*>(bytes_.data()), bytes_.size());
  // One snprintf: GCC 12 warns (-Wrestrict, a false positive) on a chain
  // of string operator+ starting from a literal.
  char text[96];
  std::snprintf(text, sizeof(text), "\"%dx%d, fnv1a64 %016llx\"", width_, height_,
                static_cast<unsigned long long>(Fnv1a64(pixels)));
  return text;
}

float ImageTask::Channel(size_t i) const { return bytes_.empty() ? floats_[i] : Value(bytes_[i]); }

Result<ImageTask> ImageTask::Load(const std::string& path) {
  // Looked at before it is opened: opening a FIFO waits for a writer
  // forever, and a device (/dev/zero) reads without end; only a regular
  // file of bounded size is read, and only as many bytes as it has.
  struct stat info {};
  if (::stat(path.c_str(), &info) != 0) {
    return Status::IOError("cannot load image '" + path + "': " + std::strerror(errno) +
                           "; allowed: a readable " + kAllowedFormats + " file");
  }
  if (!S_ISREG(info.st_mode)) {
    return Status::InvalidArgument("image '" + path + "' is " + FileKindName(info.st_mode) +
                                   "; allowed: a regular " + kAllowedFormats + " file");
  }
  const uint64_t size = static_cast<uint64_t>(info.st_size);
  if (size > kMaxFileBytes) {
    return Status::InvalidArgument("image '" + path + "' is " + std::to_string(size) +
                                   " bytes; allowed: at most " + std::to_string(kMaxFileBytes) +
                                   " bytes");
  }
  // Its first bytes before the rest, read once: a file no decoder takes is
  // refused without reading up to 2 GiB of it, and one far larger than the
  // image its header claims (a 1 x 1 image followed by a gigabyte of
  // anything, read whole in every process that loads it) is refused unread
  // too (image_dimensions.h: past 64 MiB, the first MiB's header).
  const bool sized = size > image_dimensions::kMetadataBytes;
  std::vector<uint8_t> head(sized ? size_t{1} << 20 : image_precheck::kHeadBytes);
  const size_t want = static_cast<size_t>(std::min<uint64_t>(size, head.size()));
  std::FILE* file = std::fopen(path.c_str(), "rb");
  const size_t got = file != nullptr ? std::fread(head.data(), 1, want, file) : 0;
  if (file != nullptr) std::fclose(file);
  if (got == want &&
      !image_precheck::MayBeImage(head.data(), std::min(got, image_precheck::kHeadBytes))) {
    return Status::IOError("cannot load image '" + path + "': " + kNoFormat +
                           "; allowed: " + kAllowedFormats + " files");
  }
  // (A format the task refuses is named as such by Decode, not sized here
  // by a header it does not have.)
  const auto claimed = sized && image_precheck::RefusedFormat(head.data(), got) == nullptr
                           ? image_dimensions::HeaderDimensions(head.data(), got)
                           : std::nullopt;
  if (claimed) {
    // Sides past the task's bounds are the decoder's to refuse, by name.
    const uint64_t pixels = std::min<uint64_t>(claimed->width, kMaxSide + 1) *
                            std::min<uint64_t>(claimed->height, kMaxSide + 1);
    if (size > image_dimensions::MaxFileBytes(pixels)) {
      return Status::InvalidArgument(
          "image '" + path + "' is " + std::to_string(size) + " bytes for the " +
          std::to_string(claimed->width) + " x " + std::to_string(claimed->height) +
          " pixels its header claims (the rest is no part of the image: appended, or "
          "corrupt); allowed: at most " +
          std::to_string(image_dimensions::MaxFileBytes(pixels)) +
          " bytes for that size (64 MiB of metadata and 16 bytes a pixel)");
    }
  }
  auto bytes = ReadFileOfSize(path, size);
  if (!bytes.ok()) {
    // The read's own message may say what it allows already (one
    // "allowed:" a message).
    const std::string& why = bytes.status().message();
    return Status::IOError("cannot load image '" + path + "': " + why +
                           (why.find("; allowed: ") == std::string::npos
                                ? std::string("; allowed: a readable ") + kAllowedFormats + " file"
                                : std::string()));
  }
  return Decode(reinterpret_cast<const uint8_t*>(bytes->data()), bytes->size(), path);
}

Result<ImageTask> ImageTask::Decode(const uint8_t* data, size_t size, const std::string& name) {
  // A reason that says what is allowed keeps its own (two "allowed:" in
  // one message read as a contradiction).
  const auto refuse = [&](const std::string& why) {
    const bool says_allowed = why.find("; allowed: ") != std::string::npos;
    return Status::IOError(
        "cannot load image '" + name + "': " + why +
        (says_allowed ? "" : std::string("; allowed: ") + kAllowedFormats + " files"));
  };
  const auto too_large = [&](uint64_t width, uint64_t height) {
    return Status::InvalidArgument("image '" + name + "' is " + std::to_string(width) + " x " +
                                   std::to_string(height) + " pixels; allowed: 1 to " +
                                   std::to_string(kMaxSide) + " pixels a side, at most " +
                                   std::to_string(kMaxPixels) + " pixels");
  };
  const auto fits = [](uint64_t width, uint64_t height) {
    return width > 0 && height > 0 && width <= kMaxSide && height <= kMaxSide &&
           width * height <= kMaxPixels;
  };
  // stb says "" for some damage (a chunk type it read as zeros).
  const auto reason = [&] {
    const char* why = stbi_failure_reason();
    const bool said = why != nullptr && *why != '\0';
    std::string text = said ? std::string(why) : std::string("truncated or corrupt");
    // stb tries every decoder and keeps the last complaint, and some of its
    // failures set none: a damaged file of a format it knows then reads as
    // "unknown image type", or as another decoder's words (a PNG whose
    // compressed data is garbage said "no SOI", a JPEG's).
    const char* format = image_precheck::SignatureFormat(data, size);
    if (format == nullptr && text == "unknown image type") text = kNoFormat;
    if (format != nullptr) {
      const std::string_view f = format;
      const bool foreign = !said || text == "unknown image type" ||
                           (text == "no SOI" && f != "JPEG") || (text == "not BMP" && f != "BMP") ||
                           (text == "not GIF" && f != "GIF") || (text == "not PNG" && f != "PNG") ||
                           (text == "bad png sig" && f != "PNG") || text == "not PSD" ||
                           text == "not PIC" || text == "not HDR";
      if (!foreign) {
        // stb's own words for damage its decoder met ("not enough pixels",
        // "bad huffman code"): framed, so that they name the format.
        const bool ends_with_eoi = size >= 2 && data[size - 2] == 0xFF && data[size - 1] == 0xD9;
        if (text == "outofmem") {
          text = "stb_image ran out of memory decoding this " + std::string(f);
        } else if (f == "JPEG" && text == "expected marker" && !ends_with_eoi) {
          text = "truncated JPEG: the file ends without its end-of-image marker (FF D9)";
        } else {
          text = "corrupt " + std::string(f) + " data (stb_image: " + text + ")";
        }
      } else {
        // A header its own decoder refuses may be cut or damaged, or a kind
        // of that format stb does not take (an RLE BMP, a JPEG of two
        // components): its reason tells which ("no SOF", "BMP RLE").
        const std::string own = StbHeaderRefusal(f, data, size);
        text = own.empty()
                   ? "truncated or corrupt " + std::string(f) + " (its data does not decode)"
                   : "truncated, corrupt or unsupported " + std::string(f) +
                         ": stb_image's decoder refuses its header (" + own + ")";
      }
    }
    return text;
  };
  if (size == 0) return refuse("the file is empty (0 bytes)");
  if (size > kMaxFileBytes) {
    return Status::InvalidArgument("image '" + name + "' is " + std::to_string(size) +
                                   " bytes; allowed: at most " + std::to_string(kMaxFileBytes) +
                                   " bytes");
  }
  if (const char* format = image_precheck::RefusedFormat(data, size)) {
    return refuse(std::string(format) + " is not supported");
  }
  if (Status checked = image_precheck::CheckStructure(data, size); !checked.ok()) {
    return refuse(checked.message());
  }
  const int len = static_cast<int>(size);
  int w = 0, h = 0, channels = 0;
  // The dimensions first: a small file can claim a huge image, and decoding
  // it would take the memory before anything could refuse.
  if (stbi_info_from_memory(data, len, &w, &h, &channels) == 0) {
    // stb_image refuses a PNG over 2^30 decoded bytes as "unknown image
    // type" (the last format it tried): name the size instead.
    uint32_t png_width = 0, png_height = 0;
    if (image_precheck::PngDimensions(data, size, &png_width, &png_height) &&
        !fits(png_width, png_height)) {
      return too_large(png_width, png_height);
    }
    return refuse(reason());
  }
  // stb_image gives a top-down BMP's height as it is stored, negative (its
  // loader takes the absolute value).
  if (h < 0 && data[0] == 'B' && data[1] == 'M' && h != INT_MIN) h = -h;
  if (w <= 0 || h <= 0 || !fits(uint64_t(w), uint64_t(h)))
    return too_large(std::max(w, 0), std::max(h, 0));
  // What the decoder takes for that size, before it takes it: a file of a
  // few bytes can claim 2^28 pixels, which GIF's decoder alone would hold at
  // 12 bytes each.
  const uint64_t need = image_precheck::DecodeBytes(data, size, uint64_t(w) * uint64_t(h));
  if (const uint64_t available = AvailableToThisProcessBytes(); available > 0 && need > available) {
    const auto [needs, has] = NeedAndAvailable(need, available);
    return Status::InvalidArgument("image '" + name + "' is " + std::to_string(w) + " x " +
                                   std::to_string(h) + " pixels: decoding it takes about " + needs +
                                   ", " + has + " are available; allowed: a smaller image");
  }
  // A palette PNG is decoded with its palette padded by a colour it does
  // not hold: a pixel of that colour indexes past the palette, where stb
  // would read its uninitialised stack (image_data_checks.h).
  uint8_t sentinel[3] = {};
  uint32_t entries = 0;
  const std::vector<uint8_t> padded =
      image_data_checks::PngWithSentinelPalette(data, size, sentinel, &entries);
  int width = 0, height = 0;
  unsigned char* pixels =
      padded.empty() ? stbi_load_from_memory(data, len, &width, &height, &channels, 3)
                     : stbi_load_from_memory(padded.data(), static_cast<int>(padded.size()), &width,
                                             &height, &channels, 3);
  if (pixels == nullptr) return refuse(reason());
  if (!padded.empty() && width > 0 && height > 0) {
    const size_t count = size_t(width) * size_t(height);
    for (size_t i = 0; i < count; ++i) {
      if (std::memcmp(pixels + 3 * i, sentinel, 3) == 0) {
        stbi_image_free(pixels);
        return refuse("PNG pixel (" + std::to_string(i % size_t(width)) + ", " +
                      std::to_string(i / size_t(width)) + ") indexes past the palette's " +
                      std::to_string(entries) + " entries (corrupt)");
      }
    }
  }
  ImageTask task;
  task.width_ = width;
  task.height_ = height;
  task.decode_peak_bytes_ = need;
  // What stb decoded may differ from what its header claimed (it decides
  // again while decoding): the decoded size counts, within the same bound.
  if (width <= 0 || height <= 0 || !fits(uint64_t(width), uint64_t(height))) {
    stbi_image_free(pixels);
    return too_large(std::max(width, 0), std::max(height, 0));
  }
  task.bytes_.assign(pixels, pixels + size_t(width) * size_t(height) * 3);
  stbi_image_free(pixels);
  return task;
}

ImageTask ImageTask::FromPixels(int width, int height, std::vector<float> rgb) {
  ImageTask task;
  task.width_ = width;
  task.height_ = height;
  task.floats_ = std::move(rgb);
  return task;
}

std::vector<float> ImageTask::Floats() const {
  std::vector<float> out(pixel_count() * 3);
  for (size_t i = 0; i < out.size(); ++i) out[i] = Channel(i);
  return out;
}

void ImageTask::Target(float u, float v, float* rgb) const {
  if (bytes_.empty()) {
    Bilinear(floats_.data(), width_, height_, u, v, rgb);
  } else {
    Bilinear(bytes_.data(), width_, height_, u, v, rgb);
  }
}

template <typename T>
void ImageTask::SampleRange(const T* channels, uint64_t seed, uint64_t step, uint64_t begin,
                            size_t count, float* positions, float* targets) const {
  // Positions first, so that the pixels of samples ahead can be prefetched.
  for (size_t i = 0; i < count; ++i) {
    CounterUniform2(seed, step, begin + i, &positions[2 * i], &positions[2 * i + 1]);
  }
  const float fw = static_cast<float>(width_), fh = static_cast<float>(height_);
  for (size_t i = 0; i < count; ++i) {
    if (i + kPrefetchSamples < count) {
      const float* ahead = &positions[2 * (i + kPrefetchSamples)];
      // The pixel left of and above the sample (clamped as Target clamps)
      // and the row below: Target's four reads are on these two rows.
      const int x0 = std::clamp(static_cast<int>(ahead[0] * fw - 0.5f), 0, width_ - 1);
      const int y0 = std::clamp(static_cast<int>(ahead[1] * fh - 0.5f), 0, height_ - 1);
      const int y1 = std::min(y0 + 1, height_ - 1);
      __builtin_prefetch(&channels[(static_cast<size_t>(y0) * width_ + x0) * 3]);
      __builtin_prefetch(&channels[(static_cast<size_t>(y1) * width_ + x0) * 3]);
    }
    Bilinear(channels, width_, height_, positions[2 * i], positions[2 * i + 1], targets + 3 * i);
  }
}

void ImageTask::SampleBatch(uint64_t seed, uint64_t step, uint64_t begin, size_t count,
                            float* positions, float* targets) const {
  if (bytes_.empty()) {
    SampleRange(floats_.data(), seed, step, begin, count, positions, targets);
  } else {
    SampleRange(bytes_.data(), seed, step, begin, count, positions, targets);
  }
}

void ImageTask::PixelCentres(uint64_t begin, size_t count, float* positions) const {
  const uint64_t w = static_cast<uint64_t>(width_);
  for (size_t i = 0; i < count; ++i) {
    const uint64_t p = begin + i;
    positions[2 * i] = (static_cast<float>(p % w) + 0.5f) / static_cast<float>(width_);
    positions[2 * i + 1] = (static_cast<float>(p / w) + 0.5f) / static_cast<float>(height_);
  }
}

double ImageTask::AddSquaredError(double se, uint64_t begin, size_t count,
                                  const float* prediction) const {
  const size_t first = begin * 3;
  for (size_t i = 0; i < count * 3; ++i) {
    const double d = std::clamp(prediction[i], 0.0f, 1.0f) - Channel(first + i);
    se += d * d;
  }
  return se;
}

double ImageTask::PsnrOf(double squared_error) const {
  const double mse = squared_error / static_cast<double>(pixel_count() * 3);
  // NaN stays NaN (a model whose outputs are not finite), never the 99 dB
  // of a perfect fit.
  if (std::isnan(mse)) return mse;
  return mse > 0 ? -10.0 * std::log10(mse) : 99.0;
}
uint8_t ImageTask::ToByte(float value) {
  return static_cast<uint8_t>(std::lround(std::clamp(value, 0.0f, 1.0f) * 255.0f));
}

Status ImageTask::WritePng(const std::string& path, int width, int height,
                           const std::vector<uint8_t>& rgb) {
  std::error_code ec;
  const auto parent = std::filesystem::path(path).parent_path();
  if (!parent.empty()) std::filesystem::create_directories(parent, ec);
  if (ec) return Status::IOError("cannot create folder '" + parent.string() + "': " + ec.message());
  if (std::filesystem::is_directory(path, ec)) {
    return Status::IOError("cannot write PNG '" + path +
                           "': it is a folder; allowed: a file path (or none there)");
  }
  // Encoded in memory, then written whole (temporary file, fsync, rename):
  // stb's own file writer checks no write, so a full disk or /dev/full
  // ended "done" with no file, and a run killed mid-write left half a PNG.
  std::string bytes;
  const auto append = [](void* out, void* data, int size) {
    static_cast<std::string*>(out)->append(static_cast<const char*>(data),
                                           static_cast<size_t>(size));
  };
  if (!stbi_write_png_to_func(append, &bytes, width, height, 3, rgb.data(), width * 3))
    return Status::IOError("cannot encode PNG '" + path + "'");
  return WriteFileAtomically(path, bytes).WithContext("cannot write PNG '" + path + "'");
}

}  // namespace gridsync
