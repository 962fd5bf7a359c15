// The image-fitting task: learn f(u, v) -> RGB for one image, as in
// instant-ngp's and tiny-cuda-nn's image sample.
//
// Training samples are positions drawn uniformly in [0,1)^2 from a
// counter-based RNG keyed by (seed, step, sample index), with targets from
// bilinear interpolation of the image (pixel centres at (i+0.5)/W). Any
// worker can therefore produce any slice of a step's global batch.
// Evaluation runs at every pixel centre; PSNR is over all pixels and
// channels with predictions clamped to [0,1].
//
// A loaded image is kept as its 8-bit channels (3 bytes a pixel, a quarter
// of floats): every worker holds the whole image, and a large one must not
// cost 12 bytes a pixel. A channel reads as byte / 255.0f (a table of the
// 256 values), exactly the float it was converted to before. Images made
// from floats (tests) keep their floats.
//
// Thread safety: const methods may be called concurrently.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "common/status.h"

namespace gridsync {

class ImageTask {
 public:
  // The most pixels a loaded image may have: 2^28 (e.g. 16384 x 16384),
  // 768 MiB of channels in every worker, and at most 2^24 a side (stb_image's
  // bound). stb_image's own total bound is lower for some formats; over
  // either, Decode refuses from the header, before decoding anything.
  static constexpr uint64_t kMaxPixels = uint64_t{1} << 28;
  static constexpr uint64_t kMaxSide = uint64_t{1} << 24;

  // The largest image file: stb_image reads at most 2^31 - 1 bytes.
  static constexpr uint64_t kMaxFileBytes = (uint64_t{1} << 31) - 1;

  // Loads a JPEG/PNG/BMP/TGA/GIF/PNM file: its bytes, then Decode.
  static Result<ImageTask> Load(const std::string& path);
  // The one decode boundary for images (a file's bytes; `name` for
  // messages): formats outside the list are refused by their signature, the
  // size from the header before anything is decoded, then stb_image decodes
  // to RGB, 8 bits a channel (grey and alpha channels become RGB).
  static Result<ImageTask> Decode(const uint8_t* data, size_t size, const std::string& name);
  // An image from memory (H x W x 3 floats, row 0 at the top); for tests.
  static ImageTask FromPixels(int width, int height, std::vector<float> rgb);

  int width() const { return width_; }
  int height() const { return height_; }
  uint64_t pixel_count() const { return uint64_t(width_) * uint64_t(height_); }
  // Channel i of the H x W x 3 row-major channels (in [0, 1] when loaded).
  float Channel(size_t i) const;
  // Every channel as a float (H x W x 3): for peers that want the image.
  std::vector<float> Floats() const;
  // "WxH, fnv1a64 <16 hex digits>" of its pixels: what the coordinator
  // compares between workers (spec/cluster_settings.h), whose paths to the
  // same image may differ.
  std::string Digest() const;
  // The bytes of memory the image holds.
  uint64_t memory_bytes() const { return bytes_.size() + floats_.size() * sizeof(float); }
  // The bytes decoding it took at the peak, the decoder's buffers included
  // (image_precheck::DecodeBytes: an estimate from its format, up to 19 a
  // pixel); 0 for FromPixels.
  uint64_t decode_peak_bytes() const { return decode_peak_bytes_; }

  // Samples [begin, begin + count) of the global batch of `step`:
  // positions (count x 2) and targets (count x 3).
  void SampleBatch(uint64_t seed, uint64_t step, uint64_t begin, size_t count, float* positions,
                   float* targets) const;

  // Bilinear lookup, clamped at the edges.
  void Target(float u, float v, float* rgb) const;

  // Centres of pixels [begin, begin + count) in row-major order (count x 2).
  void PixelCentres(uint64_t begin, size_t count, float* positions) const;

  // `sum` plus the squared errors of predictions (count x 3) at pixels
  // [begin, begin + count), clamped to [0,1], added one by one in pixel and
  // channel order: consecutive ranges, each added onto the sum so far, give
  // the whole image's sum bit for bit.
  double AddSquaredError(double sum, uint64_t begin, size_t count, const float* prediction) const;
  // PSNR in dB of a squared error summed over every pixel.
  double PsnrOf(double squared_error) const;

  // A prediction's channel as the PNG's byte.
  static uint8_t ToByte(float value);
  // Writes H x W x 3 bytes as a PNG.
  static Status WritePng(const std::string& path, int width, int height,
                         const std::vector<uint8_t>& rgb);

 private:
  template <typename T>
  void SampleRange(const T* channels, uint64_t seed, uint64_t step, uint64_t begin, size_t count,
                   float* positions, float* targets) const;

  int width_ = 0;
  int height_ = 0;
  std::vector<uint8_t> bytes_;  // loaded images
  std::vector<float> floats_;   // FromPixels
  uint64_t decode_peak_bytes_ = 0;
};

}  // namespace gridsync
