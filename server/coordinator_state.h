// What a coordinator keeps across its own restarts: the job it serves, the
// job's epoch, whether its training started or finished, and the job's
// checkpoint registry (the steps each part published,
// common/checkpoint_registry.h). With these a restarted coordinator is, to
// the shards and workers restarted after it, the coordinator whose members
// all died: a job with checkpoints stays open and they rejoin it from its
// newest complete step (the ordinary rejoin), instead of a new job 1 that
// every part holding checkpoints must refuse.
//
// Members, tables, barriers, the map's generation and the rest of the store
// are not kept: every member's connection died with the coordinator, and
// what they wrote there (rendezvous, rates, metrics addresses) belongs to
// processes that are gone.
//
// The file is JSON, written atomically (common/checkpoint_files.h) and
// decoded strictly: anything but the fields below, in their types and
// ranges, is refused with the file and the field named.
//
// Thread safety: free functions; one writer per file.
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <string_view>

#include "common/status.h"

namespace gridsync {

struct CoordinatorState {
  uint64_t job = 1;
  uint32_t epoch = 0;
  uint64_t resume_step = 0;
  bool training_started = false;
  bool job_done = false;
  // The cluster the state belongs to: another shape cannot rejoin its job.
  uint32_t expected_shards = 0;
  uint32_t expected_workers = 0;
  // Keys CheckpointKey(job, part) of the cluster's parts (shard-<s>,
  // worker-<w>) and their values (the part's steps).
  std::map<std::string, std::string> checkpoints;
  // The job's checkpoint run (RunKey, common/checkpoint_run.h), "" when none
  // was published: kept so that a part rejoining after a restart of the
  // coordinator is still checked against it.
  std::string run;

  bool operator==(const CoordinatorState&) const = default;
};

// Bounds of a state file: far above any real cluster's (a key per part).
inline constexpr uint64_t kMaxCoordinatorStateBytes = 16ull << 20;
// Values a restart increments stay below these, so that what it writes back
// decodes again.
inline constexpr uint64_t kMaxCoordinatorJob = uint64_t{1} << 62;
inline constexpr uint32_t kMaxCoordinatorEpoch = uint32_t{1} << 31;

// A part's published steps in a state file: at most this many bytes (a
// part keeps two steps, "100,150").
inline constexpr size_t kMaxCheckpointStepsBytes = 1024;

// Whether `part` ("shard-<s>" or "worker-<w>", canonical decimal) is one of
// a cluster's of `shards` shards and `workers` workers.
bool IsClusterPart(std::string_view part, uint32_t shards, uint32_t workers);

// Why `key` = `value` is no checkpoint registry entry that a state file of
// job `job` keeps (nullopt: it is one): the key CheckpointKey(job, part) of
// a part of the cluster (shard-<s> with s < shards, worker-<w> with w <
// workers, in decimal), the value a list of steps (ParseHeldSteps) within
// kMaxCheckpointStepsBytes. The decoder refuses anything else; the
// coordinator leaves out anything else a client wrote under the prefix, so
// the file stays one its next start accepts and no junk crowds out a part.
std::optional<std::string> CheckpointEntryProblem(uint64_t job, uint32_t shards, uint32_t workers,
                                                  const std::string& key, const std::string& value);

std::string EncodeCoordinatorState(const CoordinatorState& state);
// `what` names the source in errors (the file's path).
Result<CoordinatorState> DecodeCoordinatorState(std::string_view bytes, const std::string& what);

// nullopt when `path` does not exist; Corruption when it does not decode,
// or is larger than kMaxCoordinatorStateBytes (refused by its size, unread).
Result<std::optional<CoordinatorState>> LoadCoordinatorState(const std::string& path);
// Creates the folder if needed, then writes atomically.
Status SaveCoordinatorState(const std::string& path, const CoordinatorState& state);

}  // namespace gridsync
