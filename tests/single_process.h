// The reference every cluster test compares against: the same config
// trained in one process on the CPU, the workers' shares of a step as
// micro-batches of gradient accumulation (which is how a distributed step
// sums: 0 + part_0 + part_1 + ...), so that a cluster ends there bit for
// bit where its sums run in rank order.
//
// Thread safety: pure functions (each trains its own model).
#pragma once

#include <gtest/gtest.h>

#include <cstdint>
#include <utility>

#include "common/config.h"
#include "worker/image_task.h"
#include "worker/sync/train.h"

namespace gridsync::testing {

// With `eval_every`, PSNR after every that many steps (TrainReport's curve).
inline Result<TrainReport> TrainSingleProcess(Config config, const ImageTask& image,
                                              uint64_t eval_every = 0) {
  config.training.device = TrainingDevice::kCpu;  // the bit-for-bit reference
  config.training.gradient_accumulation *= config.distributed.world_size;
  config.distributed = DistributedConfig{};
  TrainOptions options;
  options.quiet = true;
  options.write_png = false;
  options.eval_every = eval_every;
  return TrainImage(config, image, options);
}

// TrainSingleProcess, for tests that cannot go on without it.
inline TrainReport SingleProcess(const Config& config, const ImageTask& image) {
  auto report = TrainSingleProcess(config, image);
  EXPECT_TRUE(report.ok()) << report.status().ToString();
  return std::move(report).value();
}

}  // namespace gridsync::testing
