// gridsync-bench: benchmarks that measure ours side by side with a peer or
// the physical limit in one run: `train` (vs PyTorch), `pushpull` (one PS
// shard vs raw ZeroMQ) and `allreduce` (Gloo across processes vs
// torch.distributed, nccl-tests style); `compress` arrives with its issue.
#include "tools/bench.h"

#include <CLI/CLI.hpp>

#include "common/logging.h"

int main(int argc, char** argv) {
  CLI::App app{"gridsync-bench: side-by-side benchmarks"};
  app.require_subcommand(1);
  auto train = gridsync::bench::AddTrainCommand(&app);
  auto pushpull = gridsync::bench::AddPushPullCommand(&app);
  auto allreduce = gridsync::bench::AddAllReduceCommand(&app);
  CLI11_PARSE(app, argc, argv);
  gridsync::InitLogging("bench", "warn");
  if (app.got_subcommand("train")) return train();
  if (app.got_subcommand("pushpull")) return pushpull();
  if (app.got_subcommand("allreduce")) return allreduce();
  return 2;
}
