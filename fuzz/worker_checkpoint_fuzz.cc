// libFuzzer target: a worker's checkpoint as gridsync-worker reads it when
// it resumes, rejoins or the job rolls back (worker/worker_checkpoint.h:
// LoadWorkerCheckpoint, which checks the manifest and the .bin through
// common/checkpoint_files.h, then PsClient::RestoreState: the error-feedback
// residuals through ErrorFeedback::RestoreState, worker Adam's state through
// WorkerAdam::RestoreState). Any files load or are refused with a Status; a
// load that succeeds leaves residuals only of this run's column slices and
// rows, values training can take (finite residuals and moments, v >= 0),
// step counts within the checkpoint's step, and a state that saves and loads
// again unchanged through the real writer and reader.
//
// The client is a real one (PsClient::Connect to shards that are never
// reached: nothing is sent), on a model of a few hundred parameters, so that
// a whole state is a few KiB of input.
// Input: [u8 mode][u64 step][u16 manifest length][manifest][rest]
//   mode % 6: the run (kRuns: Adam on the workers or the shards, rows or
//   column slices over two shards, or rows with delta pulls, whose states
//   carry the worker's replicas); mode & 8: the files are the input's, the
//   manifest's text and the rest as the .bin; otherwise the rest is the
//   state, written with its manifest by WriteCheckpointPart (checksum and
//   all: a forged file).
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <memory>
#include <string>
#include <vector>

#include "common/checkpoint_files.h"
#include "common/cluster_map.h"
#include "common/config.h"
#include "common/sharding.h"
#include "common/wire/message.h"
#include "fuzz/fuzz_files.h"
#include "fuzz/fuzz_input.h"
#include "kernels/cpu/error_feedback.h"
#include "spec/run_spec.h"
#include "worker/ps_client.h"
#include "worker/worker_checkpoint.h"

