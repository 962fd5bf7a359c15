// libFuzzer target: a shard's checkpoint as gridsync-ps reads it when it
// resumes or the job rolls back (server/shard_checkpoint.h:
// LoadShardCheckpoint, which checks the manifest and the .bin through
// common/checkpoint_files.h, then ShardStore::RestoreState). Any files load
// or are refused with a Status; a load that succeeds leaves a state of the
// partition's size that saves to the very bytes read, holds values training
// can take (parameters within the wire's bound, moments finite, v >= 0),
// takes a step and loads again from its own checkpoint.
//
// Input: [u8 mode][u64 step][u16 manifest length][manifest][rest]
//   mode % 3: the partition (kLayouts); mode & 4: Adam on the workers (the
//   shard keeps parameters only); mode & 8: delta pulls (replicas);
//   mode & 16: the files are the input's, the manifest's text and the rest
//   as the .bin; otherwise the .bin is a trained store's state patched by
//   the rest ([u32 offset][u8 length][bytes] each) and written with its
//   manifest by WriteCheckpointPart, checksum and all (a forged file);
//   mode & 32: under CURVE, every write and load with a checkpoint MAC key
//   (common/checkpoint_mac_key.h), so that files made from the input
//   itself must never load (that would be a forged MAC).
#include <cmath>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <memory>
#include <string>
#include <vector>

#include "common/checkpoint_files.h"
#include "common/sharding.h"
#include "common/wire/message.h"
#include "fuzz/fuzz_files.h"
#include "fuzz/fuzz_input.h"
#include "server/shard_checkpoint.h"
#include "server/shard_store.h"

