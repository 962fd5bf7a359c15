// The coordinator's key-value store (kvSet, kvGet waiting and timing out,
// a stop cancelling waiting replies) and the Store seam: HashStore and
// CoordinatorStore pass the same checks.
#include "common/checkpoint_run.h"
#include "tests/coordinator_test_util.h"

namespace gridsync {
namespace {

// The fixture lives in an anonymous namespace of the header, so each file
// names its own suite.
class CoordinatorKvTest : public CoordinatorTest {};

TEST_F(CoordinatorKvTest, KvSetThenGetInKeyOrder) {
  auto client = Connect();
  ASSERT_TRUE(client);
  const std::string binary("\0\x01\xff nccl-id", 12);
  ASSERT_TRUE(client->Set("a", "alpha").ok());
  ASSERT_TRUE(client->Set("b", binary).ok());
  ASSERT_TRUE(client->Set("a", "alpha2").ok());  // overwrite
  auto values = client->Get({"b", "a"}, 0ms);
  ASSERT_TRUE(values.ok()) << values.status().ToString();
  EXPECT_EQ(*values, (std::vector<std::string>{binary, "alpha2"}));
  auto other = Connect();
  ASSERT_TRUE(other);
  auto seen = other->Get({"a"}, 100ms);
  ASSERT_TRUE(seen.ok());
  EXPECT_EQ(seen->at(0), "alpha2");
}

TEST_F(CoordinatorKvTest, KvGetWaitsForALaterSet) {
  auto getter = Connect();
  auto setter = Connect();
  ASSERT_TRUE(getter && setter);
  std::optional<Result<std::vector<std::string>>> got;
  std::chrono::milliseconds waited{};
  std::thread thread([&] {
    const auto start = Clock::now();
    got.emplace(getter->Get({"late", "early"}, 5s));
    waited = Since(start);
  });
  ASSERT_TRUE(setter->Set("early", "1").ok());
  std::this_thread::sleep_for(150ms);
  ASSERT_TRUE(setter->Set("late", "2").ok());
  thread.join();
  ASSERT_TRUE(got.has_value());
  ASSERT_TRUE(got->ok()) << got->status().ToString();
  EXPECT_EQ(**got, (std::vector<std::string>{"2", "1"}));
  EXPECT_GE(waited, 100ms);
  EXPECT_LT(waited, 4s);
}

TEST_F(CoordinatorKvTest, KvGetTimeoutNamesTheMissingKey) {
  auto client = Connect();
  ASSERT_TRUE(client);
  ASSERT_TRUE(client->Set("present", "x").ok());
  const auto start = Clock::now();
  auto timed_out = client->Get({"present", "nccl/unique-id"}, 200ms);
  EXPECT_LT(Since(start), 2s);
  ASSERT_FALSE(timed_out.ok());
  EXPECT_EQ(timed_out.status().code(), StatusCode::kTimeout);
  EXPECT_NE(timed_out.status().message().find("'nccl/unique-id'"), std::string::npos)
      << timed_out.status().message();
  EXPECT_EQ(timed_out.status().message().find("'present'"), std::string::npos)
      << timed_out.status().message();

  auto not_found = client->Get({"nccl/unique-id"}, 0ms);
  ASSERT_FALSE(not_found.ok());
  EXPECT_EQ(not_found.status().code(), StatusCode::kNotFound);
  EXPECT_NE(not_found.status().message().find("'nccl/unique-id'"), std::string::npos);
}

TEST_F(CoordinatorKvTest, StopCancelsDeferredRepliesCleanly) {
  auto client = Connect();
  ASSERT_TRUE(client);
  std::optional<Result<std::vector<std::string>>> got;
  std::thread thread([&] { got.emplace(client->Get({"never"}, 10s)); });
  std::this_thread::sleep_for(100ms);
  const auto start = Clock::now();
  coordinator_->Stop();
  thread.join();
  EXPECT_LT(Since(start), 2s);
  ASSERT_TRUE(got.has_value());
  ASSERT_FALSE(got->ok());
  EXPECT_EQ(got->status().code(), StatusCode::kIOError) << got->status().ToString();
  coordinator_->Stop();  // idempotent
}

// ---- The Store seam: same checks for both implementations ----

// `reader` and `writer` may be the same store; a CoordinatorStore needs two
// connections because a client serialises its calls.
void ExerciseStore(Store& reader, Store& writer, const std::string& missing_name) {
  ASSERT_TRUE(writer.Set("k1", "v1").ok());
  ASSERT_TRUE(writer.Set("k2", std::string("\0v2", 3)).ok());
  auto both = reader.Get({"k2", "k1"}, 0ms);
  ASSERT_TRUE(both.ok()) << both.status().ToString();
  EXPECT_EQ(*both, (std::vector<std::string>{std::string("\0v2", 3), "v1"}));

  std::optional<Result<std::vector<std::string>>> later;
  std::atomic<bool> returned{false};
  std::thread thread([&] {
    later.emplace(reader.Get({"k3"}, 5s));
    returned = true;
  });
  std::this_thread::sleep_for(100ms);
  EXPECT_FALSE(returned.load()) << "get must wait for a key that is not set yet";
  ASSERT_TRUE(writer.Set("k3", "v3").ok());
  thread.join();
  ASSERT_TRUE(later.has_value());
  ASSERT_TRUE(later->ok()) << later->status().ToString();
  EXPECT_EQ((*later)->at(0), "v3");

  const auto start = Clock::now();
  auto timed_out = reader.Get({"k1", "absent"}, 150ms);
  EXPECT_GE(Since(start), 100ms);
  ASSERT_FALSE(timed_out.ok());
  EXPECT_EQ(timed_out.status().code(), StatusCode::kTimeout);
  EXPECT_NE(timed_out.status().message().find("'" + missing_name + "'"), std::string::npos)
      << timed_out.status().message();

  auto not_found = reader.Get({"absent"}, 0ms);
  ASSERT_FALSE(not_found.ok());
  EXPECT_EQ(not_found.status().code(), StatusCode::kNotFound);
  EXPECT_NE(not_found.status().message().find("'" + missing_name + "'"), std::string::npos);
}

TEST(HashStoreTest, SetGetWaitAndTimeout) {
  HashStore store;
  ExerciseStore(store, store, "absent");
}

TEST_F(CoordinatorKvTest, CoordinatorStoreHasTheSameSemanticsAndPrefixesKeys) {
  auto a = Connect();
  auto b = Connect();
  ASSERT_TRUE(a && b);
  CoordinatorStore reader(a.get(), "gloo/");
  CoordinatorStore writer(b.get(), "gloo/");
  ExerciseStore(reader, writer, "gloo/absent");

  auto raw = a->Get({"gloo/k1"}, 0ms);
  ASSERT_TRUE(raw.ok()) << raw.status().ToString();
  EXPECT_EQ(raw->at(0), "v1");
  auto unprefixed = a->Get({"k1"}, 0ms);
  EXPECT_FALSE(unprefixed.ok()) << "the prefix must be applied";
  CoordinatorStore other(a.get(), "nccl/");
  EXPECT_FALSE(other.Get({"k1"}, 0ms).ok()) << "prefixes must separate stores";
}

// A review of the control plane: anyone could write the keys the parts
// keep their checkpoints by. A stranger's "checkpoint/job-1/junk" made
// every step incomplete (no rejoin; the job's checkpoints dropped once its
// workers left), and a worker's forged run identity made a rejoining shard
// exit for good. Each key is now its part's own, and holds steps or a
// hexadecimal identity.
TEST_F(CoordinatorKvTest, CheckpointKeysAreTheirPartsOwn) {
  auto shard = Join(Role::kShard, 0);
  auto worker = Join(Role::kWorker, 0);
  auto stranger = Connect();
  ASSERT_TRUE(shard && worker && stranger);
  const auto refused = [](const Status& status, const std::string& why) {
    EXPECT_EQ(status.code(), StatusCode::kInvalidArgument) << status.ToString();
    EXPECT_NE(status.message().find(why), std::string::npos) << status.message();
    EXPECT_NE(status.message().find("allowed: a checkpoint key of one of the cluster's parts"),
              std::string::npos)
        << status.message();
  };
  // Each part writes its own: its steps, its restored checksum, its run at
  // a resume; shard 0 (the first part) the job's run identity.
  EXPECT_TRUE(shard->Set(CheckpointKey(1, "shard-0"), "100,150").ok());
  EXPECT_TRUE(worker->Set(CheckpointKey(1, "worker-0"), "150").ok());
  EXPECT_TRUE(worker->Set(CheckpointKey(1, "restored-150/worker-0"), "00ff00ff00ff00ff").ok());
  EXPECT_TRUE(shard->Set(RunKey(1) + "/resumed-150/shard-0", "0123abcd").ok());
  EXPECT_TRUE(shard->Set(RunKey(1), "0123abcd").ok());
  // Another part's keys, from a registered member.
  refused(worker->Set(CheckpointKey(1, "shard-0"), "50"),
          "it is shard 0's, and this connection is registered as worker 0");
  refused(worker->Set(RunKey(1), "deadbeef"),
          "it is shard 0's, and this connection is registered as worker 0");
  refused(shard->Set(CheckpointKey(1, "restored-150/worker-0"), "00"),
          "it is worker 0's, and this connection is registered as shard 0");
  // No part's key, or a value that is no part's.
  refused(stranger->Set(CheckpointKey(1, "junk"), ""), "it names no part of the cluster");
  refused(stranger->Set(CheckpointKey(1, "shard-2"), "100"), "it names no part of the cluster");
  refused(stranger->Set("checkpoint/elsewhere", "1"), "not a job's key");
  refused(stranger->Set(RunKey(1) + "x", "1"), "not a job's key");
  refused(stranger->Set(CheckpointKey(1, "restored-x/worker-0"), "1"),
          "it names no part of the cluster");
  refused(shard->Set(CheckpointKey(1, "shard-0"), "100,x"), "the entry has steps '100,x'");
  refused(shard->Set(RunKey(1), "not-hex\x1b"), "is not hexadecimal");
  // What the parts wrote is what is read.
  auto read = stranger->Get({CheckpointKey(1, "shard-0"), RunKey(1)}, 0ms);
  ASSERT_TRUE(read.ok()) << read.status().ToString();
  EXPECT_EQ(*read, (std::vector<std::string>{"100,150", "0123abcd"}));
  // With security off, a part before it registers is anyone unregistered
  // (shard 1 that restarted, setting a damaged step aside).
  EXPECT_TRUE(stranger->Set(CheckpointKey(1, "shard-1"), "100").ok());
}

}  // namespace
}  // namespace gridsync
