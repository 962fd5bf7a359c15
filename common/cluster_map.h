// The cluster map: who is in the cluster and what the tables are. Published
// by the coordinator with a generation number that changes on every
// membership change.
//
// Thread safety: plain values.
#pragma once

#include <cstdint>
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
};

}  // namespace gridsync