namespace {

using namespace gridsync;

constexpr uint32_t kShards = 2;
constexpr int kRuns = 6;

// One run: its spec, partition, the shape its checkpoints carry, and two
// clients (the one fuzzed and the one its saved state is loaded into).
struct Run {
  RunSpec spec;
  std::unique_ptr<Partition> partition;
  nlohmann::json shape;
  std::unique_ptr<PsClient> client, again;
};

std::unique_ptr<PsClient> MakeClient(const Run& run) {
  ClusterMap map;
  map.expected_shards = kShards;
  for (uint32_t s = 0; s < kShards; ++s) {
    MemberInfo shard;
    shard.role = Role::kShard;
    shard.rank = s;
    shard.endpoint = "tcp://127.0.0.1:" + std::to_string(9 + s);  // never reached
    map.shards.push_back(shard);
  }
  auto client = PsClient::Connect(map, *run.partition, 0, 1, std::chrono::milliseconds(100));
  if (!client.ok()) __builtin_trap();
  const CompressionSpec& c = run.spec.compression;
  (*client)->SetCompression(c.codec, c.error_feedback, c.min_bytes, 1);
  if (run.spec.sync.optimizer_on_workers) (*client)->SetWorkerOptimizer(run.spec.model.adam);
  (*client)->SetDeltaPulls(c.delta_pulls);
  return std::move(*client);
}

Run& RunOf(int which) {
  static std::vector<std::unique_ptr<Run>> runs(kRuns);
  std::unique_ptr<Run>& run = runs[which];
  if (run) return *run;
  Config c;
  c.encoding.n_levels = 2;
  c.encoding.log2_hashmap_size = 4;
  c.encoding.base_resolution = 2;
  c.network.n_neurons = 4;
  c.network.n_hidden_layers = 1;
  c.training.device = TrainingDevice::kCpu;
  c.distributed.enable = true;
  c.distributed.world_size = 1;
  c.distributed.gradient_sync = GradientSyncMode::kPs;
  c.ps.shards = kShards;
  c.compression.codec = "topk";
  c.compression.ratio = 0.25;
  c.compression.min_bytes = 0;
  c.ps.optimizer = which % 2 == 0 ? OptimizerPlacement::kWorker : OptimizerPlacement::kShard;
  c.compression.pull = which / 2 == 2;
  if (which / 2 == 1) {
    c.distributed.model_parallel = true;
    c.distributed.mp_dim = ModelParallelDim::kColumn;
  }
  auto spec = RunSpec::Resolve(c);
  if (!spec.ok()) __builtin_trap();
  run = std::make_unique<Run>();
  run->spec = *std::move(spec);
  run->partition = std::make_unique<Partition>(
      *Partition::Make(run->spec.model.tables, kShards, run->spec.sync.partition_dim));
  run->client = MakeClient(*run);
  run->again = MakeClient(*run);
  // The shape the real writer puts in a manifest of this run.
  const std::string& dir = fuzz::ScratchDir("worker-checkpoint");
  run->spec.config.checkpoint.dir = dir;
  if (!WriteWorkerCheckpoint(run->spec, 0, kShards, 1, run->client.get()).ok()) __builtin_trap();
  run->shape = nlohmann::json::parse(std::ifstream(dir + "/step-1/worker-0.json"))["shape"];
  return *run;
}

// Worker Adam's part of a state (worker_adam.h), consumed from *in: per
// table a flag, then m (finite), v (finite, >= 0) and step counts within
// `step`.
bool WorkerAdamIsSane(const Partition& p, uint64_t step, std::string_view* in) {
  for (uint32_t t = 0; t < p.n_tables(); ++t) {
    if (in->empty()) return false;
    const bool has = in->front() == '\1';
    in->remove_prefix(1);
    if (!has) continue;
    const size_t n = p.table(t).rows * p.table(t).width;
    if (in->size() < n * 8 + p.table(t).rows * 4) return false;
    for (size_t i = 0; i < 2 * n; ++i) {
      float x;
      std::memcpy(&x, in->data() + i * sizeof(float), sizeof(float));
      if (!std::isfinite(x) || (i >= n && x < 0.0f)) return false;
    }
    in->remove_prefix(2 * n * sizeof(float));
    for (uint64_t r = 0; r < p.table(t).rows; ++r) {
      uint32_t count;
      std::memcpy(&count, in->data() + r * sizeof(uint32_t), sizeof(uint32_t));
      if (count > step) return false;
    }
    in->remove_prefix(p.table(t).rows * sizeof(uint32_t));
  }
  return true;
}

// Delta pulls' replicas (PsClient::AppendState), consumed from *in: per
// table a flag, then its whole rows x width values, finite and within the
// wire's bound (what pulls carry).
bool ReplicasAreSane(const Partition& p, std::string_view* in) {
  const float bound = wire::Limits{}.max_abs_value;
  for (uint32_t t = 0; t < p.n_tables(); ++t) {
    if (in->empty() || static_cast<uint8_t>(in->front()) > 1) return false;
    const bool held = in->front() == '\1';
    in->remove_prefix(1);
    if (!held) continue;
    const size_t n = p.table(t).rows * p.table(t).width;
    if (in->size() < n * sizeof(float)) return false;
    for (size_t i = 0; i < n; ++i) {
      float x;
      std::memcpy(&x, in->data() + i * sizeof(float), sizeof(float));
      if (!(std::fabs(x) <= bound)) return false;
    }
    in->remove_prefix(n * sizeof(float));
  }
  return true;
}

// What a restored client must hold: residuals of this run's slices and rows
// only, finite; worker Adam's m finite, v finite and >= 0, step counts
// within `step`; delta pulls' replicas whole and within the wire's bound;
// nothing more. `state` is the client's AppendState.
bool StateIsSane(const Run& run, const PsClient& ps, const std::string& state, uint64_t step) {
  const Partition& p = *run.partition;
  const cpu::ErrorFeedback& feedback = ps.error_feedback();
  for (uint64_t key : feedback.Keys()) {
    const uint64_t t = key >> 32, col = key & 0xffffffffu;
    if (t >= p.n_tables()) return false;
    const uint32_t table = static_cast<uint32_t>(t);
    if (feedback.Width(key) != p.ColWidth(table) || col % p.ColWidth(table) != 0 ||
        col / p.ColWidth(table) >= p.ColumnGroups(table))
      return false;
    for (uint32_t row : feedback.Rows(key)) {
      if (row >= p.table(table).rows) return false;
      const float* r = feedback.Residual(key, row);
      for (uint32_t f = 0; f < feedback.Width(key); ++f) {
        if (!std::isfinite(r[f])) return false;
      }
    }
  }
  // Worker Adam's part follows the residuals' (worker_adam.h).
  std::string_view in = state;
  in.remove_prefix(1);
  cpu::ErrorFeedback skipped;
  if (!skipped.RestoreState(&in).ok()) return false;
  if (run.spec.sync.optimizer_on_workers && !WorkerAdamIsSane(p, step, &in)) return false;
  if (run.spec.compression.delta_pulls && !ReplicasAreSane(p, &in)) return false;
  return in.empty();
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  fuzz::FuzzInput in(data, size);
  const uint8_t mode = in.Take<uint8_t>();
  Run& run = RunOf(mode % kRuns);
  const bool raw = (mode & 8) != 0;
  const uint64_t step = in.Take<uint64_t>();
  const std::string manifest = in.Bytes(in.Take<uint16_t>());
  const std::string bin = in.Rest();

  const std::string& dir = run.spec.config.checkpoint.dir;
  fuzz::EmptyDir(dir);
  if (raw) {
    fuzz::WriteRawPart(dir, step, "worker-0", manifest, bin);
  } else if (!WriteCheckpointPart(dir, step, "worker-0", bin, run.shape).ok()) {
    __builtin_trap();
  }

  PsClient& ps = *run.client;
  const Status loaded = LoadWorkerCheckpoint(run.spec, 0, kShards, step, &ps);
  if (!loaded.ok()) {
    if (loaded.message().empty()) __builtin_trap();  // a refusal says what is wrong
    return 0;
  }
  std::string state;
  if (!ps.AppendState(&state).ok()) __builtin_trap();
  if (!StateIsSane(run, ps, state, step)) __builtin_trap();
  // What it saves loads again, the same (the rows in order, as AppendState
  // lists them).
  if (!WriteWorkerCheckpoint(run.spec, 0, kShards, step, &ps).ok()) __builtin_trap();
  if (!LoadWorkerCheckpoint(run.spec, 0, kShards, step, run.again.get()).ok()) __builtin_trap();
  std::string back;
  if (!run.again->AppendState(&back).ok() || back != state) __builtin_trap();
  return 0;
}
