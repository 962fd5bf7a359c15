// training.device: what the config refuses (on every machine), what a
// machine without a GPU says, and, where a device exists, the GPU trainer
// against its CPU twin (skipped here with the reason printed).
#include "kernels/cuda/device_trainer.h"

#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>

#include "common/config.h"
#include "kernels/cuda/cuda_kernels.h"
#include "worker/image_task.h"
#include "worker/sync/train.h"

namespace gridsync {
namespace {

// A 64x64 pattern with edges and gradients: enough to train on, no file.
ImageTask Pattern() {
  const int w = 64, h = 64;
  std::vector<float> rgb(static_cast<size_t>(w) * h * 3);
  for (int y = 0; y < h; ++y) {
    for (int x = 0; x < w; ++x) {
      float* p = &rgb[(static_cast<size_t>(y) * w + x) * 3];
      p[0] = static_cast<float>(x) / w;
      p[1] = ((x / 8 + y / 8) % 2) ? 0.9f : 0.1f;
      p[2] = 0.5f + 0.5f * std::sin(0.3f * static_cast<float>(x + y));
    }
  }
  return ImageTask::FromPixels(w, h, std::move(rgb));
}

Config Small(TrainingDevice device) {
  Config config;
  config.encoding.n_levels = 8;
  config.encoding.log2_hashmap_size = 14;
  config.encoding.base_resolution = 8;
  config.encoding.per_level_scale = 1.5;
  config.network.n_neurons = 32;
  config.training.batch_size = 2048;
  config.training.steps = 60;
  config.training.log_every = 0;
  config.training.device = device;
  config.task.output = (std::filesystem::temp_directory_path() / "gridsync-device-test").string();
  return config;
}

TrainOptions Quiet() {
  TrainOptions options;
  options.quiet = true;
  options.write_png = false;
  options.eval_steps = {20, 60};
  return options;
}

TEST(DeviceConfigTest, TheDeviceKeyIsCheckedAndCudaRefusedWhereItCannotRunYet) {
  auto bad = Config::Parse(R"({"training": {"device": "gpu"}})", "test.json");
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.status().message().find("auto"), std::string::npos) << bad.status().message();
  EXPECT_NE(bad.status().message().find("cuda"), std::string::npos) << bad.status().message();

  Config alone = Small(TrainingDevice::kCuda);
  EXPECT_TRUE(alone.CheckRunnable(/*standalone=*/true).ok());
  Config distributed = alone;
  distributed.distributed.enable = true;
  distributed.distributed.world_size = 2;
  const Status refused = distributed.CheckRunnable(false);
  ASSERT_FALSE(refused.ok());
  EXPECT_EQ(refused.code(), StatusCode::kUnsupported);
  EXPECT_NE(refused.message().find("training.device=cuda"), std::string::npos) << refused.message();
  Config mixed = alone;
  mixed.training.mixed_precision = true;
  EXPECT_FALSE(mixed.CheckRunnable(true).ok());
  Config accumulated = alone;
  accumulated.training.gradient_accumulation = 2;
  EXPECT_FALSE(accumulated.CheckRunnable(true).ok());
  // What the binaries refuse, check-config refuses: the round trip keeps it.
  auto again = Config::Parse(alone.ToJson().dump(), "roundtrip.json");
  ASSERT_TRUE(again.ok()) << again.status().ToString();
  EXPECT_EQ(again->training.device, TrainingDevice::kCuda);
}

TEST(DeviceConfigTest, WithoutADeviceCudaFailsSayingWhyAndAutoTrainsOnTheCpu) {
  std::string reason;
  if (cuda::Available(&reason)) GTEST_SKIP() << "a CUDA device is present: " << reason;
  const ImageTask image = Pattern();
  auto refused = TrainImage(Small(TrainingDevice::kCuda), image, Quiet());
  ASSERT_FALSE(refused.ok());
  EXPECT_NE(refused.status().message().find("training.device cuda"), std::string::npos)
      << refused.status().ToString();
  EXPECT_NE(refused.status().message().find(reason), std::string::npos)
      << refused.status().ToString();
  auto fallback = TrainImage(Small(TrainingDevice::kAuto), image, Quiet());
  ASSERT_TRUE(fallback.ok()) << fallback.status().ToString();
  auto cpu = TrainImage(Small(TrainingDevice::kCpu), image, Quiet());
  ASSERT_TRUE(cpu.ok());
  EXPECT_EQ(fallback->psnr, cpu->psnr) << "auto without a device is the CPU, bit for bit";
}

// The GPU twin: the same run on the device ends within rounding of the CPU's
// (atomics in the encoding's backward pass, cuBLAS's summation order).
TEST(DeviceTrainerTest, TrainsAsItsCpuTwinDoesWithinRounding) {
  std::string reason;
  if (!cuda::Available(&reason)) GTEST_SKIP() << reason;
  const ImageTask image = Pattern();
  auto cpu = TrainImage(Small(TrainingDevice::kCpu), image, Quiet());
  ASSERT_TRUE(cpu.ok()) << cpu.status().ToString();
  auto gpu = TrainImage(Small(TrainingDevice::kCuda), image, Quiet());
  ASSERT_TRUE(gpu.ok()) << gpu.status().ToString();
  for (const auto& [step, psnr] : cpu->psnr_at) {
    ASSERT_EQ(gpu->psnr_at.count(step), 1u);
    EXPECT_NEAR(gpu->psnr_at.at(step), psnr, 0.1) << "PSNR after step " << step;
  }
  EXPECT_NEAR(gpu->psnr, cpu->psnr, 0.1);
  EXPECT_NEAR(gpu->final_loss, cpu->final_loss, 0.02 * cpu->final_loss + 1e-6);
  EXPECT_GT(gpu->psnr, 15.0) << "the GPU run did not train";
  // The host model holds the device's parameters after the run.
  ASSERT_TRUE(gpu->model && cpu->model);
  const auto& a = gpu->model->grid_params();
  const auto& b = cpu->model->grid_params();
  ASSERT_EQ(a.size(), b.size());
  double diff = 0, norm = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    diff += (a[i] - b[i]) * (a[i] - b[i]);
    norm += b[i] * b[i];
  }
  EXPECT_LT(std::sqrt(diff), 0.05 * std::sqrt(norm) + 1e-6) << "grid parameters drifted apart";
}

}  // namespace
}  // namespace gridsync
