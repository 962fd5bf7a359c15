// Where every process of a cluster lives (common/cluster_layout.h) and how a
// process picks its address (common/host_address.h): node hosts, shard
// placement, the coordinator's node, and every refusal check-config shares
// with the binaries.
#include "common/cluster_layout.h"

#include <gtest/gtest.h>
#include <spdlog/fmt/fmt.h>
#include <stdlib.h>

#include <fstream>
#include <string>

#include "common/cli_parse.h"
#include "common/config.h"
#include "common/host_address.h"

namespace gridsync {
namespace {

Config ParseOk(const std::string& text) {
  auto c = Config::Parse(text, "test");
  EXPECT_TRUE(c.ok()) << c.status().ToString();
  return c.ok() ? *c : Config{};
}

std::string ErrorOf(const std::string& text) {
  auto c = Config::Parse(text, "test");
  EXPECT_FALSE(c.ok()) << "accepted: " << text;
  return c.ok() ? "" : c.status().message();
}

bool Contains(const std::string& s, const std::string& part) {
  return s.find(part) != std::string::npos;
}

std::string TwoHosts(const std::string& sync, const std::string& extra_nodes_a = "",
                     const std::string& extra_nodes_b = "", const std::string& more = "") {
  // Several machines: CURVE is on by default, so the keys folder is named.
  return R"({"distributed": {"enable": true, "world_size": 3, "master_addr": "10.0.0.1",
      "gradient_sync": ")" +
         sync + R"(", "nodes": [
      {"name": "a", "host": "10.0.0.1", "workers": 1)" +
         extra_nodes_a + R"(},
      {"name": "b", "host": "10.0.0.2", "workers": 2)" +
         extra_nodes_b + R"(}]},
      "security": {"keys_dir": "/etc/gridsync/keys"})" +
         more + "}";
}

TEST(HostAddressTest, LoopbackAndUnspecified) {
  // Every spelling the resolver takes (a hostile probe bound every
  // interface with ps.host "0" and "::ffff:0.0.0.0").
  for (const char* h : {"127.0.0.1", "127.1.2.3", "::1", "localhost", "node.localhost", "127.1",
                        "0x7f000001", "::ffff:127.0.0.1", "127.0.0.1."}) {
    EXPECT_TRUE(IsLoopbackHost(h)) << h;
  }
  for (const char* h : {"10.0.0.1", "192.168.1.100", "::2", "example.org", "0.0.0.0"}) {
    EXPECT_FALSE(IsLoopbackHost(h)) << h;
  }
  for (const char* h : {"0.0.0.0", "::", "", "*", "0", "0x0", "00", "0.0", "0.0.0.0.",
                        "::ffff:0.0.0.0", "0:0:0:0:0:0:0:0"}) {
    EXPECT_TRUE(IsUnspecifiedHost(h)) << h;
  }
  EXPECT_FALSE(IsUnspecifiedHost("10.0.0.1"));
}

// What a shard binds: numbers in canonical text, names resolved (ZeroMQ
// read "localhost" as an interface name and failed with "No such device").
TEST(HostAddressTest, BindAddressIsNumeric) {
  EXPECT_EQ(BindAddressOf("127.0.0.1").value(), "127.0.0.1");
  EXPECT_EQ(BindAddressOf("127.1").value(), "127.0.0.1");
  EXPECT_EQ(BindAddressOf("127.0.0.1.").value(), "127.0.0.1");
  EXPECT_EQ(BindAddressOf("::1").value(), "::1");
  auto local = BindAddressOf("localhost");
  ASSERT_TRUE(local.ok()) << local.status().ToString();
  EXPECT_TRUE(*local == "127.0.0.1" || *local == "::1") << *local;
  // Refused by the resolver itself (a name that needs DNS would send a
  // query off this machine).
  auto none = BindAddressOf("");
  ASSERT_FALSE(none.ok());
  EXPECT_NE(none.status().message().find("cannot resolve host ''"), std::string::npos)
      << none.status().ToString();
}

TEST(HostAddressTest, InterfaceAddressesAndProcessOverrides) {
  auto lo = InterfaceIpv4("lo");
  ASSERT_TRUE(lo.ok()) << lo.status().ToString();
  EXPECT_EQ(*lo, "127.0.0.1");
  EXPECT_EQ(InterfaceOf("127.0.0.1"), "lo");
  auto missing = InterfaceIpv4("no-such-if0");
  ASSERT_FALSE(missing.ok());
  EXPECT_TRUE(Contains(missing.status().message(), "lo")) << missing.status().ToString();

  unsetenv("GRIDSYNC_HOST");
  unsetenv("GRIDSYNC_SOCKET_IFNAME");
  auto node = ResolveProcessHost("", "10.0.0.2", true);
  ASSERT_TRUE(node.ok());
  EXPECT_EQ(node->host, "10.0.0.2");
  auto flag = ResolveProcessHost("10.0.0.9", "10.0.0.2", true);
  EXPECT_EQ(flag->host, "10.0.0.9");
  EXPECT_EQ(flag->source, "--host");
  setenv("GRIDSYNC_HOST", "10.0.0.7", 1);
  EXPECT_EQ(ResolveProcessHost("", "10.0.0.2", true)->host, "10.0.0.7");
  unsetenv("GRIDSYNC_HOST");
  setenv("GRIDSYNC_SOCKET_IFNAME", "lo", 1);
  EXPECT_EQ(ResolveProcessHost("", "10.0.0.2", false)->host, "127.0.0.1");
  // A loopback interface in a multi-host cluster is refused, naming its source.
  auto refused = ResolveProcessHost("", "10.0.0.2", true);
  ASSERT_FALSE(refused.ok());
  EXPECT_TRUE(Contains(refused.status().message(), "GRIDSYNC_SOCKET_IFNAME=lo"));
  EXPECT_TRUE(Contains(refused.status().message(), "loopback"));
  setenv("GRIDSYNC_SOCKET_IFNAME", "no-such-if0", 1);
  EXPECT_FALSE(ResolveProcessHost("", "10.0.0.2", false).ok());
  unsetenv("GRIDSYNC_SOCKET_IFNAME");
  EXPECT_FALSE(ResolveProcessHost("0.0.0.0", "10.0.0.2", false).ok());
  // A flag or GRIDSYNC_HOST is held to the config's host syntax, naming
  // its source and what is allowed.
  for (const char* bad : {"10.0.0.9:29500", "tcp://10.0.0.9", "not a host", "a..b"}) {
    auto refused_flag = ResolveProcessHost(bad, "10.0.0.2", false);
    ASSERT_FALSE(refused_flag.ok()) << bad;
    EXPECT_TRUE(Contains(refused_flag.status().message(), "--host: "))
        << refused_flag.status().ToString();
    EXPECT_TRUE(Contains(refused_flag.status().message(), "allowed: an IP address"));
    setenv("GRIDSYNC_HOST", bad, 1);
    auto refused_env = ResolveProcessHost("", "10.0.0.2", false);
    unsetenv("GRIDSYNC_HOST");
    ASSERT_FALSE(refused_env.ok()) << bad;
    EXPECT_TRUE(Contains(refused_env.status().message(), "GRIDSYNC_HOST: "));
  }
  EXPECT_TRUE(Contains(ResolveProcessHost("10.0.0.9:29500", "", false).status().message(),
                       "a host with a port"));
  EXPECT_EQ(ResolveProcessHost("gridsync_ps_1", "10.0.0.2", true)->host, "gridsync_ps_1");
}

// --host and --bind take what the config's hosts take (0.0.0.0 and :: are
// a bind's; the advertised host refuses them later, naming why), and refuse
// the rest at parse time, an empty value included (it fell back silently).
TEST(ClusterLayoutTest, HostFlagsHaveAHostsSyntax) {
  const auto parse = [](const std::string& value) -> std::string {
    CLI::App app;
    std::string bind;
    app.add_option("--bind", bind)->check(HostSyntax());
    std::vector<std::string> args = {value, "--bind"};  // CLI11 reads them from the back
    try {
      app.parse(args);
    } catch (const CLI::ParseError& e) {
      return e.what();
    }
    EXPECT_EQ(bind, value);
    return "";
  };
  for (const char* good : {"0.0.0.0", "::", "fe80::1%lo", "::1%1", "0x1.example", "gridsync_ps_1",
                           "localhost.", "10.0.0.7", "node-3.cluster.local"}) {
    EXPECT_EQ(parse(good), "") << good;
  }
  const std::vector<std::pair<std::string, std::string>> bad = {
      {"", "is empty"},
      {"0.0.0.0:1", "a host with a port"},
      {"[::1]", "without them"},
      {"tcp://10.0.0.7", "an endpoint URL"},
      {std::string(254, 'a'), "too long (254 characters"},
      {std::string(63, 'a') + "." + std::string(63, 'b') + "." + std::string(63, 'c') + "." +
           std::string(63, 'd') + ".eeee",
       "too long"},
      {"a..b", "labels between dots"},
      // Numeric forms the resolver reads that the decimal check did not.
      {"0x7f.1", "in a form other than four decimal numbers"},
      {"0x7f000001", "in a form other than four decimal numbers"},
      // A zone on an address that is not link-local: the coordinator bound
      // it; every client's lookup failed until its timeout.
      {"::1%lo", "a zone by name is only for fe80::/10"},
      {"0x7f000001.", "in a form other than four decimal numbers"}};
  for (const auto& [value, why] : bad) {
    const std::string error = parse(value);
    EXPECT_TRUE(Contains(error, why)) << value.substr(0, 40) << ": " << error;
    EXPECT_TRUE(Contains(error, "allowed: an IP address")) << error;
  }
}

TEST(ClusterLayoutTest, OneMachineByDefault) {
  const Config c =
      ParseOk(R"({"distributed": {"enable": true, "world_size": 2, "gradient_sync": "ps"},
                               "ps": {"shards": 3}})");
  EXPECT_FALSE(c.layout.multi_host);
  ASSERT_EQ(c.layout.nodes.size(), 1u);
  EXPECT_EQ(c.layout.nodes[0].host, "127.0.0.1");
  ASSERT_EQ(c.layout.shards.size(), 3u);
  EXPECT_EQ(c.layout.shards[2].Endpoint(), "tcp://127.0.0.1:29503");
  EXPECT_EQ(c.layout.coordinator_node, 0);
  // The seed configs name a remote master: one machine, the master's address.
  const Config seed = ParseOk(R"({"distributed": {"enable": true, "world_size": 4,
                                  "master_addr": "192.168.1.100"}})");
  EXPECT_FALSE(seed.layout.multi_host);
  EXPECT_EQ(seed.layout.nodes[0].host, "192.168.1.100");
  EXPECT_TRUE(seed.layout.shards.empty());  // nccl
}

