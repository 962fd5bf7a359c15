// Collectives when ranks fail: LocalCollective's order and failure model,
// Gloo's rendezvous, stalls and timeouts with ranks as threads, and Gloo
// ranks as forked processes meeting through the coordinator, one of them
// never joining or SIGKILLed. Each failure names the missing rank.
#include "tests/collective_test_util.h"

namespace gridsync {
namespace {

// ---- LocalCollective: determinism and its failure model ----

TEST(LocalCollective, SumsInRankOrderBitForBit) {
  constexpr int kSize = 4;
  auto ranks = LocalCollective::CreateGroup(kSize, 5s, "order");
  // Values whose float sum depends on the order: (1e8 + 1) - 1e8 + ... .
  const float inputs[kSize] = {1e8f, 1.0f, -1e8f, 1.0f};
  float expected = inputs[0];
  for (int r = 1; r < kSize; ++r) expected += inputs[r];
  std::vector<float> results(kSize);
  RunRanks(kSize, [&](int r) {
    float v = inputs[r];
    EXPECT_TRUE(ranks[static_cast<size_t>(r)]->AllReduceSum(&v, 1).ok());
    results[static_cast<size_t>(r)] = v;
  });
  for (float v : results) EXPECT_EQ(v, expected);  // ((1e8 + 1) - 1e8) + 1 = 1 in float
  EXPECT_EQ(expected, 1.0f);
}

TEST(LocalCollective, EveryOperationTimesOutNamingTheMissingRank) {
  const std::vector<std::pair<std::string, std::function<Status(Collective&)>>> ops = {
      {"AllReduceSum",
       [](Collective& c) {
         std::vector<float> d(10);
         return c.AllReduceSum(d.data(), d.size());
       }},
      {"ReduceScatterSum",
       [](Collective& c) {
         std::vector<float> in(6), out(2);
         return c.ReduceScatterSum(in.data(), out.data(), {2, 2, 2});
       }},
      {"AllGatherV",
       [](Collective& c) {
         std::vector<float> in(2), out(6);
         return c.AllGatherV(in.data(), {2, 2, 2}, out.data());
       }},
      {"Broadcast",
       [](Collective& c) {
         std::vector<float> d(10);
         return c.Broadcast(d.data(), d.size(), 2);
       }},
      {"Barrier", [](Collective& c) { return c.Barrier(); }},
  };
  for (const auto& [name, op] : ops) {
    auto ranks = LocalCollective::CreateGroup(3, 300ms, "timeouts");
    std::vector<Status> statuses(2);
    const auto start = Clock::now();
    RunRanks(2, [&, &op = op](int r) {
      statuses[static_cast<size_t>(r)] = op(*ranks[static_cast<size_t>(r)]);
    });
    EXPECT_LT(SecondsSince(start), 1.5) << name;
    // The rank that gives up first names rank 2; the other says the group
    // broke because of it, naming rank 2 as well.
    for (const auto& status : statuses) {
      EXPECT_EQ(status.code(), StatusCode::kTimeout) << status.ToString();
      EXPECT_CONTAINS(status.message(), name);
      EXPECT_CONTAINS(status.message(), "missing ranks: 2");
    }
    // The group is broken from now on.
    Status later = ranks[0]->Barrier();
    EXPECT_FALSE(later.ok());
    EXPECT_CONTAINS(later.message(), "broken by an earlier failure");
  }
}

TEST(LocalCollective, DisagreeingCallsFailOnEveryRank) {
  auto ranks = LocalCollective::CreateGroup(2, 5s, "disagree");
  std::vector<Status> statuses(2);
  RunRanks(2, [&](int r) {
    std::vector<float> d(10 + static_cast<size_t>(r));
    statuses[static_cast<size_t>(r)] =
        ranks[static_cast<size_t>(r)]->AllReduceSum(d.data(), d.size());
  });
  for (const auto& status : statuses) {
    EXPECT_EQ(status.code(), StatusCode::kInvalidArgument) << status.ToString();
    EXPECT_CONTAINS(status.message(),
                    "rank 0 called AllReduceSum(10 floats); rank 1 called AllReduceSum(11 floats)");
  }
}

TEST(LocalCollective, DestroyedOrAbortedPeerFailsPendingOperations) {
  {
    auto ranks = LocalCollective::CreateGroup(2, 10s, "leave");
    Status status;
    const auto start = Clock::now();
    std::thread waiter([&] {
      float v = 1.0f;
      status = ranks[0]->AllReduceSum(&v, 1);
    });
    std::this_thread::sleep_for(100ms);
    ranks[1].reset();  // what a dead process is to Gloo
    waiter.join();
    EXPECT_LT(SecondsSince(start), 2.0);
    EXPECT_EQ(status.code(), StatusCode::kIOError) << status.ToString();
    EXPECT_CONTAINS(status.message(), "rank 1 left group 'leave'");
  }
  {
    auto ranks = LocalCollective::CreateGroup(3, 10s, "abort");
    std::vector<Status> statuses(2);
    std::thread waiters([&] {
      RunRanks(2, [&](int r) {
        statuses[static_cast<size_t>(r)] = ranks[static_cast<size_t>(r)]->Barrier();
      });
    });
    std::this_thread::sleep_for(100ms);
    ranks[2]->Abort("injected fault");
    waiters.join();
    for (const auto& status : statuses) EXPECT_CONTAINS(status.ToString(), "injected fault");
  }
}

// ---- Gloo: rendezvous, groups, timeouts (ranks as threads) ----

TEST(GlooCollective, RankThatNeverJoinsFailsRendezvousNamingIt) {
  HashStore store;
  const std::string group = UniqueGroup("nojoin");
  std::vector<std::optional<Result<std::unique_ptr<Collective>>>> made(2);
  const auto start = Clock::now();
  RunRanks(2, [&](int r) {
    GlooCollectiveOptions options;
    options.timeout = 2s;
    made[static_cast<size_t>(r)].emplace(NewGlooCollective(&store, r, 3, group, options));
  });
  const double seconds = SecondsSince(start);
  EXPECT_LT(seconds, 2.0 + 1.5);
  for (auto& result : made) {
    ASSERT_FALSE(result->ok());
    EXPECT_EQ(result->status().code(), StatusCode::kTimeout) << result->status().ToString();
    EXPECT_CONTAINS(result->status().message(), "ranks that did not join: 2");
    EXPECT_CONTAINS(result->status().message(), "group '" + group + "'");
  }
}

TEST(GlooCollective, EveryOperationTimesOutWhenAPeerStalls) {
  const std::vector<std::pair<std::string, std::function<Status(Collective&)>>> ops = {
      {"AllReduceSum",
       [](Collective& c) {
         std::vector<float> d(1000);
         return c.AllReduceSum(d.data(), d.size());
       }},
      {"ReduceScatterSum",
       [](Collective& c) {
         std::vector<float> in(600), out(200);
         return c.ReduceScatterSum(in.data(), out.data(), {200, 200, 200});
       }},
      {"AllGatherV",
       [](Collective& c) {
         std::vector<float> in(200), out(600);
         return c.AllGatherV(in.data(), {200, 200, 200}, out.data());
       }},
      {"Broadcast",
       [](Collective& c) {
         std::vector<float> d(1000);
         return c.Broadcast(d.data(), d.size(), 2);
       }},
      {"Barrier", [](Collective& c) { return c.Barrier(); }},
  };
  for (const auto& [name, op] : ops) {
    HashStore store;
    const std::string group = UniqueGroup("stall");
    auto ranks = MakeGroup(Backend::kGloo, 3, 1s, group, &store);
    ASSERT_EQ(ranks.size(), 3u);
    std::vector<Status> statuses(2);
    std::vector<double> seconds(2);
    // Rank 2 stays alive but never enters the operation.
    RunRanks(2, [&, &op = op](int r) {
      const auto start = Clock::now();
      statuses[static_cast<size_t>(r)] = op(*ranks[static_cast<size_t>(r)]);
      seconds[static_cast<size_t>(r)] = SecondsSince(start);
    });
    for (int r = 0; r < 2; ++r) {
      const Status& status = statuses[static_cast<size_t>(r)];
      EXPECT_FALSE(status.ok()) << name << " on rank " << r;
      EXPECT_TRUE(status.code() == StatusCode::kTimeout || status.code() == StatusCode::kIOError)
          << status.ToString();
      EXPECT_CONTAINS(status.message(), "gloo " + name);
      EXPECT_CONTAINS(status.message(),
                      "group '" + group + "' (rank " + std::to_string(r) + " of 3)");
      EXPECT_LT(seconds[static_cast<size_t>(r)], 1.0 + 1.5) << name;
    }
    // The first rank to give up reports the timeout; Gloo then closes its
    // pairs, so the other may see the connection close first.
    EXPECT_TRUE(statuses[0].code() == StatusCode::kTimeout ||
                statuses[1].code() == StatusCode::kTimeout)
        << statuses[0].ToString() << " / " << statuses[1].ToString();
    Status later = ranks[0]->Barrier();
    EXPECT_CONTAINS(later.message(), "broken by an earlier failure");
  }
}

TEST(GlooCollective, SeveralGroupsShareOneStore) {
  HashStore store;
  // A flat group of 4 and two "intra-node" pairs, all through one store.
  std::vector<std::unique_ptr<Collective>> flat(4), pair(4);
  std::vector<Status> statuses(4);
  RunRanks(4, [&](int r) {
    GlooCollectiveOptions options;
    options.timeout = 10s;
    auto f = NewGlooCollective(&store, r, 4, "flat-g1", options);
    auto p = NewGlooCollective(&store, r % 2, 2, "node" + std::to_string(r / 2) + "-g1", options);
    if (!f.ok() || !p.ok()) {
      statuses[static_cast<size_t>(r)] = f.ok() ? p.status() : f.status();
      return;
    }
    flat[static_cast<size_t>(r)] = std::move(f).value();
    pair[static_cast<size_t>(r)] = std::move(p).value();
    float a = static_cast<float>(r);
    float b = static_cast<float>(r);
    Status s1 = flat[static_cast<size_t>(r)]->AllReduceSum(&a, 1);
    Status s2 = pair[static_cast<size_t>(r)]->AllReduceSum(&b, 1);
    statuses[static_cast<size_t>(r)] = s1.ok() ? s2 : s1;
    EXPECT_EQ(a, 6.0f);
    EXPECT_EQ(b, r < 2 ? 1.0f : 5.0f);
  });
  for (const auto& status : statuses) EXPECT_TRUE(status.ok()) << status.ToString();
}

// ---- Gloo: ranks as forked processes, rendezvous through the coordinator ----

struct Child {
  pid_t pid = -1;
  int result_fd = -1;    // the child's report
  int progress_fd = -1;  // optional: the child writes a byte when asked
};

struct Outcome {
  bool exited = false;
  int exit_code = -1;
  int signal = 0;
  std::string report;
};

// Forks a child that runs body(progress_fd) and reports the returned text.
Child Spawn(const std::function<std::string(int progress_fd)>& body) {
  int result[2];
  int progress[2];
  if (pipe(result) != 0 || pipe(progress) != 0) {
    ADD_FAILURE() << "pipe: " << std::strerror(errno);
    return {};
  }
  const pid_t pid = fork();
  if (pid == 0) {
    prctl(PR_SET_PDEATHSIG, SIGKILL);  // never outlive the test
    close(result[0]);
    close(progress[0]);
    const std::string report = body(progress[1]);
    size_t written = 0;
    while (written < report.size()) {
      const ssize_t n = write(result[1], report.data() + written, report.size() - written);
      if (n < 0 && errno == EINTR) continue;
      if (n <= 0) break;
      written += static_cast<size_t>(n);
    }
    _exit(0);  // no gtest teardown in the child
  }
  close(result[1]);
  close(progress[1]);
  if (pid < 0) ADD_FAILURE() << "fork: " << std::strerror(errno);
  return Child{pid, result[0], progress[0]};
}

// Waits for the child until `deadline`, then kills it.
Outcome Reap(Child& child, Clock::time_point deadline) {
  Outcome outcome;
  int status = 0;
  for (;;) {
    const pid_t done = waitpid(child.pid, &status, WNOHANG);
    if (done == child.pid) break;
    if (Clock::now() > deadline) {
      kill(child.pid, SIGKILL);
      waitpid(child.pid, &status, 0);
      ADD_FAILURE() << "child " << child.pid << " hung; killed";
      break;
    }
    std::this_thread::sleep_for(10ms);
  }
  outcome.exited = WIFEXITED(status);
  outcome.exit_code = outcome.exited ? WEXITSTATUS(status) : -1;
  outcome.signal = WIFSIGNALED(status) ? WTERMSIG(status) : 0;
  char buffer[4096];
  ssize_t n;
  while ((n = read(child.result_fd, buffer, sizeof(buffer))) > 0)
    outcome.report.append(buffer, static_cast<size_t>(n));
  close(child.result_fd);
  close(child.progress_fd);
  return outcome;
}

class GlooMultiProcess : public ::testing::Test {
 protected:
  void SetUp() override {
    CoordinatorOptions options;
    options.port = 0;
    auto started = Coordinator::Start(options);
    ASSERT_TRUE(started.ok()) << started.status().ToString();
    coordinator_ = std::move(started).value();
  }
  void TearDown() override {
    if (coordinator_) coordinator_->Stop();
  }

