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
// Thread safety: const methods may be called concurrently.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "common/status.h"

namespace gridsync {

class ImageTask {
 public:
  // Loads a JPEG/PNG/BMP/... through stb_image; RGB, values scaled to [0,1].
  static Result<ImageTask> Load(const std::string& path);
  // An image from memory (H x W x 3 floats, row 0 at the top); for tests.
  static ImageTask FromPixels(int width, int height, std::vector<float> rgb);

  int width() const { return width_; }
  int height() const { return height_; }
  const std::vector<float>& pixels() const { return rgb_; }

  // Samples [begin, begin + count) of the global batch of `step`:
  // positions (count x 2) and targets (count x 3).
  void SampleBatch(uint64_t seed, uint64_t step, uint64_t begin, size_t count, float* positions,
                   float* targets) const;

  // Bilinear lookup, clamped at the edges.
  void Target(float u, float v, float* rgb) const;

  // Positions of all pixel centres, row-major (width*height x 2).
  std::vector<float> PixelCentres() const;

  // PSNR in dB of a prediction at the pixel centres (width*height x 3).
  double Psnr(const std::vector<float>& prediction) const;

  // Creates `folder` if needed and proves a file can be written in it (a
  // temporary one, removed again): the check a run makes before training.
  // (Declared here, with WritePng, the one writer of task.output.)
  static Status CheckWritableFolder(const std::string& folder);
  static Status WritePng(const std::string& path, int width, int height,
                         const std::vector<float>& rgb);

 private:
  int width_ = 0;
  int height_ = 0;
  std::vector<float> rgb_;
};

}  // namespace gridsync
