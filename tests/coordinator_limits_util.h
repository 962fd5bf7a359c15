// Helpers of the coordinator's limit tests (coordinator_input_test.cc,
// coordinator_queue_test.cc): coordinators with given options, members,
// and raw request frames for the hostile cases.
//
// Thread safety: as the tests use them, one thread each.
#pragma once

#include "common/wire/coord_codec.h"
#include "tests/coordinator_test_util.h"

namespace gridsync {
namespace {

inline std::unique_ptr<Coordinator> StartWith(CoordinatorOptions options) {
  options.port = 0;
  auto started = Coordinator::Start(options);
  EXPECT_TRUE(started.ok()) << started.status().ToString();
  return started.ok() ? std::move(started).value() : nullptr;
}

// A budget of 2 MiB (strangers' share 1 MiB), for one shard and one worker.
inline CoordinatorOptions TwoMiBBudget() {
  CoordinatorOptions options;
  options.max_pending_bytes = 2 << 20;
  options.expected_shards = 1;
  options.expected_workers = 1;
  return options;
}

// A client registered as worker 0.
inline Result<std::unique_ptr<CoordinatorClient>> RegisteredMember(Coordinator& coordinator) {
  auto member = CoordinatorClient::Connect("127.0.0.1", coordinator.port(), 5s);
  if (!member.ok()) return member.status();
  GRIDSYNC_RETURN_IF_ERROR((*member)->Register(Member(Role::kWorker, 0), 2s).status());
  return member;
}

inline void ExpectServes(Coordinator& coordinator) {
  auto client = CoordinatorClient::Connect("127.0.0.1", coordinator.port(), 5s);
  ASSERT_TRUE(client.ok()) << client.status().ToString();
  EXPECT_TRUE((*client)->Heartbeat().ok());
  ASSERT_TRUE((*client)->Set("k", "v").ok());
  auto got = (*client)->Get({"k"}, 0ms);
  ASSERT_TRUE(got.ok()) << got.status().ToString();
  EXPECT_EQ(got->at(0), "v");
}

inline std::string BarrierFrame(uint64_t id, const std::string& name, uint32_t count,
                                uint32_t timeout_ms, const std::string& member = "") {
  capnp::MallocMessageBuilder message;
  auto request = message.initRoot<schema::CoordRequest>();
  request.setRequestId(id);
  auto barrier = request.initBarrier();
  barrier.setName(capnp::Text::Reader(name.data(), name.size()));
  barrier.setCount(count);
  barrier.setTimeoutMs(timeout_ms);
  if (!member.empty()) barrier.setMember(capnp::Text::Reader(member.data(), member.size()));
  return FrameOf(message);
}

inline std::string KvSetFrame(uint64_t id, const std::string& key, size_t value_bytes) {
  capnp::MallocMessageBuilder message;
  auto request = message.initRoot<schema::CoordRequest>();
  request.setRequestId(id);
  auto set = request.initKvSet();
  set.setKey(capnp::Text::Reader(key.data(), key.size()));
  const std::string value(value_bytes, 'x');
  set.setValue(
      capnp::Data::Reader(reinterpret_cast<const capnp::byte*>(value.data()), value.size()));
  return FrameOf(message);
}

inline std::string KvGetFrame(uint64_t id, const std::string& key, uint32_t timeout_ms) {
  capnp::MallocMessageBuilder message;
  auto request = message.initRoot<schema::CoordRequest>();
  request.setRequestId(id);
  auto get = request.initKvGet();
  get.initKeys(1).set(0, capnp::Text::Reader(key.data(), key.size()));
  get.setTimeoutMs(timeout_ms);
  return FrameOf(message);
}

inline std::string RegisterFrame(uint64_t id, const RegisterInfo& info) {
  capnp::MallocMessageBuilder message;
  auto request = message.initRoot<schema::CoordRequest>();
  request.setRequestId(id);
  wire::RegisterToWire(info, request.initRegister());
  return FrameOf(message);
}

// A raw connection registered as worker `rank` (its reply read).
inline std::unique_ptr<RawConnection> RegisteredWorker(uint16_t port, int32_t rank) {
  auto raw = std::make_unique<RawConnection>(port);
  EXPECT_TRUE(raw->Send(RegisterFrame(100, Member(Role::kWorker, rank))));
  const auto reply = raw->ReadReply(3s);
  EXPECT_TRUE(reply.decoded && !reply.is_error) << "rank " << rank << ": " << reply.text;
  return raw;
}

// The coordinator's stats once `done` holds of them (or the last read,
// after 3 s).
template <typename Done>
CoordinatorStats StatsOnce(Coordinator& coordinator, Done done) {
  const auto deadline = Clock::now() + 3s;
  for (;;) {
    auto stats = coordinator.stats(2s);
    EXPECT_TRUE(stats.ok()) << stats.status().ToString();
    if (!stats.ok()) return {};
    if (done(*stats) || Clock::now() > deadline) return *stats;
    std::this_thread::sleep_for(10ms);
  }
}

}  // namespace
}  // namespace gridsync
