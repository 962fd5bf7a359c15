// `gridsync monitor CONFIG`: the seed article's monitor script made real. It
// finds the cluster through the coordinator (the map, and the metrics
// addresses every process put in the store as "metrics/<role>/<rank>"),
// scrapes each process's /metrics and shows, refreshed every --interval:
//   per worker: step/total, step time, communication share, samples/s,
//     loss, PSNR (the model holder), bytes each way, GPU utilisation and
//     memory (NVML, where the worker has a GPU);
//   per shard: version, pushes, pulls, bytes, waiting pulls, mean apply
//     time, refusals;
//   the coordinator: job, generation, members, barrier waits.
// --once prints one view and exits; --json prints it as JSON, for scripts.
// A process without metrics (metrics.port 0) or that does not answer is
// listed as such; the exit code is 0 when the coordinator answered.
//
// Thread safety: runs on the main thread.
#pragma once

#include <string>
#include <vector>

namespace gridsync {

struct MonitorOptions {
  std::string config_path;
  std::vector<std::string> overrides;
  bool once = false;
  bool json = false;
  double interval_seconds = 2.0;
  double timeout_seconds = 2.0;  // per request (coordinator, each scrape)
};

int RunMonitor(const MonitorOptions& options);

// --json's error line on stdout: {"error":{"code","message","exit_code"}},
// for every failure, a refused flag included (gridsync.cc's parse), so that
// a program reading the view lines never takes the end of its input for a
// quiet cluster.
void PrintJsonError(const std::string& code, const std::string& message, int exit_code);

}  // namespace gridsync
