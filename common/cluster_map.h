// The cluster map: who is in the cluster and what the tables are. Published
// by the coordinator with a generation number that changes on every
// membership change.
//
// Thread safety: plain values.
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

namespace gridsync {

enum class Role : uint8_t { kShard = 0, kWorker = 1, kObserver = 2 };
const char* RoleName(Role role);

struct TableInfo {
  std::string name;
  uint64_t rows = 0;
  uint32_t width = 0;
  bool operator==(const TableInfo&) const = default;
};

// One setting a process runs with, as the coordinator compares it at
// registration (spec/cluster_settings.h): a config key and its value as
// JSON text.
struct Setting {
  std::string key;
  std::string value;
  bool operator==(const Setting&) const = default;
};

// Bounds the coordinator's decoder holds a registration's settings to.
inline constexpr size_t kMaxSettings = 128;
inline constexpr size_t kMaxSettingKeyBytes = 128;
inline constexpr size_t kMaxSettingValueBytes = 4096;

// Where `mine` differs from `reference` (spec/cluster_settings.h): "key: A
// here, B there" for each key whose value differs or that only one of them
// has ("(not sent)"), joined by "; " (nullopt when they agree).
std::optional<std::string> SettingsMismatch(const std::vector<Setting>& mine,
                                            const std::vector<Setting>& reference);

struct MemberInfo {
  Role role = Role::kWorker;
  uint32_t rank = 0;
  std::string node;
  uint32_t local_rank = 0;
  std::string endpoint;  // shards: their ZeroMQ endpoint
  uint32_t pid = 0;
};

struct ClusterMap {
  uint64_t generation = 0;
  // The job the workers in the map belong to. Shards and the coordinator
  // outlive jobs (systemd units); a job ends when its last worker leaves
  // after training started, and the next workers start job + 1.
  uint64_t job = 1;
  // Rollbacks of the job: a restarted shard that rejoins from its newest
  // complete checkpoint moves the epoch, and every process of the job goes
  // back to resume_step (the checkpoint's) and carries on from there.
  uint32_t epoch = 0;
  uint64_t resume_step = 0;
  uint32_t expected_shards = 0;
  uint32_t expected_workers = 0;
  std::vector<MemberInfo> shards;   // sorted by rank
  std::vector<MemberInfo> workers;  // sorted by rank
  std::vector<TableInfo> tables;

  bool complete() const {
    return shards.size() == expected_shards && workers.size() == expected_workers;
  }
};

struct RegisterInfo {
  Role role = Role::kWorker;
  int32_t requested_rank = -1;  // -1: next free rank
  std::string node;
  uint32_t local_rank = 0;
  std::string endpoint;
  uint32_t pid = 0;
  std::vector<TableInfo> tables;  // shards and workers: must match the cluster's
  // A shard restarted during training: the checkpoint step it loaded and
  // rejoins the job from (0: a fresh shard).
  uint64_t rejoin_step = 0;
  // Settings that must agree (spec/cluster_settings.h): `shared` across
  // every shard and worker while any is registered, `job` across the
  // workers of one job (workers only).
  std::vector<Setting> shared_settings;
  std::vector<Setting> job_settings;
};

// Where a job stands: which job, its epoch (rollbacks so far) and the step
// the latest rollback went back to. What a shard checks a message against
// and what a worker checks it still follows.
// Where the workers' collectives keep their rendezvous state in the
// coordinator's store (CoordinatorStore's prefix); the coordinator drops it
// when the last worker leaves.
inline constexpr char kCollectiveStorePrefix[] = "collective/";

// Where a shard or worker that cannot join the job says why before it
// exits on a refusal no restart mends (checkpoint files of another run):
// "cannot-join/<role>/<rank>". Without it the others' wait for the cluster
// ended naming only "missing shards [0, 1]" (a hostile probe). The
// coordinator names the reason beside the missing rank, refuses it from
// another registered member or for a registered rank (and, with security
// on, from a connection that proved another role's key), and clears it
// when the rank registers or the job ends.
inline constexpr char kCannotJoinPrefix[] = "cannot-join/";
std::string CannotJoinKey(Role role, uint32_t rank);

// Ranks as messages name them: "[0, 2, 3]".
std::string RankList(const std::vector<uint32_t>& ranks);

struct JobState {
  uint64_t job = 0;
  uint32_t epoch = 0;
  uint64_t resume_step = 0;
  // The ranks of the workers the map lists, ascending (members of the job
  // now: registered, and not dropped for silence).
  std::vector<uint32_t> workers;
};

}  // namespace gridsync
