// gridsync-bench: benchmarks that measure ours side by side with a peer or
// the physical limit in one run: `train` (vs PyTorch), `pushpull` (one PS
// shard vs raw ZeroMQ), `allreduce` (Gloo across processes vs
// torch.distributed, nccl-tests style), `compress` (gradient codecs vs
// memcpy, and their PSNR cost in a ps-mode cluster), `load` (many workers
// against one PS shard: latency, throughput and memory as workers grow) and
// `apply` (one shard's apply of a bsp step's 1 to 16 pushes, no sockets).
#include "tools/bench.h"

#include <CLI/CLI.hpp>
#include <cstdio>
#include <exception>
#include <new>

#include "common/cli_parse.h"
#include "common/logging.h"

namespace gridsync::bench {

Result<Config> LoadStandaloneConfig(const std::string& path,
                                    const std::vector<std::string>& overrides) {
  GRIDSYNC_ASSIGN_OR_RETURN(Config config, Config::LoadFile(path, overrides));
  GRIDSYNC_RETURN_IF_ERROR(config.CheckRunnable(/*standalone=*/true));
  return config;
}

}  // namespace gridsync::bench

int main(int argc, char** argv) {
  gridsync::KeepStandardStreamsOpen();  // before any descriptor is made
  CLI::App app{"gridsync-bench: side-by-side benchmarks"};
  app.require_subcommand(1);
  auto train = gridsync::bench::AddTrainCommand(&app);
  auto pushpull = gridsync::bench::AddPushPullCommand(&app);
  auto allreduce = gridsync::bench::AddAllReduceCommand(&app);
  auto compress = gridsync::bench::AddCompressCommand(&app);
  auto load = gridsync::bench::AddLoadCommand(&app);
  auto apply = gridsync::bench::AddApplyCommand(&app);
  GRIDSYNC_PARSE_COMMAND_LINE(app, argc, argv);
  gridsync::InitLogging("bench", "warn");
  // The last line of defence: a size the checks before a run did not bound
  // (a --max-bytes past this machine's memory, say) ends the command with
  // a word, not std::terminate's abort.
  try {
    if (app.got_subcommand("train")) return train();
    if (app.got_subcommand("pushpull")) return pushpull();
    if (app.got_subcommand("allreduce")) return allreduce();
    if (app.got_subcommand("compress")) return compress();
    if (app.got_subcommand("load")) return load();
    if (app.got_subcommand("apply")) return apply();
  } catch (const std::bad_alloc&) {
    std::fprintf(stderr,
                 "gridsync-bench: out of memory: the run asked for more than this machine can "
                 "allocate; allowed: smaller sizes, a smaller model or batch\n");
    return 1;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "gridsync-bench: %s\n", e.what());
    return 1;
  }
  return 2;
}
