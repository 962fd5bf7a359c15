// gradient_sync "nccl" in one process: every worker a thread over
// rank-ordered in-process groups (LocalCollective), flat or hierarchical,
// so that a run ends bit for bit where the single-process reference ends.
//
// Thread safety: RunLocal is reentrant (each call makes its own groups).
#pragma once

#include <functional>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "common/config.h"
#include "worker/collective/local_collective.h"
#include "worker/image_task.h"
#include "worker/sync/train.h"

namespace gridsync::testing {

// Every worker of `config` as a thread, quiet; `customize(rank, options)`
// (optional) sets a rank's options (a throttle, a start step). The
// reports in rank order.
inline std::vector<Result<TrainReport>> RunLocal(
    const Config& config, const ImageTask& image,
    const std::function<void(int, WorkerOptions*)>& customize = {}) {
  const auto& d = config.distributed;
  const int world = d.world_size;
  const auto timeout = d.timeout();
  auto flat = LocalCollective::CreateGroup(world, timeout, "flat");
  const auto nodes = d.ResolvedNodes();
  const int slices = d.HierarchicalSlices();
  std::vector<std::vector<std::unique_ptr<LocalCollective>>> intra;
  for (const auto& n : nodes)
    intra.push_back(LocalCollective::CreateGroup(n.workers, timeout, "intra-" + n.name));
  std::vector<std::vector<std::unique_ptr<LocalCollective>>> inter;
  for (int l = 0; l < slices; ++l) {
    inter.push_back(LocalCollective::CreateGroup(static_cast<int>(nodes.size()), timeout,
                                                 "inter-" + std::to_string(l)));
  }
  std::vector<Result<TrainReport>> reports(static_cast<size_t>(world), Status::Internal("not run"));
  std::vector<std::thread> threads;
  for (int r = 0; r < world; ++r) {
    threads.emplace_back([&, r] {
      AllReduceGroups groups;
      groups.flat = flat[static_cast<size_t>(r)].get();
      if (d.hierarchical) {
        const int node = d.NodeOf(r);
        const int local = d.LocalRankOf(r);
        groups.intra = intra[static_cast<size_t>(node)][static_cast<size_t>(local)].get();
        if (local < slices)
          groups.inter = inter[static_cast<size_t>(local)][static_cast<size_t>(node)].get();
      }
      WorkerOptions options;
      options.train.quiet = true;
      options.train.write_png = false;
      if (customize) customize(r, &options);
      reports[static_cast<size_t>(r)] = TrainImageAllReduce(config, image, r, groups, options);
    });
  }
  for (auto& t : threads) t.join();
  return reports;
}

}  // namespace gridsync::testing
