// Subcommands of gridsync-bench. Each registers its options on the CLI app
// and returns the function that runs it (returning the process exit code).
//
// Thread safety: used from main only.
#pragma once

#include <CLI/CLI.hpp>
#include <functional>

namespace gridsync::bench {

using Runner = std::function<int()>;

Runner AddTrainCommand(CLI::App* app);
Runner AddPushPullCommand(CLI::App* app);
Runner AddAllReduceCommand(CLI::App* app);
Runner AddCompressCommand(CLI::App* app);
Runner AddLoadCommand(CLI::App* app);

}  // namespace gridsync::bench
