// training.device: what the config refuses (on every machine), what a
// machine without a GPU says, and, where a device exists, the GPU trainer
// against its CPU twin (skipped here with the reason printed).
#include "kernels/cuda/device_trainer.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <filesystem>

#include "common/config.h"
#include "kernels/cuda/cuda_kernels.h"
#include "spec/run_spec.h"
#include "tests/test_util.h"
#include "worker/host_trainer.h"
#include "worker/image_task.h"
#include "worker/sync/device_sync.h"
#include "worker/sync/train.h"
#include "worker/sync/train_loop.h"

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
  testing::UseSmallModel(&config);
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

TEST(DeviceConfigTest, TheDeviceKeyIsCheckedAndCudaAcceptedWithEveryMode) {
  auto bad = Config::Parse(R"({"training": {"device": "gpu"}})", "test.json");
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.status().message().find("auto"), std::string::npos) << bad.status().message();
  EXPECT_NE(bad.status().message().find("cuda"), std::string::npos) << bad.status().message();

  // Every sync mode, mixed precision and accumulation run with the model
  // on the device (the sync paths: device_allreduce_sync.h,
  // device_staged_sync.h).
  Config alone = Small(TrainingDevice::kCuda);
  EXPECT_TRUE(alone.CheckRunnable(/*standalone=*/true).ok());
  for (GradientSyncMode mode :
       {GradientSyncMode::kNccl, GradientSyncMode::kPs, GradientSyncMode::kHybrid}) {
    Config distributed = alone;
    distributed.distributed.enable = true;
    distributed.distributed.world_size = 2;
    distributed.distributed.gradient_sync = mode;
    distributed.training.mixed_precision = true;
    distributed.training.gradient_accumulation = 2;
    const Status runnable = distributed.CheckRunnable(false);
    EXPECT_TRUE(runnable.ok()) << ToString(mode) << ": " << runnable.ToString();
  }
  // What the binaries refuse, check-config refuses: the round trip keeps it.
  auto again = Config::Parse(alone.ToJson().dump(), "roundtrip.json");
  ASSERT_TRUE(again.ok()) << again.status().ToString();
  EXPECT_EQ(again->training.device, TrainingDevice::kCuda);
}

