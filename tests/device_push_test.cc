// ps pushes encoded on the model's device before the copy (DeviceTrainer's
// PrepareGridPush ... LoadResiduals): each block's payload is the bytes the
// CPU's codec writes for the same values with cpu::ErrorFeedback's
// residuals added, and the residuals kept are the CPU's, entry for entry,
// over several steps. The same check runs on the CPU twin (every machine)
// and on a GPU (skipped here with the reason printed); bad blocks and
// residual states are refused by both.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <filesystem>
#include <span>
#include <string>
#include <vector>

#include "common/cluster_map.h"
#include "common/config.h"
#include "common/sharding.h"
#include "common/thread_pool.h"
#include "kernels/cpu/codec.h"
#include "kernels/cpu/error_feedback.h"
#include "kernels/cpu/hash_encoding.h"
#include "kernels/cuda/cuda_kernels.h"
#include "kernels/cuda/device_trainer.h"
#include "spec/run_spec.h"
#include "tests/test_util.h"
#include "worker/host_trainer.h"
#include "worker/image_task.h"
#include "worker/model.h"
#include "worker/ps_client.h"
#include "worker/sync/device_staged_sync.h"
#include "worker/sync/device_sync.h"
#include "worker/sync/train_loop.h"
#include "worker/worker_adam.h"

