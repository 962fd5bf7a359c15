// Standalone training on a real photo: reaches a stated PSNR, and the
// properties the distributed modes will rely on (thread-count invariance,
// gradient accumulation equals one batch, mixed-precision skip on overflow,
// the dynamic-resolution schedule).
#include "worker/sync/train.h"

#include <gtest/gtest.h>
#include <spdlog/sinks/ostream_sink.h>
#include <spdlog/spdlog.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <sstream>

#include "common/config.h"
#include "common/thread_pool.h"
#include "tests/test_util.h"
#include "worker/image_task.h"
#include "worker/local_optimizer.h"
#include "worker/loss_scaler.h"
#include "worker/model.h"
#include "worker/sync/local_sync.h"
#include "worker/sync/train_loop.h"

namespace gridsync {
namespace {

// A 128x128 crop of the default photo (Grace Hopper's face and uniform):
// small enough for CI, real enough to have edges and texture.
ImageTask LoadCrop() {
  auto full = ImageTask::Load(kDefaultImagePath);
  EXPECT_TRUE(full.ok()) << full.status().ToString()
                         << " (install python-matplotlib-data: scripts/install-deps.sh)";
  if (!full.ok()) return ImageTask::FromPixels(1, 1, {0, 0, 0});
  const int w = 128, h = 128, x0 = 192, y0 = 100;
  std::vector<float> rgb(static_cast<size_t>(w) * h * 3);
  for (int y = 0; y < h; ++y) {
    for (int x = 0; x < w; ++x) {
      for (int c = 0; c < 3; ++c) {
        rgb[(static_cast<size_t>(y) * w + x) * 3 + c] =
            full->Channel((static_cast<size_t>(y0 + y) * full->width() + x0 + x) * 3 + c);
      }
    }
  }
  return ImageTask::FromPixels(w, h, std::move(rgb));
}

Config SmallConfig() {
  Config config;
  testing::UseSmallModel(&config);
  config.training.batch_size = 4096;
  config.training.learning_rate = 1e-2;
  config.training.steps = 300;
  config.training.threads = 2;
  config.training.log_every = 0;
  config.training.device = TrainingDevice::kCpu;  // the CPU's properties, on any host
  config.task.output = (std::filesystem::temp_directory_path() / "gridsync-train-test").string();
  return config;
}

TrainOptions Quiet() {
  TrainOptions options;
  options.quiet = true;
  options.write_png = false;
  return options;
}

// Evaluation predicts an image in pieces of bounded memory: its PSNR and
// reconstruction are bit for bit those of one Predict over every pixel
// centre, here on an image of more than two pieces (the last partial) and a
// model moved off its initial values by a few steps.
TEST(TrainTest, EvaluationInPiecesIsOnePredictOverTheImage) {
  const int w = 1031, h = 523;  // 539,213 pixels: 2^18 + 2^18 + a part
  std::vector<float> rgb(size_t(w) * h * 3);
  for (size_t i = 0; i < rgb.size(); ++i)
    rgb[i] = static_cast<float>((i * 2654435761u) % 997) / 996.0f;
  const ImageTask image = ImageTask::FromPixels(w, h, rgb);
  Config config = SmallConfig();
  config.training.steps = 3;
  auto spec = RunSpec::Resolve(config);
  ASSERT_TRUE(spec.ok()) << spec.status().ToString();
  auto model = HashGridModel::Create(spec->model);
  ASSERT_TRUE(model.ok()) << model.status().ToString();
  for (float& p : (*model)->grid_params()) p = std::sin(&p - (*model)->grid_params().data()) * 0.3f;
  (*model)->RefreshWorkingCopyAll();
  ThreadPool pool(2);
  const uint32_t levels = (*model)->layout().n_levels();

  std::vector<float> centres(size_t(w) * h * 2);
  for (int y = 0; y < h; ++y) {
    for (int x = 0; x < w; ++x) {
      centres[2 * (size_t(y) * w + x)] = (static_cast<float>(x) + 0.5f) / w;
      centres[2 * (size_t(y) * w + x) + 1] = (static_cast<float>(y) + 0.5f) / h;
    }
  }
  std::vector<float> prediction(size_t(w) * h * 3);
  (*model)->Predict(centres.data(), size_t(w) * h, levels, prediction.data(), &pool);
  double se = 0;
  std::vector<uint8_t> png(prediction.size());
  for (size_t i = 0; i < prediction.size(); ++i) {
    const double d = std::clamp(prediction[i], 0.0f, 1.0f) - rgb[i];
    se += d * d;
    png[i] = static_cast<uint8_t>(std::lround(std::clamp(prediction[i], 0.0f, 1.0f) * 255.0f));
  }
  const double want = -10.0 * std::log10(se / static_cast<double>(prediction.size()));

  std::vector<uint8_t> got_png;
  const double got = EvalPsnr(**model, image, levels, &pool, &got_png);
  EXPECT_EQ(got, want);  // bit for bit
  EXPECT_EQ(got_png, png);
  EXPECT_EQ(EvalPsnr(**model, image, levels, &pool, nullptr), want);
}

TEST(TrainTest, RealImageCropReachesStatedPsnr) {
  const ImageTask image = LoadCrop();
  Config config = SmallConfig();
  TrainOptions options = Quiet();
  options.write_png = true;
  options.eval_steps = {10};
  auto report = TrainImage(config, image, options);
  ASSERT_TRUE(report.ok()) << report.status().ToString();
  // Stated target: 30 dB after 300 steps of batch 4096 on the 128x128 crop.
  EXPECT_GE(report->psnr, 30.0);
  EXPECT_LT(report->psnr_at.at(10), report->psnr - 5.0);  // it learned, not just started high
  EXPECT_TRUE(std::filesystem::exists(report->png_path));
  EXPECT_GT(report->samples_per_second, 0);
  EXPECT_EQ(report->skipped_steps, 0u);
}

// A run whose model diverges (a learning rate far too large for a deep
// network: the loss is NaN within a few steps) fails, naming the step and
// what to change. It ended "done" with PSNR 99 dB and NaN parameters.
TEST(TrainTest, DivergedRunFailsInsteadOfScoringNaNAsPerfect) {
  const ImageTask image = LoadCrop();
  Config config = SmallConfig();
  config.training.learning_rate = 10;
  config.network.n_hidden_layers = 16;
  config.training.steps = 100;
  auto report = TrainImage(config, image, Quiet());
  ASSERT_FALSE(report.ok()) << "PSNR " << report->psnr << ", final loss " << report->final_loss;
  EXPECT_NE(report.status().message().find("training diverged"), std::string::npos)
      << report.status().ToString();
  EXPECT_NE(report.status().message().find("training.learning_rate"), std::string::npos)
      << report.status().ToString();
}

// A model that blows up but stays finite (a probe's 16 x 1024 MLP under
// mixed precision: 0.18, then 3e14, every later step skipped) is warned of,
// once each: the leap of the loss, and fp16 overflowing at the least scale.
TEST(TrainTest, ALeapingLossAndUnscaledOverflowAreWarnedOfOnce) {
  const ImageTask image = LoadCrop();
  Config config = SmallConfig();
  config.network.n_hidden_layers = 16;
  config.network.n_neurons = 256;
  config.training.learning_rate = 0.1;
  config.training.mixed_precision = true;
  config.training.batch_size = 256;
  config.training.steps = 24;
  std::ostringstream out;
  auto previous = spdlog::default_logger();
  spdlog::set_default_logger(std::make_shared<spdlog::logger>(
      "train", std::make_shared<spdlog::sinks::ostream_sink_mt>(out)));
  auto report = TrainImage(config, image, Quiet());
  spdlog::set_default_logger(previous);
  const std::string log = out.str();
  const auto count = [&log](const std::string& what) {
    size_t n = 0;
    for (size_t at = log.find(what); at != std::string::npos; at = log.find(what, at + 1)) ++n;
    return n;
  };
  EXPECT_EQ(count("training is diverging; allowed: a smaller training.learning_rate (now 0.1)"), 1u)
      << log;
  EXPECT_EQ(count("the gradients overflow fp16 at loss scale 1, the least"), 1u) << log;
  // Warned, not refused: the loss stayed finite (a NaN one fails the run).
  if (report.ok()) {
    EXPECT_GT(report->skipped_steps, 10u);
  }
}

TEST(TrainTest, MixedPrecisionTrainsAlmostAsWell) {
  const ImageTask image = LoadCrop();
  Config config = SmallConfig();
  auto fp32 = TrainImage(config, image, Quiet());
  config.training.mixed_precision = true;
  auto mixed = TrainImage(config, image, Quiet());
  ASSERT_TRUE(fp32.ok() && mixed.ok());
  EXPECT_GE(mixed->psnr, fp32->psnr - 1.0);
  EXPECT_GT(mixed->final_loss_scale, 1.0f);
}

TEST(TrainTest, ThreadCountDoesNotChangeAnyBit) {
  const ImageTask image = LoadCrop();
  Config config = SmallConfig();
  config.training.steps = 5;
  // Several of the lookup's and forward pass's 4096-sample ranges, the last
  // one partial.
  config.training.batch_size = 9000;
  // The MLP's scratch is a thread's, reused by the chunks it runs (a 2048
  // chunk, then the 808 tail on one thread): in both formats.
  for (const MlpPrecision precision : {MlpPrecision::kFp32, MlpPrecision::kBf16}) {
    SCOPED_TRACE(ToString(precision));
    config.training.mlp_precision = precision;
    config.training.threads = 1;
    auto one = TrainImage(config, image, Quiet());
    config.training.threads = 3;
    auto three = TrainImage(config, image, Quiet());
    ASSERT_TRUE(one.ok() && three.ok());
    EXPECT_EQ(one->model->grid_params(), three->model->grid_params());
    for (size_t i = 0; i < one->model->mlp_weights().size(); ++i) {
      EXPECT_EQ(one->model->mlp_weights()[i], three->model->mlp_weights()[i]) << "matrix " << i;
    }
  }
}

// TrainOptions::timing_warmup_steps times the steps after the warmup
// (evaluations excluded, as from the whole run), changes nothing trained,
// and leaves no steady figure when no step is left after it.
TEST(TrainTest, SteadyTimingSkipsTheWarmupSteps) {
  const ImageTask image = LoadCrop();
  Config config = SmallConfig();
  config.training.steps = 6;
  TrainOptions options = Quiet();
  auto whole = TrainImage(config, image, options);
  ASSERT_TRUE(whole.ok()) << whole.status().ToString();
  EXPECT_EQ(whole->steady_steps, 6u);
  EXPECT_EQ(whole->steady_seconds, whole->train_seconds);
  EXPECT_EQ(whole->steady_samples_per_second, whole->samples_per_second);

  options.timing_warmup_steps = 2;
  options.eval_steps = {1, 4};  // before and after the steady clock starts
  auto warm = TrainImage(config, image, options);
  ASSERT_TRUE(warm.ok()) << warm.status().ToString();
  EXPECT_EQ(warm->steady_steps, 4u);
  EXPECT_GT(warm->steady_seconds, 0.0);
  EXPECT_LT(warm->steady_seconds, warm->train_seconds);
  EXPECT_DOUBLE_EQ(warm->steady_samples_per_second,
                   4.0 * config.training.batch_size / warm->steady_seconds);
  EXPECT_EQ(warm->model->grid_params(), whole->model->grid_params());

  options.timing_warmup_steps = 6;
  auto none_left = TrainImage(config, image, options);
  ASSERT_TRUE(none_left.ok()) << none_left.status().ToString();
  EXPECT_EQ(none_left->steady_steps, 0u);
  EXPECT_EQ(none_left->steady_samples_per_second, 0.0);
}

TEST(TrainTest, GradientAccumulationEqualsOneBatch) {
  const ImageTask image = LoadCrop();
  Config config = SmallConfig();
  config.training.steps = 5;
  auto one = TrainImage(config, image, Quiet());
  config.training.gradient_accumulation = 4;
  auto four = TrainImage(config, image, Quiet());
  ASSERT_TRUE(one.ok() && four.ok());
  // Micro-batches are summed as 0 + part_0 + part_1 + ..., a different float
  // association than one pass over the batch: per-row sums differ in the last
  // bits. Adam normalises by sqrt(v), so a relative gradient error e moves a
  // parameter by about lr*e per step: 5 steps at lr 1e-2 and e ~ 1e-6 stay
  // far below 1e-6. Only a row whose summed gradient is ~0 can flip sign and
  // move by up to 2*lr per step; such rows must be rare.
  const auto& a = one->model->grid_params();
  const auto& b = four->model->grid_params();
  ASSERT_EQ(a.size(), b.size());
  size_t close = 0, far = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    const double diff = std::fabs(double{a[i]} - b[i]);
    (diff <= 1e-6 ? close : far) += 1;
    ASSERT_LE(diff, 2 * 1e-2 * 5) << "parameter " << i;
  }
  EXPECT_LE(far, a.size() / 10000) << close << " parameters within 1e-6";
  EXPECT_NEAR(one->final_loss, four->final_loss, 1e-6);
  // And it differs from training on a quarter of the batch.
  config.training.gradient_accumulation = 1;
  config.training.batch_size = 1024;
  auto quarter = TrainImage(config, image, Quiet());
  ASSERT_TRUE(quarter.ok());
  EXPECT_NE(quarter->model->grid_params(), a);
}

// The device twin sums each square in double (SquaredErrorKernel); so does
// the CPU. One error of 1e4 beside 2047 * 3 errors of 0.1: in float, every
// 0.01 added to 1e8 (an ulp of 8) would vanish, and the loss would read
// 1e8 instead of 1e8 + 61.43.
TEST(TrainTest, LossIsSummedInDouble) {
  const auto spec = RunSpec::Resolve(SmallConfig());
  ASSERT_TRUE(spec.ok()) << spec.status().ToString();
  auto model = HashGridModel::Create(spec->model);
  ASSERT_TRUE(model.ok());
  ThreadPool pool(1);
  const ImageTask image = LoadCrop();
  constexpr size_t kSamples = 2048;  // one MLP chunk: no sum across chunks
  std::vector<float> pos(kSamples * 2), target(kSamples * 3), y(kSamples * 3);
  image.SampleBatch(1, 0, 0, kSamples, pos.data(), target.data());
  (*model)->Predict(pos.data(), kSamples, 8, y.data(), &pool);
  for (size_t i = 0; i < y.size(); ++i) target[i] = y[i] - (i == 0 ? 1e4f : 0.1f);
  ModelGradients grads((*model)->layout(), (*model)->mlp_shape());
  const double sse = (*model)->AccumulateGradients(pos.data(), target.data(), kSamples, kSamples,
                                                   1.0f, 8, &grads, &pool);
  EXPECT_NEAR(sse - 1e8, (y.size() - 1) * 0.01, 0.5);
}

TEST(TrainTest, OverflowSkipsStepAndLowersScale) {
  Config config = SmallConfig();
  config.training.mixed_precision = true;
  const auto spec = RunSpec::Resolve(config);
  ASSERT_TRUE(spec.ok()) << spec.status().ToString();
  auto model = HashGridModel::Create(spec->model);
  ASSERT_TRUE(model.ok());
  ThreadPool pool(1);
  const ImageTask image = LoadCrop();
  const BatchSource source(image, 1);
  LocalSync sync(*spec, model->get(), &source, &pool);
  LossScaler scaler(true);
  ModelGradients grads((*model)->layout(), (*model)->mlp_shape());
  std::vector<float> pos(64 * 2), target(64 * 3);
  image.SampleBatch(1, 0, 0, 64, pos.data(), target.data());
  (*model)->AccumulateGradients(pos.data(), target.data(), 64, 64, scaler.scale(), 8, &grads,
                                &pool);
  grads.mlp[0](0, 0) = std::numeric_limits<float>::infinity();
  const auto grid_before = (*model)->grid_params();
  const auto mlp_before = (*model)->mlp_weights();
  const float scale_before = scaler.scale();
  auto outcome = sync.Apply(0, &grads, scaler.scale());
  ASSERT_TRUE(outcome.ok());
  EXPECT_FALSE(outcome->finite);
  EXPECT_FALSE(scaler.Update(outcome->finite));
  EXPECT_EQ(scaler.scale(), scale_before / 2);
  EXPECT_EQ((*model)->grid_params(), grid_before);
  EXPECT_EQ((*model)->mlp_weights()[0], mlp_before[0]);
  EXPECT_EQ(grads.grid.TouchedRows(0), 0u);  // cleared for the next step
  EXPECT_EQ(grads.mlp[0].norm(), 0.0f);
  // A value above fp16's range (65504) at the loss scale is an overflow too.
  (*model)->AccumulateGradients(pos.data(), target.data(), 64, 64, scaler.scale(), 8, &grads,
                                &pool);
  grads.mlp[1](0, 0) = 1e6f;
  outcome = sync.Apply(1, &grads, scaler.scale());
  ASSERT_TRUE(outcome.ok());
  EXPECT_FALSE(outcome->finite);
  // A clean step applies.
  (*model)->AccumulateGradients(pos.data(), target.data(), 64, 64, scaler.scale(), 8, &grads,
                                &pool);
  outcome = sync.Apply(2, &grads, scaler.scale());
  ASSERT_TRUE(outcome.ok());
  EXPECT_TRUE(outcome->finite);
  EXPECT_NE((*model)->grid_params(), grid_before);
}

TEST(TrainTest, DynamicResolutionScheduleUnlocksCoarseToFine) {
  Config config = SmallConfig();
  config.encoding.n_levels = 16;
  config.training.steps = 1000;
  auto fixed = HashGridModel::Create(RunSpec::Resolve(config)->model);
  ASSERT_TRUE(fixed.ok());
  EXPECT_EQ((*fixed)->ActiveLevels(0), 16u);
  config.training.dynamic_resolution = true;
  auto dynamic = HashGridModel::Create(RunSpec::Resolve(config)->model);
  ASSERT_TRUE(dynamic.ok());
  // L0 = ceil(16/4) = 4 levels at first, all 16 by step N = steps/2 = 500.
  EXPECT_EQ((*dynamic)->ActiveLevels(0), 4u);
  EXPECT_EQ((*dynamic)->ActiveLevels(250), 10u);
  EXPECT_EQ((*dynamic)->ActiveLevels(499), 15u);
  EXPECT_EQ((*dynamic)->ActiveLevels(500), 16u);
  EXPECT_EQ((*dynamic)->ActiveLevels(900), 16u);
  uint32_t last = 0;
  for (uint64_t s = 0; s < 1000; s += 10) {
    EXPECT_GE((*dynamic)->ActiveLevels(s), last);
    last = (*dynamic)->ActiveLevels(s);
  }
  config.training.dynamic_resolution_steps = 100;
  auto quick = HashGridModel::Create(RunSpec::Resolve(config)->model);
  EXPECT_EQ((*quick)->ActiveLevels(100), 16u);
}

TEST(TrainTest, DynamicResolutionTrains) {
  const ImageTask image = LoadCrop();
  Config config = SmallConfig();
  config.training.dynamic_resolution = true;
  auto report = TrainImage(config, image, Quiet());
  ASSERT_TRUE(report.ok());
  EXPECT_GE(report->psnr, 28.0);
}

TEST(ImageTaskTest, BilinearTargetsAndSlicedSampling) {
  // 2x1 image: black then white.
  const ImageTask image = ImageTask::FromPixels(2, 1, {0, 0, 0, 1, 1, 1});
  float rgb[3];
  image.Target(0.25f, 0.5f, rgb);  // centre of pixel 0
  EXPECT_FLOAT_EQ(rgb[0], 0.0f);
  image.Target(0.5f, 0.5f, rgb);  // halfway between the centres
  EXPECT_FLOAT_EQ(rgb[1], 0.5f);
  image.Target(0.99f, 0.5f, rgb);  // clamped past the last centre
  EXPECT_FLOAT_EQ(rgb[2], 1.0f);
  // Any slice of a global batch equals the same part of the whole batch.
  std::vector<float> all_pos(100 * 2), all_t(100 * 3), part_pos(30 * 2), part_t(30 * 3);
  image.SampleBatch(7, 3, 0, 100, all_pos.data(), all_t.data());
  image.SampleBatch(7, 3, 50, 30, part_pos.data(), part_t.data());
  for (int i = 0; i < 60; ++i) EXPECT_EQ(part_pos[i], all_pos[100 + i]);
  image.SampleBatch(7, 4, 50, 30, part_pos.data(), part_t.data());
  EXPECT_NE(part_pos[0], all_pos[100]);
}

}  // namespace
}  // namespace gridsync
