// The config of a cluster server process (the coordinator, a PS shard),
// loaded as `gridsync check-config` judges it: the file with its --set
// overrides, its notes logged, then refused where check-config refuses it
// for a cluster (CheckRunnable) or where the cluster has no `role` to run
// (CheckClusterProcess). One function, so the two servers cannot drift
// apart in what they accept.
//
// Thread safety: reentrant; it logs and writes to stderr.
#pragma once

#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "common/config.h"

namespace gridsync {

// The loaded config, or nullopt after printing why it is refused (the
// caller exits kConfigErrorExitCode before anything listens). `role` names
// the process in the refusal ("PS shard", "coordinator").
std::optional<Config> LoadServerConfig(const std::string& path,
                                       const std::vector<std::string>& overrides,
                                       std::string_view role);

}  // namespace gridsync