TEST(ClusterLayoutTest, TwoHostsSpreadShardsAndFindTheCoordinator) {
  const Config c = ParseOk(TwoHosts("ps", "", "", R"(, "ps": {"shards": 3, "base_port": 31000})"));
  EXPECT_TRUE(c.layout.multi_host);
  EXPECT_EQ(c.layout.coordinator_node, 0);
  ASSERT_EQ(c.layout.shards.size(), 3u);
  EXPECT_EQ(c.layout.shards[0].Endpoint(), "tcp://10.0.0.1:31000");
  EXPECT_EQ(c.layout.shards[1].Endpoint(), "tcp://10.0.0.2:31001");
  EXPECT_EQ(c.layout.shards[2].Endpoint(), "tcp://10.0.0.1:31002");
  EXPECT_EQ(c.layout.FirstRank(1), 1);
  EXPECT_EQ(c.layout.NodeIndex("b"), 1);
  EXPECT_EQ(c.layout.NodeIndex("c"), -1);
  // Explicit placement, dealt in node order; it survives the resolved dump.
  const Config placed = ParseOk(
      TwoHosts("hybrid", R"(, "shards": 0)", R"(, "shards": 2)", R"(, "ps": {"shards": 2})"));
  EXPECT_EQ(placed.layout.shards[0].node, 1);
  EXPECT_EQ(placed.layout.shards[1].host, "10.0.0.2");
  auto again = Config::Parse(placed.ToJson().dump(), "resolved");
  ASSERT_TRUE(again.ok()) << again.status().ToString();
  EXPECT_EQ(again->layout.shards[1].node, 1);
}

