#include "server/shard_checkpoint.h"

#include <spdlog/spdlog.h>

#include <algorithm>
#include <chrono>
#include <nlohmann/json.hpp>

#include "common/checkpoint_files.h"
#include "common/checkpoint_registry.h"
#include "common/checkpoint_run.h"

namespace gridsync {
namespace {

std::string Part(uint32_t shard) { return ShardPart(shard); }

nlohmann::json Shapes(const ShardStore& store) {
  nlohmann::json shapes = nlohmann::json::array();
  for (uint32_t t = 0; t < store.n_tables(); ++t) {
    shapes.push_back({store.table_rows(t), store.table_width(t)});
  }
  return shapes;
}

}  // namespace

Status WriteShardCheckpoint(const std::string& dir, uint32_t shard, uint64_t step,
                            const ShardStore& store, const std::vector<uint64_t>& keep,
                            const std::string& run, const CheckpointMacKey* key) {
  std::string data;
  store.AppendState(&data);
  return WriteCheckpointPart(dir, step, Part(shard), data, Shapes(store), keep, run, key);
}

Status LoadShardCheckpoint(const std::string& dir, uint32_t shard, uint64_t step, ShardStore* store,
                           std::string* run, const CheckpointMacKey* key) {
  GRIDSYNC_ASSIGN_OR_RETURN(
      const std::string data,
      ReadCheckpointPart(dir, step, Part(shard), Shapes(*store), store->StateBytes(), run, key));
  return store->RestoreState(data, step)
      .WithContext(dir + "/step-" + std::to_string(step) + "/" + Part(shard) + ".bin");
}

std::string ShardPart(uint32_t shard) { return "shard-" + std::to_string(shard); }

void ShardCheckpoints::SetRegistry(Store* registry) {
  std::lock_guard<std::mutex> lock(registry_mu_);
  registry_ = registry;
}

void ShardCheckpoints::Publish(uint64_t job) {
  std::lock_guard<std::mutex> lock(registry_mu_);
  if (registry_ == nullptr) return;
  if (Status published = ledger_.Publish(*registry_, job); !published.ok()) {
    spdlog::warn("shard {}: the checkpoint steps it holds were not published: {}", shard_,
                 published.ToString());
  }
}

void ShardCheckpoints::AfterStep(uint64_t applied, uint64_t job, const ShardStore& store) {
  if (every_ == 0 || applied % every_ != 0) return;
  const auto start = std::chrono::steady_clock::now();
  // What the coordinator last acknowledged stays on disk (see
  // WriteCheckpointPart): read under the lock Publish writes it under.
  std::vector<uint64_t> keep;
  Result<std::string> run = std::string();
  {
    std::lock_guard<std::mutex> lock(registry_mu_);
    if (registry_ != nullptr) ledger_.RefreshCommon(*registry_, job);
    keep = ledger_.MustKeep();
    // Made by shard 0 when the job started (JobStarted): a short wait.
    run = ledger_.RunForWriting(registry_, job, std::min(timeout_, kRunWait));
  }
  const Status written =
      run.ok() ? WriteShardCheckpoint(dir_, shard_, applied, store, keep, *run, KeyOrNull(key_))
               : run.status();
  if (!written.ok()) {
    failed_.fetch_add(1, std::memory_order_relaxed);
    spdlog::error("shard {}: checkpoint at step {} not written: {}", shard_, applied,
                  written.ToString());
    return;
  }
  written_.fetch_add(1, std::memory_order_relaxed);
  newest_step_.store(applied, std::memory_order_relaxed);
  ledger_.Wrote(applied);
  Publish(job);
  spdlog::info(
      "shard {}: checkpoint at step {} written in {:.0f} ms", shard_, applied,
      std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start).count());
}

Status ShardCheckpoints::RollBack(uint64_t step, uint64_t job, ShardStore* store) {
  if (every_ == 0 || step == 0) {
    return Status::InvalidArgument(
        "the job rolled back to step " + std::to_string(step) + ", but shard " +
        std::to_string(shard_) + " writes no checkpoints (checkpoint.every_steps " +
        std::to_string(every_) + "); every process needs the same config");
  }
  std::string run;
  GRIDSYNC_RETURN_IF_ERROR(LoadShardCheckpoint(dir_, shard_, step, store, &run, KeyOrNull(key_)));
  {
    std::lock_guard<std::mutex> lock(registry_mu_);
    GRIDSYNC_RETURN_IF_ERROR(ledger_.RolledBackTo(step, std::move(run), "shard"));
  }
  Publish(job);
  return Status::OK();
}

Status ShardCheckpoints::CheckStartRun(Store& registry, uint64_t job, uint64_t step,
                                       bool rejoined) {
  std::string run;
  std::vector<std::string> shards;
  {
    std::lock_guard<std::mutex> lock(registry_mu_);
    run = ledger_.run();
    for (const auto& part : ledger_.job_parts()) {
      if (part.starts_with("shard-")) shards.push_back(part);
    }
  }
  // The shards start together; workers holding state compare themselves
  // with every part once they load theirs (worker/sync/ps_session.cc).
  return rejoined
             ? CheckRejoinedRun(registry, job, step, Part(shard_), run, dir_)
             : AgreeOnResumedRun(registry, job, step, shards, Part(shard_), run, dir_, timeout_);
}

void ShardCheckpoints::StartedFrom(uint64_t step, uint64_t job) {
  ledger_.RolledBack(step);
  Publish(job);
}

void ShardCheckpoints::JobStarted(uint64_t job) {
  if (every_ == 0) return;
  std::lock_guard<std::mutex> lock(registry_mu_);
  const auto& parts = ledger_.job_parts();
  if (registry_ == nullptr || ledger_.run_known() || parts.empty() || parts.front() != Part(shard_))
    return;
  if (auto run = ledger_.RunForWriting(registry_, job, std::chrono::milliseconds(0)); !run.ok()) {
    spdlog::warn(
        "shard {}: job {}'s run identity was not published: {}; its first checkpoint "
        "publishes it again",
        shard_, job, run.status().ToString());
  }
}

}  // namespace gridsync
