// libFuzzer target: an nccl worker's checkpoint as gridsync-worker reads it
// when it resumes (worker/worker_checkpoint.h: LoadAllReduceCheckpoint,
// which checks the manifest and the .bin through common/checkpoint_files.h,
// then takes the model's parameters and Adam's state through
// LocalOptimizer::RestoreState or ShardedUpdate::RestoreState). Any files
// load or are refused with a Status; a load that succeeds leaves values
// training can take (parameters finite and within the wire's 1e15, m
// finite, v finite and >= 0, step counts within the checkpoint's step), a
// state that saves to the very bytes read, and a model that takes a
// training step.
//
// The model is a tiny one (a few hundred parameters), so that a whole state
// is a few KiB of input.
// Input: [u8 mode][u64 step][u16 manifest length][manifest][rest]
//   mode % 4: the run (kRuns: the replicated optimizer, or model_parallel
//   over two workers, rows or column slices, rank 0 or 1); mode & 4: the
//   files are the input's, the manifest's text and the rest as the .bin;
//   otherwise the .bin is a trained state patched by the rest ([u32
//   offset][u8 length][bytes] each) and written with its manifest by
//   WriteCheckpointPart, checksum and all (a forged file).
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <thread>
#include <vector>

#include "common/checkpoint_files.h"
#include "common/config.h"
#include "common/sharding.h"
#include "common/thread_pool.h"
#include "common/wire/message.h"
#include "fuzz/fuzz_files.h"
#include "fuzz/fuzz_input.h"
#include "spec/run_spec.h"
#include "worker/collective/local_collective.h"
#include "worker/local_optimizer.h"
#include "worker/model.h"
#include "worker/params_file.h"
#include "worker/sync/sharded_update.h"
#include "worker/worker_checkpoint.h"

namespace {

using namespace gridsync;

constexpr int kRuns = 4;
constexpr uint32_t kWorkers = 2;   // under model_parallel
constexpr uint64_t kBaseStep = 2;  // steps the patched state was trained

// One run: its spec, the fuzzed worker's model and optimizer, the tables
// its Adam state holds (rows x width each, in file order), a trained
// state's bytes and manifest shape.
struct Run {
  RunSpec spec;
  uint32_t rank = 0;
  uint32_t workers = 1;
  std::unique_ptr<HashGridModel> model;
  std::unique_ptr<LocalOptimizer> replicated;
  std::unique_ptr<ShardedUpdate> sharded;
  std::vector<std::pair<uint64_t, uint32_t>> adam_tables;
  std::string base;
  nlohmann::json shape;