TEST(ClusterLayoutTest, RefusesWhatOtherMachinesCouldNotReach) {
  const std::string loop = ErrorOf(R"({"distributed": {"enable": true, "world_size": 2,
      "master_addr": "10.0.0.1", "nodes": [{"name": "a", "host": "127.0.0.1"},
      {"name": "b", "host": "10.0.0.2"}]}})");
  EXPECT_TRUE(Contains(loop, "distributed.nodes[0].host")) << loop;
  EXPECT_TRUE(Contains(loop, "loopback")) << loop;
  const std::string master = ErrorOf(R"({"distributed": {"enable": true, "world_size": 2,
      "master_addr": "127.0.0.1", "nodes": [{"name": "a", "host": "10.0.0.1"},
      {"name": "b", "host": "10.0.0.2"}]}})");
  EXPECT_TRUE(Contains(master, "distributed.master_addr")) << master;
  const std::string any = ErrorOf(R"({"distributed": {"enable": true, "world_size": 1,
      "nodes": [{"name": "a", "host": "0.0.0.0"}]}})");
  EXPECT_TRUE(Contains(any, "names no machine")) << any;
  // master_addr '::' with no node hosts: said of master_addr, once (a node
  // whose host was taken from it was blamed as well).
  const std::string unspecified =
      ErrorOf(R"({"distributed": {"enable": true, "world_size": 1, "master_addr": "::"}})");
  EXPECT_TRUE(Contains(unspecified, "distributed.master_addr: '::' names no machine"))
      << unspecified;
  EXPECT_FALSE(Contains(unspecified, "nodes[0].host")) << unspecified;
  const std::string half = ErrorOf(R"({"distributed": {"enable": true, "world_size": 2,
      "master_addr": "10.0.0.1", "nodes": [{"name": "a", "host": "10.0.0.1"}, {"name": "b"}]}})");
  EXPECT_TRUE(Contains(half, "distributed.nodes[1].host")) << half;
  const std::string ps_host = ErrorOf(TwoHosts("ps", "", "", R"(, "ps": {"host": "10.0.0.1"})"));
  EXPECT_TRUE(Contains(ps_host, "ps.host")) << ps_host;
  const std::string sum =
      ErrorOf(TwoHosts("ps", R"(, "shards": 1)", "", R"(, "ps": {"shards": 2})"));
  EXPECT_TRUE(Contains(sum, "add up to 1")) << sum;
  const std::string nccl = ErrorOf(TwoHosts("nccl", R"(, "shards": 1)"));
  EXPECT_TRUE(Contains(nccl, "distributed.nodes[0].shards")) << nccl;
  const std::string port = ErrorOf(R"({"distributed": {"enable": true, "gradient_sync": "ps"},
      "ps": {"shards": 4, "base_port": 65534}})");
  EXPECT_TRUE(Contains(port, "ps.base_port")) << port;
  // One machine on a real address with the coordinator on loopback is fine.
  const Config local = ParseOk(R"({"distributed": {"enable": true, "world_size": 2,
      "master_addr": "127.0.0.1", "nodes": [{"name": "a", "host": "10.0.0.1"},
      {"name": "b", "host": "10.0.0.1"}]}})");
  EXPECT_FALSE(local.layout.multi_host);
  // On one machine too, shards placed by the nodes listen on their node's
  // host: a ps.host beside them did nothing (a review).
  const std::string placed = ErrorOf(R"({"distributed": {"enable": true, "world_size": 2,
      "gradient_sync": "ps", "master_addr": "127.0.0.1", "nodes": [{"name": "a",
      "host": "127.0.0.1", "workers": 2, "shards": 2}]}, "ps": {"shards": 2,
      "host": "127.0.0.2"}})");
  EXPECT_TRUE(Contains(placed, "ps.host: '127.0.0.2' has no effect")) << placed;
  const Config placed_alone = ParseOk(R"({"distributed": {"enable": true, "world_size": 2,
      "gradient_sync": "ps", "master_addr": "127.0.0.1", "nodes": [{"name": "a",
      "host": "127.0.0.1", "workers": 2, "shards": 2}]}, "ps": {"shards": 2}})");
  EXPECT_EQ(placed_alone.layout.shards[1].host, "127.0.0.1");
}

