// Host addresses: which strings name this machine only (loopback) or no
// machine at all (the unspecified 0.0.0.0 and ::), an interface's address,
// and the address one process binds and advertises.
//
// Every role (coordinator, shard, worker) resolves its address the same way,
// first match wins:
//   1. the --host flag of the process;
//   2. GRIDSYNC_HOST in its environment;
//   3. GRIDSYNC_SOCKET_IFNAME (an interface name, as NCCL_SOCKET_IFNAME): the
//      interface's first IPv4 address;
//   4. its node's `host` in the config (distributed.nodes[].host).
// A flag's or the environment's host must have a host's syntax, as the
// config's do (config_reader::HostSyntaxProblem).
// In a multi-host cluster the result must be reachable from other machines:
// a loopback or unspecified address is refused, naming where it came from.
//
// Thread safety: free functions; ResolveProcessHost reads the environment.
#pragma once

#include <string>
#include <string_view>

#include "common/config.h"
#include "common/status.h"

namespace gridsync {

// 127.0.0.0/8, ::1, "localhost" (and *.localhost): reachable from this machine only.
bool IsLoopbackHost(std::string_view host);
// 0.0.0.0 and ::: a bind-everything address, which names no peer.
bool IsUnspecifiedHost(std::string_view host);

// The first IPv4 address of interface `name` (NotFound naming the interfaces
// that exist when there is no such interface or it has no IPv4 address).
Result<std::string> InterfaceIpv4(std::string_view name);

// The interface that holds `address` ("" when none does, e.g. a host name).
std::string InterfaceOf(std::string_view address);

struct ProcessHost {
  std::string host;    // the address to bind and advertise
  std::string source;  // where it came from, for messages: "--host", "GRIDSYNC_HOST", ...
};

// This process's address (see the order above). `node_host` is its node's
// resolved host; `multi_host` whether the cluster spans machines.
// `config_source` names where the config's host came from, for messages
// and logs (a shard's may be ps.host).
Result<ProcessHost> ResolveProcessHost(
    std::string_view flag_host, const std::string& node_host, bool multi_host,
    std::string_view config_source = "the node's host in the config");

// The numeric address a socket binds for `host`: a numeric address in its
// canonical text ("127.1" and "127.0.0.1." read 127.0.0.1), and a host name
// resolved by getaddrinfo (its first IPv4 address, else its first IPv6). A
// name went to ZeroMQ's bind as it was, which reads a non-numeric address
// as an interface name ("cannot bind tcp://localhost:...: No such device").
// IOError naming the host when it does not resolve.
Result<std::string> BindAddressOf(std::string_view host);

// OK when the config's host names resolve on this machine, as its
// processes will resolve them at their start: master_addr always (every
// process connects to it), and, for a cluster wholly on this machine,
// ps.host (where shards run) and the nodes' hosts (its shards bind them). Numeric addresses
// need no lookup; a name is looked up (the resolver's own files and DNS).
// InvalidArgument naming the key and the resolver's answer otherwise: an
// unresolvable master_addr passed check-config and the coordinator then
// exited 1 ("cannot resolve bind address").
Status CheckHostsResolve(const Config& config);

// An integer from the environment variable `name` (the launcher's contract:
// GRIDSYNC_RANK, GRIDSYNC_SHARD...): `fallback` when unset, InvalidArgument
// naming the variable when it is not an integer in [lo, hi].
Result<int> IntFromEnv(const char* name, int fallback, int lo, int hi);

}  // namespace gridsync
