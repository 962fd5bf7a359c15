// Checkpoints of PS shards: each shard writes its partition (parameters,
// Adam's m and v, per-row step counts) every checkpoint.every_steps applied
// steps, and a restarted job loads them (gridsync launch --resume).
//
// Files: part shard-<i> of each step (common/checkpoint_files.h: atomic
// writes, a manifest with the table shapes and a checksum, the two newest
// steps kept). Workers with state of their own write part worker-<r> of the
// same steps (worker/worker_checkpoint.h).
//
// A shard restarted during training rejoins from the newest step every part
// holds (common/checkpoint_registry.h publishes them) and the job rolls back
// to it: the other shards reload that step (ShardCheckpoints::RollBack).
//
// Thread safety: free functions; the store must not change meanwhile.
// ShardCheckpoints: the shard's I/O thread, but SetRegistry from any.
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "common/checkpoint_mac_key.h"
#include "common/checkpoint_registry.h"
#include "common/status.h"
#include "common/store.h"
#include "server/shard_store.h"

namespace gridsync {

// `keep`: steps to leave on disk (WriteCheckpointPart).
// `run`: the run it belongs to (common/checkpoint_run.h).
// `key` (under CURVE): the files carry the MAC it makes, and a load
// refuses files without one or whose MAC differs (ReadCheckpointPart).
Status WriteShardCheckpoint(const std::string& dir, uint32_t shard, uint64_t step,
                            const ShardStore& store, const std::vector<uint64_t>& keep = {},
                            const std::string& run = "", const CheckpointMacKey* key = nullptr);
// Loads step `step` of shard `shard` into `store`, after checking the
// manifest: step, shard, table shapes, size (the .bin's and the store's
// state size, before it is read) and checksum. `run` (unless null)
// receives the run the files name.
Status LoadShardCheckpoint(const std::string& dir, uint32_t shard, uint64_t step, ShardStore* store,
                           std::string* run = nullptr, const CheckpointMacKey* key = nullptr);
std::string ShardPart(uint32_t shard);  // "shard-<i>"

// One shard's checkpoints during its jobs: written every `every` applied
// steps, published to the registry (the coordinator's store) when there is
// one, and reloaded when the job rolls back.
class ShardCheckpoints {
 public:
  // `job_parts`: the parts a step of the job needs (CheckpointParts);
  // `timeout`: how long the first checkpoint of a fresh job waits for the
  // job's run (common/checkpoint_run.h).
  // `key`: as WriteShardCheckpoint's, for every write and reload.
  ShardCheckpoints(std::string dir, uint32_t shard, uint64_t every,
                   std::vector<std::string> job_parts, std::chrono::milliseconds timeout,
                   std::optional<CheckpointMacKey> key = std::nullopt)
      : dir_(dir),
        shard_(shard),
        every_(every),
        timeout_(timeout),
        key_(std::move(key)),
        ledger_(std::move(dir), ShardPart(shard)) {
    ledger_.SetJobParts(std::move(job_parts));
  }

  // Where the steps held are published (null: nowhere).
  void SetRegistry(Store* registry);

  // After applied step `applied` - 1: writes the partition when a checkpoint
  // is due. A failed write is logged and the run goes on (the previous
  // checkpoint stays complete): a full disk never stops training.
  void AfterStep(uint64_t applied, uint64_t job, const ShardStore& store);

  // The job rolled back to `step`: loads that checkpoint into `store`
  // (which holds nothing of the job yet) and forgets this part's later
  // steps (an abandoned history). Files of another run than the one this
  // shard serves are refused.
  Status RollBack(uint64_t step, uint64_t job, ShardStore* store);
  // The shard loaded its checkpoint of `step`, which names run `run`, before
  // it registered (gridsync launch --resume, or a rejoin).
  void Loaded(std::string run) { ledger_.SetRun(std::move(run)); }
  // Before it registers for `job` (a registration moves the job's epoch,
  // and every process rolls back): the run its files name checked against
  // the other shards' (a resume: AgreeOnResumedRun, waiting up to the
  // timeout for them) or the job's (a rejoin: CheckRejoinedRun).
  // InvalidArgument: files of another run, which no restart mends.
  Status CheckStartRun(Store& registry, uint64_t job, uint64_t step, bool rejoined);
  // ... registered for `job`: its later steps go (an abandoned history) and
  // what it holds is published.
  void StartedFrom(uint64_t step, uint64_t job);
  // A job started afresh (registered, or NewJob): shard 0 makes the job's
  // run and publishes it, so the other parts find it at their first
  // checkpoint without waiting on the serving loop.
  void JobStarted(uint64_t job);
  // A new job began: nothing of the last one is offered for a rejoin.
  void NewJob(uint64_t job) {
    {
      std::lock_guard<std::mutex> lock(registry_mu_);
      ledger_.Reset();
    }
    JobStarted(job);
  }

  // What AfterStep wrote and failed to write so far (any thread).
  struct Counts {
    uint64_t written = 0, failed = 0, newest_step = 0;
  };
  Counts counts() const {
    return {written_.load(std::memory_order_relaxed), failed_.load(std::memory_order_relaxed),
            newest_step_.load(std::memory_order_relaxed)};
  }

 private:
  void Publish(uint64_t job);

  const std::string dir_;
  const uint32_t shard_;
  const uint64_t every_;
  const std::chrono::milliseconds timeout_;
  const std::optional<CheckpointMacKey> key_;
  CheckpointLedger ledger_;  // the I/O thread's (StartedFrom: before serving)
  std::atomic<uint64_t> written_{0}, failed_{0}, newest_step_{0};
  std::mutex registry_mu_;
  Store* registry_ = nullptr;  // guarded by registry_mu_
};

}  // namespace gridsync
