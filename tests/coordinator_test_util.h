// What the coordinator tests share (coordinator_test.cc,
// coordinator_input_test.cc, coordinator_binary_test.cc): members and
// tables to register, a free port, and the in-process coordinator fixture.
#pragma once

#include <arpa/inet.h>
#include <capnp/message.h>
#include <capnp/serialize.h>
#include <fcntl.h>
#include <gtest/gtest.h>
#include <kj/exception.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <unistd.h>

#include <array>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <csignal>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <optional>
#include <random>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "common/checkpoint_registry.h"
#include "common/cluster_map.h"
#include "common/coordinator_client.h"
#include "common/store.h"
#include "common/wire/gridsync.capnp.h"
#include "ops/service_watchdog.h"
#include "server/coordinator.h"
#include "tests/loopback_listener.h"
#include "tests/raw_coord_connection.h"

namespace gridsync {
namespace {

using namespace std::chrono_literals;
using Clock = std::chrono::steady_clock;
namespace schema = wire::schema;
using testing::FrameOf;
using testing::LengthPrefix;
using testing::RawConnection;

constexpr auto kConnectTimeout = 2s;

inline std::chrono::milliseconds Since(Clock::time_point start) {
  return std::chrono::duration_cast<std::chrono::milliseconds>(Clock::now() - start);
}

inline std::vector<TableInfo> Tables() {
  return {{"grid.level0", 4096, 2}, {"grid.level1", 524288, 2}, {"mlp.w0", 64, 32}};
}

inline RegisterInfo Member(Role role, int32_t rank, std::vector<TableInfo> tables = Tables()) {
  RegisterInfo info;
  info.role = role;
  info.requested_rank = rank;
  info.node = "node-a";
  info.local_rank = rank < 0 ? 0 : static_cast<uint32_t>(rank);
  info.endpoint = role == Role::kShard ? "tcp://127.0.0.1:1" : "";
  info.pid = 1000 + static_cast<uint32_t>(rank + 1);
  info.tables = std::move(tables);
  return info;
}

inline std::vector<uint32_t> Ranks(const std::vector<MemberInfo>& members) {
  std::vector<uint32_t> ranks;
  for (const auto& m : members) ranks.push_back(m.rank);
  return ranks;
}

using testing::UnusedPort;  // tests/loopback_listener.h

// ---- In-process coordinator ----

class CoordinatorTest : public ::testing::Test {
 protected:
  void SetUp() override {
    CoordinatorOptions options;
    options.port = 0;
    options.expected_shards = 2;
    options.expected_workers = 3;
    auto started = Coordinator::Start(options);
    ASSERT_TRUE(started.ok()) << started.status().ToString();
    coordinator_ = std::move(started).value();
    ASSERT_NE(coordinator_->port(), 0);
  }

  std::unique_ptr<CoordinatorClient> Connect() {
    auto client = CoordinatorClient::Connect("127.0.0.1", coordinator_->port(), kConnectTimeout);
    EXPECT_TRUE(client.ok()) << client.status().ToString();
    return client.ok() ? std::move(client).value() : nullptr;
  }

  // A connected client registered as role/rank; the rank it got.
  std::unique_ptr<CoordinatorClient> Join(Role role, int32_t rank, uint32_t* got = nullptr) {
    auto client = Connect();
    if (!client) return nullptr;
    auto reg = client->Register(Member(role, rank), 2s);
    EXPECT_TRUE(reg.ok()) << reg.status().ToString();
    if (!reg.ok()) return nullptr;
    if (got) *got = reg->rank;
    return client;
  }

  // Polls the map until `done` holds it (a member's departure is seen when
  // its connection closes) or `within` passes; false on a failed read.
  bool WaitForMap(const std::function<bool(const ClusterMap&)>& done,
                  std::chrono::milliseconds within) {
    auto observer = Connect();
    if (!observer) return false;
    for (auto start = Clock::now(); Since(start) < within;) {
      auto map = observer->GetMap(false, 0ms);
      EXPECT_TRUE(map.ok()) << map.status().ToString();
      if (!map.ok()) return false;
      if (done(*map)) break;
      std::this_thread::sleep_for(10ms);
    }
    return true;
  }

  // The server still serves a well-behaved client.
  void ExpectHealthy() {
    auto client = Connect();
    ASSERT_TRUE(client);
    EXPECT_TRUE(client->Heartbeat().ok());
    ASSERT_TRUE(client->Set("health", "fine").ok());
    auto values = client->Get({"health"}, 0ms);
    ASSERT_TRUE(values.ok()) << values.status().ToString();
    EXPECT_EQ(values->at(0), "fine");
  }

  std::unique_ptr<Coordinator> coordinator_;
};

}  // namespace
}  // namespace gridsync
