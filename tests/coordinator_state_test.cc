// The coordinator's state across its own restarts (server/coordinator_state.h):
// the file's strict decoding, and a restarted coordinator serving the job it
// kept, so that restarted shards and workers rejoin it.
#include "server/coordinator_state.h"

#include <spdlog/fmt/fmt.h>
#include <unistd.h>

#include "common/checkpoint_run.h"
#include "tests/coordinator_test_util.h"
#include "tests/file_size_limit.h"

namespace gridsync {
namespace {

class CoordinatorStateTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = std::filesystem::temp_directory_path() /
           ("gridsync-coord-state-" + std::to_string(::getpid()) + "-" +
            ::testing::UnitTest::GetInstance()->current_test_info()->name());
    std::filesystem::remove_all(dir_);
    path_ = (dir_ / "coordinator-state.json").string();
  }
  void TearDown() override { std::filesystem::remove_all(dir_); }

  Result<std::unique_ptr<Coordinator>> StartCoordinator(bool fresh = false, uint32_t shards = 2,
                                                        uint32_t workers = 1) {
    CoordinatorOptions options;
    options.expected_shards = shards;
    options.expected_workers = workers;
    options.state_file = path_;
    options.fresh_state = fresh;
    return Coordinator::Start(options);
  }

  static std::unique_ptr<CoordinatorClient> Connect(const Coordinator& coordinator) {
    auto client = CoordinatorClient::Connect("127.0.0.1", coordinator.port(), kConnectTimeout);
    EXPECT_TRUE(client.ok()) << client.status().ToString();
    return client.ok() ? std::move(client).value() : nullptr;
  }

  // Registers `info`, retrying while the rank is still held by a client that
  // just closed its connection.
  static Result<CoordinatorClient::Registration> Register(CoordinatorClient& client,
                                                          const RegisterInfo& info) {
    return client.RegisterAgain(info, 3s);
  }

  // A job of 2 shards and 1 worker that passed 'init'; `checkpoints` are the
  // steps each shard published. Returns the coordinator (its clients closed).
  std::unique_ptr<Coordinator> RunJob(const std::vector<std::string>& checkpoints) {
    auto started = StartCoordinator(/*fresh=*/true);
    EXPECT_TRUE(started.ok()) << started.status().ToString();
    if (!started.ok()) return nullptr;
    auto coordinator = std::move(started).value();
    auto shard0 = Connect(*coordinator);
    auto shard1 = Connect(*coordinator);
    auto worker = Connect(*coordinator);
    EXPECT_TRUE(shard0 && shard1 && worker);
    EXPECT_TRUE(shard0->Register(Member(Role::kShard, 0), 2s).ok());
    EXPECT_TRUE(shard1->Register(Member(Role::kShard, 1), 2s).ok());
    EXPECT_TRUE(worker->Register(Member(Role::kWorker, 0), 2s).ok());
    EXPECT_TRUE(worker->Barrier("init", 1, "worker-0", 2s).ok());
    // Each shard publishes its own (the coordinator refuses another's).
    EXPECT_LE(checkpoints.size(), 2u);
    for (size_t s = 0; s < checkpoints.size() && s < 2; ++s) {
      EXPECT_TRUE((s == 0 ? shard0 : shard1)
                      ->Set(CheckpointKey(1, "shard-" + std::to_string(s)), checkpoints[s])
                      .ok());
    }
    return coordinator;
  }

  std::filesystem::path dir_;
  std::string path_;
};

