#include "common/cluster_map.h"

namespace gridsync {

const char* RoleName(Role role) {
  switch (role) {
    case Role::kShard:
      return "shard";
    case Role::kWorker:
      return "worker";
    case Role::kObserver:
      return "observer";
  }
  return "unknown-role";
}

}  // namespace gridsync
