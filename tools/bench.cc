// gridsync-bench: benchmarks that measure ours side by side with a peer or
// the physical limit in one run. `train` today; `pushpull`, `allreduce` and
// `compress` arrive with their issues.
#include <CLI/CLI.hpp>

#include "common/logging.h"
#include "tools/bench.h"

int main(int argc, char** argv) {
  CLI::App app{"gridsync-bench: side-by-side benchmarks"};
  app.require_subcommand(1);
  auto train = gridsync::bench::AddTrainCommand(&app);
  CLI11_PARSE(app, argc, argv);
  gridsync::InitLogging("bench", "warn");
  if (app.got_subcommand("train")) return train();
  return 2;
}
