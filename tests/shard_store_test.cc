// ShardStore's readers of scattered rows (server/shard_store.h): the stale
// read's look-ahead, the delta pull's params - replica and the replica's
// advance equal a row-at-a-time reference built from the store's own
// checkpoint bytes, for every row width (the compile-time ones and a
// run-time one) and for partitions whose local rows are the global ids (one
// shard) or not (rows spread over two shards), on requests long enough for
// the prefetching loops to run ahead. A step whose pushes are merged in one
// pass (ApplyMerged) ends bit for bit where summing them first does: with
// updates (ps.optimizer = worker), where both equal a row-at-a-time mean of
// each row's updates, and with Adam on the shard.
#include "server/shard_store.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "common/sharding.h"
#include "kernels/adam_math.h"
#include "spec/shard_memory.h"

namespace gridsync {
namespace {

struct Arrays {
  std::vector<float> params, m, v;
  std::vector<uint32_t> steps;
};

// Table 0's arrays out of AppendState (params, m, v, step counts: the
// checkpoint's layout, shard_store.h).
Arrays ReadTable0(const ShardStore& store) {
  std::string bytes;
  store.AppendState(&bytes);
  const size_t values = store.table_rows(0) * store.table_width(0);
  Arrays a;
  a.params.resize(values);
  a.m.resize(values);
  a.v.resize(values);
  a.steps.resize(store.table_rows(0));
  size_t at = 0;
  for (auto* array : {&a.params, &a.m, &a.v}) {
    std::memcpy(array->data(), bytes.data() + at, values * sizeof(float));
    at += values * sizeof(float);
  }
  std::memcpy(a.steps.data(), bytes.data() + at, a.steps.size() * sizeof(uint32_t));
  return a;
}

// Ascending rows of table 0 that `shard` owns, about one in `gap`.
std::vector<uint32_t> OwnedRows(const Partition& partition, uint32_t shard, uint32_t gap,
                                std::mt19937* rng) {
  std::vector<uint32_t> rows;
  std::uniform_int_distribution<uint32_t> step(1, 2 * gap - 1);
  for (uint32_t r = step(*rng); r < partition.table(0).rows; r += step(*rng)) {
    if (partition.Owner(0, r, 0) == shard) rows.push_back(r);
  }
  return rows;
}

wire::Block SparseBlock(uint32_t width, const std::vector<uint32_t>& rows,
                        const std::vector<float>& values) {
  wire::Block block;
  block.table = 0;
  block.width = width;
  block.row_count = static_cast<uint32_t>(rows.size());
  block.rows = rows;
  block.values = values;
  return block;
}

// One table of 5 row blocks and a part, of `width` columns, over `shards`
// shards by rows.
Partition OneLevel(uint32_t width, uint32_t shards) {
  const std::vector<TableInfo> tables = {{"level", 5 * kRowBlock + 123, width}};
  return *Partition::Make(tables, shards, ModelParallelDim::kRow);
}

class ShardStoreReadsTest : public ::testing::TestWithParam<std::tuple<uint32_t, uint32_t>> {};

TEST_P(ShardStoreReadsTest, ScatteredReadersMatchARowAtATimeReference) {
  const auto [width, shards] = GetParam();
  const Partition partition = OneLevel(width, shards);
  const uint32_t shard = shards - 1;
  AdamHyper hyper;
  ShardStore store(partition, shard, hyper);
  store.EnableReplicas(2);
  std::mt19937 rng(7 + width * 10 + shards);
  std::uniform_real_distribution<float> value(-1.0f, 1.0f);

  // Initial values, then a few pushes over overlapping random rows: rows
  // step different numbers of times and some never (t = 0 is sent as is).
  const std::vector<uint32_t> all = OwnedRows(partition, shard, 1, &rng);
  std::vector<float> init(all.size() * width);
  for (float& x : init) x = value(rng);
  store.Assign(SparseBlock(width, all, init));
  for (int push = 0; push < 4; ++push) {
    const std::vector<uint32_t> rows = OwnedRows(partition, shard, 3, &rng);
    std::vector<float> grad(rows.size() * width);
    for (float& x : grad) x = value(rng);
    store.PrepareStep();
    store.ApplyDirect(SparseBlock(width, rows, grad), 0, rows.size());
  }
  const Arrays a = ReadTable0(store);

  const std::vector<uint32_t> asked = OwnedRows(partition, shard, 2, &rng);
  ASSERT_GT(asked.size(), 1000u);
  const wire::Block request = SparseBlock(width, asked, {});
  // Ranges that start and end off chunk boundaries.
  const size_t begin = 5, end = asked.size() - 3;
  const float ahead = 1.5f;
  std::vector<float> got((end - begin) * width);
  store.GatherAhead(request, begin, end, ahead, got.data());
  int stepped = 0;
  for (size_t i = begin; i < end; ++i) {
    const uint64_t local = partition.LocalRow(0, asked[i]);
    const uint32_t t = a.steps[local];
    stepped += t > 0;
    for (uint32_t f = 0; f < width; ++f) {
      const size_t at = local * width + f;
      const float want = t == 0 ? a.params[at]
                                : a.params[at] - AdamStepSize(hyper, t) * ahead * a.m[at] /
                                                     (sqrtf(a.v[at]) + hyper.epsilon);
      ASSERT_EQ(got[(i - begin) * width + f], want) << "row " << asked[i] << " column " << f;
    }
  }
  EXPECT_GT(stepped, 100);
  EXPECT_LT(stepped, static_cast<int>(end - begin));

  // Delta pulls: replica 1 starts at the initial values, so params - replica
  // is what the pushes moved; advancing it by half that, twice (the second
  // time whole), leaves delta half, then zero.
  std::vector<float> delta((end - begin) * width);
  store.GatherDelta(request, 1, begin, end, delta.data());
  for (size_t i = begin; i < end; ++i) {
    const uint64_t local = partition.LocalRow(0, asked[i]);
    const size_t k = std::lower_bound(all.begin(), all.end(), asked[i]) - all.begin();
    for (uint32_t f = 0; f < width; ++f) {
      ASSERT_EQ(delta[(i - begin) * width + f], a.params[local * width + f] - init[k * width + f])
          << "row " << asked[i];
    }
  }
  std::vector<float> half(delta);
  for (float& x : half) x *= 0.5f;
  store.AdvanceReplica(request, 1, begin, end, half.data(), /*whole=*/false);
  std::vector<float> rest((end - begin) * width);
  store.GatherDelta(request, 1, begin, end, rest.data());
  for (size_t j = 0; j < rest.size(); ++j) {
    const size_t i = begin + j / width;
    const size_t k = std::lower_bound(all.begin(), all.end(), asked[i]) - all.begin();
    const float replica = init[k * width + j % width] + half[j];
    ASSERT_EQ(rest[j], a.params[partition.LocalRow(0, asked[i]) * width + j % width] - replica);
  }
  // A checkpoint keeps every worker's replica: a store restored from this
  // one's state answers the same deltas, so a rollback puts both ends of
  // each delta back where they were (restoring used to set every replica to
  // the parameters, and the workers' replicas no longer matched).
  {
    std::string state;
    store.AppendState(&state);
    EXPECT_EQ(state.size(), store.StateBytes());
    ShardStore restored(partition, shard, hyper);
    restored.EnableReplicas(2);
    ASSERT_TRUE(restored.RestoreState(state, 4).ok());
    for (uint32_t worker : {0u, 1u}) {
      std::vector<float> mine(rest.size()), theirs(rest.size());
      store.GatherDelta(request, worker, begin, end, mine.data());
      restored.GatherDelta(request, worker, begin, end, theirs.data());
      EXPECT_EQ(mine, theirs) << "worker " << worker;
    }
    ShardStore without(partition, shard, hyper);  // no replicas: another size
    EXPECT_FALSE(without.RestoreState(state, 4).ok());
  }
  std::vector<float> whole((end - begin) * width);
  store.Gather(request, begin, end, whole.data());
  store.AdvanceReplica(request, 1, begin, end, whole.data(), /*whole=*/true);
  store.GatherDelta(request, 1, begin, end, rest.data());
  for (float x : rest) ASSERT_EQ(x, 0.0f);
  // Worker 0's replica was never advanced.
  store.GatherDelta(request, 0, begin, end, rest.data());
  EXPECT_EQ(rest, delta);
}

// Updates (ps.optimizer = worker): steps of three pushes, merged in one
// pass (ApplyMerged) or each summed before the apply, move every row by the
// mean of the updates
// it received, bit for bit as a row-at-a-time reference sums them in rank
// order; rows one push listed move by 0.0f + update (a -0.0f update on a
// -0.0f parameter included: +0.0f, not -0.0f). Later steps (one of them
// dense, as MLP weights are pushed) check that none left sums, counts or
// touched rows behind.
TEST_P(ShardStoreReadsTest, UpdatesMergedOrSummedMatchTheMeanOfEachRow) {
  const auto [width, shards] = GetParam();
  const Partition partition = OneLevel(width, shards);
  const uint32_t shard = shards - 1;
  // Two ways to the same parameters: the pushes merged in one pass, and
  // each summed before the apply.
  ShardStore merged(partition, shard, AdamHyper{}, /*apply_updates=*/true);
  ShardStore summed(partition, shard, AdamHyper{}, /*apply_updates=*/true);
  std::mt19937 rng(11 + width * 10 + shards);
  std::uniform_real_distribution<float> value(-1.0f, 1.0f);

  const std::vector<uint32_t> all = OwnedRows(partition, shard, 1, &rng);
  std::vector<float> want(all.size() * width);
  for (float& x : want) x = value(rng);
  for (size_t j = 0; j < width; ++j) want[j] = -0.0f;  // the first row
  for (ShardStore* store : {&merged, &summed}) store->Assign(SparseBlock(width, all, want));
  const auto index = [&](uint32_t row) {
    return std::lower_bound(all.begin(), all.end(), row) - all.begin();
  };
  // A dense block names a run of rows: the owned rows' first run.
  size_t run = 1;
  while (run < all.size() && all[run] == all[0] + run) ++run;
  ASSERT_GT(run, 1000u);
  for (int step = 0; step < 3; ++step) {
    const bool dense = step == 2;  // MLP weights are pushed dense
    // Blocks view their rows and values (spans): both live here.
    std::vector<std::vector<uint32_t>> push_rows(3);
    std::vector<std::vector<float>> push_updates(3);
    std::vector<wire::Block> pushes;
    std::vector<float> sum(want.size(), 0.0f);
    std::vector<uint32_t> count(all.size(), 0);
    for (int rank = 0; rank < 3; ++rank) {
      std::vector<uint32_t>& rows = push_rows[rank];
      if (dense) {
        rows.assign(all.begin(), all.begin() + run);
      } else {
        rows = OwnedRows(partition, shard, 2, &rng);
        // The first row in the last push only, with a -0.0f update.
        rows.erase(std::remove(rows.begin(), rows.end(), all[0]), rows.end());
        if (rank == 2) rows.insert(rows.begin(), all[0]);
      }
      std::vector<float>& updates = push_updates[rank];
      updates.resize(rows.size() * width);
      for (float& x : updates) x = value(rng);
      if (rank == 2 && !dense) std::fill_n(updates.begin(), width, -0.0f);
      for (size_t i = 0; i < rows.size(); ++i) {
        const size_t k = index(rows[i]);
        ++count[k];
        for (uint32_t f = 0; f < width; ++f) sum[k * width + f] += updates[i * width + f];
      }
      pushes.push_back(SparseBlock(width, rows, updates));
      if (dense) {
        pushes.back().dense = true;
        pushes.back().rows = {};
        pushes.back().row_begin = all[0];
      }
    }
    for (size_t k = 0; k < all.size(); ++k) {
      const float inv = count[k] > 1 ? 1.0f / static_cast<float>(count[k]) : 1.0f;
      for (uint32_t f = 0; f < width; ++f) {
        if (count[k] != 0)
          want[k * width + f] = std::fma(sum[k * width + f], inv, want[k * width + f]);
      }
    }
    ASSERT_TRUE(merged.ApplyMerged({&pushes[0], &pushes[1], &pushes[2]}));
    summed.PrepareStep();
    for (const wire::Block& push : pushes) summed.Accumulate(push);
    constexpr size_t kChunk = 1000;
    for (size_t c = 0; c < summed.TouchedChunks(0, kChunk); ++c)
      summed.ApplyTouchedChunk(0, c, kChunk);
    summed.FinishTable(0);
    std::vector<float> got(want.size());
    for (const ShardStore* store : {&merged, &summed}) {
      const char* way = store == &merged ? "merged" : "summed";
      store->Gather(SparseBlock(width, all, {}), 0, all.size(), got.data());
      for (size_t j = 0; j < got.size(); ++j) {
        ASSERT_EQ(std::memcmp(&got[j], &want[j], sizeof(float)), 0)
            << way << ", step " << step << ", row " << all[j / width] << " column " << j % width
            << ": " << got[j] << " against " << want[j] << " (" << count[j / width] << " pushes)";
      }
      // -0.0f moved by a -0.0f update: +0.0f, as the summing buffer's
      // 0.0f + -0.0f always made it.
      if (step == 0) {
        EXPECT_FALSE(std::signbit(got[0])) << way;
      }
    }
  }
  // Past kMaxMergedPushes nothing is merged (or moved).
  const std::vector<uint32_t> one = {all[5]};
  const std::vector<float> values(width, 1.0f);
  const wire::Block block = SparseBlock(width, one, values);
  std::vector<const wire::Block*> many(ShardStore::kMaxMergedPushes + 1, &block);
  std::vector<float> before(width), after(width);
  merged.Gather(block, 0, 1, before.data());
  EXPECT_FALSE(merged.ApplyMerged(many));
  merged.Gather(block, 0, 1, after.data());
  EXPECT_EQ(before, after);
}

// Adam on the shard: steps of three pushes merged in one pass
// (ApplyMerged) leave parameters, moments and step counts bit for bit where
// a store summing them before Adam leaves them, in sparse steps (a row
// whose sum is zero does not step: one push's row of zeros, another's sum
// that cancels) and in a dense one (every row steps, zero sums too).
TEST_P(ShardStoreReadsTest, AdamOnMergedPushesMatchesSummingFirst) {
  const auto [width, shards] = GetParam();
  const Partition partition = OneLevel(width, shards);
  const uint32_t shard = shards - 1;
  ShardStore summed(partition, shard, AdamHyper{});
  ShardStore merged(partition, shard, AdamHyper{});
  std::mt19937 rng(13 + width * 10 + shards);
  std::uniform_real_distribution<float> value(-1.0f, 1.0f);
  const std::vector<uint32_t> all = OwnedRows(partition, shard, 1, &rng);
  std::vector<float> init(all.size() * width);
  for (float& x : init) x = value(rng);
  summed.Assign(SparseBlock(width, all, init));
  merged.Assign(SparseBlock(width, all, init));
  size_t run = 1;  // a dense block names a run of rows: the owned rows' first
  while (run < all.size() && all[run] == all[0] + run) ++run;
  ASSERT_GT(run, 1000u);
  for (int step = 0; step < 3; ++step) {
    const bool dense = step == 1;
    std::vector<std::vector<uint32_t>> rows(3);
    std::vector<std::vector<float>> grads(3);
    for (int rank = 0; rank < 3; ++rank) {
      if (dense) {
        rows[rank].assign(all.begin(), all.begin() + run);
      } else {
        rows[rank] = OwnedRows(partition, shard, 2, &rng);
        for (uint32_t row : {all[0], all[1]})
          rows[rank].erase(std::remove(rows[rank].begin(), rows[rank].end(), row),
                           rows[rank].end());
      }
      grads[rank].resize(rows[rank].size() * width);
      for (float& x : grads[rank]) x = value(rng);
      if (dense) std::fill_n(grads[rank].begin(), width, 0.0f);  // all[0]'s sum is zero
    }
    if (!dense) {  // all[0]: zeros from one push; all[1]: +0.5 and -0.5
      rows[2].insert(rows[2].begin(), all[0]);
      grads[2].insert(grads[2].begin(), width, 0.0f);
      rows[0].insert(rows[0].begin(), all[1]);
      grads[0].insert(grads[0].begin(), width, 0.5f);
      rows[2].insert(rows[2].begin() + 1, all[1]);
      grads[2].insert(grads[2].begin() + width, width, -0.5f);
    }
    std::vector<wire::Block> blocks;
    for (int rank = 0; rank < 3; ++rank) {
      blocks.push_back(SparseBlock(width, rows[rank], grads[rank]));
      if (dense) {
        blocks.back().dense = true;
        blocks.back().rows = {};
        blocks.back().row_begin = all[0];
      }
    }
    summed.PrepareStep();
    for (const wire::Block& block : blocks) summed.Accumulate(block);
    constexpr size_t kChunk = 1000;
    for (size_t c = 0; c < summed.TouchedChunks(0, kChunk); ++c)
      summed.ApplyTouchedChunk(0, c, kChunk);
    summed.FinishTable(0);
    merged.PrepareStep();
    ASSERT_TRUE(merged.ApplyMerged({&blocks[0], &blocks[1], &blocks[2]}));

    const Arrays a = ReadTable0(summed), b = ReadTable0(merged);
    ASSERT_EQ(std::memcmp(a.params.data(), b.params.data(), a.params.size() * sizeof(float)), 0)
        << "step " << step;
    ASSERT_EQ(std::memcmp(a.m.data(), b.m.data(), a.m.size() * sizeof(float)), 0);
    ASSERT_EQ(std::memcmp(a.v.data(), b.v.data(), a.v.size() * sizeof(float)), 0);
    ASSERT_EQ(a.steps, b.steps) << "step " << step;
    // Steps 0 and 2 leave both rows alone; the dense step 1 steps them.
    for (uint32_t row : {all[0], all[1]})
      EXPECT_EQ(b.steps[partition.LocalRow(0, row)], step >= 1 ? 1u : 0u) << "step " << step;
  }
}

INSTANTIATE_TEST_SUITE_P(WidthsAndShards, ShardStoreReadsTest,
                         ::testing::Combine(::testing::Values(1u, 2u, 3u, 8u),
                                            ::testing::Values(1u, 2u)));

}  // namespace
}  // namespace gridsync

