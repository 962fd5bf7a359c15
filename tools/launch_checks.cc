#include "tools/launch_checks.h"

#include "common/wire/curve.h"

namespace gridsync {
namespace {

bool Here(int node, int n) { return node < 0 || n == node; }

}  // namespace

int WorkersHere(const ClusterLayout& layout, int node) {
  int workers = 0;
  for (int n = 0; n < static_cast<int>(layout.nodes.size()); ++n)
    workers += Here(node, n) ? layout.nodes[static_cast<size_t>(n)].workers : 0;
  return workers;
}

Status CheckKeysOfRolesHere(const Config& config, int node, bool run_coordinator) {
  const ClusterLayout& layout = config.layout;
  bool shards_here = false;
  for (const auto& shard : layout.shards) shards_here |= Here(node, shard.node);
  const bool workers_here = WorkersHere(layout, node) > 0;
  if (run_coordinator) GRIDSYNC_RETURN_IF_ERROR(wire::CheckRoleKeys(config, {"coordinator"}));
  if (shards_here) GRIDSYNC_RETURN_IF_ERROR(wire::CheckRoleKeys(config, {"shard"}));
  if (workers_here) GRIDSYNC_RETURN_IF_ERROR(wire::CheckRoleKeys(config, {"worker"}));
  return Status::OK();
}

Status CheckArgsSharedByWorkers(const Config& config, int node,
                                const std::vector<std::string>& worker_args) {
  const int workers_here = WorkersHere(config.layout, node);
  if (workers_here < 2) return Status::OK();
  constexpr std::string_view kFlag = "--metrics-port";
  for (size_t i = 0; i < worker_args.size(); ++i) {
    const std::string& arg = worker_args[i];
    std::string value;
    if (arg == kFlag) {
      value = i + 1 < worker_args.size() ? worker_args[i + 1] : "";
    } else if (arg.size() > kFlag.size() && arg.compare(0, kFlag.size(), kFlag) == 0 &&
               arg[kFlag.size()] == '=') {
      value = arg.substr(kFlag.size() + 1);
    } else {
      continue;
    }
    if (value == "0") continue;  // off, for every worker
    return Status::InvalidArgument(
        "--worker-arg --metrics-port " + value + ": one port for the " +
        std::to_string(workers_here) +
        " workers on this machine, which cannot all listen on it; allowed: metrics.port in the "
        "config (each process takes its own port from it), or --rank0-arg --metrics-port for "
        "worker 0 alone");
  }
  return Status::OK();
}

std::vector<std::pair<int, int>> WorkerLinesToCheck(const ClusterLayout& layout, int node) {
  std::vector<std::pair<int, int>> lines;
  bool other = false;
  for (int n = 0; n < static_cast<int>(layout.nodes.size()); ++n) {
    if (!Here(node, n)) continue;
    for (int local = 0; local < layout.nodes[static_cast<size_t>(n)].workers; ++local) {
      const int w = layout.FirstRank(n) + local;
      if (w == 0 || !other) lines.emplace_back(w, n);
      other = other || w != 0;
    }
  }
  return lines;
}

Status CheckStepsLeft(const Config& config, uint64_t resume_step) {
  if (resume_step < static_cast<uint64_t>(config.training.steps)) return Status::OK();
  const std::string step = std::to_string(resume_step);
  return Status::InvalidArgument(
      "the newest complete checkpoint in " + config.checkpoint.dir + " is of step " + step +
      ", and training.steps is " + std::to_string(config.training.steps) +
      ": nothing is left to train; allowed: training.steps above " + step);
}

}  // namespace gridsync
