// `gridsync launch CONFIG`: a local cluster from one config on this machine:
// the coordinator, ps.shards shards and distributed.world_size workers, each
// a child process of the launcher.
//
// Their output is streamed line by line with a name prefix ("[ps-1] ...").
// When every worker has finished, the shards and the coordinator are stopped
// and the launcher prints the run's summary. If any process fails (non-zero
// exit, a signal, or a server exiting early), or on Ctrl-C/SIGTERM, the
// launcher says which one and why, stops all the others (SIGTERM, then
// SIGKILL after a grace period) and exits non-zero. Children also get
// PR_SET_PDEATHSIG, so none outlives a launcher that is killed outright.
//
// Thread safety: runs on the main thread; installs signal handlers.
#pragma once

#include <string>
#include <vector>

namespace gridsync {

struct LaunchOptions {
  std::string config_path;
  std::vector<std::string> overrides;   // --set key=value, passed to every process
  std::string bin_dir;                  // empty: next to this executable (build tree or install)
  std::vector<std::string> worker_args; // extra arguments for every worker
  std::vector<std::string> rank0_args;  // extra arguments for worker 0 only
  double grace_seconds = 5.0;
};

// Returns the process exit code.
int RunLaunch(const LaunchOptions& options);

}  // namespace gridsync