  // In the child: a CoordinatorStore and a Gloo rank of `group`.
  struct Joined {
    std::unique_ptr<CoordinatorClient> client;
    std::unique_ptr<CoordinatorStore> store;
    std::unique_ptr<Collective> collective;
    Status status;
  };
  Joined Join(int rank, int size, const std::string& group, std::chrono::milliseconds timeout) {
    Joined joined;
    auto client = CoordinatorClient::Connect("127.0.0.1", coordinator_->port(), 5s);
    if (!client.ok()) {
      joined.status = client.status();
      return joined;
    }
    joined.client = std::move(client).value();
    joined.store = std::make_unique<CoordinatorStore>(joined.client.get());
    GlooCollectiveOptions options;
    options.timeout = timeout;
    auto made = NewGlooCollective(joined.store.get(), rank, size, group, options);
    if (!made.ok()) {
      joined.status = made.status();
      return joined;
    }
    joined.collective = std::move(made).value();
    return joined;
  }

  std::unique_ptr<Coordinator> coordinator_;
};

TEST_F(GlooMultiProcess, OperationsAcrossProcesses) {
  constexpr int kSize = 3;
  const std::string group = UniqueGroup("procs");
  std::vector<Child> children;
  for (int r = 0; r < kSize; ++r) {
    children.push_back(Spawn([&, r](int) -> std::string {
      Joined joined = Join(r, kSize, group, 10s);
      if (!joined.status.ok()) return "join: " + joined.status.ToString();
      return ExerciseAllOperations(*joined.collective);
    }));
  }
  const auto deadline = Clock::now() + 20s;
  for (int r = 0; r < kSize; ++r) {
    Outcome outcome = Reap(children[static_cast<size_t>(r)], deadline);
    EXPECT_TRUE(outcome.exited && outcome.exit_code == 0)
        << "rank " << r << " signal " << outcome.signal;
    EXPECT_EQ(outcome.report, "") << "rank " << r;
  }
}

TEST_F(GlooMultiProcess, RankThatNeverJoinsFailsTheOthersWithinTheTimeout) {
  const std::string group = UniqueGroup("procs-nojoin");
  std::vector<Child> children;
  const auto start = Clock::now();
  for (int r = 0; r < 2; ++r) {  // rank 2 of 3 never starts
    children.push_back(Spawn([&, r](int) -> std::string {
      Joined joined = Join(r, 3, group, 2s);
      return joined.status.ok() ? std::string("joined without rank 2") : joined.status.ToString();
    }));
  }
  for (auto& child : children) {
    Outcome outcome = Reap(child, start + 10s);
    EXPECT_TRUE(outcome.exited);
    EXPECT_CONTAINS(outcome.report, "Timeout");
    EXPECT_CONTAINS(outcome.report, "ranks that did not join: 2");
  }
  EXPECT_LT(SecondsSince(start), 2.0 + 2.0);
}

TEST_F(GlooMultiProcess, SigkilledRankFailsTheOthersWithinTheTimeout) {
  constexpr int kSize = 3;
  constexpr auto kTimeout = 2s;
  const std::string group = UniqueGroup("procs-kill");
  std::vector<Child> children;
  for (int r = 0; r < kSize; ++r) {
    children.push_back(Spawn([&, r](int progress_fd) -> std::string {
      Joined joined = Join(r, kSize, group, kTimeout);
      if (!joined.status.ok()) return "join: " + joined.status.ToString();
      std::vector<float> data(size_t{1} << 18);
      for (int it = 0; it < 1000000; ++it) {
        std::fill(data.begin(), data.end(), 1.0f);
        Status status = joined.collective->AllReduceSum(data.data(), data.size());
        if (!status.ok())
          return "failed after " + std::to_string(it) + " all-reduces: " + status.ToString();
        if (it == 3 && write(progress_fd, "x", 1) != 1) return "progress pipe";
      }
      return "never failed";
    }));
  }
  // Once rank 2 has done a few all-reduces, kill it in the middle of the run.
  pollfd ready{children[2].progress_fd, POLLIN, 0};
  ASSERT_EQ(poll(&ready, 1, 15000), 1) << "rank 2 made no progress";
  ASSERT_EQ(kill(children[2].pid, SIGKILL), 0);
  const auto killed = Clock::now();
  Outcome victim = Reap(children[2], killed + 5s);
  EXPECT_EQ(victim.signal, SIGKILL);
  for (int r = 0; r < 2; ++r) {
    Outcome outcome = Reap(children[static_cast<size_t>(r)], killed + 10s);
    EXPECT_TRUE(outcome.exited) << "rank " << r << " signal " << outcome.signal;
    EXPECT_CONTAINS(outcome.report, "failed after");
    EXPECT_CONTAINS(outcome.report, "gloo AllReduceSum(262144 floats) in group '" + group +
                                        "' (rank " + std::to_string(r) + " of 3)");
  }
  EXPECT_LT(SecondsSince(killed), 2.0 + 2.0) << "the survivors must fail within the timeout";
}

}  // namespace
}  // namespace gridsync
