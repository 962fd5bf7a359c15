#include "common/cluster_layout.h"

#include <algorithm>
#include <fstream>
#include <set>
#include <string>
#include <utility>

#include "common/host_address.h"

namespace gridsync {

std::string ShardPlacement::Endpoint() const {
  // ZeroMQ wants IPv6 literals in brackets.
  const bool v6 = host.find(':') != std::string::npos;
  return "tcp://" + (v6 ? "[" + host + "]" : host) + ":" + std::to_string(port);
}

int ClusterLayout::NodeIndex(std::string_view name) const {
  for (size_t n = 0; n < nodes.size(); ++n) {
    if (nodes[n].name == name) return static_cast<int>(n);
  }
  return -1;
}

int ClusterLayout::FirstRank(int n) const {
  int first = 0;
  for (int i = 0; i < n && i < static_cast<int>(nodes.size()); ++i) first += nodes[i].workers;
  return first;
}

ClusterLayout ResolveLayout(const Config& config, std::vector<ConfigProblem>* problems) {
  const DistributedConfig& d = config.distributed;
  ClusterLayout layout;
  layout.nodes = d.ResolvedNodes();
  auto node_key = [&](size_t n, const char* key) {
    return "distributed.nodes[" + std::to_string(n) + "]." + key;
  };
  const size_t count = layout.nodes.size();

  size_t with_host = 0;
  for (const auto& node : layout.nodes) with_host += node.host.empty() ? 0 : 1;
  if (with_host != 0 && with_host != count) {
    for (size_t n = 0; n < count; ++n) {
      if (!layout.nodes[n].host.empty()) continue;
      problems->push_back({node_key(n, "host"), "missing while other nodes set one",
                           "a host for every node (machines of one cluster), or for none (every "
                           "process on this machine)"});
    }
    return layout;
  }
  if (IsUnspecifiedHost(d.master_addr)) {
    problems->push_back(
        {"distributed.master_addr",
         "'" + d.master_addr + "' names no machine, so nobody could reach the coordinator",
         "the coordinator's address (a loopback address when every process runs "
         "on one machine)"});
  }
  if (with_host == 0) {
    const std::string host = IsLoopbackHost(d.master_addr) ? "127.0.0.1" : d.master_addr;
    for (auto& node : layout.nodes) node.host = host;
  }
  std::set<std::string> hosts;
  for (const auto& node : layout.nodes) hosts.insert(node.host);
  // A loopback master_addr means "the coordinator is on this machine": with
  // one node host, that is still one machine.
  layout.multi_host =
      hosts.size() > 1 || (!IsLoopbackHost(d.master_addr) && *hosts.begin() != d.master_addr);

  // Named in the loopback problems below, built once (a config of 20,000
  // loopback nodes built it per node: gigabytes) and cut short.
  std::string all_hosts;
  size_t listed = 0;
  for (const auto& h : hosts) {
    if (listed == 8) {
      all_hosts += " and " + std::to_string(hosts.size() - listed) + " more";
      break;
    }
    all_hosts += (all_hosts.empty() ? "" : ", ") + h;
    ++listed;
  }
  for (size_t n = 0; n < count; ++n) {
    const std::string& host = layout.nodes[n].host;
    // A host taken from master_addr (no node sets one) is master_addr's
    // problem, said above, not a node's.
    if (IsUnspecifiedHost(host) && with_host > 0) {
      problems->push_back({node_key(n, "host"),
                           "'" + host + "' names no machine: it is what other processes connect to",
                           "the node's address on the cluster's network (bind-all is a "
                           "process flag: --bind 0.0.0.0)"});
    } else if (layout.multi_host && IsLoopbackHost(host)) {
      problems->push_back({node_key(n, "host"),
                           "'" + host +
                               "' is a loopback address in a cluster of several machines "
                               "(hosts: " +
                               all_hosts + "), so the other machines could not reach this node",
                           "the node's address on the cluster's network"});
    }
  }
  if (layout.multi_host && IsLoopbackHost(d.master_addr)) {
    problems->push_back({"distributed.master_addr",
                         "'" + d.master_addr +
                             "' is a loopback address, but the nodes are on "
                             "other machines, which could not reach the coordinator",
                         "the coordinator's address on the cluster's network"});
  }

  layout.coordinator_node = layout.multi_host ? -1 : 0;
  for (size_t n = 0; n < count && layout.multi_host; ++n) {
    if (layout.nodes[n].host == d.master_addr) {
      layout.coordinator_node = static_cast<int>(n);
      break;
    }
  }

  // Shards.
  size_t with_shards = 0;
  int placed = 0;
  for (const auto& node : layout.nodes) {
    with_shards += node.shards >= 0 ? 1 : 0;
    placed += node.shards > 0 ? node.shards : 0;
  }
  if (d.gradient_sync == GradientSyncMode::kNccl) {
    for (size_t n = 0; n < count; ++n) {
      if (layout.nodes[n].shards > 0) {
        problems->push_back({node_key(n, "shards"),
                             std::to_string(layout.nodes[n].shards) +
                                 " has no effect: gradient_sync \"nccl\" runs no PS shards",
                             "0 or leave it out, or gradient_sync \"ps\" or \"hybrid\""});
      }
    }
    return layout;
  }
  // Shards placed on several machines, or by the nodes on one, listen on
  // their node's host: ps.host would put them all on one address, or do
  // nothing.
  if (config.ps.host_given && (layout.multi_host || with_shards > 0)) {
    problems->push_back(
        {"ps.host",
         "'" + config.ps.host +
             (layout.multi_host
                  ? "' would put every shard on one address, but the cluster spans several "
                    "machines"
                  : "' has no effect: distributed.nodes[].shards places the shards, and each "
                    "listens on its node's host"),
         layout.multi_host ? "leave ps.host out; shards listen on their node's host "
                             "(distributed.nodes[].shards places them)"
                           : "leave ps.host out (set the node's host), or leave the nodes' "
                             "shards out"});
  }
  std::vector<int> shard_node;
  if (with_shards > 0) {
    if (placed != config.ps.shards) {
      problems->push_back({"distributed.nodes",
                           "shards add up to " + std::to_string(placed) + ", but ps.shards is " +
                               std::to_string(config.ps.shards),
                           "node shard counts (unset counts as 0) that sum to ps.shards"});
      return layout;
    }
    for (size_t n = 0; n < count; ++n) {
      for (int s = 0; s < layout.nodes[n].shards; ++s) shard_node.push_back(static_cast<int>(n));
    }
  } else {
    for (int s = 0; s < config.ps.shards; ++s) {
      shard_node.push_back(layout.multi_host ? s % static_cast<int>(count) : 0);
    }
  }
  const bool one_address = !layout.multi_host && with_shards == 0;
  if (one_address && (config.ps.host_given || with_host == 0) &&
      IsUnspecifiedHost(config.ps.host)) {
    problems->push_back(
        {"ps.host",
         "'" + config.ps.host + "' names no machine: it is the address the workers connect to",
         "the shards' address on this machine, e.g. 127.0.0.1 (bind-all is a "
         "process flag: --bind 0.0.0.0)"});
    return layout;
  }
  for (int s = 0; s < config.ps.shards; ++s) {
    ShardPlacement placement;
    placement.node = shard_node[static_cast<size_t>(s)];
    placement.host = one_address && (config.ps.host_given || with_host == 0)
                         ? config.ps.host
                         : layout.nodes[static_cast<size_t>(placement.node)].host;
    placement.port = config.ps.base_port > 0 ? config.ps.base_port + s : d.master_port + 1 + s;
    if (placement.port > 65535) {
      problems->push_back(
          {config.ps.base_port > 0 ? "ps.base_port" : "distributed.master_port",
           "shard " + std::to_string(s) + " would listen on port " + std::to_string(placement.port),
           config.ps.base_port > 0
               ? "ports up to 65535: a base port of at most " +
                     std::to_string(65535 - config.ps.shards + 1)
               : "ports up to 65535: shards listen from master_port + 1, so a master_port of "
                 "at most " +
                     std::to_string(65535 - config.ps.shards) + " (or ps.base_port)"});
      break;
    }
    layout.shards.push_back(std::move(placement));
  }
  return layout;
}

void CheckPorts(const Config& config, std::vector<ConfigProblem>* problems) {
  const DistributedConfig& d = config.distributed;
  const char* shard_key = config.ps.base_port > 0 ? "ps.base_port" : "distributed.master_port";
  for (size_t s = 0; s < config.layout.shards.size(); ++s) {
    // Across machines only the coordinator's own (master_addr) can clash.
    const bool coordinators_machine =
        !config.layout.multi_host || config.layout.shards[s].host == d.master_addr;
    if (coordinators_machine && config.layout.shards[s].port == d.master_port) {
      problems->push_back({shard_key,
                           "shard " + std::to_string(s) + " would listen on port " +
                               std::to_string(d.master_port) +
                               ", distributed.master_port, where the coordinator listens",
                           "a ps.base_port whose ps.shards ports leave master_port out, or 0 "
                           "(shards at master_port + 1 on)"});
      return;
    }
  }
  const int m = config.metrics.port;
  if (m <= 0) return;
  const int shards = static_cast<int>(config.layout.shards.size());
  const int last = m + shards + d.world_size;
  std::vector<int> taken = {d.master_port};
  for (const auto& shard : config.layout.shards) taken.push_back(shard.port);
  for (size_t i = 0; i < taken.size(); ++i) {
    if (taken[i] < m || taken[i] > last) continue;
    problems->push_back({"metrics.port",
                         std::to_string(m) + ".." + std::to_string(last) +
                             " (the coordinator's, then one per " +
                             "shard and per worker) takes port " + std::to_string(taken[i]) + ", " +
                             (i == 0 ? std::string("distributed.master_port")
                                     : "shard " + std::to_string(i - 1) + "'s"),
                         "0 (off) or a range clear of master_port and the shards' ports"});
    return;
  }
}

Status CheckMetricsPortFlag(const Config& config, int port, const std::string& host) {
  const DistributedConfig& d = config.distributed;
  if (port <= 0 || !d.enable) return Status::OK();
  auto here = [&](const std::string& h) { return !config.layout.multi_host || h == host; };
  std::string whose;
  if (here(d.master_addr) && port == d.master_port)
    whose = "the coordinator's (distributed.master_port)";
  for (size_t s = 0; whose.empty() && s < config.layout.shards.size(); ++s) {
    const ShardPlacement& shard = config.layout.shards[s];
    if (here(shard.host) && shard.port == port) whose = "shard " + std::to_string(s) + "'s";
  }
  if (whose.empty()) return Status::OK();
  return Status::InvalidArgument("--metrics-port " + std::to_string(port) + ": the port is " +
                                 whose +
                                 " on this machine; allowed: a port no server of the "
                                 "cluster listens on here, or 0 (no metrics endpoint)");
}

std::vector<std::string> EphemeralPortNotes(const Config& config, const std::string& range_file) {
  std::ifstream in(range_file);
  long low = 0, high = 0;
  if (!(in >> low >> high) || low <= 0 || high < low) return {};
  const DistributedConfig& d = config.distributed;
  if (!d.enable) return {};
  std::vector<std::pair<int, std::string>> ports = {{d.master_port, "distributed.master_port"}};
  for (size_t s = 0; s < config.layout.shards.size(); ++s)
    ports.emplace_back(config.layout.shards[s].port, "shard " + std::to_string(s));
  if (config.metrics.port > 0) {
    const int last =
        config.metrics.port + static_cast<int>(config.layout.shards.size()) + d.world_size;
    for (int p = config.metrics.port; p <= last; ++p) ports.emplace_back(p, "metrics");
  }
  std::vector<int> inside;
  std::set<std::string> whose;
  for (const auto& [port, name] : ports) {
    if (port < low || port > high) continue;
    inside.push_back(port);
    whose.insert(name.starts_with("shard ") ? "the shards'" : name);
  }
  if (inside.empty()) return {};
  std::sort(inside.begin(), inside.end());
  std::string names;
  for (const auto& w : whose) names += (names.empty() ? "" : ", ") + w;
  return {"ports " + std::to_string(inside.front()) + ".." + std::to_string(inside.back()) + " (" +
          names + ") lie in this host's ephemeral range " + std::to_string(low) + "-" +
          std::to_string(high) + " (" + range_file +
          "), from which every outgoing connection takes its source port: one may hold a "
          "server's port before it binds it (\"Address already in use\"); safer: ports below " +
          std::to_string(low) + ", or reserved (sysctl net.ipv4.ip_local_reserved_ports)"};
}

}  // namespace gridsync