namespace {

using namespace gridsync;

struct Layout {
  std::vector<TableInfo> tables;
  uint32_t shards;
  ModelParallelDim dim;
  uint32_t shard;  // the one whose checkpoint is read
};

// Small tables (a shard still stores whole blocks of kRowBlock rows): one
// table on one shard; a level and an MLP matrix over two shards by rows;
// one table cut into column slices.
const std::vector<Layout>& Layouts() {
  static const std::vector<Layout> layouts = {
      {{{"level0", 16, 2}}, 1, ModelParallelDim::kRow, 0},
      {{{"level0", 16, 2}, {"mlp0", 8, 4}}, 2, ModelParallelDim::kRow, 1},
      {{{"level0", 16, 4}}, 2, ModelParallelDim::kColumn, 1},
  };
  return layouts;
}

const Partition& PartitionOf(size_t layout) {
  static const std::vector<std::unique_ptr<Partition>> partitions = [] {
    std::vector<std::unique_ptr<Partition>> out;
    for (const Layout& l : Layouts()) {
      out.push_back(std::make_unique<Partition>(*Partition::Make(l.tables, l.shards, l.dim)));
    }
    return out;
  }();
  return *partitions[layout];
}

// Steps the first rows of every table the shard owns: what training leaves
// in parameters, moments and step counts.
void Step(ShardStore* store, const Partition& partition, float scale) {
  store->PrepareStep();
  for (uint32_t t = 0; t < partition.n_tables(); ++t) {
    const uint32_t group = partition.ColumnGroupOf(store->shard(), t);
    std::vector<uint32_t> rows;
    for (uint32_t r = 0; r < partition.table(t).rows && rows.size() < 4; ++r) {
      if (partition.Owner(t, r, group) == store->shard()) rows.push_back(r);
    }
    if (rows.empty()) continue;
    std::vector<float> values(rows.size() * store->table_width(t));
    for (size_t i = 0; i < values.size(); ++i) {
      values[i] = scale * static_cast<float>(i + 1) / 64.0f;
    }
    wire::Block block;
    block.table = t;
    block.width = store->table_width(t);
    block.col_begin = partition.ColBegin(t, group);
    block.row_count = static_cast<uint32_t>(rows.size());
    block.rows = rows;
    block.values = values;
    store->ApplyDirect(block, 0, rows.size());
  }
}

// A trained store's state, per layout and optimizer placement.
const std::string& BaseState(size_t layout, bool updates) {
  static std::vector<std::string> states(Layouts().size() * 2);
  std::string& state = states[layout * 2 + (updates ? 1 : 0)];
  if (state.empty()) {
    const Partition& partition = PartitionOf(layout);
    ShardStore store(partition, Layouts()[layout].shard, AdamHyper{}, updates);
    Step(&store, partition, 1.0f);
    Step(&store, partition, -0.5f);
    store.AppendState(&state);
  }
  return state;
}

// What a restored state must hold: values a shard can serve and step on.
bool ValuesAreSane(const std::string& state, const ShardStore& store) {
  std::string_view in = state;
  const float bound = wire::Limits{}.max_abs_value;
  auto floats = [&](size_t n, auto ok) {
    for (size_t i = 0; i < n; ++i) {
      float x;
      std::memcpy(&x, in.data() + i * sizeof(float), sizeof(float));
      if (!ok(x)) return false;
    }
    in.remove_prefix(n * sizeof(float));
    return true;
  };
  for (uint32_t t = 0; t < store.n_tables(); ++t) {
    const size_t n = store.table_rows(t) * store.table_width(t);
    if (!floats(n, [&](float x) { return std::isfinite(x) && std::fabs(x) <= bound; }))
      return false;
    if (store.applies_updates()) continue;
    if (!floats(n, [](float x) { return std::isfinite(x); })) return false;
    if (!floats(n, [](float x) { return std::isfinite(x) && x >= 0.0f; })) return false;
    in.remove_prefix(store.table_rows(t) * sizeof(uint32_t));
  }
  return in.empty();
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  fuzz::FuzzInput in(data, size);
  const uint8_t mode = in.Take<uint8_t>();
  const size_t layout = mode % 3;
  const bool updates = (mode & 4) != 0, replicas = (mode & 8) != 0, raw = (mode & 16) != 0;
  static const CheckpointMacKey kKey = *CheckpointMacKey::FromCurveSecret(std::string(40, 'k'));
  const CheckpointMacKey* key = (mode & 32) != 0 ? &kKey : nullptr;
  const uint64_t step = in.Take<uint64_t>();
  const std::string manifest = in.Bytes(in.Take<uint16_t>());
  const Partition& partition = PartitionOf(layout);
  const uint32_t shard = Layouts()[layout].shard;

  const std::string& dir = fuzz::ScratchDir("shard-checkpoint");
  fuzz::EmptyDir(dir);
  std::string bin;
  if (raw) {
    bin = in.Rest();
    fuzz::WriteRawPart(dir, step, ShardPart(shard), manifest, bin);
  } else {
    bin = BaseState(layout, updates);
    while (in.left() > 0) {
      const size_t offset = in.Take<uint32_t>() % bin.size();
      const std::string patch = in.Bytes(in.Take<uint8_t>());
      bin.replace(offset, std::min(patch.size(), bin.size() - offset), patch);
    }
    ShardStore writer(partition, shard, AdamHyper{}, updates);
    nlohmann::json shapes = nlohmann::json::array();
    for (uint32_t t = 0; t < writer.n_tables(); ++t) {
      shapes.push_back({writer.table_rows(t), writer.table_width(t)});
    }
    if (!WriteCheckpointPart(dir, step, ShardPart(shard), bin, shapes, {}, "", key).ok())
      __builtin_trap();
  }

  ShardStore store(partition, shard, AdamHyper{}, updates);
  if (replicas) store.EnableReplicas(2);
  const Status loaded = LoadShardCheckpoint(dir, shard, step, &store, nullptr, key);
  if (raw && key != nullptr && loaded.ok()) __builtin_trap();  // the input forged a MAC
  if (!loaded.ok()) {
    if (loaded.message().empty()) __builtin_trap();  // a refusal says what is wrong
    return 0;
  }
  // The state is the partition's, byte for byte what the file held.
  std::string again;
  store.AppendState(&again);
  if (again.size() != store.StateBytes() || again != bin) __builtin_trap();
  if (!ValuesAreSane(again, store)) __builtin_trap();
  // Training goes on from it, and what it saves loads again.
  Step(&store, partition, 0.25f);
  const uint64_t next = step + 1 == 0 ? step : step + 1;
  if (!WriteShardCheckpoint(dir, shard, next, store, {}, "", key).ok()) __builtin_trap();
  ShardStore reloaded(partition, shard, AdamHyper{}, updates);
  const Status reload = LoadShardCheckpoint(dir, shard, next, &reloaded, nullptr, key);
  std::string saved, back;
  store.AppendState(&saved);
  reloaded.AppendState(&back);
  // Refused only when the step took a value out of bounds (a moment near
  // the float range overflows).
  if (!reload.ok() && ValuesAreSane(saved, store)) __builtin_trap();
  if (reload.ok() && saved != back) __builtin_trap();
  return 0;
}
