// The PS with compression and with Adam on the workers: delta pulls,
// compressed pushes that never touch untouched rows, malformed payloads
// refused, worker Adam's updates, their averaging on the shard, the final
// flush of error feedback, and residuals per column slice.
#include <algorithm>
#include <limits>
#include <numeric>
#include <random>

#include "tests/ps_test_util.h"

namespace gridsync {
namespace {

TEST(PsCompressionTest, DeltaPullsShrinkPullsAndTrainAsWell) {
  const ImageTask image = SmallImage();
  for (const char* codec : {"onebit", "topk", "fp16"}) {
    double pulled[2] = {0, 0}, psnr[2] = {0, 0};
    for (int pull = 0; pull < 2; ++pull) {
      Config config = SmallConfig(2, 2);
      config.compression.codec = codec;
      config.compression.ratio = 0.1;
      config.compression.min_bytes = 0;
      config.compression.pull = pull == 1;
      config.training.steps = 30;
      auto cluster = Cluster::Start(config);
      auto reports = cluster->Train(image);
      for (auto& r : reports) ASSERT_TRUE(r.ok()) << codec << ": " << r.status().ToString();
      pulled[pull] = reports[0]->bytes_pulled_per_step;
      psnr[pull] = reports[0]->psnr;
    }
    EXPECT_LT(pulled[1] * (std::string(codec) == "fp16" ? 1.7 : 3.0), pulled[0])
        << codec << ": pulled " << pulled[1] << " B/step with delta pulls, " << pulled[0]
        << " without";
    // 30 steps is the worst case: parameters move fastest early, so the
    // replica lags most (at 200 steps onebit loses 0.65 dB, README).
    EXPECT_NEAR(psnr[1], psnr[0], 1.0) << codec;
  }
}

TEST(PsCompressionTest, CompressedPushesTrainAndNeverTouchUntouchedRows) {
  const ImageTask image = SmallImage();
  for (const char* codec : {"onebit", "topk", "int8", "randomk"}) {
    Config config = SmallConfig(2, 2);
    config.compression.codec = codec;
    config.compression.ratio = 0.1;
    config.compression.min_bytes = 0;
    config.training.steps = 10;
    auto cluster = Cluster::Start(config);
    auto reports = cluster->Train(image);
    for (auto& r : reports) ASSERT_TRUE(r.ok()) << codec << ": " << r.status().ToString();
    // The rows any batch of the run read: the only rows allowed to move.
    auto initial = HashGridModel::Create(testing::SpecOf(cluster->config).model);
    ASSERT_TRUE(initial.ok());
    const auto& layout = (*initial)->layout();
    std::vector<uint8_t> read(layout.total_rows(), 0);
    ThreadPool pool(1);
    cpu::GridBatchLookup lookup;
    const size_t batch = static_cast<size_t>(config.training.batch_size);
    std::vector<float> pos(batch * 2), target(batch * 3);
    for (int step = 0; step < config.training.steps; ++step) {
      image.SampleBatch(config.training.seed, static_cast<uint64_t>(step), 0, batch, pos.data(),
                        target.data());
      cpu::HashGridLookup(layout, pos.data(), batch, layout.n_levels(), &lookup, &pool);
      for (uint32_t l = 0; l < layout.n_levels(); ++l) {
        for (size_t i = 0; i < batch * lookup.corners; ++i) {
          read[layout.level(l).row_offset + lookup.rows[lookup.Index(l, 0) + i]] = 1;
        }
      }
    }
    const auto& before = (*initial)->grid_params();
    const auto& after = reports[0]->model->grid_params();
    size_t moved = 0, moved_unread = 0;
    for (uint64_t row = 0; row < layout.total_rows(); ++row) {
      for (uint32_t f = 0; f < layout.features(); ++f) {
        const size_t at = row * layout.features() + f;
        if (before[at] != after[at]) {
          ++moved;
          moved_unread += read[row] == 0;
        }
      }
    }
    EXPECT_GT(moved, 0u) << codec;
    // Lossy codecs with error feedback deliver what they held back as one more step.
    EXPECT_TRUE(reports[0]->flushed_residuals) << codec;
    for (auto* shard : cluster->shards) {
      EXPECT_EQ(AppliedSteps(*shard, static_cast<uint64_t>(config.training.steps) + 1),
                static_cast<uint64_t>(config.training.steps) + 1)
          << codec;
    }
    EXPECT_EQ(moved_unread, 0u) << codec << ": rows no batch touched received updates";
    EXPECT_LT(reports[0]->bytes_pushed_per_step, SmallConfig(2, 2).training.batch_size * 64.0)
        << codec;
  }
}

TEST(PsCompressionTest, MalformedCompressedPayloadIsRefusedAndChangesNothing) {
  auto cluster = Cluster::Start(SmallConfig(1, 1));
  const Partition& partition = *cluster->partition;
  const std::vector<wire::TableShape> shapes = ShapesOf(partition);
  RawClient raw(cluster->shards[0]->endpoint());
  auto push = [&](auto mutate) {
    wire::OutHeader h;
    h.kind = wire::Kind::kPush;
    h.request_id = 3;
    h.num_workers = 1;
    wire::OutBlock b;
    b.table = 0;
    b.width = partition.table(0).width;
    b.rows = {1, 2, 3, 4};
    b.row_count = 4;
    b.codec.codec = Codec::kOnebit;
    std::vector<float> values(8, 0.25f);
    b.payload.resize(EncodedSize(b.codec, values.size()));
    cpu::Encode(b.codec, values.data(), values.size(), 0, b.payload.data());
    mutate(b);
    std::vector<wire::OutBlock> blocks;
    blocks.push_back(std::move(b));
    return wire::Encode(h, std::move(blocks));
  };
  // A NaN scale in an otherwise well-formed onebit payload.
  auto nan_scale = push([](wire::OutBlock& b) {
    const float nan = std::nanf("");
    std::memcpy(b.payload.data(), &nan, sizeof(nan));
  });
  auto reply = raw.Exchange(std::move(nan_scale), shapes);
  ASSERT_TRUE(reply.ok()) << reply.status().ToString();
  EXPECT_EQ(reply->kind, wire::Kind::kError);
  EXPECT_NE(reply->error.message().find("onebit"), std::string::npos) << reply->error.message();
  // A payload one byte short.
  auto frames = push([](wire::OutBlock&) {});
  frames.back() = zmq::message_t(frames.back().data(), frames.back().size() - 1);
  reply = raw.Exchange(std::move(frames), shapes);
  ASSERT_TRUE(reply.ok());
  EXPECT_EQ(reply->kind, wire::Kind::kError);
  EXPECT_EQ(AppliedSteps(*cluster->shards[0], 0u), 0u);
  // A well-formed compressed push is accepted and applied.
  reply = raw.Exchange(push([](wire::OutBlock&) {}), shapes);
  ASSERT_TRUE(reply.ok());
  EXPECT_EQ(reply->kind, wire::Kind::kPushAck) << reply->error.ToString();
  EXPECT_EQ(AppliedSteps(*cluster->shards[0], 1u), 1u);
}

// ---- ps.optimizer = worker: Adam on the workers, updates on the wire ----

TEST(WorkerAdamTest, UpdatesAreTheNegatedAdamStepAndZeroRowsAreDropped) {
  const std::vector<TableInfo> tables = {{"grid", 100, 2}, {"mlp", 3, 4}};
  auto partition = Partition::Make(tables, 1, ModelParallelDim::kRow);
  ASSERT_TRUE(partition.ok());
  AdamHyper hyper;
  WorkerAdam adam(*partition, hyper);
  // Reference: Adam applied in place, as on a shard.
  cpu::AdamTable ref_grid, ref_mlp;
  ref_grid.Resize(100, 2);
  ref_mlp.Resize(3, 4);
  std::vector<float> params_grid(200, 0.5f), params_mlp(12, -0.25f);
  std::mt19937 rng(7);
  std::normal_distribution<float> normal(0.0f, 1e-3f);
  for (int step = 0; step < 5; ++step) {
    const std::vector<uint32_t> rows = {3, 17, 42, 99};
    std::vector<float> grad(rows.size() * 2);
    for (auto& g : grad) g = normal(rng);
    grad[2] = grad[3] = 0.0f;  // row 17: no gradient, must not step
    std::vector<float> mlp_grad(12);
    for (auto& g : mlp_grad) g = step == 2 ? 0.0f : normal(rng);  // dense: steps anyway
    const auto updates = adam.ToUpdates({{0, false, rows.data(), rows.size(), grad.data()},
                                         {1, true, nullptr, 0, mlp_grad.data()}});
    ASSERT_EQ(updates.size(), 2u);
    ASSERT_EQ(updates[0].row_count, 3u);
    EXPECT_EQ(updates[0].rows[0], 3u);
    EXPECT_EQ(updates[0].rows[1], 42u);
    EXPECT_EQ(updates[0].rows[2], 99u);
    EXPECT_TRUE(updates[1].dense);
    SparseRows sparse;
    sparse.width = 2;
    sparse.rows = rows;
    sparse.values.assign(grad.begin(), grad.end());
    const std::vector<float> before_grid = params_grid;
    const std::vector<float> before_mlp = params_mlp;
    cpu::AdamUpdateRows(hyper, sparse, 1.0f, params_grid.data(), &ref_grid);
    cpu::AdamUpdateDense(hyper, mlp_grad.data(), 3, 1.0f, params_mlp.data(), &ref_mlp);
    for (size_t i = 0; i < 3; ++i) {
      for (uint32_t f = 0; f < 2; ++f) {
        const size_t at = size_t{updates[0].rows[i]} * 2 + f;
        const float applied = before_grid[at] + updates[0].values[i * 2 + f];
        EXPECT_EQ(applied, params_grid[at]) << "step " << step << " row " << updates[0].rows[i];
      }
    }
    EXPECT_EQ(params_grid[34], 0.5f);  // row 17 untouched
    for (size_t i = 0; i < 12; ++i)
      EXPECT_EQ(before_mlp[i] + updates[1].values[i], params_mlp[i]) << i;
  }
  EXPECT_GT(adam.StateBytes(), 0u);
}

// A table listed twice in one call steps twice, in list order, and each
// listing gets its own rows and updates: the second must not overwrite the
// first's (they shared one output buffer).
TEST(WorkerAdamTest, ATableListedTwiceGetsTheUpdatesOfEachListing) {
  const std::vector<TableInfo> tables = {{"grid", 100, 2}};
  auto partition = Partition::Make(tables, 1, ModelParallelDim::kRow);
  ASSERT_TRUE(partition.ok());
  AdamHyper hyper;
  WorkerAdam twice(*partition, hyper), apart(*partition, hyper);
  std::vector<uint32_t> rows_a(100), rows_b = {5, 60};
  for (uint32_t i = 0; i < 100; ++i) rows_a[i] = i;
  std::vector<float> grad_a(200), grad_b = {0.5f, -0.25f, 1.0f, 2.0f};
  for (size_t i = 0; i < grad_a.size(); ++i) grad_a[i] = 0.01f * static_cast<float>(i + 1);
  const auto both = twice.ToUpdates({{0, false, rows_a.data(), rows_a.size(), grad_a.data()},
                                     {0, false, rows_b.data(), rows_b.size(), grad_b.data()}});
  ASSERT_EQ(both.size(), 2u);
  const auto first = apart.ToUpdates({{0, false, rows_a.data(), rows_a.size(), grad_a.data()}});
  const std::vector<uint32_t> first_rows(first[0].rows, first[0].rows + first[0].row_count);
  const std::vector<float> first_values(first[0].values, first[0].values + first[0].row_count * 2);
  const auto second = apart.ToUpdates({{0, false, rows_b.data(), rows_b.size(), grad_b.data()}});
  ASSERT_EQ(both[0].row_count, first_rows.size());
  EXPECT_EQ(std::vector<uint32_t>(both[0].rows, both[0].rows + both[0].row_count), first_rows);
  EXPECT_EQ(std::vector<float>(both[0].values, both[0].values + both[0].row_count * 2),
            first_values);
  ASSERT_EQ(both[1].row_count, second[0].row_count);
  EXPECT_EQ(std::vector<uint32_t>(both[1].rows, both[1].rows + both[1].row_count),
            std::vector<uint32_t>(second[0].rows, second[0].rows + second[0].row_count));
  EXPECT_EQ(std::vector<float>(both[1].values, both[1].values + both[1].row_count * 2),
            std::vector<float>(second[0].values, second[0].values + second[0].row_count * 2));
}

// DGC's momentum masking skips chunks of undelivered values: every delivered
// value (NaN and denormals included, -0.0f not) zeroes its own momentum and
// nothing else does, for any column slice, width and position in a chunk.
TEST(WorkerAdamTest, MomentumMaskingZeroesExactlyTheDeliveredValues) {
  std::mt19937 random(5);
  for (uint32_t stride : {1u, 2u, 3u, 8u}) {
    for (uint32_t cw = 1; cw <= stride; ++cw) {
      for (double density : {0.0, 0.01, 0.3, 1.0}) {
        const uint32_t col = stride - cw;
        const size_t table_rows = 500;
        const size_t n = 37 + random() % 200;  // rows pushed, distinct, in any order
        std::vector<uint32_t> all(table_rows);
        std::iota(all.begin(), all.end(), 0u);
        std::shuffle(all.begin(), all.end(), random);
        const std::vector<uint32_t> rows(all.begin(), all.begin() + n);
        std::vector<float> delivered(n * cw, 0.0f);
        std::uniform_real_distribution<double> unit(0.0, 1.0);
        const float specials[] = {-0.0f, 1e-42f, std::numeric_limits<float>::quiet_NaN(), -3.5f};
        for (size_t j = 0; j < delivered.size(); ++j) {
          if (unit(random) < 0.05) delivered[j] = specials[random() % 4];
          if (unit(random) < density) delivered[j] = static_cast<float>(unit(random)) - 0.5f;
        }
        std::vector<float> m(table_rows * stride, 1.0f);
        MaskMomentumRows(m.data(), stride, rows.data(), n, col, cw, delivered.data());
        std::vector<float> want(table_rows * stride, 1.0f);
        for (size_t i = 0; i < n; ++i) {
          for (uint32_t f = 0; f < cw; ++f) {
            if (delivered[i * cw + f] != 0.0f) want[size_t{rows[i]} * stride + col + f] = 0.0f;
          }
        }
        ASSERT_EQ(m, want) << "stride " << stride << ", columns " << col << ".." << col + cw
                           << ", density " << density << ", " << n << " rows";
      }
    }
  }
}

TEST(PsWorkerOptimizerTest, OneWorkerEndsBitForBitWhereAdamOnTheShardEnds) {
  const ImageTask image = SmallImage();
  std::vector<std::vector<float>> params;
  for (OptimizerPlacement where : {OptimizerPlacement::kShard, OptimizerPlacement::kWorker}) {
    Config config = SmallConfig(1, 2);
    config.ps.optimizer = where;
    auto cluster = Cluster::Start(config);
    auto reports = cluster->Train(image);
    ASSERT_TRUE(reports[0].ok()) << reports[0].status().ToString();
    EXPECT_FALSE(reports[0]->flushed_residuals);  // no codec: nothing held back
    params.push_back(FlattenParams(*reports[0]->model));
  }
  ExpectBitIdentical(params[0], params[1]);
}

TEST(PsWorkerOptimizerTest, TwoWorkersTrainAsWellAsAdamOnTheShard) {
  const ImageTask image = SmallImage();
  std::vector<double> loss;
  for (OptimizerPlacement where : {OptimizerPlacement::kShard, OptimizerPlacement::kWorker}) {
    Config config = SmallConfig(2, 2);
    config.training.steps = 40;
    config.ps.optimizer = where;
    auto cluster = Cluster::Start(config);
    auto reports = cluster->Train(image);
    for (auto& r : reports) ASSERT_TRUE(r.ok()) << r.status().ToString();
    loss.push_back(reports[0]->final_loss);
  }
  // Each worker normalises its own half-batch gradient: not the same
  // numbers as Adam on the sum, but the same progress.
  EXPECT_LT(loss[1], 1.25 * loss[0]) << "shard " << loss[0] << " worker " << loss[1];
}

// Worker-side Adam, the codec with its error feedback and the pending
// updates run on the training threads (tables and feedback keys in
// parallel): the run is the same bit for bit with one thread or three.
TEST(PsWorkerOptimizerTest, TrainingThreadsChangeNoBitOfACompressedRun) {
  const ImageTask image = SmallImage();
  std::vector<std::vector<float>> params;
  for (int threads : {1, 3}) {
    Config config = SmallConfig(2, 2);
    config.training.steps = 20;
    config.training.threads = threads;
    config.ps.optimizer = OptimizerPlacement::kWorker;
    config.compression.codec = "onebit";
    config.compression.error_feedback = true;
    auto cluster = Cluster::Start(config);
    auto reports = cluster->Train(image);
    for (auto& r : reports) ASSERT_TRUE(r.ok()) << r.status().ToString();
    params.push_back(FlattenParams(*reports[0]->model));
  }
  ExpectBitIdentical(params[0], params[1]);
}

// topk and randomk at ratio 1 hold nothing back: the run is the one without
// a codec, bit for bit. DGC's momentum masking must not apply then (it reset
// the momentum of every value, every step: -1.5 dB at 200 steps). Nor where
// a ratio below 1 keeps every value of a block (k rounds up to n): masking
// is decided per block.
TEST(PsWorkerOptimizerTest, SparsifyingCodecsAtRatioOneEndWhereNoCodecEnds) {
  const ImageTask image = SmallImage();
  std::vector<std::vector<float>> params;
  const std::pair<const char*, double> runs[] = {
      {"none", 1.0}, {"topk", 1.0}, {"randomk", 1.0}, {"topk", 0.9999999}};
  for (const auto& [codec, ratio] : runs) {
    Config config = SmallConfig(2, 2);
    config.training.steps = 20;
    config.ps.optimizer = OptimizerPlacement::kWorker;
    config.compression.codec = codec;
    config.compression.ratio = ratio;
    config.compression.error_feedback = std::string(codec) != "none";
    auto cluster = Cluster::Start(config);
    auto reports = cluster->Train(image);
    for (auto& r : reports) ASSERT_TRUE(r.ok()) << codec << ": " << r.status().ToString();
    params.push_back(FlattenParams(*reports[0]->model));
  }
  ExpectBitIdentical(params[0], params[1]);
  ExpectBitIdentical(params[0], params[2]);
  ExpectBitIdentical(params[0], params[3]);
}

TEST(PsWorkerOptimizerTest, ShardAveragesUpdatesOverThePushesListingTheRow) {
  Config config = SmallConfig(2, 1);
  config.ps.optimizer = OptimizerPlacement::kWorker;
  auto cluster = Cluster::Start(config);
  const Partition& partition = *cluster->partition;
  const std::vector<wire::TableShape> shapes = ShapesOf(partition);
  RawClient raw(cluster->shards[0]->endpoint());
  auto push = [&](uint32_t worker, std::vector<uint32_t> rows, std::vector<float> values,
                  wire::PushValues kind = wire::PushValues::kUpdates) {
    wire::OutHeader h;
    h.kind = wire::Kind::kPush;
    h.request_id = 10 + worker;
    h.worker_rank = worker;
    h.num_workers = 2;
    h.push_values = kind;
    wire::OutBlock b;
    b.table = 0;
    b.width = 2;
    b.row_count = static_cast<uint32_t>(rows.size());
    b.rows = std::move(rows);
    b.values.assign(values.begin(), values.end());
    std::vector<wire::OutBlock> blocks;
    blocks.push_back(std::move(b));
    return raw.Exchange(wire::Encode(h, std::move(blocks)), shapes);
  };
  // Gradients where updates are expected: refused, naming both.
  auto refused = push(0, {1}, {1.0f, 1.0f}, wire::PushValues::kGradients);
  ASSERT_TRUE(refused.ok());
  ASSERT_EQ(refused->kind, wire::Kind::kError);
  EXPECT_NE(refused->error.message().find("carries gradients"), std::string::npos)
      << refused->error.message();
  EXPECT_NE(refused->error.message().find("allowed: updates"), std::string::npos)
      << refused->error.message();
  // Worker 0 lists rows 1 and 2, worker 1 rows 2 and 3 (zero for row 3 still counts:
  // a worker that touched a row but whose codec held its update back).
  auto a = push(0, {1, 2}, {1.0f, 2.0f, 3.0f, 4.0f});
  auto b = push(1, {2, 3}, {5.0f, 8.0f, 0.0f, 0.0f});
  ASSERT_TRUE(a.ok() && b.ok());
  ASSERT_EQ(a->kind, wire::Kind::kPushAck) << a->error.ToString();
  ASSERT_EQ(b->kind, wire::Kind::kPushAck) << b->error.ToString();
  wire::OutHeader h;
  h.kind = wire::Kind::kPull;
  h.request_id = 20;
  h.min_version = 1;
  wire::OutBlock q;
  q.table = 0;
  q.width = 2;
  q.rows = {0, 1, 2, 3};
  q.row_count = 4;
  std::vector<wire::OutBlock> blocks;
  blocks.push_back(std::move(q));
  auto reply = raw.Exchange(wire::Encode(h, std::move(blocks)), shapes);
  ASSERT_TRUE(reply.ok()) << reply.status().ToString();
  ASSERT_EQ(reply->kind, wire::Kind::kPullReply) << reply->error.ToString();
  const auto& v = reply->blocks[0].values;
  const std::vector<float> expected = {0, 0, 1, 2, (3 + 5) / 2.0f, (4 + 8) / 2.0f, 0, 0};
  ASSERT_EQ(v.size(), expected.size());
  for (size_t i = 0; i < expected.size(); ++i) EXPECT_EQ(v[i], expected[i]) << i;

  // And a shard running Adam refuses updates.
  auto adam_cluster = Cluster::Start(SmallConfig(1, 1));
  RawClient adam_raw(adam_cluster->shards[0]->endpoint());
  wire::OutHeader u;
  u.kind = wire::Kind::kPush;
  u.request_id = 1;
  u.num_workers = 1;
  u.push_values = wire::PushValues::kUpdates;
  auto no = adam_raw.Exchange(wire::Encode(u, {}), shapes);
  ASSERT_TRUE(no.ok());
  ASSERT_EQ(no->kind, wire::Kind::kError);
  EXPECT_NE(no->error.message().find("carries updates; allowed: gradients"), std::string::npos)
      << no->error.message();
  EXPECT_EQ(AppliedSteps(*adam_cluster->shards[0], 0u), 0u);
}

// A long-running shard (a systemd unit) serves job after job: once the
// coordinator's job moved on, the new job's first message starts the shard
// afresh, an older job's worker is refused by name, and a message claiming a
// job the coordinator does not run changes nothing.
TEST(PsWorkerOptimizerTest, FlushDeliversExactlyWhatErrorFeedbackHeld) {
  Config config = SmallConfig(1, 2);
  config.compression.codec = "topk";
  config.compression.ratio = 0.05;
  config.compression.min_bytes = 0;
  OneWorker one = OneWorker::Join(config);
  ASSERT_TRUE(one.session.ok()) << one.session.status().ToString();
  auto& model = one.model;
  auto& session = one.session;
  PsClient& ps = *session->ps;
  ASSERT_TRUE(ps.optimizer_on_worker());
  const auto& layout = (*model)->layout();
  const uint32_t F = layout.features();
  std::mt19937 rng(3);
  std::normal_distribution<float> normal(0.0f, 1e-3f);
  const int steps = 6;
  for (int step = 0; step < steps; ++step) {
    std::vector<std::vector<uint32_t>> rows(layout.n_levels());
    std::vector<std::vector<float>> values(layout.n_levels());
    std::vector<TableRowsRef> push;
    for (uint32_t l = 0; l < layout.n_levels(); ++l) {
      for (uint32_t r = static_cast<uint32_t>(step); r < layout.level(l).rows; r += 7)
        rows[l].push_back(r);
      for (size_t i = 0; i < rows[l].size() * F; ++i) values[l].push_back(normal(rng));
      push.push_back({l, false, rows[l].data(), rows[l].size(), values[l].data()});
    }
    ASSERT_TRUE(ps.Push(wire::Kind::kPush, static_cast<uint64_t>(step), push).ok());
  }
  ASSERT_GT(ps.error_feedback().Entries(), 0u);
  // What the shards hold, and what this worker still holds back.
  ASSERT_TRUE(PullAllParams(ps, **model, steps).ok());
  const std::vector<float> held_at_shards = (*model)->grid_params();
  std::vector<float> expected = held_at_shards;
  for (uint32_t l = 0; l < layout.n_levels(); ++l) {
    for (uint32_t r = 0; r < layout.level(l).rows; ++r) {
      const float* residual = ps.PendingUpdate(l, 0, r);
      if (residual == nullptr) continue;
      for (uint32_t f = 0; f < F; ++f)
        expected[(layout.level(l).row_offset + r) * F + f] += residual[f];
    }
  }
  ASSERT_NE(expected, held_at_shards);
  // A pull with the pending view shows the same numbers the flush will make real.
  std::vector<TablePullRef> all;
  for (uint32_t l = 0; l < layout.n_levels(); ++l) {
    all.push_back(
        {l, true, nullptr, 0, (*model)->grid_params().data() + layout.level(l).row_offset * F});
  }
  ASSERT_TRUE(ps.SendPull(steps, all).ok());
  ps.GatherPendingUpdates();
  ASSERT_TRUE(ps.ReceivePull().ok());
  ExpectBitIdentical((*model)->grid_params(), expected);

  auto flushed = ps.FlushResiduals(steps, steps);
  ASSERT_TRUE(flushed.ok()) << flushed.status().ToString();
  EXPECT_TRUE(*flushed);
  EXPECT_EQ(ps.error_feedback().Entries(), 0u);
  ASSERT_TRUE(PullAllParams(ps, **model, steps + 1).ok());
  ExpectBitIdentical((*model)->grid_params(), expected);
  for (auto* shard : one.cluster->shards)
    EXPECT_EQ(AppliedSteps(*shard, static_cast<uint64_t>(steps) + 1),
              static_cast<uint64_t>(steps) + 1);
}

// The pending view of a sparse pull: every pulled row gets its residual,
// in levels of 16384 rows, which GatherPendingUpdates cuts into slices; a
// pull without it (the next one here) gets the shards' values as they are.
TEST(PsWorkerOptimizerTest, ASparsePullsPendingViewAddsEveryRowsResidual) {
  Config config = SmallConfig(1, 2);
  config.compression.codec = "onebit";
  config.compression.min_bytes = 0;
  OneWorker one = OneWorker::Join(config);
  ASSERT_TRUE(one.session.ok()) << one.session.status().ToString();
  auto& model = one.model;
  PsClient& ps = *one.session->ps;
  ASSERT_TRUE(ps.optimizer_on_worker());
  const auto& layout = (*model)->layout();
  const uint32_t F = layout.features();
  std::mt19937 rng(4);
  std::normal_distribution<float> normal(0.0f, 1e-3f);
  std::vector<std::vector<uint32_t>> rows(layout.n_levels());
  std::vector<std::vector<float>> values(layout.n_levels());
  std::vector<TableRowsRef> push;
  uint32_t largest = 0;
  for (uint32_t l = 0; l < layout.n_levels(); ++l) {
    largest = std::max<uint32_t>(largest, static_cast<uint32_t>(layout.level(l).rows));
    for (uint32_t r = 0; r < layout.level(l).rows; r += 2) rows[l].push_back(r);
    for (size_t i = 0; i < rows[l].size() * F; ++i) values[l].push_back(normal(rng));
    push.push_back({l, false, rows[l].data(), rows[l].size(), values[l].data()});
  }
  ASSERT_GT(largest, 8192u);  // two slices at least
  ASSERT_TRUE(ps.Push(wire::Kind::kPush, 0, push).ok());
  ASSERT_GT(ps.error_feedback().Entries(), 0u);
  // Every row of every level, as sparse rows.
  std::vector<std::vector<uint32_t>> every(layout.n_levels());
  std::vector<TablePullRef> pulls;
  for (uint32_t l = 0; l < layout.n_levels(); ++l) {
    every[l].resize(layout.level(l).rows);
    std::iota(every[l].begin(), every[l].end(), 0u);
    pulls.push_back({l, false, every[l].data(), every[l].size(),
                     (*model)->grid_params().data() + layout.level(l).row_offset * F});
  }
  ASSERT_TRUE(ps.SendPull(1, pulls).ok());
  ASSERT_TRUE(ps.ReceivePull().ok());
  const std::vector<float> at_shards = (*model)->grid_params();
  std::vector<float> expected = at_shards;
  size_t with_residual = 0;
  for (uint32_t l = 0; l < layout.n_levels(); ++l) {
    for (uint32_t r = 0; r < layout.level(l).rows; ++r) {
      const float* residual = ps.PendingUpdate(l, 0, r);
      if (residual == nullptr) continue;
      ++with_residual;
      for (uint32_t f = 0; f < F; ++f)
        expected[(layout.level(l).row_offset + r) * F + f] += residual[f];
    }
  }
  EXPECT_GT(with_residual, 8192u);
  ASSERT_NE(expected, at_shards);
  ASSERT_TRUE(ps.SendPull(1, pulls).ok());
  ps.GatherPendingUpdates();
  ASSERT_TRUE(ps.ReceivePull().ok());
  ExpectBitIdentical((*model)->grid_params(), expected);
  // The pending buffers belonged to that pull alone.
  ASSERT_TRUE(ps.SendPull(1, pulls).ok());
  ASSERT_TRUE(ps.ReceivePull().ok());
  ExpectBitIdentical((*model)->grid_params(), at_shards);
}

// Error feedback keeps residuals per (table, column slice). Under column
// partitioning a table 512 wide has slices at columns 0 and 256; the old key
// table * 256 + col_begin gave table t's second slice the key of table t+1's
// first, so two MLP tables shared residuals. After one topk push of known
// gradients, every residual must be either the gradient itself (a value topk
// did not keep) or zero (a kept value), for every slice of every table.
TEST(PsCompressionTest, WideTablesKeepTheirOwnResidualsUnderColumnPartitioning) {
  Config config = SmallConfig(1, 2);
  config.network.n_neurons = 512;
  config.distributed.model_parallel = true;
  config.distributed.mp_dim = ModelParallelDim::kColumn;
  config.compression.codec = "topk";
  config.compression.ratio = 0.05;
  config.compression.min_bytes = 0;
  config.compression.error_feedback = true;
  config.ps.optimizer = OptimizerPlacement::kShard;
  OneWorker one = OneWorker::Join(config);
  ASSERT_TRUE(one.session.ok()) << one.session.status().ToString();
  auto& model = one.model;
  auto& session = one.session;
  PsClient& ps = *session->ps;
  const uint32_t levels = (*model)->layout().n_levels();
  const auto& weights = (*model)->mlp_weights();
  std::mt19937 rng(5);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::vector<std::vector<float>> grads;
  std::vector<TableRowsRef> push;
  for (size_t i = 0; i < weights.size(); ++i) {
    grads.emplace_back(static_cast<size_t>(weights[i].size()));
    for (float& g : grads.back()) g = normal(rng);
    push.push_back({levels + static_cast<uint32_t>(i), true, nullptr, 0, grads.back().data()});
  }
  ASSERT_TRUE(ps.Push(wire::Kind::kPush, 0, push).ok());
  const Partition& partition = *session->partition;
  size_t wide = 0, checked = 0, equal = 0, wrong = 0;
  for (size_t i = 0; i < weights.size(); ++i) {
    const uint32_t t = levels + static_cast<uint32_t>(i);
    const uint32_t width = partition.table(t).width;
    if (partition.ColumnGroups(t) > 1) ++wide;
    for (uint32_t g = 0; g < partition.ColumnGroups(t); ++g) {
      const uint32_t col = partition.ColBegin(t, g);
      for (uint32_t r = 0; r < partition.table(t).rows; ++r) {
        const float* residual = ps.PendingUpdate(t, col, r);
        if (residual == nullptr) continue;
        for (uint32_t f = 0; f < partition.ColWidth(t); ++f) {
          const float sent = grads[i][size_t{r} * width + col + f];
          ++checked;
          if (residual[f] == sent) {
            ++equal;
          } else if (residual[f] != 0.0f) {
            ++wrong;
          }
        }
      }
    }
  }
  ASSERT_GE(wide, 2u) << "the test needs two consecutive tables cut into column slices";
  EXPECT_EQ(wrong, 0u) << "residuals of another table or slice: " << wrong << " of " << checked;
  EXPECT_GT(equal, checked * 9 / 10) << "topk at 5% keeps most values back";
}

}  // namespace
}  // namespace gridsync