namespace gridsync {
namespace {

// gridsync launch --resume judges the shards' checkpoint parts by
// ShardCheckpointShape and ShardStateBytes (spec/shard_memory.h) before
// anything starts: they must be what a shard's store writes, for every
// partition axis, shard count, optimizer placement and replica count.
TEST(ShardStoreStateTest, TheSpecsCheckpointSizeIsWhatTheStoreWrites) {
  const std::vector<TableInfo> tables = {
      {"level", 5 * kRowBlock + 123, 2}, {"mlp", 64 * 27 + 5, 64}, {"out", 3 * 64, 3}};
  for (const ModelParallelDim dim :
       {ModelParallelDim::kRow, ModelParallelDim::kColumn, ModelParallelDim::kBoth}) {
    for (const uint32_t shards : {1u, 2u, 3u, 4u, 5u}) {
      const Partition partition = *Partition::Make(tables, shards, dim);
      for (uint32_t s = 0; s < shards; ++s) {
        for (const bool updates : {false, true}) {
          for (const uint32_t replicas : {0u, 2u}) {
            ShardStore store(partition, s, AdamHyper{}, updates);
            if (replicas > 0) store.EnableReplicas(replicas);
            std::string state;
            store.AppendState(&state);
            EXPECT_EQ(ShardStateBytes(partition, s, updates, replicas), state.size())
                << ToString(dim) << ", shard " << s << " of " << shards;
            nlohmann::json shape = nlohmann::json::array();
            for (uint32_t t = 0; t < store.n_tables(); ++t)
              shape.push_back({store.table_rows(t), store.table_width(t)});
            EXPECT_EQ(ShardCheckpointShape(partition, s), shape)
                << ToString(dim) << ", shard " << s << " of " << shards;
          }
        }
      }
    }
  }
}

}  // namespace
}  // namespace gridsync
