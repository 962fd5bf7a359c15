// The cluster map of one in-process PS shard on loopback, as the benches
// that drive a PsShard with real PsClients (pushpull, load) hand it to
// PsClient::Connect: the coordinator's part, without a coordinator.
//
// Thread safety: a pure function.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "common/cluster_map.h"

namespace gridsync::bench {

inline ClusterMap OneShardMap(const std::string& endpoint, const std::vector<TableInfo>& tables,
                              uint32_t workers) {
  ClusterMap map;
  map.expected_shards = 1;
  map.expected_workers = workers;
  MemberInfo member;
  member.role = Role::kShard;
  member.node = "127.0.0.1";
  member.endpoint = endpoint;
  map.shards.push_back(member);
  map.tables = tables;
  return map;
}

}  // namespace gridsync::bench
