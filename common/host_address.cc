#include "common/host_address.h"

#include <arpa/inet.h>
#include <ifaddrs.h>
#include <net/if.h>
#include <netdb.h>
#include <netinet/in.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "common/config_reader.h"

namespace gridsync {
namespace {

std::string Join(const std::set<std::string>& names) {
  std::string out;
  for (const auto& n : names) out += (out.empty() ? "" : ", ") + n;
  return out.empty() ? "none" : out;
}

using IfAddrs = std::unique_ptr<ifaddrs, void (*)(ifaddrs*)>;

IfAddrs ListInterfaces() {
  ifaddrs* list = nullptr;
  if (getifaddrs(&list) != 0) list = nullptr;
  return IfAddrs(list, [](ifaddrs* p) {
    if (p != nullptr) freeifaddrs(p);
  });
}

std::string AddressText(const sockaddr* sa) {
  char text[INET6_ADDRSTRLEN] = {};
  if (sa->sa_family == AF_INET) {
    inet_ntop(AF_INET, &reinterpret_cast<const sockaddr_in*>(sa)->sin_addr, text, sizeof(text));
  } else if (sa->sa_family == AF_INET6) {
    inet_ntop(AF_INET6, &reinterpret_cast<const sockaddr_in6*>(sa)->sin6_addr, text, sizeof(text));
  }
  return text;
}

}  // namespace

namespace {

// A numeric address as the resolver takes it (ZeroMQ and Asio resolve
// through getaddrinfo): IPv4 in every form inet_aton reads ("0", "0x0",
// "127.1"), IPv6, an IPv4-mapped IPv6 address as its IPv4 one, and one
// trailing dot (a fully qualified name). A hostile probe passed "0" and
// "::ffff:0.0.0.0" for 0.0.0.0, which bound every interface.
enum class Numeric { kNone, kV4, kV6 };
Numeric ParseNumeric(std::string_view host, in_addr* v4, in6_addr* v6) {
  std::string s(host);
  if (!s.empty() && s.back() == '.') s.pop_back();
  if (s.empty()) return Numeric::kNone;
  if (inet_aton(s.c_str(), v4) != 0) return Numeric::kV4;
  if (inet_pton(AF_INET6, s.c_str(), v6) != 1) return Numeric::kNone;
  if (IN6_IS_ADDR_V4MAPPED(v6)) {
    std::memcpy(&v4->s_addr, v6->s6_addr + 12, 4);
    return Numeric::kV4;
  }
  return Numeric::kV6;
}

}  // namespace

Result<std::string> BindAddressOf(std::string_view host) {
  in_addr v4{};
  in6_addr v6{};
  char text[INET6_ADDRSTRLEN] = {};
  switch (ParseNumeric(host, &v4, &v6)) {
    case Numeric::kV4:
      return std::string(inet_ntop(AF_INET, &v4, text, sizeof(text)));
    case Numeric::kV6:
      return std::string(inet_ntop(AF_INET6, &v6, text, sizeof(text)));
    case Numeric::kNone:
      break;
  }
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* found = nullptr;
  const std::string name(host);
  if (const int rc = getaddrinfo(name.c_str(), nullptr, &hints, &found); rc != 0) {
    return Status::IOError("cannot resolve host '" + name +
                           "' to an address on this machine: " + gai_strerror(rc) +
                           "; allowed: a name this machine resolves, or its numeric address");
  }
  std::unique_ptr<addrinfo, void (*)(addrinfo*)> owned(found, freeaddrinfo);
  const addrinfo* pick = nullptr;
  for (const addrinfo* a = found; a != nullptr; a = a->ai_next) {
    if (a->ai_family == AF_INET) {
      pick = a;
      break;
    }
    if (a->ai_family == AF_INET6 && pick == nullptr) pick = a;
  }
  if (pick == nullptr)
    return Status::IOError("host '" + name + "' resolves to no IPv4 or IPv6 address");
  return AddressText(pick->ai_addr);
}

bool IsLoopbackHost(std::string_view host) {
  if (host == "localhost" || host == "ip6-localhost" || host == "ip6-loopback") return true;
  if (host.size() > 10 && host.substr(host.size() - 10) == ".localhost") return true;
  in_addr v4{};
  in6_addr v6{};
  switch (ParseNumeric(host, &v4, &v6)) {
    case Numeric::kV4:
      return (ntohl(v4.s_addr) >> 24) == 127;
    case Numeric::kV6:
      return IN6_IS_ADDR_LOOPBACK(&v6);
    case Numeric::kNone:
      return false;
  }
  return false;
}

bool IsUnspecifiedHost(std::string_view host) {
  if (host.empty() || host == "*") return true;
  in_addr v4{};
  in6_addr v6{};
  switch (ParseNumeric(host, &v4, &v6)) {
    case Numeric::kV4:
      return v4.s_addr == 0;
    case Numeric::kV6:
      return IN6_IS_ADDR_UNSPECIFIED(&v6);
    case Numeric::kNone:
      return false;
  }
  return false;
}

Result<std::string> InterfaceIpv4(std::string_view name) {
  IfAddrs list = ListInterfaces();
  std::set<std::string> seen;
  for (ifaddrs* a = list.get(); a != nullptr; a = a->ifa_next) {
    if (a->ifa_name == nullptr) continue;
    seen.insert(a->ifa_name);
    if (name != a->ifa_name || a->ifa_addr == nullptr || a->ifa_addr->sa_family != AF_INET)
      continue;
    return AddressText(a->ifa_addr);
  }
  if (seen.count(std::string(name)) != 0) {
    return Status::NotFound("interface " + std::string(name) + " has no IPv4 address");
  }
  return Status::NotFound("no interface named " + std::string(name) + "; this machine has " +
                          Join(seen));
}

std::string InterfaceOf(std::string_view address) {
  IfAddrs list = ListInterfaces();
  for (ifaddrs* a = list.get(); a != nullptr; a = a->ifa_next) {
    if (a->ifa_name == nullptr || a->ifa_addr == nullptr) continue;
    if (AddressText(a->ifa_addr) == address) return a->ifa_name;
  }
  return "";
}

Result<int> IntFromEnv(const char* name, int fallback, int lo, int hi) {
  const char* text = std::getenv(name);
  if (text == nullptr || *text == '\0') return fallback;
  char* end = nullptr;
  errno = 0;
  const long value = std::strtol(text, &end, 10);
  if (errno != 0 || *end != '\0' || value < lo || value > hi) {
    return Status::InvalidArgument(std::string(name) + "=" + text + ": not an integer in " +
                                   std::to_string(lo) + ".." + std::to_string(hi));
  }
  return static_cast<int>(value);
}

Result<ProcessHost> ResolveProcessHost(std::string_view flag_host, const std::string& node_host,
                                       bool multi_host, std::string_view config_source) {
  ProcessHost out;
  if (!flag_host.empty()) {
    out = {std::string(flag_host), "--host"};
  } else if (const char* env = std::getenv("GRIDSYNC_HOST"); env != nullptr && *env != '\0') {
    out = {env, "GRIDSYNC_HOST"};
  } else if (const char* ifname = std::getenv("GRIDSYNC_SOCKET_IFNAME");
             ifname != nullptr && *ifname != '\0') {
    auto address = InterfaceIpv4(ifname);
    if (!address.ok()) {
      return Status::InvalidArgument(
          "GRIDSYNC_SOCKET_IFNAME=" + std::string(ifname) + ": " + address.status().message() +
          "; allowed: an interface of this machine with an IPv4 address");
    }
    out = {*address, "GRIDSYNC_SOCKET_IFNAME=" + std::string(ifname)};
  } else {
    out = {node_host, std::string(config_source)};
  }
  // The config's host passed the config's rule; a flag or the environment
  // is held to the same one, so that "10.0.0.7:29500" or "tcp://..." is
  // named here rather than failing in ZeroMQ's bind or a peer's connect.
  if (out.source == "--host" || out.source == "GRIDSYNC_HOST") {
    if (std::string why = config_reader::HostSyntaxProblem(out.host); !why.empty()) {
      return Status::InvalidArgument(out.source + ": " + config_reader::Quote(out.host) + " is " +
                                     why + "; allowed: " + config_reader::kHostSyntax);
    }
  }
  if (IsUnspecifiedHost(out.host)) {
    return Status::InvalidArgument(out.source + ": '" + out.host +
                                   "' names no machine, so peers could not reach this process; "
                                   "allowed: an address of this machine that peers can reach");
  }
  if (multi_host && IsLoopbackHost(out.host)) {
    return Status::InvalidArgument(
        out.source + ": '" + out.host +
        "' is a loopback address, but this cluster spans several machines, whose processes could "
        "not reach it; allowed: an address of this machine on the cluster's network");
  }
  return out;
}

Status CheckHostsResolve(const Config& config) {
  std::vector<std::pair<std::string, std::string>> hosts = {
      {"distributed.master_addr", config.distributed.master_addr}};
  if (!config.layout.multi_host) {
    // (ps.host only where shards run and it places them.)
    if (config.ps.host_given && config.distributed.gradient_sync != GradientSyncMode::kNccl)
      hosts.push_back({"ps.host", config.ps.host});
    for (size_t n = 0; n < config.layout.nodes.size(); ++n) {
      hosts.push_back(
          {"distributed.nodes[" + std::to_string(n) + "].host", config.layout.nodes[n].host});
    }
  }
  std::set<std::string> looked_up;
  for (const auto& [key, host] : hosts) {
    if (host.empty() || !looked_up.insert(host).second) continue;
    if (auto address = BindAddressOf(host); !address.ok()) {
      return Status::InvalidArgument(key + ": " + address.status().message());
    }
  }
  return Status::OK();
}

}  // namespace gridsync