// A hostile probe: ps.host 0.0.0.0 passed check-config and the shards then
// refused it, blaming "the node's host"; a ps.base_port on master_port and
// metrics ports on a shard's passed and failed to bind at run time, while a
// metrics range clear of the shards (at ps.base_port) was refused.
TEST(ClusterLayoutTest, PortsAndTheShardsAddressAreCheckedAsTheBinariesUseThem) {
  const std::string local = R"({"distributed": {"enable": true, "gradient_sync": "ps",
      "master_port": 41000}, "ps": {"shards": 2)";
  for (const char* host : {"0.0.0.0", "::"}) {
    const std::string any = ErrorOf(local + R"(, "host": ")" + host + R"("}})");
    EXPECT_TRUE(Contains(any, "ps.host: '" + std::string(host) + "' names no machine")) << any;
  }
  const Config v6 = ParseOk(local + R"(, "host": "::1"}})");
  EXPECT_EQ(v6.layout.shards[0].Endpoint(), "tcp://[::1]:41001");
  const std::string bracketed = ErrorOf(local + R"(, "host": "[::1]"}})");
  EXPECT_TRUE(Contains(bracketed, "ps.host: brackets in \"[::1]\"")) << bracketed;
  // Across machines only a shard on the coordinator's can take its port.
  const Config apart = ParseOk(TwoHosts("ps", R"(, "shards": 0)", R"(, "shards": 2)",
                                        R"(, "ps": {"shards": 2, "base_port": 29500})"));
  EXPECT_EQ(apart.layout.shards[0].host, "10.0.0.2");
  const std::string on_master = ErrorOf(local + R"(, "base_port": 40999}})");
  EXPECT_TRUE(Contains(on_master, "ps.base_port: shard 1 would listen on port 41000")) << on_master;
  // Past 65535: the bound named is the key's own (master_port's was given
  // as base_port's, one too high).
  const std::string high = ErrorOf(
      R"({"distributed": {"enable": true, "world_size": 2, "gradient_sync": "ps",
          "master_port": 65534}, "ps": {"shards": 2}})");
  EXPECT_TRUE(Contains(high, "distributed.master_port: shard 1 would listen on port 65536"))
      << high;
  EXPECT_TRUE(Contains(high, "a master_port of at most 65533")) << high;
  const std::string high_base = ErrorOf(local + R"(, "base_port": 65535}})");
  EXPECT_TRUE(Contains(high_base, "a base port of at most 65534")) << high_base;
  const std::string metrics =
      ErrorOf(local + R"(, "base_port": 50000}, "metrics": {"port": 49998}})");
  EXPECT_TRUE(Contains(metrics, "metrics.port: 49998..50001")) << metrics;
  EXPECT_TRUE(Contains(metrics, "takes port 50000, shard 0's")) << metrics;
  const std::string coordinator = ErrorOf(local + R"(}, "metrics": {"port": 40998}})");
  EXPECT_TRUE(Contains(coordinator, "takes port 41000, distributed.master_port")) << coordinator;
  // Clear of the shards, which are not after master_port here.
  const Config clear = ParseOk(local + R"(, "base_port": 50000}, "metrics": {"port": 41001}})");
  EXPECT_EQ(clear.metrics.port, 41001);
}

