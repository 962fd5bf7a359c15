// Helpers shared by the distributed-training tests: a small synthetic image
// and the two ways parameters may match the single-process run.
#pragma once

#include <cmath>
#include <cstring>
#include <vector>

#include <gtest/gtest.h>

#include "common/config.h"
#include "worker/image_task.h"

namespace gridsync::testing {

// A smooth colour field with an edge: enough structure to train on, loaded
// in no time.
inline ImageTask SmallImage() {
  const int w = 64, h = 48;
  std::vector<float> rgb(static_cast<size_t>(w) * h * 3);
  for (int y = 0; y < h; ++y) {
    for (int x = 0; x < w; ++x) {
      float* p = &rgb[(static_cast<size_t>(y) * w + x) * 3];
      p[0] = static_cast<float>(x) / w;
      p[1] = static_cast<float>(y) / h;
      p[2] = x + y > 50 ? 0.9f : 0.1f;
    }
  }
  return ImageTask::FromPixels(w, h, std::move(rgb));
}

// A small model and a distributed run of `workers` on this machine: fast
// enough to train a few steps in every test.
inline Config SmallDistributedConfig(int workers, GradientSyncMode sync, int steps) {
  Config c;
  c.encoding.n_levels = 8;
  c.encoding.log2_hashmap_size = 14;
  c.encoding.base_resolution = 8;
  c.network.n_neurons = 32;
  c.training.batch_size = 4096;
  c.training.steps = steps;
  c.training.threads = 1;
  c.training.log_every = 0;
  c.distributed.enable = true;
  c.distributed.world_size = workers;
  c.distributed.gradient_sync = sync;
  c.distributed.master_addr = "127.0.0.1";
  c.distributed.timeout_s = 20;
  return c;
}

inline void ExpectBitIdentical(const std::vector<float>& a, const std::vector<float>& b) {
  ASSERT_EQ(a.size(), b.size());
  size_t differing = 0, first = a.size();
  for (size_t i = 0; i < a.size(); ++i) {
    if (std::memcmp(&a[i], &b[i], sizeof(float)) != 0) {
      if (first == a.size()) first = i;
      ++differing;
    }
  }
  EXPECT_EQ(differing, 0u) << "first difference at parameter " << first << ": " << a[first] << " vs "
                           << b[first];
}

// The same float sums in another association (ring all-reduce, node-first
// sums): a few ulps per gradient, which Adam (normalised by sqrt(v)) turns
// into moves of about lr * relative error per step. A row whose summed
// gradient is ~0 may flip sign and move by up to 2*lr per step; such rows
// must be rare.
inline void ExpectWithinRounding(const std::vector<float>& a, const std::vector<float>& b, int steps,
                                 double lr) {
  ASSERT_EQ(a.size(), b.size());
  size_t far = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    const double diff = std::fabs(double{a[i]} - b[i]);
    far += diff > 1e-5;
    ASSERT_LE(diff, 2 * lr * steps) << "parameter " << i;
  }
  EXPECT_LE(far, a.size() / 1000) << far << " of " << a.size()
                                  << " parameters differ by more than 1e-5";
}

}  // namespace gridsync::testing