TEST_F(CoordinatorStateTest, TheFileRoundTripsAndDamageIsRefusedByName) {
  CoordinatorState state;
  state.job = 7;
  state.epoch = 2;
  state.resume_step = 150;
  state.training_started = true;
  state.expected_shards = 2;
  state.expected_workers = 3;
  state.checkpoints = {{CheckpointKey(7, "shard-0"), "100,150"},
                       {CheckpointKey(7, "shard-1"), "150"},
                       {CheckpointKey(7, "worker-2"), ""}};
  state.run = "0123456789abcdef0123456789abcdef";
  const std::string good = EncodeCoordinatorState(state);
  auto decoded = DecodeCoordinatorState(good, "f");
  ASSERT_TRUE(decoded.ok()) << decoded.status().ToString();
  EXPECT_EQ(*decoded, state);

  // Each damage and the words its refusal must contain.
  auto replace = [&](const std::string& from, const std::string& to) {
    std::string s = good;
    const size_t at = s.find(from);
    EXPECT_NE(at, std::string::npos) << from;
    return at == std::string::npos ? s : s.replace(at, from.size(), to);
  };
  const std::string deep = std::string(100000, '[') + std::string(100000, ']');
  const std::vector<std::pair<std::string, std::string>> damaged = {
      {"", "is not JSON"},
      {good.substr(0, good.size() / 2), "is not JSON"},
      {"[1, 2]", "is not a JSON object"},
      {replace("\"job\": 7", "\"job\": 0"), "job is 0"},
      {replace("\"job\": 7", "\"job\": -7"), "job is -7"},
      {replace("\"job\": 7", "\"job\": \"7\""), "job is \"7\""},
      {replace("\"job\": 7", "\"job\": [7]"), "job is a JSON array"},
      {replace("\"job\": 7", "\"job\": " + deep), "nests deeper than the checkpoints object"},
      {replace("\"epoch\": 2", "\"epoch\": 4294967296"), "epoch is 4294967296"},
      {replace("\"version\": 1", "\"version\": 2"), "version is 2"},
      {replace("\"gridsync-coordinator-state\"", "\"other\""), "format is \"other\""},
      {replace("\"job_done\": false", "\"job_done\": 0"), "job_done is 0"},
      {replace("\"job_done\": false", "\"job_done\": false, \"extra\": 1"),
       "key \"extra\" is unknown"},
      {replace("\"job_done\": false", "\"job_done\": false, \"job\": 7"),
       "key \"job\" appears twice"},
      {replace("checkpoint/job-7/shard-1", "checkpoint/job-6/shard-1"),
       "is no checkpoint key of a part of job 7"},
      {replace("checkpoint/job-7/shard-1", "checkpoint/job-7/shard-2"), "(s < 2)"},
      {replace("checkpoint/job-7/shard-1", "checkpoint/job-7/shard-01"),
       "is no checkpoint key of a part"},
      {replace("checkpoint/job-7/shard-1", "checkpoint/job-7/\xff"), "is not JSON"},
      {replace("\"150\"", "\"15x\""), "has steps '15x'"},
      {replace("\"150\"", "150"), "has 150"},
      {replace("\"resume_step\": 150,", ""), "resume_step is missing"},
      {std::string(kMaxCoordinatorStateBytes + 1, ' '), "holds"},
      {replace("0123456789abcdef0123456789abcdef", "../x"), "run is \"../x\""},
      {replace("\"0123456789abcdef0123456789abcdef\"", "7"), "run is 7"},
  };
  // A file written before runs were named has none.
  auto older =
      DecodeCoordinatorState(replace(" \"run\": \"0123456789abcdef0123456789abcdef\",\n", ""), "f");
  ASSERT_TRUE(older.ok()) << older.status().ToString();
  EXPECT_EQ(older->run, "");
  for (const auto& [bytes, words] : damaged) {
    auto refused = DecodeCoordinatorState(bytes, "the-file");
    ASSERT_FALSE(refused.ok()) << bytes.substr(0, 300);
    EXPECT_NE(refused.status().message().find(words), std::string::npos)
        << refused.status().message().substr(0, 500);
    EXPECT_LT(refused.status().message().size(), 1000u) << "a message echoing the file";
    EXPECT_NE(refused.status().message().find("the-file"), std::string::npos);
    EXPECT_NE(refused.status().message().find("--fresh"), std::string::npos);
  }
}

