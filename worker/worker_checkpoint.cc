#include "worker/worker_checkpoint.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <nlohmann/json.hpp>

#include "common/checkpoint_files.h"
#include "common/state_bytes.h"
#include "common/wire/message.h"

namespace gridsync {
namespace {

std::string Part(uint32_t rank) { return "worker-" + std::to_string(rank); }

// What the state depends on: the tables, how the shards cut them (residual
// keys name column slices), where Adam runs and the codec.
nlohmann::json Shape(const RunSpec& spec, uint32_t shards) {
  nlohmann::json tables = nlohmann::json::array();
  for (const auto& t : spec.model.tables) tables.push_back({t.rows, t.width});
  return {{"tables", tables},
          {"shards", shards},
          {"partition", ToString(spec.sync.partition_dim)},
          {"optimizer", spec.sync.optimizer_on_workers ? "worker" : "shard"},
          {"codec", spec.config.compression.codec}};
}

// What an nccl worker's part depends on: the tables, and how model_parallel
// cuts Adam's state among the workers.
nlohmann::json AllReduceShape(const RunSpec& spec, uint32_t workers) {
  nlohmann::json tables = nlohmann::json::array();
  for (const auto& t : spec.model.tables) tables.push_back({t.rows, t.width});
  const bool sharded = spec.config.distributed.model_parallel;
  return {{"tables", tables},
          {"gradient_sync", "nccl"},
          {"workers", workers},
          {"model_parallel", sharded},
          {"partition", sharded ? ToString(spec.sync.partition_dim) : "none"}};
}

// Training makes finite parameters, far below what the wire carries
// (wire::Limits::max_abs_value); anything else is a damaged or forged file.
Status CheckParams(const HashGridModel& model) {
  const float bound = wire::Limits{}.max_abs_value;
  auto check = [&](const float* p, size_t n, const std::string& where) {
    const size_t at = wire::FirstOutOfBounds({p, n}, bound);
    if (at == n) return Status::OK();
    return Status::Corruption(where + ", parameter " + std::to_string(at) + ", is " +
                              std::to_string(p[at]) +
                              "; allowed: finite and at most 1e15 in magnitude, so the file is "
                              "damaged or not this run's");
  };
  GRIDSYNC_RETURN_IF_ERROR(
      check(model.grid_params().data(), model.grid_params().size(), "the grid"));
  for (size_t i = 0; i < model.mlp_weights().size(); ++i) {
    const auto& m = model.mlp_weights()[i];
    GRIDSYNC_RETURN_IF_ERROR(
        check(m.data(), static_cast<size_t>(m.size()), "MLP matrix " + std::to_string(i)));
  }
  return Status::OK();
}

uint64_t ParamBytes(const HashGridModel& model) { return model.n_params() * sizeof(float); }

uint64_t OptimizerBytes(const AllReduceState& state) {
  return state.sharded != nullptr ? state.sharded->StateBytes() : state.replicated->StateBytes();
}

}  // namespace

Status WriteWorkerCheckpoint(const RunSpec& spec, uint32_t rank, uint32_t shards, uint64_t step,
                             PsClient* ps, const std::vector<uint64_t>& keep,
                             const std::string& run, const CheckpointMacKey* key) {
  std::string data;
  GRIDSYNC_RETURN_IF_ERROR(ps->AppendState(&data));
  return WriteCheckpointPart(spec.config.checkpoint.dir, step, Part(rank), data,
                             Shape(spec, shards), keep, run, key);
}

Status CheckWorkerCheckpoint(const RunSpec& spec, uint32_t rank, uint32_t shards, uint64_t step,
                             const CheckpointMacKey* key) {
  return ReadCheckpointPart(spec.config.checkpoint.dir, step, Part(rank), Shape(spec, shards),
                            std::nullopt, nullptr, key)
      .status();
}

Status LoadWorkerCheckpoint(const RunSpec& spec, uint32_t rank, uint32_t shards, uint64_t step,
                            PsClient* ps, std::string* run, const CheckpointMacKey* key) {
  const std::string& dir = spec.config.checkpoint.dir;
  // No state size to check against: the residuals' rows, and which tables
  // Adam stepped, vary with training. RestoreState checks what it takes.
  GRIDSYNC_ASSIGN_OR_RETURN(
      const std::string data,
      ReadCheckpointPart(dir, step, Part(rank), Shape(spec, shards), std::nullopt, run, key));
  return ps->RestoreState(data, step)
      .WithContext(dir + "/step-" + std::to_string(step) + "/" + Part(rank) + ".bin");
}

Status WriteAllReduceCheckpoint(const RunSpec& spec, uint32_t rank, uint32_t workers, uint64_t step,
                                const AllReduceState& state, const std::vector<uint64_t>& keep,
                                const CheckpointMacKey* key) {
  std::string data;
  data.reserve(ParamBytes(*state.model) + OptimizerBytes(state));
  AppendArray(&data, state.model->grid_params());
  for (const auto& m : state.model->mlp_weights()) {
    data.append(reinterpret_cast<const char*>(m.data()),
                static_cast<size_t>(m.size()) * sizeof(float));
  }
  if (state.sharded != nullptr) {
    state.sharded->AppendState(&data);
  } else {
    state.replicated->AppendState(&data);
  }
  return WriteCheckpointPart(spec.config.checkpoint.dir, step, Part(rank), data,
                             AllReduceShape(spec, workers), keep, /*run=*/"", key);
}

Status LoadAllReduceCheckpoint(const RunSpec& spec, uint32_t rank, uint32_t workers, uint64_t step,
                               const AllReduceState& state, const CheckpointMacKey* key) {
  const std::string& dir = spec.config.checkpoint.dir;
  const std::string file = dir + "/step-" + std::to_string(step) + "/" + Part(rank) + ".bin";
  // Every size is the model's and the optimizer's: the file is refused by
  // its size before anything of it is read.
  GRIDSYNC_ASSIGN_OR_RETURN(const std::string data,
                            ReadCheckpointPart(dir, step, Part(rank), AllReduceShape(spec, workers),
                                               ParamBytes(*state.model) + OptimizerBytes(state),
                                               /*run=*/nullptr, key));
  std::string_view in(data);
  HashGridModel& model = *state.model;
  bool whole = TakeArray(&in, &model.grid_params());
  for (auto& m : model.mlp_weights()) {
    const size_t bytes = static_cast<size_t>(m.size()) * sizeof(float);
    whole = whole && in.size() >= bytes;
    if (!whole) break;
    std::memcpy(m.data(), in.data(), bytes);
    in.remove_prefix(bytes);
  }
  if (!whole) return Status::Corruption(file + ": shorter than the model's parameters");
  GRIDSYNC_RETURN_IF_ERROR(CheckParams(model).WithContext(file));
  model.RefreshWorkingCopyAll();
  GRIDSYNC_RETURN_IF_ERROR((state.sharded != nullptr ? state.sharded->RestoreState(&in, step, model)
                                                     : state.replicated->RestoreState(&in, step))
                               .WithContext(file));
  if (!in.empty()) {
    return Status::Corruption(file + ": " + std::to_string(in.size()) +
                              " bytes after the model and its Adam state");
  }
  return Status::OK();
}

}  // namespace gridsync
