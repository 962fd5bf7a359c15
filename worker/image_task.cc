#include "worker/image_task.h"

#include <stb_image.h>
#include <stb_image_write.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>

#include "common/counter_rng.h"

namespace gridsync {

Result<ImageTask> ImageTask::Load(const std::string& path) {
  int w = 0, h = 0, channels = 0;
  unsigned char* data = stbi_load(path.c_str(), &w, &h, &channels, 3);
  if (data == nullptr) {
    return Status::IOError("cannot load image '" + path + "': " + stbi_failure_reason() +
                           "; allowed: JPEG, PNG, BMP, TGA, GIF or PNM files");
  }
  std::vector<float> rgb(static_cast<size_t>(w) * h * 3);
  for (size_t i = 0; i < rgb.size(); ++i) rgb[i] = static_cast<float>(data[i]) / 255.0f;
  stbi_image_free(data);
  return FromPixels(w, h, std::move(rgb));
}

ImageTask ImageTask::FromPixels(int width, int height, std::vector<float> rgb) {
  ImageTask task;
  task.width_ = width;
  task.height_ = height;
  task.rgb_ = std::move(rgb);
  return task;
}

void ImageTask::Target(float u, float v, float* rgb) const {
  const float x = u * static_cast<float>(width_) - 0.5f;
  const float y = v * static_cast<float>(height_) - 0.5f;
  const float fx = std::floor(x);
  const float fy = std::floor(y);
  const float ax = x - fx;
  const float ay = y - fy;
  const int x0 = std::clamp(static_cast<int>(fx), 0, width_ - 1);
  const int x1 = std::clamp(static_cast<int>(fx) + 1, 0, width_ - 1);
  const int y0 = std::clamp(static_cast<int>(fy), 0, height_ - 1);
  const int y1 = std::clamp(static_cast<int>(fy) + 1, 0, height_ - 1);
  const float* p00 = &rgb_[(static_cast<size_t>(y0) * width_ + x0) * 3];
  const float* p01 = &rgb_[(static_cast<size_t>(y0) * width_ + x1) * 3];
  const float* p10 = &rgb_[(static_cast<size_t>(y1) * width_ + x0) * 3];
  const float* p11 = &rgb_[(static_cast<size_t>(y1) * width_ + x1) * 3];
  for (int c = 0; c < 3; ++c) {
    const float top = p00[c] + (p01[c] - p00[c]) * ax;
    const float bottom = p10[c] + (p11[c] - p10[c]) * ax;
    rgb[c] = top + (bottom - top) * ay;
  }
}

void ImageTask::SampleBatch(uint64_t seed, uint64_t step, uint64_t begin, size_t count,
                            float* positions, float* targets) const {
  for (size_t i = 0; i < count; ++i) {
    float u, v;
    CounterUniform2(seed, step, begin + i, &u, &v);
    positions[2 * i] = u;
    positions[2 * i + 1] = v;
    Target(u, v, targets + 3 * i);
  }
}

std::vector<float> ImageTask::PixelCentres() const {
  std::vector<float> pos(static_cast<size_t>(width_) * height_ * 2);
  for (int y = 0; y < height_; ++y) {
    for (int x = 0; x < width_; ++x) {
      const size_t i = static_cast<size_t>(y) * width_ + x;
      pos[2 * i] = (static_cast<float>(x) + 0.5f) / static_cast<float>(width_);
      pos[2 * i + 1] = (static_cast<float>(y) + 0.5f) / static_cast<float>(height_);
    }
  }
  return pos;
}

double ImageTask::Psnr(const std::vector<float>& prediction) const {
  double se = 0;
  for (size_t i = 0; i < rgb_.size(); ++i) {
    const double d = std::clamp(prediction[i], 0.0f, 1.0f) - rgb_[i];
    se += d * d;
  }
  const double mse = se / static_cast<double>(rgb_.size());
  return mse > 0 ? -10.0 * std::log10(mse) : 99.0;
}

Status ImageTask::CheckWritableFolder(const std::string& folder) {
  std::error_code ec;
  std::filesystem::create_directories(folder, ec);
  if (ec) {
    return Status::IOError("cannot create folder '" + folder + "': " + ec.message() +
                           "; allowed: a folder this process can create and write");
  }
  const auto probe =
      std::filesystem::path(folder) / (".gridsync-write-test-" + std::to_string(::getpid()));
  std::FILE* f = std::fopen(probe.c_str(), "wb");
  if (f == nullptr) {
    return Status::IOError("cannot write in folder '" + folder + "': " + std::strerror(errno) +
                           "; allowed: a folder this process can write");
  }
  std::fclose(f);
  std::filesystem::remove(probe, ec);
  return Status::OK();
}

Status ImageTask::WritePng(const std::string& path, int width, int height,
                           const std::vector<float>& rgb) {
  std::error_code ec;
  const auto parent = std::filesystem::path(path).parent_path();
  if (!parent.empty()) std::filesystem::create_directories(parent, ec);
  if (ec) return Status::IOError("cannot create folder '" + parent.string() + "': " + ec.message());
  std::vector<unsigned char> bytes(rgb.size());
  for (size_t i = 0; i < rgb.size(); ++i) {
    bytes[i] = static_cast<unsigned char>(std::lround(std::clamp(rgb[i], 0.0f, 1.0f) * 255.0f));
  }
  if (!stbi_write_png(path.c_str(), width, height, 3, bytes.data(), width * 3)) {
    return Status::IOError("cannot write PNG '" + path + "'");
  }
  return Status::OK();
}

}  // namespace gridsync