TEST_F(CoordinatorStateTest, ARestartedCoordinatorServesTheJobItKeptAndItsPartsRejoin) {
  auto first = RunJob({"100,150", "150"});
  ASSERT_TRUE(first);
  {
    // What is no part's steps is refused under the prefix (it is not kept
    // either: the file must stay one the next start accepts, with every
    // part).
    auto client = Connect(*first);
    std::string long_steps;
    for (int i = 1; i < 600; ++i) long_steps += std::to_string(i) + ",";
    for (const auto& [part, steps] :
         std::vector<std::pair<std::string, std::string>>{{"junk", "150"},
                                                          {"", "100"},
                                                          {"shard-2", "150"},
                                                          {"shard-01", "150"},
                                                          {"\xff\xfe", "150"},
                                                          {"worker-0", "not steps"},
                                                          {"worker-0", long_steps + "150"}}) {
      const Status refused = client->Set(CheckpointKey(1, part), steps);
      EXPECT_EQ(refused.code(), StatusCode::kInvalidArgument) << part << ": " << refused.ToString();
    }
    ASSERT_TRUE(client->Set(RunKey(1), "00ff00ff00ff00ff00ff00ff00ff00ff").ok());
    ASSERT_TRUE(client->Heartbeat().ok()) << "the coordinator still answers";
  }
  first->Stop();  // as if killed: stopping keeps the job as it was
  first.reset();

  auto started = StartCoordinator();
  ASSERT_TRUE(started.ok()) << started.status().ToString();
  auto second = std::move(started).value();
  auto observer = Connect(*second);
  auto map = observer->GetMap(false, 0ms);
  ASSERT_TRUE(map.ok());
  EXPECT_EQ(map->job, 1u);
  EXPECT_TRUE(map->shards.empty() && map->workers.empty());
  auto registry = observer->Get({CheckpointKey(1, "shard-0"), CheckpointKey(1, "shard-1")}, 0ms);
  ASSERT_TRUE(registry.ok()) << registry.status().ToString();
  EXPECT_EQ(*registry, (std::vector<std::string>{"100,150", "150"}));
  // The job's checkpoint run is kept too: a part rejoining is checked
  // against it (common/checkpoint_run.h).
  auto run = observer->Get({RunKey(1)}, 0ms);
  ASSERT_TRUE(run.ok()) << run.status().ToString();
  EXPECT_EQ((*run)[0], "00ff00ff00ff00ff00ff00ff00ff00ff");
  for (const std::string part : {"junk", "", "shard-2", "shard-01", "\xff\xfe", "worker-0"}) {
    EXPECT_FALSE(observer->Get({CheckpointKey(1, part)}, 0ms).ok()) << "kept '" << part << "'";
  }

  // A shard with fresh parameters would lose the training: refused.
  auto fresh = Connect(*second);
  auto refused = fresh->Register(Member(Role::kShard, 0), 2s);
  ASSERT_FALSE(refused.ok());
  EXPECT_NE(refused.status().message().find("joined after training started"), std::string::npos)
      << refused.status().ToString();
  // A code of its own, which the shard and worker turn into their "cannot
  // rejoin" exit status (a supervisor does not restart them into it again).
  EXPECT_EQ(refused.status().code(), StatusCode::kFailedPrecondition)
      << refused.status().ToString();
  // The parts rejoin from the step every part holds; the job rolls back.
  std::vector<std::unique_ptr<CoordinatorClient>> parts;
  for (auto [role, rank] : {std::pair{Role::kShard, 0}, {Role::kShard, 1}, {Role::kWorker, 0}}) {
    parts.push_back(Connect(*second));
    RegisterInfo info = Member(role, rank);
    info.rejoin_step = 150;
    auto registered = Register(*parts.back(), info);
    ASSERT_TRUE(registered.ok()) << registered.status().ToString();
    EXPECT_EQ(registered->map.job, 1u);
    EXPECT_EQ(registered->map.resume_step, 150u);
  }
  auto job = observer->CurrentJob();
  ASSERT_TRUE(job.ok());
  EXPECT_EQ(job->epoch, 3u) << "each rejoin moves the epoch";
  // Kept before the replies went out: another restart comes back here.
  auto kept = LoadCoordinatorState(path_);
  ASSERT_TRUE(kept.ok() && kept->has_value()) << kept.status().ToString();
  EXPECT_EQ((*kept)->epoch, 3u);
  EXPECT_EQ((*kept)->resume_step, 150u);
  EXPECT_TRUE((*kept)->training_started);
  // One coordinator per state file: a second one is refused, naming it.
  auto twin = StartCoordinator();
  ASSERT_FALSE(twin.ok());
  EXPECT_NE(twin.status().message().find("another coordinator keeps its job in " + path_),
            std::string::npos)
      << twin.status().ToString();
}

TEST_F(CoordinatorStateTest, AJobWithoutACompleteStepOrOfAnotherShapeIsNotRejoined) {
  auto restart = [&](std::unique_ptr<Coordinator> coordinator, uint32_t shards = 2) {
    coordinator->Stop();
    coordinator.reset();
    auto started = StartCoordinator(/*fresh=*/false, shards);
    EXPECT_TRUE(started.ok()) << started.status().ToString();
    return started.ok() ? std::move(started).value() : nullptr;
  };
  // Training started, nothing published: nothing to rejoin, the next job.
  auto coordinator = restart(RunJob({}));
  ASSERT_TRUE(coordinator);
  auto client = Connect(*coordinator);
  auto job = client->CurrentJob();
  ASSERT_TRUE(job.ok());
  EXPECT_EQ(job->job, 2u);
  EXPECT_TRUE(Register(*client, Member(Role::kShard, 0)).ok()) << "a fresh job's shard";
  client.reset();
  coordinator.reset();
  // Only shard 0 published its first step: no step every part holds.
  coordinator = restart(RunJob({"50"}));
  ASSERT_TRUE(coordinator);
  job = Connect(*coordinator)->CurrentJob();
  ASSERT_TRUE(job.ok());
  EXPECT_EQ(job->job, 2u) << "a job nobody can rejoin stayed open";
  coordinator.reset();
  // A job with a complete step, but the cluster now has 3 shards: as new
  // (job 1, so that the old run's parts refuse to start afresh over its
  // checkpoints).
  coordinator = restart(RunJob({"150", "150"}), /*shards=*/3);
  ASSERT_TRUE(coordinator);
  job = Connect(*coordinator)->CurrentJob();
  ASSERT_TRUE(job.ok());
  EXPECT_EQ(job->job, 1u);
  EXPECT_EQ(job->epoch, 0u);
  coordinator.reset();
  // --fresh forgets a job that could be rejoined.
  auto first = RunJob({"150", "150"});
  ASSERT_TRUE(first);
  first->Stop();
  first.reset();
  auto started = StartCoordinator(/*fresh=*/true);
  ASSERT_TRUE(started.ok()) << started.status().ToString();
  client = Connect(**started);
  job = client->CurrentJob();
  ASSERT_TRUE(job.ok());
  EXPECT_EQ(job->job, 1u);
  EXPECT_EQ(job->epoch, 0u);
  EXPECT_TRUE(Register(*client, Member(Role::kShard, 0)).ok()) << "a fresh job's shard";
}