// Ports in the host's ephemeral range are noted (a worker's outgoing
// connection once took a shard's port first), against a range file of the
// test's own; outside it, or with no readable file, nothing is said.
TEST(ClusterLayoutTest, PortsInTheEphemeralRangeAreNoted) {
  const std::string dir = ::testing::TempDir();
  const std::string range = dir + "/port_range";
  { std::ofstream(range) << "32768\t60999\n"; }
  const Config inside = ParseOk(R"({"distributed": {"enable": true, "world_size": 2,
      "master_port": 47620, "gradient_sync": "ps"}, "ps": {"shards": 2}})");
  const auto notes = EphemeralPortNotes(inside, range);
  ASSERT_EQ(notes.size(), 1u);
  EXPECT_TRUE(Contains(notes[0], "ports 47620..47622 (distributed.master_port, the shards')"))
      << notes[0];
  EXPECT_TRUE(Contains(notes[0], "ephemeral range 32768-60999")) << notes[0];
  const Config below = ParseOk(R"({"distributed": {"enable": true, "world_size": 2,
      "master_port": 29500}, "ps": {"shards": 2}})");
  EXPECT_TRUE(EphemeralPortNotes(below, range).empty());
  const Config metrics = ParseOk(R"({"distributed": {"enable": true, "world_size": 2,
      "master_port": 29500, "gradient_sync": "ps"}, "ps": {"shards": 2}, "metrics": {"port": 40000}})");
  const auto metric_notes = EphemeralPortNotes(metrics, range);
  ASSERT_EQ(metric_notes.size(), 1u);
  EXPECT_TRUE(Contains(metric_notes[0], "ports 40000..40004 (metrics)")) << metric_notes[0];
  EXPECT_TRUE(EphemeralPortNotes(inside, dir + "/missing").empty());
  { std::ofstream(range) << "garbage\n"; }
  EXPECT_TRUE(EphemeralPortNotes(inside, range).empty());
}

