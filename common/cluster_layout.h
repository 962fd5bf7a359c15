// ClusterLayout resolution: which machine every process of a cluster runs on
// and the address it binds and advertises, from one config that serves every
// node (the struct is in config.h, since Config carries it resolved).
//
// The rules:
//  - Either every node sets `host` or none does. None: one machine; every
//    node's host is 127.0.0.1 when master_addr is a loopback address, else
//    master_addr. An unspecified address (0.0.0.0, ::) is never a host.
//  - The cluster is multi-host when the nodes name more than one host, or
//    its one host is not the coordinator's (master_addr, unless that is a
//    loopback address: then the coordinator is on the same machine). Then master_addr
//    and every node host must be reachable from other machines (not
//    loopback), and ps.host is refused: shards are placed on nodes.
//  - Shards (gradient_sync ps or hybrid): when any node sets `shards`, the
//    counts (unset = 0) must add up to ps.shards and are dealt in node order;
//    otherwise a multi-host cluster puts shard s on node s % nodes (every
//    machine serves a share, as BytePS colocates servers), and one machine
//    puts them all on ps.host. A shard listens on its node's host, port
//    ps.base_port + s (or master_port + 1 + s when base_port is 0).
//  - The coordinator runs on the first node whose host is master_addr (one
//    machine: node 0); -1 when none is (it then runs elsewhere).
//
// Thread safety: a pure function of the config.
#pragma once

#include <string>
#include <vector>

#include "common/config.h"

namespace gridsync {

struct ConfigProblem {
  std::string key;      // "distributed.nodes[1].host"
  std::string problem;  // what is wrong
  std::string allowed;  // what would be accepted
};

// The layout of `config`, whose sections are already valid on their own.
// Problems are appended to *problems; the layout is meaningful only when
// none were.
ClusterLayout ResolveLayout(const Config& config, std::vector<ConfigProblem>* problems);

// The ports of `config` with its layout resolved: no shard on the
// coordinator's machine on its port (master_port), and the metrics
// endpoints' range (metrics.port, one more per shard and per worker) clear
// of both; for the metrics every machine's ports count (each machine's
// processes take their offsets from the same metrics.port). Problems are appended to *problems.
void CheckPorts(const Config& config, std::vector<ConfigProblem>* problems);

// A process's --metrics-port flag against the cluster's servers on its
// machine (`host`, as the config names it; any host in a single-host
// config): the coordinator's master_port and the shards' ports. The
// config's metrics.port is checked against them (CheckPorts); the flag was
// not, so the second bind failed once the cluster had started (a hostile
// probe). InvalidArgument naming the port's owner; OK for 0 and -1.
Status CheckMetricsPortFlag(const Config& config, int port, const std::string& host);

// A note when the ports `config` listens on (the coordinator's, the
// shards', the metrics endpoints') fall in this host's ephemeral range
// (`range_file`: Linux's ip_local_port_range, "low high"), where the
// kernel picks the source port of every outgoing connection: a worker's
// connection can hold a shard's port before the shard binds it ("Address
// already in use", seen in a probe at master_port 47620). A note, not a
// refusal: the ports usually stay free, and the range is this host's
// only. Empty when the file cannot be read or no port falls in it.
std::vector<std::string> EphemeralPortNotes(
    const Config& config, const std::string& range_file = "/proc/sys/net/ipv4/ip_local_port_range");

}  // namespace gridsync