TEST_F(CoordinatorStateTest, ADamagedOrUnwritableStateFailsStartNamingTheFile) {
  std::filesystem::create_directories(dir_);
  std::ofstream(path_) << "{\"format\": \"gridsync-coordinator-state\", \"version\": 1, \"job\": ";
  auto damaged = StartCoordinator();
  ASSERT_FALSE(damaged.ok());
  EXPECT_NE(damaged.status().message().find(path_), std::string::npos)
      << damaged.status().ToString();
  EXPECT_NE(damaged.status().message().find("is not JSON"), std::string::npos);
  // --fresh starts over it.
  auto fresh = StartCoordinator(/*fresh=*/true);
  ASSERT_TRUE(fresh.ok()) << fresh.status().ToString();
  fresh->reset();
  // A folder that cannot be created (a file stands in its place).
  std::filesystem::remove_all(dir_);
  std::ofstream(dir_.string()) << "a file, not a folder";
  auto unwritable = StartCoordinator();
  ASSERT_FALSE(unwritable.ok());
  EXPECT_NE(unwritable.status().message().find("cannot keep its state in " + path_),
            std::string::npos)
      << unwritable.status().ToString();
  std::filesystem::remove(dir_);
}

TEST_F(CoordinatorStateTest, AFileBeyondTheBoundIsRefusedUnread) {
  // 4 GiB of holes: refused by the size the file system reports, neither
  // read nor cut to the bound.
  std::filesystem::create_directories(dir_);
  std::ofstream(path_) << "{";
  std::filesystem::resize_file(path_, uint64_t{4} << 30);
  auto refused = LoadCoordinatorState(path_);
  ASSERT_FALSE(refused.ok());
  EXPECT_EQ(refused.status().code(), StatusCode::kCorruption);
  EXPECT_NE(refused.status().message().find(
                fmt::format("{}: the file holds 4294967296 bytes; allowed: at most {}", path_,
                            kMaxCoordinatorStateBytes)),
            std::string::npos)
      << refused.status().ToString();
}

TEST_F(CoordinatorStateTest, AFailedWriteRemovesTheFileARestartWouldTrust) {
  auto started = StartCoordinator(/*fresh=*/true);
  ASSERT_TRUE(started.ok()) << started.status().ToString();
  auto coordinator = std::move(started).value();
  ASSERT_TRUE(std::filesystem::exists(path_));
  // No room to write (as on a full disk): the next write fails.
  auto worker = Connect(*coordinator);
  {
    const ScopedFileSizeLimit no_room(0);
    ASSERT_TRUE(worker->Register(Member(Role::kWorker, 0), 2s).ok());
    ASSERT_TRUE(worker->Barrier("init", 1, "worker-0", 2s).ok()) << "serving goes on";
    EXPECT_FALSE(std::filesystem::exists(path_)) << "a file that no longer says what it serves";
  }
  // Writable again: the next change writes it whole.
  auto shard = Connect(*coordinator);  // shard 0 before it registers
  ASSERT_TRUE(shard->Set(CheckpointKey(1, "shard-0"), "50").ok());
  auto kept = LoadCoordinatorState(path_);
  ASSERT_TRUE(kept.ok() && kept->has_value()) << kept.status().ToString();
  EXPECT_TRUE((*kept)->training_started);
  EXPECT_EQ((*kept)->checkpoints.size(), 1u);
}

}  // namespace
}  // namespace gridsync
