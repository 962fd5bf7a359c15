// LoadServerConfig (server_config.h).
//
// Thread safety: see server_config.h.
#include "common/server_config.h"

#include <cstdio>

#include "common/logging.h"

namespace gridsync {

std::optional<Config> LoadServerConfig(const std::string& path,
                                       const std::vector<std::string>& overrides,
                                       std::string_view role) {
  auto config = Config::LoadFile(path, overrides);
  if (!config.ok()) {
    std::fprintf(stderr, "%s\n", config.status().message().c_str());
    return std::nullopt;
  }
  LogConfigNotes(path, config->NotesFor(/*standalone=*/false));
  // What `gridsync check-config` refuses, this refuses too, before a
  // cluster forms around a config its workers would refuse.
  if (auto runnable = config->CheckRunnable(/*standalone=*/false); !runnable.ok()) {
    std::fprintf(stderr, "%s: %s\n", path.c_str(), runnable.message().c_str());
    return std::nullopt;
  }
  // A server runs only in a cluster (alone, one process trains without
  // one), and checkpoint.dir as check-config checks it.
  if (auto cluster = config->CheckClusterProcess(role); !cluster.ok()) {
    std::fprintf(stderr, "%s: %s\n", path.c_str(), cluster.message().c_str());
    return std::nullopt;
  }
  return std::move(*config);
}

}  // namespace gridsync
