// Subcommands of gridsync-bench. Each registers its options on the CLI app
// and returns the function that runs it (returning the process exit code).
//
// Thread safety: used from main only.
#pragma once

#include <CLI/CLI.hpp>
#include <functional>
#include <string>
#include <vector>

#include "common/config.h"
#include "common/status.h"

namespace gridsync::bench {

using Runner = std::function<int()>;

// A standalone bench's config: `path` with `overrides` applied, refused
// unless a standalone run could take it (Config::CheckRunnable), as the
// binaries would. The caller prints a refusal and exits with
// kConfigErrorExitCode.
Result<Config> LoadStandaloneConfig(const std::string& path,
                                    const std::vector<std::string>& overrides);

Runner AddTrainCommand(CLI::App* app);
Runner AddPushPullCommand(CLI::App* app);
Runner AddAllReduceCommand(CLI::App* app);
Runner AddCompressCommand(CLI::App* app);
Runner AddLoadCommand(CLI::App* app);
Runner AddApplyCommand(CLI::App* app);

}  // namespace gridsync::bench
