#include "worker/worker_placement.h"

#include <cstdlib>

#include "common/host_address.h"

namespace gridsync {
namespace {

// The nodes a --node may name, for a refusal: the first few (a config may
// list thousands).
std::string NodeNames(const ClusterLayout& layout) {
  std::string names;
  for (size_t i = 0; i < layout.nodes.size() && i < 8; ++i)
    names += (i == 0 ? "" : ", ") + layout.nodes[i].name;
  if (layout.nodes.size() > 8) names += ", ... (" + std::to_string(layout.nodes.size()) + " nodes)";
  return names;
}

}  // namespace

Result<WorkerPlacement> PlaceWorker(const Config& config, int* rank, std::string_view node_name,
                                    std::string_view host_flag) {
  const DistributedConfig& d = config.distributed;
  const ClusterLayout& layout = config.layout;
  if (*rank < 0) {
    GRIDSYNC_ASSIGN_OR_RETURN(*rank, IntFromEnv("GRIDSYNC_RANK", -1, 0, d.world_size - 1));
  }
  if (*rank >= d.world_size) {
    return Status::InvalidArgument("--rank " + std::to_string(*rank) +
                                   ": out of range; allowed: 0.." +
                                   std::to_string(d.world_size - 1) + " (distributed.world_size " +
                                   std::to_string(d.world_size) + ")");
  }
  if (node_name.empty()) {
    const char* from_env = std::getenv("GRIDSYNC_NODE");
    if (from_env != nullptr) node_name = from_env;
  }
  int node = -1;
  if (!node_name.empty()) {
    node = layout.NodeIndex(node_name);
    if (node < 0) {
      return Status::InvalidArgument("--node " + std::string(node_name) +
                                     ": no such node; allowed: " + NodeNames(layout));
    }
  }
  // A systemd unit per local rank (gridsync-worker@<local rank>) knows its
  // node and local rank, not its global rank: the node's first rank + local.
  if (*rank < 0 && std::getenv("GRIDSYNC_LOCAL_RANK") != nullptr) {
    const int at = node >= 0 ? node : 0;
    if (node < 0 && layout.multi_host) {
      return Status::InvalidArgument(
          "GRIDSYNC_LOCAL_RANK needs the worker's node (--node or GRIDSYNC_NODE) in a cluster on "
          "several machines");
    }
    const int workers = layout.nodes[static_cast<size_t>(at)].workers;
    GRIDSYNC_ASSIGN_OR_RETURN(const int local,
                              IntFromEnv("GRIDSYNC_LOCAL_RANK", -1, 0, workers - 1));
    *rank = layout.FirstRank(at) + local;
  }
  if (*rank >= 0) {
    const int of_rank = d.NodeOf(*rank);
    if (node >= 0 && node != of_rank) {
      return Status::InvalidArgument(
          "rank " + std::to_string(*rank) + " belongs to node " +
          layout.nodes[static_cast<size_t>(of_rank)].name + ", not --node " +
          std::string(node_name) + "; allowed: ranks " + std::to_string(layout.FirstRank(node)) +
          ".." +
          std::to_string(layout.FirstRank(node) + layout.nodes[static_cast<size_t>(node)].workers -
                         1));
    }
    node = of_rank;
  }
  if (node < 0) {
    if (layout.multi_host) {
      return Status::InvalidArgument(
          "a worker of a cluster on several machines needs its rank (--rank or GRIDSYNC_RANK) or "
          "its node (--node) to know which address to use; allowed: --rank 0.." +
          std::to_string(d.world_size - 1) + ", or --node " + NodeNames(layout));
    }
    node = 0;  // one machine: every node has the same host
  }

  WorkerPlacement placement;
  placement.node = layout.nodes[static_cast<size_t>(node)].name;
  placement.local_rank = *rank >= 0 ? d.LocalRankOf(*rank) : -1;
  GRIDSYNC_ASSIGN_OR_RETURN(
      ProcessHost host, ResolveProcessHost(host_flag, layout.nodes[static_cast<size_t>(node)].host,
                                           layout.multi_host));
  placement.endpoint.hostname = host.host;
  placement.endpoint.cuda_device = placement.local_rank;
  placement.host_source = host.source;
  if (std::getenv("NCCL_SOCKET_IFNAME") == nullptr) {
    const char* ifname = std::getenv("GRIDSYNC_SOCKET_IFNAME");
    const std::string iface =
        ifname != nullptr && *ifname != '\0' ? ifname : InterfaceOf(host.host);
    if (!iface.empty()) setenv("NCCL_SOCKET_IFNAME", iface.c_str(), 0);
  }
  return placement;
}

}  // namespace gridsync
