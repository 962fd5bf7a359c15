// Helpers shared by the distributed-training tests: a small synthetic image
// and the two ways parameters may match the single-process run.
#pragma once

#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <vector>

#include "common/config.h"
#include "worker/image_task.h"
#include "worker/model.h"
#include "worker/params_file.h"

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
// The small model every test trains: 8 levels of 2^14 rows from
// resolution 8 (scale 1.5, the default), a 32-wide MLP.
inline void UseSmallModel(Config* c) {
  c->encoding.n_levels = 8;
  c->encoding.log2_hashmap_size = 14;
  c->encoding.base_resolution = 8;
  c->network.n_neurons = 32;
}

inline Config SmallDistributedConfig(int workers, GradientSyncMode sync, int steps) {
  Config c;
  UseSmallModel(&c);
  c.training.batch_size = 4096;
  c.training.steps = steps;
  c.training.threads = 1;
  c.training.log_every = 0;
  // The references these runs are compared with bit for bit train on the
  // CPU, also where a GPU is present (auto would pick it).
  c.training.device = TrainingDevice::kCpu;
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

// The run specification of `config` (RunSpec::Resolve), which must resolve.
inline RunSpec SpecOf(const Config& config) {
  auto spec = RunSpec::Resolve(config);
  EXPECT_TRUE(spec.ok()) << spec.status().ToString();
  return spec.ok() ? *std::move(spec) : RunSpec{};
}

// The parameters a model of this config starts from (seeded).
inline std::vector<float> InitialParams(const Config& config) {
  auto model = HashGridModel::Create(SpecOf(config).model);
  EXPECT_TRUE(model.ok()) << model.status().ToString();
  return model.ok() ? FlattenParams(**model) : std::vector<float>{};
}

// `a` ends within rounding of `b` (both trained from `init`): the RMS
// difference is at most `relative` of the RMS distance b moved from init,
// and at most `far_fraction` of the parameters differ by more than 1e-4.
// The same float sums in another association (ring all-reduce, node-first
// sums) change the last bits of each gradient, which Adam's normalisation
// turns into relative changes of the same order; a row whose summed
// gradient is ~0 may flip sign and move by up to 2*lr per step, so a few
// parameters may differ more. A wrong reduction (a share missing, doubled
// or mis-scaled) moves the parameters by a large fraction of their total
// movement and fails both checks.
inline void ExpectWithinRounding(const std::vector<float>& a, const std::vector<float>& b,
                                 const std::vector<float>& init, double relative = 0.02,
                                 double far_fraction = 0.001) {
  ASSERT_EQ(a.size(), b.size());
  ASSERT_EQ(a.size(), init.size());
  double off = 0, moved = 0;
  size_t far = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    const double d = double{a[i]} - b[i];
    const double m = double{b[i]} - init[i];
    off += d * d;
    moved += m * m;
    far += std::fabs(d) > 1e-4;
  }
  off = std::sqrt(off / static_cast<double>(a.size()));
  moved = std::sqrt(moved / static_cast<double>(a.size()));
  ASSERT_GT(moved, 0.0) << "the reference did not train";
  EXPECT_LE(off, relative * moved) << "RMS difference " << off << " against " << moved << " moved";
  EXPECT_LE(static_cast<double>(far), far_fraction * static_cast<double>(a.size()))
      << far << " of " << a.size() << " parameters differ by more than 1e-4";
}

}  // namespace gridsync::testing
