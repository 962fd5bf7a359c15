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
// Across machines, in the manner of torchrun: `gridsync launch CONFIG --node
// NAME` on each machine starts that node's workers, the shards the layout
// places there, and the coordinator if the node's host is master_addr (the
// same config file serves every node; common/cluster_layout.h has the
// rules). Without --node the config must be for one machine, and every
// process starts here. Each child gets the environment contract:
//   GRIDSYNC_NODE, GRIDSYNC_HOST (the node's address), GRIDSYNC_WORLD_SIZE,
//   GRIDSYNC_MASTER_ADDR, GRIDSYNC_MASTER_PORT; workers also GRIDSYNC_RANK,
//   GRIDSYNC_LOCAL_RANK, GRIDSYNC_LOCAL_WORLD_SIZE; shards GRIDSYNC_SHARD.
// A GRIDSYNC_HOST or GRIDSYNC_SOCKET_IFNAME already in the launcher's
// environment wins over the node's host (common/host_address.h).
//
// Thread safety: runs on the main thread; installs signal handlers.
#pragma once

#include <string>
#include <vector>

namespace gridsync {

struct LaunchOptions {
  std::string config_path;
  std::vector<std::string> overrides;    // --set key=value, passed to every process
  std::string bin_dir;                   // empty: next to this executable (build tree or install)
  std::vector<std::string> worker_args;  // extra arguments for every worker
  std::vector<std::string> rank0_args;   // extra arguments for worker 0 only
  double grace_seconds = 5.0;
  std::string node;          // --node: this machine's node; empty: every process here
  bool coordinator = false;  // --coordinator: also run the coordinator here
  // --resume: start from the newest checkpoint every shard completed
  // (checkpoint.dir); shards load it, workers continue at its step.
  bool resume = false;
  // --max-restarts: a shard, worker or coordinator that fails during
  // training is restarted, up to this many times each, with checkpoints on;
  // a shard or worker rejoins the job from the newest complete checkpoint
  // and every process rolls back to it; the coordinator serves the job it
  // kept (server/coordinator_state.h), and the others rejoin it.
  int max_restarts = 0;
  // --start-timeout: seconds a started process may take to say it serves
  // (a server's READY=1, a worker's first watchdog ping) before it is
  // killed as stuck while starting, as systemd's TimeoutStartSec= kills a
  // unit; 0: LaunchStartTimeout's default (launch_watchdog.h).
  double start_timeout_seconds = 0;
};

// Returns the process exit code.
int RunLaunch(const LaunchOptions& options);

}  // namespace gridsync
