// The control plane: gridsync-coordinator's engine in process (threads and
// real sockets on 127.0.0.1). Its key-value store and the Store seam
// (HashStore and CoordinatorStore with the same checks):
// coordinator_kv_test.cc. Raw malformed bytes and resource limits:
// coordinator_input_test.cc; the real binary and systemd:
// coordinator_binary_test.cc; the waits for the map and barriers:
// coordinator_waits_test.cc.
#include "tests/coordinator_test_util.h"

namespace gridsync {
namespace {

TEST_F(CoordinatorTest, RegistrationAssignsExplicitAndAutomaticRanks) {
  uint32_t rank = 99;
  auto shard1 = Join(Role::kShard, 1, &rank);
  ASSERT_TRUE(shard1);
  EXPECT_EQ(rank, 1u);
  auto shard0 = Join(Role::kShard, -1, &rank);
  ASSERT_TRUE(shard0);
  EXPECT_EQ(rank, 0u);

  auto worker2 = Join(Role::kWorker, 2, &rank);
  ASSERT_TRUE(worker2);
  EXPECT_EQ(rank, 2u);

  auto other = Connect();
  ASSERT_TRUE(other);
  auto duplicate = other->Register(Member(Role::kWorker, 2), 2s);
  ASSERT_FALSE(duplicate.ok());
  EXPECT_EQ(duplicate.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(duplicate.status().message().find("worker rank 2 is already taken"), std::string::npos)
      << duplicate.status().message();
  auto shard_full = other->Register(Member(Role::kShard, -1), 2s);
  ASSERT_FALSE(shard_full.ok());
  EXPECT_NE(shard_full.status().message().find("all 2 shard ranks taken"), std::string::npos)
      << shard_full.status().message();
  auto out_of_range = other->Register(Member(Role::kWorker, 7), 2s);
  ASSERT_FALSE(out_of_range.ok());
  EXPECT_NE(out_of_range.status().message().find("out of range"), std::string::npos)
      << out_of_range.status().message();

  auto worker0 = Join(Role::kWorker, -1, &rank);
  ASSERT_TRUE(worker0);
  EXPECT_EQ(rank, 0u);
  // The refused connection can still register; it gets the last free rank.
  auto reg = other->Register(Member(Role::kWorker, -1), 2s);
  ASSERT_TRUE(reg.ok()) << reg.status().ToString();
  EXPECT_EQ(reg->rank, 1u);
  EXPECT_TRUE(reg->map.complete());
  EXPECT_EQ(Ranks(reg->map.shards), (std::vector<uint32_t>{0, 1}));
  EXPECT_EQ(Ranks(reg->map.workers), (std::vector<uint32_t>{0, 1, 2}));
  EXPECT_EQ(reg->map.shards[0].endpoint, "tcp://127.0.0.1:1");
  EXPECT_EQ(reg->map.workers[2].pid, 1003u);
  EXPECT_EQ(reg->map.tables, Tables());
  EXPECT_EQ(reg->map.generation, 5u);  // five joins

  auto again = other->Register(Member(Role::kWorker, -1), 2s);
  ASSERT_FALSE(again.ok());
  EXPECT_NE(again.status().message().find("already registered"), std::string::npos);

  auto extra = Connect();
  ASSERT_TRUE(extra);
  auto too_many = extra->Register(Member(Role::kWorker, -1), 2s);
  ASSERT_FALSE(too_many.ok());
  EXPECT_EQ(too_many.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(too_many.status().message().find("all 3 worker ranks taken"), std::string::npos)
      << too_many.status().message();

  // Observers get the map and no rank.
  auto observer = extra->Register(Member(Role::kObserver, -1, {}), 2s);
  ASSERT_TRUE(observer.ok()) << observer.status().ToString();
  EXPECT_EQ(observer->map.workers.size(), 3u);
  EXPECT_EQ(observer->map.generation, 5u);
}

TEST_F(CoordinatorTest, TableMismatchIsRefusedNamingTableAndSizes) {
  auto shard = Join(Role::kShard, 0);
  ASSERT_TRUE(shard);

  auto worker = Connect();
  ASSERT_TRUE(worker);
  auto tables = Tables();
  tables[1].rows = 262144;
  auto reg = worker->Register(Member(Role::kWorker, 0, tables), 2s);
  ASSERT_FALSE(reg.ok());
  EXPECT_EQ(reg.status().code(), StatusCode::kInvalidArgument);
  const std::string& text = reg.status().message();
  EXPECT_NE(text.find("'grid.level1'"), std::string::npos) << text;
  EXPECT_NE(text.find("262144 x 2"), std::string::npos) << text;
  EXPECT_NE(text.find("524288 x 2"), std::string::npos) << text;
  EXPECT_NE(text.find("shard 0"), std::string::npos) << text;  // who defined them
  EXPECT_EQ(text.find("grid.level0"), std::string::npos)
      << "names the first differing table: " << text;

  auto shorter = Tables();
  shorter.pop_back();
  auto reg2 = worker->Register(Member(Role::kWorker, 0, shorter), 2s);
  ASSERT_FALSE(reg2.ok());
  EXPECT_NE(reg2.status().message().find("'mlp.w0' (64 x 32)"), std::string::npos)
      << reg2.status().message();

  auto good = worker->Register(Member(Role::kWorker, 0), 2s);
  ASSERT_TRUE(good.ok()) << good.status().ToString();
  EXPECT_EQ(good->map.workers.size(), 1u);
}

// A hostile probe: a worker started with another training.batch_size (or
// seed, or image) trained to exit 0 beside the others, and one with another
// ps.consistency failed 14 steps in without naming the key. The first member
// defines the settings (spec/cluster_settings.h); a later one that differs
// is refused naming each key and both values. The shared settings hold
// while any member is registered; a job's from its first worker until no
// worker is left.
TEST_F(CoordinatorTest, SettingsMismatchIsRefusedNamingKeysAndValues) {
  const std::vector<Setting> shared = {{"ps.consistency", "\"bsp\""},
                                       {"training.learning_rate", "0.01"}};
  auto member = [&](Role role, int32_t rank, std::vector<Setting> shared_settings,
                    std::vector<Setting> job) {
    RegisterInfo info = Member(role, rank);
    info.shared_settings = std::move(shared_settings);
    info.job_settings = std::move(job);
    return info;
  };
  auto shard = Connect();
  ASSERT_TRUE(shard);
  ASSERT_TRUE(shard->Register(member(Role::kShard, 0, shared, {}), 2s).ok());

  auto worker0 = Connect();
  ASSERT_TRUE(worker0);
  const std::vector<Setting> async = {{"ps.consistency", "\"async\""},
                                      {"training.learning_rate", "0.01"}};
  auto refused = worker0->Register(member(Role::kWorker, 0, async, {}), 2s);
  ASSERT_FALSE(refused.ok());
  EXPECT_EQ(refused.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(refused.status().message().find(
                "settings differ from the cluster's (set by shard 0 (node 'node-a', pid 1001)): "
                "ps.consistency: \"async\" here, \"bsp\" there"),
            std::string::npos)
      << refused.status().message();
  EXPECT_EQ(refused.status().message().find("learning_rate"), std::string::npos)
      << "names only what differs: " << refused.status().message();
  auto missing = worker0->Register(member(Role::kWorker, 0, {shared[0]}, {}), 2s);
  ASSERT_FALSE(missing.ok());
  EXPECT_NE(missing.status().message().find("training.learning_rate: (not sent) here, 0.01"),
            std::string::npos)
      << missing.status().message();

  const std::vector<Setting> batch_1024 = {{"training.batch_size", "1024"}, {"training.seed", "1"}};
  ASSERT_TRUE(worker0->Register(member(Role::kWorker, 0, shared, batch_1024), 2s).ok());
  auto worker1 = Connect();
  ASSERT_TRUE(worker1);
  const std::vector<Setting> batch_2048 = {{"training.batch_size", "2048"}, {"training.seed", "1"}};
  auto other_batch = worker1->Register(member(Role::kWorker, 1, shared, batch_2048), 2s);
  ASSERT_FALSE(other_batch.ok());
  EXPECT_NE(other_batch.status().message().find(
                "settings differ from job 1's (set by worker 0 (node 'node-a', pid 1001)): "
                "training.batch_size: 2048 here, 1024 there"),
            std::string::npos)
      << other_batch.status().message();
  // A shard sends no job settings: only the workers of a job must agree.
  auto shard1 = Connect();
  ASSERT_TRUE(shard1);
  EXPECT_TRUE(shard1->Register(member(Role::kShard, 1, shared, {}), 2s).ok());

  // Every worker gone: the next job may run another batch, still with the
  // shards' shared settings.
  worker0.reset();
  ASSERT_TRUE(WaitForMap([](const ClusterMap& map) { return map.workers.empty(); }, 2s));
  auto next_job = worker1->Register(member(Role::kWorker, 1, shared, batch_2048), 2s);
  EXPECT_TRUE(next_job.ok()) << next_job.status().ToString();
  auto still_shared = Connect();
  ASSERT_TRUE(still_shared);
  EXPECT_FALSE(still_shared->Register(member(Role::kWorker, 0, async, batch_2048), 2s).ok());

  // The coordinator keeps the first member's settings for the cluster's
  // life: the decoder bounds them.
  auto flood = Connect();
  ASSERT_TRUE(flood);
  std::vector<Setting> many(kMaxSettings + 1, Setting{"k", "v"});
  auto too_many = flood->Register(member(Role::kWorker, 2, many, {}), 2s);
  ASSERT_FALSE(too_many.ok());
  EXPECT_NE(
      too_many.status().message().find("sharedSettings has 129 entries; allowed: at most 128"),
      std::string::npos)
      << too_many.status().message();
  ExpectHealthy();
}

// With the coordinator's own settings (gridsync-coordinator sets them from
// its config), the first member to register does not define them: an odd
// first member is refused, naming the coordinator's config, and the
// reference outlives every member.
TEST_F(CoordinatorTest, TheCoordinatorsSettingsAreTheReferenceFromTheStart) {
  CoordinatorOptions options;
  options.expected_shards = 1;
  options.expected_workers = 1;
  options.shared_settings = {{"ps.consistency", "\"bsp\""}, {"training.learning_rate", "0.01"}};
  options.shared_settings_source = "the coordinator's config cluster.json";
  coordinator_.reset();
  auto started = Coordinator::Start(options);
  ASSERT_TRUE(started.ok()) << started.status().ToString();
  coordinator_ = std::move(started).value();

  auto member = [&](Role role, int32_t rank, std::vector<Setting> shared) {
    RegisterInfo info = Member(role, rank);
    info.shared_settings = std::move(shared);
    return info;
  };
  const std::vector<Setting> async = {{"ps.consistency", "\"async\""},
                                      {"training.learning_rate", "0.01"}};
  for (int round = 0; round < 2; ++round) {
    // Round 1: after every member left, the reference is still the config's.
    auto odd = Connect();
    ASSERT_TRUE(odd);
    auto refused = odd->Register(member(Role::kWorker, 0, async), 2s);
    ASSERT_FALSE(refused.ok()) << "round " << round << ": the first member was not refused";
    EXPECT_NE(refused.status().message().find(
                  "settings differ from the cluster's (set by the coordinator's config "
                  "cluster.json): ps.consistency: \"async\" here, \"bsp\" there"),
              std::string::npos)
        << refused.status().message();
    auto shard = Connect();
    ASSERT_TRUE(shard);
    auto joined = shard->Register(member(Role::kShard, 0, options.shared_settings), 2s);
    ASSERT_TRUE(joined.ok()) << "round " << round << ": " << joined.status().ToString();
    shard.reset();
    ASSERT_TRUE(WaitForMap([](const ClusterMap& map) { return map.shards.empty(); }, 2s));
  }
  ExpectHealthy();
}

TEST_F(CoordinatorTest, GenerationBumpsOnJoinAndOnDisconnect) {
  auto observer = Connect();
  ASSERT_TRUE(observer);
  auto before = observer->GetMap(false, 0ms);
  ASSERT_TRUE(before.ok()) << before.status().ToString();

  uint32_t rank = 0;
  auto worker = Join(Role::kWorker, 1, &rank);
  ASSERT_TRUE(worker);
  auto joined = observer->GetMap(false, 0ms);
  ASSERT_TRUE(joined.ok());
  EXPECT_EQ(joined->generation, before->generation + 1);
  ASSERT_EQ(joined->workers.size(), 1u);
  EXPECT_EQ(joined->workers[0].rank, 1u);

  worker.reset();  // closes the connection
  ClusterMap after;
  const auto start = Clock::now();
  do {
    auto map = observer->GetMap(false, 0ms);
    ASSERT_TRUE(map.ok());
    after = *map;
    if (after.generation != joined->generation) break;
    std::this_thread::sleep_for(10ms);
  } while (Since(start) < 3s);
  EXPECT_EQ(after.generation, joined->generation + 1);
  EXPECT_TRUE(after.workers.empty());

  // The rank is free again.
  auto back = Join(Role::kWorker, 1);
  EXPECT_TRUE(back);
}

// The collectives' rendezvous state (Gloo's addresses, NCCL's ids, the
// backend vote) goes when the last worker leaves: the next job's workers
// reuse the group names, and a second nccl-mode job on a long-lived
// coordinator used to wait for the first job's Gloo peers. Other keys stay.
TEST_F(CoordinatorTest, TheLastWorkerLeavingDropsTheCollectivesRendezvousKeys) {
  auto observer = Connect();
  ASSERT_TRUE(observer);
  auto first = Join(Role::kWorker, 0);
  auto second = Join(Role::kWorker, 1);
  ASSERT_TRUE(first && second);
  const std::string gloo = std::string(kCollectiveStorePrefix) + "gloo/flat/0";
  ASSERT_TRUE(first->Set(gloo, "127.0.0.1:1234").ok());
  ASSERT_TRUE(first->Set("metrics/worker/0", "127.0.0.1:9100").ok());

  first.reset();  // one worker left: its peers' rendezvous state stays
  std::this_thread::sleep_for(200ms);
  EXPECT_TRUE(observer->Get({gloo}, 0ms).ok());

  second.reset();  // the last one
  bool gone = false;
  const auto start = Clock::now();
  while (!gone && Since(start) < 3s) {
    gone = !observer->Get({gloo}, 0ms).ok();
    if (!gone) std::this_thread::sleep_for(10ms);
  }
  EXPECT_TRUE(gone) << gloo << " outlived the workers";
  auto other = observer->Get({"metrics/worker/0"}, 0ms);
  EXPECT_TRUE(other.ok()) << other.status().ToString();
}

// A long-running coordinator serves job after job: an ended job's checkpoint
// registry, run identity and adaptive-split rounds go with it (they piled up
// a few keys a job until the store's key bound refused a later job's, and
// the next job's workers read the old rounds' rates without waiting). The
// next job's keys, and keys of no job, stay.
TEST_F(CoordinatorTest, AnEndedJobsKeysGoWithIt) {
  auto observer = Connect();
  ASSERT_TRUE(observer);
  auto worker = Join(Role::kWorker, 0);
  ASSERT_TRUE(worker);
  ASSERT_TRUE(worker->Barrier("init", 1, "worker-0", 2s).ok());
  auto job = worker->CurrentJob();
  ASSERT_TRUE(job.ok());
  const uint64_t first = job->job;
  const std::vector<std::string> ended = {
      CheckpointKey(first, "shard-0"), CheckpointKey(first, "worker-0"),
      "checkpoint-run/job-" + std::to_string(first),
      "checkpoint-run/job-" + std::to_string(first) + "/resumed-100/shard-0", "rates/100/0"};
  const std::vector<std::string> kept = {
      CheckpointKey(first + 1, "shard-0"),
      "checkpoint-run/job-" + std::to_string(first) + "0",  // job 10's, not job 1's
      "metrics/worker/0"};
  // Shard 0's keys (and the run, the first part's) from a connection that
  // did not register: a shard before it registers, with security off.
  auto shard = Connect();
  ASSERT_TRUE(shard);
  const auto writer = [&](const std::string& key) {
    return key.find("shard-0") != std::string::npos || key.starts_with("checkpoint-run/")
               ? shard.get()
               : worker.get();
  };
  for (const auto& key : ended) ASSERT_TRUE(writer(key)->Set(key, "100").ok()) << key;
  for (const auto& key : kept) ASSERT_TRUE(writer(key)->Set(key, "100").ok()) << key;
  ASSERT_TRUE(worker->Barrier("done", 1, "worker-0", 2s).ok());
  worker.reset();  // the job's last worker leaves: job 2 starts
  bool advanced = false;
  for (auto start = Clock::now(); Since(start) < 3s && !advanced;) {
    auto now = observer->CurrentJob();
    ASSERT_TRUE(now.ok());
    advanced = now->job == first + 1;
    if (!advanced) std::this_thread::sleep_for(10ms);
  }
  ASSERT_TRUE(advanced) << "job " << first << " did not end with its last worker";
  for (const auto& key : ended) {
    EXPECT_FALSE(observer->Get({key}, 0ms).ok()) << key << " outlived its job";
  }
  for (const auto& key : kept) {
    auto got = observer->Get({key}, 0ms);
    EXPECT_TRUE(got.ok()) << key << ": " << got.status().ToString();
  }
}

// A hostile probe filled the store from a connection that never
// registered (65536 one-byte keys in 4 s), and every later member's kvSet
// (checkpoint lists, rendezvous, metrics) was refused. Unregistered
// connections now share 1/16 of it; the members keep the rest.
TEST_F(CoordinatorTest, UnregisteredConnectionsCannotFillTheMembersStore) {
  auto stranger = Connect();
  ASSERT_TRUE(stranger);
  const uint32_t share = CoordinatorOptions{}.max_unregistered_store_keys;
  for (uint32_t i = 0; i < share; ++i) {
    ASSERT_TRUE(stranger->Set("junk/" + std::to_string(i), "x").ok()) << i;
  }
  auto refused = stranger->Set("junk/more", "x");
  ASSERT_FALSE(refused.ok());
  EXPECT_NE(refused.message().find("connections that did not register hold " +
                                   std::to_string(share) + " keys"),
            std::string::npos)
      << refused.ToString();
  EXPECT_TRUE(stranger->Set("junk/0", "y").ok()) << "its own key stays writable";
  auto member = Join(Role::kWorker, 0);
  ASSERT_TRUE(member);
  EXPECT_TRUE(member->Set("member/own", "100").ok());
  // Overwriting a member's key takes a place in the share (it grew the
  // store outside it), and the share is full.
  auto overwrite = stranger->Set("member/own", std::string(1000, 'x'));
  EXPECT_FALSE(overwrite.ok()) << "a member's key overwritten outside the share";
  EXPECT_NE(overwrite.message().find("connections that did not register hold"), std::string::npos)
      << overwrite.ToString();
  // A key a member wrote leaves the strangers' share.
  ASSERT_TRUE(member->Set("junk/1", "z").ok());
  EXPECT_TRUE(stranger->Set("junk/more", "x").ok());
}

// A hostile probe: without security anyone who could connect set
// metrics/worker/0 and the monitor scraped (and showed) whatever that
// address served. metrics/<role>/<rank> is now the registered member's own.
TEST_F(CoordinatorTest, OnlyTheMemberItselfPublishesItsMetricsAddress) {
  auto stranger = Connect();
  auto worker = Join(Role::kWorker, 0);
  ASSERT_TRUE(stranger && worker);
  const Status forged = stranger->Set("metrics/worker/0", "127.0.0.1:1");
  EXPECT_FALSE(forged.ok());
  EXPECT_NE(forged.message().find("only by that member's own connection"), std::string::npos)
      << forged.ToString();
  const Status other = worker->Set("metrics/worker/1", "127.0.0.1:1");
  EXPECT_FALSE(other.ok());
  EXPECT_NE(other.message().find("allowed: 'metrics/worker/0'"), std::string::npos)
      << other.ToString();
  ASSERT_TRUE(worker->Set("metrics/worker/0", "127.0.0.1:9100").ok());
  auto got = stranger->Get({"metrics/worker/0"}, 0ms);
  ASSERT_TRUE(got.ok()) << got.status().ToString();
  EXPECT_EQ(got->at(0), "127.0.0.1:9100");
  EXPECT_TRUE(stranger->Set("other/key", "v").ok()) << "keys outside metrics/ stay open";
}

// Issue 10: a shard restarted after a crash used to rejoin the running job
// with fresh parameters. Once the workers passed "init", a shard's
// registration is refused, pointing at --resume; a new job (everyone left)
// accepts shards again.
TEST_F(CoordinatorTest, AShardRestartedDuringTrainingIsRefused) {
  auto shard = Join(Role::kShard, 0);
  auto worker = Join(Role::kWorker, 0);
  ASSERT_TRUE(shard && worker);
  ASSERT_TRUE(worker->Barrier("init", 1, "worker-0", 2s).ok());
  shard.reset();  // the shard process dies
  ASSERT_TRUE(WaitForMap([](const ClusterMap& map) { return map.shards.empty(); }, 3s));
  auto restarted = Connect();
  auto refused = restarted->Register(Member(Role::kShard, 0), 2s);
  ASSERT_FALSE(refused.ok());
  EXPECT_NE(refused.status().message().find("fresh parameters"), std::string::npos)
      << refused.status().ToString();
  // The job ends; the next job's shards register.
  worker.reset();
  restarted.reset();
  std::unique_ptr<CoordinatorClient> next;
  for (auto start = Clock::now(); Since(start) < 3s && !next;) {
    auto client = Connect();
    if (client->Register(Member(Role::kShard, 0), 2s).ok())
      next = std::move(client);
    else
      std::this_thread::sleep_for(20ms);
  }
  EXPECT_TRUE(next) << "a new job could not register its shard";
}

TEST_F(CoordinatorTest, AShardRejoiningFromACheckpointMovesTheEpoch) {
  // Before training, nothing can be rejoined.
  auto early = Connect();
  RegisterInfo info = Member(Role::kShard, 0);
  info.rejoin_step = 50;
  auto refused = early->Register(info, 2s);
  ASSERT_FALSE(refused.ok());
  EXPECT_NE(refused.status().message().find("has not started"), std::string::npos)
      << refused.status().ToString();
  early.reset();
  // Nor by a worker.
  auto worker_try = Connect();
  RegisterInfo worker_info = Member(Role::kWorker, 1);
  worker_info.rejoin_step = 50;
  EXPECT_FALSE(worker_try->Register(worker_info, 2s).ok());
  worker_try.reset();

  std::unique_ptr<CoordinatorClient> shard;
  for (auto start = Clock::now(); Since(start) < 3s && !shard;) {
    auto client = Connect();
    if (client->Register(Member(Role::kShard, 0), 2s).ok())
      shard = std::move(client);
    else
      std::this_thread::sleep_for(10ms);
  }
  auto worker = Join(Role::kWorker, 0);
  ASSERT_TRUE(shard && worker);
  ASSERT_TRUE(worker->Barrier("init", 1, "worker-0", 2s).ok());
  auto before = worker->CurrentJob();
  ASSERT_TRUE(before.ok());
  EXPECT_EQ(before->epoch, 0u);
  // What the parts published of their checkpoints: 150 is every part's
  // (shard 1 before it registers). A worker's checksum of its restored
  // parameters under the prefix is no part's steps.
  ASSERT_TRUE(shard->Set(CheckpointKey(before->job, "shard-0"), "100,150").ok());
  ASSERT_TRUE(Connect()->Set(CheckpointKey(before->job, "shard-1"), "150").ok());
  ASSERT_TRUE(
      worker->Set(CheckpointKey(before->job, "restored-150/worker-0"), "00ff00ff00ff00ff").ok());
  shard.reset();  // the shard process dies
  // A step not every part holds is refused, naming the part.
  for (auto start = Clock::now(); Since(start) < 3s;) {
    auto client = Connect();
    RegisterInfo claim = Member(Role::kShard, 0);
    claim.rejoin_step = 100;
    auto reg = client->Register(claim, 2s);
    ASSERT_FALSE(reg.ok()) << "a step shard-1 does not hold was accepted";
    if (reg.status().message().find("already taken") != std::string::npos) {
      std::this_thread::sleep_for(10ms);
      continue;
    }
    EXPECT_NE(reg.status().message().find("part shard-1 does not hold it"), std::string::npos)
        << reg.status().ToString();
    break;
  }
  std::unique_ptr<CoordinatorClient> rejoined;
  CoordinatorClient::Registration registration;
  for (auto start = Clock::now(); Since(start) < 3s && !rejoined;) {
    auto client = Connect();
    RegisterInfo again = Member(Role::kShard, 0);
    again.rejoin_step = 150;
    auto reg = client->Register(again, 2s);
    if (reg.ok()) {
      rejoined = std::move(client);
      registration = *reg;
    } else {
      std::this_thread::sleep_for(10ms);  // the dead one is still registered
    }
  }
  ASSERT_TRUE(rejoined) << "the restarted shard could not rejoin";
  EXPECT_EQ(registration.map.epoch, 1u);
  EXPECT_EQ(registration.map.resume_step, 150u);
  auto after = worker->CurrentJob();
  ASSERT_TRUE(after.ok());
  EXPECT_EQ(after->job, before->job);
  EXPECT_EQ(after->epoch, 1u);
  EXPECT_EQ(after->resume_step, 150u);
  // Its last worker dies before the end: with checkpoints published, the
  // job stays open for restarted workers to rejoin.
  worker.reset();
  auto observer = Connect();
  for (auto start = Clock::now(); Since(start) < 1s;) {
    auto map = observer->GetMap(false, 0ms);
    ASSERT_TRUE(map.ok());
    if (map->workers.empty()) break;
    std::this_thread::sleep_for(10ms);
  }
  std::this_thread::sleep_for(100ms);
  auto kept = observer->CurrentJob();
  ASSERT_TRUE(kept.ok());
  EXPECT_EQ(kept->job, before->job) << "a job with checkpoints ended when its workers died";
  EXPECT_EQ(kept->epoch, 1u);
}

}  // namespace
}  // namespace gridsync