// 20,000 loopback nodes built the list of every host into every node's
// problem (gigabytes, then std::bad_alloc); thousands of nodes of one name
// compared each with every earlier one and reported each pair.
TEST(ClusterLayoutTest, ManyBadNodesGiveABoundedReport) {
  auto nodes = [](int count, bool same_name) {
    std::string text = R"({"distributed": {"enable": true, "master_addr": "10.0.0.1",
        "world_size": )" +
                       std::to_string(count) + R"(, "nodes": [)";
    for (int n = 0; n < count; ++n) {
      text += fmt::format(R"({}{{"name": "n{}", "host": "127.0.{}.{}"}})", n ? "," : "",
                          same_name ? "" : std::to_string(n), n / 250, n % 250 + 1);
    }
    return text + "]}}";
  };
  for (const bool same_name : {false, true}) {
    const std::string report = ErrorOf(nodes(20000, same_name));
    EXPECT_LT(report.size(), 64u * 1024) << report.substr(0, 2000);
    EXPECT_TRUE(Contains(report, "more problems not listed (the first 50 are)"))
        << report.substr(0, 2000);
  }
  EXPECT_TRUE(Contains(ErrorOf(nodes(20000, false)), "and 19992 more)"));
  std::string too_many = R"({"distributed": {"nodes": [)";
  for (int n = 0; n <= 65536; ++n) too_many += n ? ",{}" : "{}";
  const std::string count = ErrorOf(too_many + "]}}");
  EXPECT_TRUE(Contains(count, "distributed.nodes: 65537 nodes; allowed: at most 65536")) << count;
}

}  // namespace
}  // namespace gridsync