  AllReduceState State() const { return {model.get(), replicated.get(), sharded.get()}; }
};

ThreadPool& Pool() {
  static ThreadPool pool(1);
  return pool;
}

std::string ReadAll(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
}

// A gradient in FlattenParams' layout: small, not zero, varying by `seed`.
std::vector<float> Gradient(const HashGridModel& model, float seed) {
  std::vector<float> g(model.n_params());
  for (size_t i = 0; i < g.size(); ++i) g[i] = seed * static_cast<float>(i % 7 + 1) / 16.0f;
  return g;
}

// Copies `model`'s parameters into a fresh model of the same spec.
std::unique_ptr<HashGridModel> CopyOf(const RunSpec& spec, const HashGridModel& model) {
  auto copy = HashGridModel::Create(spec.model);
  if (!copy.ok()) __builtin_trap();
  (*copy)->grid_params() = model.grid_params();
  (*copy)->mlp_weights() = model.mlp_weights();
  (*copy)->RefreshWorkingCopyAll();
  return std::move(*copy);
}

// One training step of the run's worker: the replicated optimizer applies a
// dense gradient; a model_parallel worker steps with a fresh partner (the
// other rank, on a copy of the model) over an in-process group of two.
void TrainStep(Run& run, float seed) {
  std::vector<float> flat = Gradient(*run.model, seed);
  if (run.replicated) {
    cpu::MlpWeights mlp = run.model->mlp_weights();
    size_t at = run.model->grid_params().size();
    for (auto& m : mlp) {
      std::memcpy(m.data(), flat.data() + at, static_cast<size_t>(m.size()) * sizeof(float));
      at += static_cast<size_t>(m.size());
    }
    run.replicated->ApplyDense(flat.data(), &mlp, 1.0f, &Pool());
    return;
  }
  std::unique_ptr<HashGridModel> partner_model = CopyOf(run.spec, *run.model);
  const int other = 1 - static_cast<int>(run.rank);
  auto partner = ShardedUpdate::Make(run.spec, *partner_model, other, kWorkers);
  if (!partner.ok()) __builtin_trap();
  auto group = LocalCollective::CreateGroup(kWorkers, std::chrono::seconds(20), "fuzz");
  std::vector<float> partner_flat = flat;
  Status partner_status;
  std::thread peer([&] {
    partner_status = partner->Step(*group[static_cast<size_t>(other)], false, 1.0f, &partner_flat,
                                   partner_model.get());
  });
  const Status mine = run.sharded->Step(*group[run.rank], false, 1.0f, &flat, run.model.get());
  peer.join();
  if (!mine.ok() || !partner_status.ok()) __builtin_trap();
}

Run& RunOf(int which) {
  static std::vector<std::unique_ptr<Run>> runs(kRuns);
  std::unique_ptr<Run>& run = runs[static_cast<size_t>(which)];
  if (run) return *run;
  Config c;
  c.encoding.n_levels = 2;
  c.encoding.log2_hashmap_size = 4;
  c.encoding.base_resolution = 2;
  c.network.n_neurons = 4;
  c.network.n_hidden_layers = 1;
  c.training.device = TrainingDevice::kCpu;
  c.distributed.enable = true;
  c.distributed.gradient_sync = GradientSyncMode::kNccl;
  c.distributed.world_size = which == 0 ? 1 : static_cast<int>(kWorkers);
  c.checkpoint.every_steps = 1;
  c.checkpoint.dir = fuzz::ScratchDir("allreduce-checkpoint");
  if (which != 0) {
    c.distributed.model_parallel = true;
    c.distributed.mp_dim = which == 3 ? ModelParallelDim::kColumn : ModelParallelDim::kRow;
  }
  auto spec = RunSpec::Resolve(c);
  if (!spec.ok()) __builtin_trap();
  run = std::make_unique<Run>();
  run->spec = *std::move(spec);
  run->rank = which == 1 ? 0 : (which == 0 ? 0 : 1);
  run->workers = which == 0 ? 1 : kWorkers;
  auto model = HashGridModel::Create(run->spec.model);
  if (!model.ok()) __builtin_trap();
  run->model = std::move(*model);
  // The tables of Adam's state, as the partition cuts them for this worker
  // (one worker: every table whole).
  auto partition =
      Partition::Make(run->spec.model.tables, run->workers, run->spec.sync.partition_dim);
  if (!partition.ok()) __builtin_trap();
  for (uint32_t t = 0; t < partition->n_tables(); ++t) {
    uint64_t rows = 0;
    for (uint32_t r = 0; r < partition->table(t).rows; ++r) {
      for (uint32_t g = 0; g < partition->ColumnGroups(t); ++g) {
        if (partition->Owner(t, r, g) == run->rank) ++rows;
      }
    }
    run->adam_tables.push_back({rows, partition->ColWidth(t)});
  }
  uint64_t bytes = 0;
  if (which == 0) {
    run->replicated = std::make_unique<LocalOptimizer>(run->model.get(), run->spec.model.adam);
    bytes = run->replicated->StateBytes();
  } else {
    auto sharded =
        ShardedUpdate::Make(run->spec, *run->model, static_cast<int>(run->rank), kWorkers);
    if (!sharded.ok()) __builtin_trap();
    run->sharded = std::make_unique<ShardedUpdate>(std::move(*sharded));
    bytes = run->sharded->StateBytes();
  }
  uint64_t expected = 0;
  for (const auto& [rows, width] : run->adam_tables) expected += rows * (width * 8 + 4);
  if (bytes != expected) __builtin_trap();  // the oracle's tables are the optimizer's
  // A trained state: what the real writer puts in this run's part.
  TrainStep(*run, 1.0f);
  TrainStep(*run, -0.5f);
  const std::string& dir = run->spec.config.checkpoint.dir;
  if (!WriteAllReduceCheckpoint(run->spec, run->rank, run->workers, kBaseStep, run->State()).ok())
    __builtin_trap();
  const std::string base =
      dir + "/step-" + std::to_string(kBaseStep) + "/worker-" + std::to_string(run->rank);
  run->base = ReadAll(base + ".bin");
  run->shape = nlohmann::json::parse(std::ifstream(base + ".json"))["shape"];
  return *run;
}

// What a restored state must hold: parameters finite and within the wire's
// bound, then per table m finite, v finite and >= 0, step counts <= step.
bool StateIsSane(const Run& run, const std::string& state, uint64_t step) {
  std::string_view in = state;
  const float bound = wire::Limits{}.max_abs_value;
  auto floats = [&](uint64_t n, auto ok) {
    if (in.size() < n * sizeof(float)) return false;
    for (uint64_t i = 0; i < n; ++i) {
      float x;
      std::memcpy(&x, in.data() + i * sizeof(float), sizeof(float));
      if (!ok(x)) return false;
    }
    in.remove_prefix(n * sizeof(float));
    return true;
  };
  if (!floats(run.model->n_params(),
              [&](float x) { return std::isfinite(x) && std::fabs(x) <= bound; }))
    return false;
  for (const auto& [rows, width] : run.adam_tables) {
    const uint64_t n = rows * width;
    if (!floats(n, [](float x) { return std::isfinite(x); })) return false;
    if (!floats(n, [](float x) { return std::isfinite(x) && x >= 0.0f; })) return false;
    if (in.size() < rows * sizeof(uint32_t)) return false;
    for (uint64_t r = 0; r < rows; ++r) {
      uint32_t count;
      std::memcpy(&count, in.data() + r * sizeof(uint32_t), sizeof(uint32_t));
      if (count > step) return false;
    }
    in.remove_prefix(rows * sizeof(uint32_t));
  }
  return in.empty();
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  fuzz::FuzzInput in(data, size);
  const uint8_t mode = in.Take<uint8_t>();
  Run& run = RunOf(mode % kRuns);
  const bool raw = (mode & 4) != 0;
  const uint64_t step = in.Take<uint64_t>();
  const std::string manifest = in.Bytes(in.Take<uint16_t>());

  const std::string& dir = run.spec.config.checkpoint.dir;
  const std::string part = "worker-" + std::to_string(run.rank);
  fuzz::EmptyDir(dir);
  std::string bin;
  if (raw) {
    bin = in.Rest();
    fuzz::WriteRawPart(dir, step, part, manifest, bin);
  } else {
    bin = run.base;
    while (in.left() > 0) {
      const size_t offset = in.Take<uint32_t>() % bin.size();
      const std::string patch = in.Bytes(in.Take<uint8_t>());
      bin.replace(offset, std::min(patch.size(), bin.size() - offset), patch);
    }
    if (!WriteCheckpointPart(dir, step, part, bin, run.shape).ok()) __builtin_trap();
  }

  const Status loaded = LoadAllReduceCheckpoint(run.spec, run.rank, run.workers, step, run.State());
  if (!loaded.ok()) {
    if (loaded.message().empty()) __builtin_trap();  // a refusal says what is wrong
    return 0;
  }
  if (!StateIsSane(run, bin, step)) __builtin_trap();
  // What it saves is the very bytes it read.
  fuzz::EmptyDir(dir);
  if (!WriteAllReduceCheckpoint(run.spec, run.rank, run.workers, step, run.State()).ok())
    __builtin_trap();
  if (ReadAll(dir + "/step-" + std::to_string(step) + "/" + part + ".bin") != bin) __builtin_trap();
  // Training goes on from it.
  TrainStep(run, 0.25f);
  return 0;
}