// collective auto stays open (the workers vote: NCCL only where every
// model is on a GPU of its own) where the gradients are summed on the
// device: nccl mode and hybrid (its node sum); it is Gloo on the CPU.
TEST(DeviceConfigTest, CollectiveAutoIsVotedWhereTheGradientsAreSummedOnTheDevice) {
  struct Case {
    GradientSyncMode mode;
    TrainingDevice device;
    const char* codec;
    const char* expected;
  };
  const Case cases[] = {
      {GradientSyncMode::kNccl, TrainingDevice::kAuto, "none", "auto"},
      {GradientSyncMode::kNccl, TrainingDevice::kCpu, "none", "gloo"},
      {GradientSyncMode::kHybrid, TrainingDevice::kCuda, "onebit", "auto"},
      {GradientSyncMode::kHybrid, TrainingDevice::kAuto, "topk", "auto"},
      {GradientSyncMode::kHybrid, TrainingDevice::kCuda, "none", "auto"},
      {GradientSyncMode::kHybrid, TrainingDevice::kCpu, "onebit", "gloo"},
      {GradientSyncMode::kPs, TrainingDevice::kCuda, "onebit", "gloo"},
  };
  for (const Case& c : cases) {
    Config config = Small(c.device);
    config.distributed.enable = true;
    config.distributed.world_size = 2;
    config.distributed.gradient_sync = c.mode;
    config.compression.codec = c.codec;
    auto spec = RunSpec::Resolve(config);
    ASSERT_TRUE(spec.ok()) << spec.status().ToString();
    EXPECT_EQ(spec->sync.collective, c.expected)
        << ToString(c.mode) << " " << ToString(c.device) << " " << c.codec;
  }
  Config pinned = Small(TrainingDevice::kCuda);
  pinned.distributed.enable = true;
  pinned.distributed.gradient_sync = GradientSyncMode::kHybrid;
  pinned.distributed.collective = CollectiveKind::kGloo;
  pinned.compression.codec = "onebit";
  auto spec = RunSpec::Resolve(pinned);
  ASSERT_TRUE(spec.ok()) << spec.status().ToString();
  EXPECT_EQ(spec->sync.collective, "gloo") << "what the config names, it gets";
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

// A standalone run through DeviceSync, with the device trainer's CPU twin,
// against the CPU's LocalSync: the same parameters bit for bit, in fp32 and
// under mixed precision (loss scaling, the fp16 rounding and its overflow
// check, the working copies).
TEST(DeviceTrainerTest, TheStandaloneDevicePathOnTheCpuTwinEqualsTheCpu) {
  const ImageTask image = Pattern();
  for (bool mixed : {false, true}) {
    Config config = Small(TrainingDevice::kCpu);
    config.training.mixed_precision = mixed;
    auto spec = RunSpec::Resolve(config);
    ASSERT_TRUE(spec.ok()) << spec.status().ToString();
    auto cpu = TrainImage(*spec, image, Quiet());
    ASSERT_TRUE(cpu.ok()) << cpu.status().ToString();

    auto created = HashGridModel::Create(spec->model);
    ASSERT_TRUE(created.ok());
    std::shared_ptr<HashGridModel> model = std::move(created).value();
    ThreadPool pool(1);
    auto twin = HostTrainer::Create(*spec, *model, &pool);
    ASSERT_TRUE(twin.ok()) << twin.status().ToString();
    const BatchSource source(image, config.training.seed);
    DeviceSync sync(*spec, model.get(), &source, std::move(twin).value());
    DistributedConfig alone;
    SplitSchedule split(BatchSplit(alone, config.training.batch_size));
    WorkerOptions options;
    options.train = Quiet();
    auto device = RunTrainLoop(*spec, image, model, sync, split, pool, options);
    ASSERT_TRUE(device.ok()) << device.status().ToString();
    EXPECT_EQ(device->device, "the CPU twin");
    EXPECT_EQ(model->grid_params(), cpu->model->grid_params()) << (mixed ? "mixed" : "fp32");
    EXPECT_EQ(device->psnr, cpu->psnr) << (mixed ? "mixed" : "fp32");
    EXPECT_EQ(device->skipped_steps, cpu->skipped_steps);
  }
}

// The cut the overlapped backward pass uses: the MLP's matrices first, then
// the grid's levels finest first; every gradient in exactly one bucket;
// every grid bucket but the last at least the bucket size.
TEST(DeviceTrainerTest, GradientBucketsHoldEveryGradientOnceFinestLevelsFirst) {
  Config config = Small(TrainingDevice::kCpu);
  auto spec = RunSpec::Resolve(config);
  ASSERT_TRUE(spec.ok()) << spec.status().ToString();
  auto model = HashGridModel::Create(spec->model);
  ASSERT_TRUE(model.ok());
  ThreadPool pool(1);
  auto twin = HostTrainer::Create(*spec, **model, &pool);
  ASSERT_TRUE(twin.ok());
  const auto buffers = (*twin)->GradientBuffers();
  const auto& layout = (*model)->layout();
  ASSERT_GE(layout.n_levels(), 4u);
  for (size_t bucket_bytes : {size_t{1}, size_t{4096}, size_t{64} << 10, SIZE_MAX}) {
    SCOPED_TRACE(bucket_bytes);
    std::vector<std::pair<uint32_t, uint32_t>> groups;
    const auto buckets = cuda::CutGradientBuckets(layout, buffers, bucket_bytes, &groups);
    ASSERT_EQ(buckets.size(), groups.size() + 1);
    ASSERT_EQ(buckets[0].size(), buffers.size() - 1);
    for (size_t i = 1; i < buffers.size(); ++i) {
      EXPECT_EQ(buckets[0][i - 1].data(), buffers[i].data());
      EXPECT_EQ(buckets[0][i - 1].size(), buffers[i].size());
    }
    // Grid buckets: contiguous, from the end of the grid down to its start.
    const float* end = buffers[0].data() + buffers[0].size();
    uint32_t level_end = layout.n_levels();
    for (size_t b = 1; b < buckets.size(); ++b) {
      ASSERT_EQ(buckets[b].size(), 1u);
      EXPECT_EQ(buckets[b][0].data() + buckets[b][0].size(), end) << "bucket " << b;
      end = buckets[b][0].data();
      const auto [begin, stop] = groups[b - 1];
      EXPECT_EQ(stop, level_end);
      EXPECT_LT(begin, stop);
      EXPECT_EQ(buckets[b][0].data(),
                buffers[0].data() + layout.level(begin).row_offset * layout.features());
      level_end = begin;
      if (b + 1 < buckets.size()) {
        EXPECT_GE(buckets[b][0].size_bytes(), bucket_bytes);
      }
    }
    EXPECT_EQ(end, buffers[0].data());
    EXPECT_EQ(level_end, 0u);
    if (bucket_bytes == 1) {
      EXPECT_EQ(groups.size(), layout.n_levels());
    }
    if (bucket_bytes == SIZE_MAX) {
      EXPECT_EQ(groups.size(), 1u);
    }
  }
}

// The backward pass cut into buckets (BeginGradients, fp16 rounding bucket
// by bucket, FinishGradients) gives the gradients of the whole pass
// (ComputeGradients then RoundGradientsToHalf), within the atomics' order.
TEST(DeviceTrainerTest, AnOverlappedPassGivesTheWholePassGradients) {
  std::string reason;
  if (!cuda::Available(&reason)) GTEST_SKIP() << reason;
  Config config = Small(TrainingDevice::kCuda);
  config.training.mixed_precision = true;
  auto spec = RunSpec::Resolve(config);
  ASSERT_TRUE(spec.ok()) << spec.status().ToString();
  auto model = HashGridModel::Create(spec->model);
  ASSERT_TRUE(model.ok());
  const ImageTask image = Pattern();
  const BatchSource source(image, 7);
  StepBatch batch;
  source.Fill(0, 0, 2048, &batch);
  std::vector<std::vector<float>> gradients[2];
  for (int overlapped = 0; overlapped < 2; ++overlapped) {
    auto trainer = MakeDeviceTrainer(*spec, **model, 0);
    ASSERT_TRUE(trainer.ok()) << trainer.status().ToString();
    const auto buckets = (*trainer)->CutBuckets(overlapped ? 4096 : SIZE_MAX);
    ASSERT_FALSE(buckets.empty());
    if (overlapped) {
      ASSERT_TRUE((*trainer)
                      ->BeginGradients(batch.positions.data(), batch.targets.data(), 2048, 2048, 16,
                                       1024.0f, true)
                      .ok());
      auto finished = (*trainer)->FinishGradients();
      ASSERT_TRUE(finished.ok()) << finished.status().ToString();
      EXPECT_TRUE(finished->fits);
      EXPECT_GT(finished->sse, 0.0);
    } else {
      auto sse = (*trainer)->ComputeGradients(batch.positions.data(), batch.targets.data(), 2048,
                                              2048, 16, 1024.0f);
      ASSERT_TRUE(sse.ok()) << sse.status().ToString();
      auto fits = (*trainer)->RoundGradientsToHalf();
      ASSERT_TRUE(fits.ok() && *fits);
    }
    // Read back in one cut, the same for both.
    const auto whole = (*trainer)->CutBuckets(SIZE_MAX);
    for (size_t b = 0; b < whole.size(); ++b) {
      std::vector<std::vector<float>> host;
      std::vector<std::span<float>> spans;
      for (const auto& buffer : whole[b]) host.emplace_back(buffer.size());
      for (auto& h : host) spans.emplace_back(h);
      ASSERT_TRUE((*trainer)->CopyBucket(b, spans, false).ok());
      for (auto& h : host) gradients[overlapped].insert(gradients[overlapped].end(), h);
    }
  }
  auto flatten = [](const std::vector<std::vector<float>>& parts) {
    std::vector<float> all;
    for (const auto& p : parts) all.insert(all.end(), p.begin(), p.end());
    return all;
  };
  std::vector<float> whole = flatten(gradients[0]), cut = flatten(gradients[1]);
  ASSERT_EQ(whole.size(), cut.size());
  double diff = 0, norm = 0;
  for (size_t i = 0; i < whole.size(); ++i) {
    diff += (whole[i] - cut[i]) * (whole[i] - cut[i]);
    norm += whole[i] * whole[i];
  }
  EXPECT_GT(norm, 0.0);
  EXPECT_LT(std::sqrt(diff), 1e-3 * std::sqrt(norm));
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
  EXPECT_GT(gpu->kernel_bytes, 0.0);
  EXPECT_GT(gpu->kernel_seconds, 0.0);
  EXPECT_GT(gpu->kernel_peak_bytes_per_second, 0.0);
}

// Mixed precision on the device (fp16 working copies, fp16 gradients at a
// loss scale) trains as the CPU's mixed precision does, within 0.3 dB.
TEST(DeviceTrainerTest, MixedPrecisionOnTheDeviceTrainsAsTheCpuDoes) {
  std::string reason;
  if (!cuda::Available(&reason)) GTEST_SKIP() << reason;
  const ImageTask image = Pattern();
  Config cpu_config = Small(TrainingDevice::kCpu);
  cpu_config.training.mixed_precision = true;
  Config gpu_config = cpu_config;
  gpu_config.training.device = TrainingDevice::kCuda;
  auto cpu = TrainImage(cpu_config, image, Quiet());
  ASSERT_TRUE(cpu.ok()) << cpu.status().ToString();
  auto gpu = TrainImage(gpu_config, image, Quiet());
  ASSERT_TRUE(gpu.ok()) << gpu.status().ToString();
  EXPECT_NEAR(gpu->psnr, cpu->psnr, 0.3);
  EXPECT_GT(gpu->psnr, 15.0) << "the GPU run did not train";
}

}  // namespace
}  // namespace gridsync