namespace gridsync {
namespace {

using PushBlock = cuda::DeviceTrainer::PushBlock;

ImageTask Stripes() {
  const int w = 48, h = 48;
  std::vector<float> rgb(static_cast<size_t>(w) * h * 3);
  for (size_t i = 0; i < rgb.size(); ++i) rgb[i] = static_cast<float>((i * 7919) % 97) / 97.0f;
  return ImageTask::FromPixels(w, h, std::move(rgb));
}

RunSpec Spec(TrainingDevice device) {
  Config config;
  testing::UseSmallModel(&config);
  config.training.batch_size = 1024;
  config.training.mixed_precision = true;
  config.training.device = device;
  config.task.output = (std::filesystem::temp_directory_path() / "gridsync-push-test").string();
  auto spec = RunSpec::Resolve(config);
  EXPECT_TRUE(spec.ok()) << spec.status().ToString();
  return *spec;
}

std::string StateOf(const cpu::ErrorFeedback& feedback) {
  std::string bytes;
  feedback.AppendState(&bytes);
  return bytes;
}

// Adam's values: the same floats on the CPU twin; on a GPU within rounding
// (its powf and fused multiply-adds round their own way).
bool Close(float a, float b, bool exact) {
  if (exact) return a == b || (std::isnan(a) && std::isnan(b));
  return std::fabs(a - b) <= 1e-5f * std::max(std::fabs(a), std::fabs(b)) + 1e-30f;
}

void ExpectClose(std::span<const float> a, std::span<const float> b, bool exact,
                 const std::string& what) {
  ASSERT_EQ(a.size(), b.size()) << what;
  size_t differ = 0, first = a.size();
  for (size_t i = 0; i < a.size(); ++i) {
    if (Close(a[i], b[i], exact)) continue;
    if (differ++ == 0) first = i;
  }
  EXPECT_EQ(differ, 0u) << what << ": first at " << first << ": " << a[first] << " vs " << b[first];
}

// Three steps of pushes through `trainer`, every level cut into two
// "shards" by rows and (with two features) two column slices, against the
// CPU's codec and error feedback on the values the trainer holds; with
// `worker_adam`, the rows first become updates as WorkerAdam makes them,
// and m is masked as WorkerAdam masks it. `exact`: Adam's floats bit for
// bit (the CPU twin), else within rounding (a GPU); codec bytes and
// residuals are always exact (both encode the trainer's own values).
void ExpectPushBlocksAreTheCpus(cuda::DeviceTrainer* trainer, const HashGridModel& model,
                                const RunSpec& spec, const CodecOptions& options, bool worker_adam,
                                bool exact, const std::string& what) {
  SCOPED_TRACE(what + (worker_adam ? ", Adam on the worker" : ""));
  const auto& layout = model.layout();
  const uint32_t F = layout.features();
  const ImageTask image = Stripes();
  const BatchSource source(image, 11);
  ThreadPool pool(1);
  cpu::ErrorFeedback reference;
  const Partition partition = *Partition::Make(spec.model.tables, 1, ModelParallelDim::kRow);
  WorkerAdam adam(partition, spec.model.adam);
  const bool mask =
      worker_adam && (options.codec == Codec::kTopk || options.codec == Codec::kRandomk);
  for (uint64_t step = 0; step < 3; ++step) {
    StepBatch batch;
    source.Fill(step, 0, 1024, &batch);
    auto sse = trainer->ComputeGradients(batch.positions.data(), batch.targets.data(), 1024, 1024,
                                         layout.n_levels(), 256.0f);
    ASSERT_TRUE(sse.ok()) << sse.status().ToString();
    cpu::GridBatchLookup lookup;
    cpu::HashGridLookup(layout, batch.positions.data(), batch.count, layout.n_levels(), &lookup,
                        &pool);
    cpu::GridRowSet rows(layout);
    rows.Assign(lookup, &pool);
    std::vector<uint32_t> global;
    for (uint32_t l = 0; l < layout.n_levels(); ++l)
      for (uint32_t r : rows.rows(l))
        global.push_back(static_cast<uint32_t>(layout.level(l).row_offset + r));
    auto fits = trainer->PrepareGridPush(global.data(), global.size(), true, 1.0f / 256.0f);
    ASSERT_TRUE(fits.ok()) << fits.status().ToString();
    EXPECT_TRUE(*fits);
    size_t nonzero = 0;
    for (uint32_t l = 0; l < layout.n_levels(); ++l) {
      std::vector<uint32_t> level_rows = rows.rows(l);
      if (worker_adam) {
        std::vector<float> gradient(level_rows.size() * F);
        ASSERT_TRUE(
            trainer
                ->FetchPushBlock({l, 0, F, level_rows.data(), level_rows.size()}, gradient.data())
                .ok());
        const auto want = adam.ToUpdates(
            {TableRowsRef{l, false, level_rows.data(), level_rows.size(), gradient.data()}});
        std::vector<uint32_t> kept;
        const Status stepped =
            trainer->GridWorkerAdam(l, level_rows.data(), level_rows.size(), &kept);
        ASSERT_TRUE(stepped.ok()) << stepped.ToString();
        const size_t n_want = want.empty() ? 0 : want[0].row_count;
        ASSERT_EQ(kept.size(), n_want) << "level " << l;
        std::vector<float> updates(kept.size() * F);
        ASSERT_TRUE(
            trainer->FetchPushBlock({l, 0, F, kept.data(), kept.size()}, updates.data()).ok());
        for (size_t i = 0; i < kept.size(); ++i) {
          ASSERT_EQ(kept[i], want[0].rows[i]);
          for (uint32_t f = 0; f < F; ++f)
            ASSERT_TRUE(Close(updates[i * F + f], want[0].values[i * F + f], exact))
                << "level " << l << " row " << kept[i];
        }
        level_rows = kept;
      }
      const size_t half = level_rows.size() / 2;
      for (size_t part = 0; part < 2; ++part) {
        const uint32_t* r = level_rows.data() + (part == 0 ? 0 : half);
        const size_t n = part == 0 ? half : level_rows.size() - half;
        const uint32_t width = F == 1 ? 1 : F / 2;
        for (uint32_t col = 0; col < F; col += width) {
          const PushBlock block{l, col, width, r, n};
          std::vector<float> values(n * width);
          ASSERT_TRUE(trainer->FetchPushBlock(block, values.data()).ok());
          for (float v : values) nonzero += v != 0.0f;
          const uint64_t key = cuda::DeviceTrainer::PushBlockKey(l, col);
          const uint64_t seed = step * 1000 + l * 10 + part;
          reference.AddResidual(key, r, n, width, values.data());
          std::vector<uint8_t> want(EncodedSize(options, values.size()));
          std::vector<float> decoded(values.size());
          cpu::Encode(options, values.data(), values.size(), seed, want.data());
          ASSERT_TRUE(
              cpu::Decode(options, want.data(), want.size(), values.size(), seed, decoded.data())
                  .ok());
          reference.StoreResidual(key, r, n, width, values.data(), decoded.data());
          if (mask) adam.MaskMomentum(l, r, n, col, width, decoded.data());
          std::vector<uint8_t> got(want.size());
          const Status encoded =
              trainer->EncodePushBlock(block, options, seed, true, mask, got.data());
          ASSERT_TRUE(encoded.ok()) << encoded.ToString();
          ASSERT_EQ(got, want) << "level " << l << " part " << part << " col " << col << " step "
                               << step;
        }
      }
    }
    EXPECT_GT(nonzero, 0u);
    // Without feedback: the values alone, and the residuals untouched.
    if (!rows.rows(0).empty()) {
      const PushBlock block{0, 0, F, rows.rows(0).data(), rows.rows(0).size()};
      std::vector<float> values(block.n * F);
      ASSERT_TRUE(trainer->FetchPushBlock(block, values.data()).ok());
      std::vector<uint8_t> want(EncodedSize(options, values.size())), got(want.size());
      cpu::Encode(options, values.data(), values.size(), 5, want.data());
      ASSERT_TRUE(trainer->EncodePushBlock(block, options, 5, false, false, got.data()).ok());
      EXPECT_EQ(got, want);
    }
    ASSERT_TRUE(trainer->ZeroGridGradientRows(global.data(), global.size()).ok());
    cpu::ErrorFeedback held;
    ASSERT_TRUE(trainer->CopyResidualsTo(&held).ok());
    ASSERT_EQ(StateOf(held), StateOf(reference)) << "step " << step;
  }
  EXPECT_GT(reference.Entries(), 0u);
  if (worker_adam) {
    // Adam's state, level by level, is WorkerAdam's; loaded back it stays.
    for (uint32_t l = 0; l < layout.n_levels(); ++l) {
      const cpu::AdamTable& want = *adam.State(l);
      cpu::AdamTable got;
      got.Resize(layout.level(l).rows, F);
      ASSERT_TRUE(trainer->CopyGridAdamState(l, got.m.data(), got.v.data(), got.step.data()).ok());
      ExpectClose(got.m, want.m, exact, "m of level " + std::to_string(l));
      ExpectClose(got.v, want.v, exact, "v of level " + std::to_string(l));
      EXPECT_EQ(got.step, want.step) << "level " << l;
      ASSERT_TRUE(trainer->LoadGridAdamState(l, nullptr, nullptr, nullptr).ok());
      ASSERT_TRUE(trainer->CopyGridAdamState(l, got.m.data(), got.v.data(), got.step.data()).ok());
      EXPECT_TRUE(std::all_of(got.step.begin(), got.step.end(), [](uint32_t s) { return s == 0; }));
      ASSERT_TRUE(
          trainer->LoadGridAdamState(l, want.m.data(), want.v.data(), want.step.data()).ok());
      ASSERT_TRUE(trainer->CopyGridAdamState(l, got.m.data(), got.v.data(), got.step.data()).ok());
      EXPECT_TRUE(got.m == want.m) << "level " << l << ": m loaded is not m read back";
    }
  }
  // The pending updates join uploaded rows: zero rows plus the residuals.
  {
    std::vector<uint32_t> global(layout.total_rows());
    for (uint32_t r = 0; r < global.size(); ++r) global[r] = r;
    const std::vector<float> zeros(layout.total_params(), 0.0f);
    ASSERT_TRUE(trainer->UploadGridRows(global.data(), global.size(), zeros.data()).ok());
    ASSERT_TRUE(trainer->AddResidualsToGridRows(global.data(), global.size()).ok());
    std::vector<float> grid;
    std::vector<std::vector<float>> mlp;
    ASSERT_TRUE(trainer->Download(&grid, &mlp).ok());
    std::vector<float> want(layout.total_params(), 0.0f);
    for (uint32_t l = 0; l < layout.n_levels(); ++l) {
      for (uint32_t col = 0; col < F; ++col) {
        const uint64_t key = cuda::DeviceTrainer::PushBlockKey(l, col);
        const uint32_t w = reference.Width(key);
        const size_t rows = layout.level(l).rows;
        std::vector<float> residuals(rows * w);
        if (w == 0 || !reference.GatherResiduals(key, nullptr, 0, rows, w, residuals.data()))
          continue;
        float* level = want.data() + layout.level(l).row_offset * F;
        for (size_t r = 0; r < rows; ++r)
          for (uint32_t f = 0; f < w; ++f) level[r * F + col + f] += residuals[r * w + f];
      }
    }
    size_t entries = 0;
    for (float v : want) entries += v != 0.0f;
    EXPECT_GT(entries, 0u);
    EXPECT_EQ(grid, want);
  }
  // A restore replaces what is held: empty, then the reference again.
  ASSERT_TRUE(trainer->LoadResiduals(cpu::ErrorFeedback()).ok());
  cpu::ErrorFeedback held;
  ASSERT_TRUE(trainer->CopyResidualsTo(&held).ok());
  EXPECT_EQ(held.Entries(), 0u);
  ASSERT_TRUE(trainer->LoadResiduals(reference).ok());
  ASSERT_TRUE(trainer->CopyResidualsTo(&held).ok());
  EXPECT_EQ(StateOf(held), StateOf(reference));
}

// What both refuse: blocks outside the grid, rows out of order, residual
// states of another model; and they stay usable.
void ExpectBadBlocksAreRefused(cuda::DeviceTrainer* trainer, const HashGridLayout& layout) {
  const uint32_t F = layout.features();
  const uint32_t rows_in_level = layout.level(0).rows;
  const uint32_t ok_rows[] = {1, 2};
  const uint32_t beyond[] = {1, rows_in_level};
  const uint32_t unordered[] = {2, 1};
  float values[16] = {};
  uint8_t payload[64] = {};
  CodecOptions onebit;
  onebit.codec = Codec::kOnebit;
  const PushBlock bad[] = {
      {layout.n_levels(), 0, F, ok_rows, 2},  // no such level
      {0, 0, F + 1, ok_rows, 2},              // wider than a row
      {0, F, 1, ok_rows, 2},                  // past the last column
      {0, 0, F, beyond, 2},                   // a row beyond the level
      {0, 0, F, unordered, 2},                // rows not ascending
  };
  for (const PushBlock& block : bad) {
    const Status fetched = trainer->FetchPushBlock(block, values);
    EXPECT_EQ(fetched.code(), StatusCode::kInvalidArgument) << fetched.ToString();
    const Status encoded = trainer->EncodePushBlock(block, onebit, 1, true, false, payload);
    EXPECT_EQ(encoded.code(), StatusCode::kInvalidArgument) << encoded.ToString();
  }
  const uint32_t global_beyond = static_cast<uint32_t>(layout.total_rows());
  EXPECT_FALSE(trainer->PrepareGridPush(&global_beyond, 1, false, 1.0f).ok());
  EXPECT_FALSE(trainer->ZeroGridGradientRows(&global_beyond, 1).ok());
  EXPECT_FALSE(trainer->AddResidualsToGridRows(&global_beyond, 1).ok());
  std::vector<uint32_t> kept;
  EXPECT_FALSE(trainer->GridWorkerAdam(0, unordered, 2, &kept).ok());
  EXPECT_FALSE(trainer->GridWorkerAdam(layout.n_levels(), ok_rows, 2, &kept).ok());
  EXPECT_FALSE(trainer->LoadGridAdamState(layout.n_levels(), nullptr, nullptr, nullptr).ok());
  cpu::ErrorFeedback other;
  const float residual[8] = {1, 2, 3, 4, 5, 6, 7, 8};
  other.Assign(uint64_t{layout.n_levels()} << 32, F, ok_rows, 1, residual);  // the MLP's table
  Status loaded = trainer->LoadResiduals(other);
  EXPECT_EQ(loaded.code(), StatusCode::kInvalidArgument) << loaded.ToString();
  EXPECT_NE(loaded.message().find("allowed"), std::string::npos) << loaded.ToString();
  cpu::ErrorFeedback far;
  far.Assign(0, F, &rows_in_level, 1, residual);
  loaded = trainer->LoadResiduals(far);
  EXPECT_EQ(loaded.code(), StatusCode::kInvalidArgument) << loaded.ToString();
  // Still usable.
  EXPECT_TRUE(trainer->FetchPushBlock({0, 0, F, ok_rows, 2}, values).ok());
}

std::vector<CodecOptions> Codecs() {
  CodecOptions onebit, topk, qsgd, randomk;
  onebit.codec = Codec::kOnebit;
  topk.codec = Codec::kTopk;
  topk.ratio = 0.2;
  qsgd.codec = Codec::kQsgd;
  randomk.codec = Codec::kRandomk;
  randomk.ratio = 0.3;
  return {onebit, topk, qsgd, randomk};
}

TEST(DevicePushTest, TheCpuTwinsPushBlocksAreTheClientsCodecAndErrorFeedback) {
  const RunSpec spec = Spec(TrainingDevice::kCpu);
  auto model = HashGridModel::Create(spec.model);
  ASSERT_TRUE(model.ok());
  ThreadPool pool(1);
  for (const CodecOptions& options : Codecs()) {
    for (bool worker_adam : {false, true}) {
      auto trainer = HostTrainer::Create(spec, **model, &pool);
      ASSERT_TRUE(trainer.ok()) << trainer.status().ToString();
      ExpectPushBlocksAreTheCpus(trainer->get(), **model, spec, options, worker_adam,
                                 /*exact=*/true, std::string(CodecName(options.codec)));
    }
  }
  auto trainer = HostTrainer::Create(spec, **model, &pool);
  ASSERT_TRUE(trainer.ok());
  ExpectBadBlocksAreRefused(trainer->get(), (*model)->layout());
}

TEST(DevicePushTest, TheGpusPushBlocksAreTheCpusBytesAndResiduals) {
  std::string reason;
  if (!cuda::Available(&reason)) GTEST_SKIP() << reason;
  const RunSpec spec = Spec(TrainingDevice::kCuda);
  auto model = HashGridModel::Create(spec.model);
  ASSERT_TRUE(model.ok());
  for (const CodecOptions& options : Codecs()) {
    for (bool worker_adam : {false, true}) {
      auto trainer = MakeDeviceTrainer(spec, **model, 0);
      ASSERT_TRUE(trainer.ok()) << trainer.status().ToString();
      ExpectPushBlocksAreTheCpus(trainer->get(), **model, spec, options, worker_adam,
                                 /*exact=*/false, std::string(CodecName(options.codec)));
    }
  }
  auto trainer = MakeDeviceTrainer(spec, **model, 0);
  ASSERT_TRUE(trainer.ok()) << trainer.status().ToString();
  ExpectBadBlocksAreRefused(trainer->get(), (*model)->layout());
}

// The PS client's side: a worker state restored into a client with a
// device source puts the grid tables' residuals and Adam state on the
// device (the MLP's stay in the client), and the client's next state,
// copied back, is the same bytes; what changes on the device shows in it.
// No shard is needed: nothing is sent.
TEST(DevicePushTest, TheClientsStateGoesToTheDeviceAndComesBack) {
  Config config = testing::SmallDistributedConfig(1, GradientSyncMode::kPs, 4);
  config.compression.codec = "onebit";
  config.ps.optimizer = OptimizerPlacement::kWorker;
  auto resolved = RunSpec::Resolve(config);
  ASSERT_TRUE(resolved.ok()) << resolved.status().ToString();
  const RunSpec& spec = *resolved;
  const Partition partition = *Partition::Make(spec.model.tables, 1, ModelParallelDim::kRow);
  auto model = HashGridModel::Create(spec.model);
  ASSERT_TRUE(model.ok());
  const auto& layout = (*model)->layout();
  const uint32_t F = layout.features(), levels = layout.n_levels();
  ClusterMap map;
  map.expected_shards = 1;
  MemberInfo shard;
  shard.role = Role::kShard;
  shard.endpoint = "tcp://127.0.0.1:9";  // never reached: nothing is sent
  map.shards.push_back(shard);
  auto client = PsClient::Connect(map, partition, 0, 1, std::chrono::milliseconds(500));
  ASSERT_TRUE(client.ok()) << client.status().ToString();
  PsClient& ps = **client;
  ps.SetCompression(spec.compression.codec, true, 0, 1);
  ps.SetWorkerOptimizer(spec.model.adam);

  // A state: residuals of level 1 and of the first MLP matrix, Adam's state
  // of level 2 and of the MLP.
  cpu::ErrorFeedback feedback;
  const uint32_t rows[] = {3, 17};
  const std::vector<float> residual = {0.5f, -0.25f, 1.5f, 2.0f, 4.0f, 8.0f, -1.0f, 3.0f};
  ASSERT_LE(size_t{2} * F, residual.size()) << "the residuals below are read as 2 rows of F";
  ASSERT_LE(size_t{4} + F, residual.size());
  feedback.Assign(uint64_t{1} << 32, F, rows, 2, residual.data());
  // The MLP row is as wide as its table: a row read past `residual` was
  // whatever lay beyond it, now and then not finite (and rightly refused).
  const uint32_t mlp_width = partition.table(levels).width;
  std::vector<float> mlp_residual(mlp_width);
  for (uint32_t f = 0; f < mlp_width; ++f) mlp_residual[f] = 0.125f * static_cast<float>(f + 1);
  feedback.Assign(uint64_t{levels} << 32, mlp_width, rows, 1, mlp_residual.data());
  WorkerAdam adam(partition, spec.model.adam);
  cpu::AdamTable* grid_state = adam.State(2);
  grid_state->m[5] = 0.125f;
  grid_state->v[7] = 0.0625f;
  grid_state->step[3] = 9;
  adam.State(levels)->m[0] = 2.5f;
  std::string saved(1, '\1');
  feedback.AppendState(&saved);
  adam.AppendState(&saved);

  ThreadPool pool(1);
  auto trainer = HostTrainer::Create(spec, **model, &pool);
  ASSERT_TRUE(trainer.ok());
  auto source = MakeTrainerPushSource(trainer->get());
  std::vector<uint32_t> grid_tables(levels);
  for (uint32_t l = 0; l < levels; ++l) grid_tables[l] = l;
  ASSERT_TRUE(ps.SetDevicePushSource(source.get(), grid_tables).ok());
  const Status early = ps.RestoreState(saved, 8);
  ASSERT_EQ(early.code(), StatusCode::kInvalidArgument)
      << "level 2's row 3 stepped 9 times: " << early.ToString();
  ASSERT_TRUE(ps.RestoreState(saved, 9).ok());

  cpu::ErrorFeedback on_device;
  ASSERT_TRUE((*trainer)->CopyResidualsTo(&on_device).ok());
  EXPECT_EQ(on_device.Keys(), std::vector<uint64_t>{uint64_t{1} << 32});
  ASSERT_NE(on_device.Residual(uint64_t{1} << 32, 17), nullptr);
  EXPECT_EQ(on_device.Residual(uint64_t{1} << 32, 17)[0], residual[F]);
  cpu::AdamTable got;
  got.Resize(layout.level(2).rows, F);
  ASSERT_TRUE((*trainer)->CopyGridAdamState(2, got.m.data(), got.v.data(), got.step.data()).ok());
  EXPECT_EQ(got.m, grid_state->m);
  EXPECT_EQ(got.step, grid_state->step);

  std::string again;
  ASSERT_TRUE(ps.AppendState(&again).ok());
  EXPECT_TRUE(again == saved) << "the state did not come back as it went";

  // A change on the device shows in the next state; the MLP's residual,
  // kept by the client, stays.
  cpu::ErrorFeedback changed;
  changed.Assign(uint64_t{1} << 32, F, rows + 1, 1, residual.data() + 4);
  ASSERT_TRUE((*trainer)->LoadResiduals(changed).ok());
  again.clear();
  ASSERT_TRUE(ps.AppendState(&again).ok());
  EXPECT_FALSE(again == saved);
  EXPECT_EQ(ps.error_feedback().Residual(uint64_t{1} << 32, 3), nullptr);
  ASSERT_NE(ps.error_feedback().Residual(uint64_t{1} << 32, 17), nullptr);
  EXPECT_EQ(ps.error_feedback().Residual(uint64_t{1} << 32, 17)[0], residual[4]);
  ASSERT_NE(ps.error_feedback().Residual(uint64_t{levels} << 32, 3), nullptr);

  // Detached, the client keeps what the device held.
  ASSERT_TRUE(ps.SetDevicePushSource(nullptr).ok());
  std::string detached;
  ASSERT_TRUE(ps.AppendState(&detached).ok());
  EXPECT_TRUE(detached == again) << detached.size() << " vs " << again.size();

  // States of another model are refused, naming what is allowed: a slice
  // wider than the table's, and a row beyond it.
  for (int bad = 0; bad < 2; ++bad) {
    cpu::ErrorFeedback other;
    const uint32_t beyond = layout.level(1).rows;
    if (bad == 0) {
      other.Assign(uint64_t{1} << 32, F + 1, rows, 1, residual.data());
    } else {
      other.Assign(uint64_t{1} << 32, F, &beyond, 1, residual.data());
    }
    std::string hostile(1, '\1');
    other.AppendState(&hostile);
    adam.AppendState(&hostile);
    const Status refused = ps.RestoreState(hostile, 9);
    EXPECT_EQ(refused.code(), StatusCode::kInvalidArgument) << refused.ToString();
    EXPECT_NE(refused.message().find("allowed"), std::string::npos) << refused.ToString();
  }
}

}  // namespace
}  // namespace gridsync
