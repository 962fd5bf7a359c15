// The job gate (server/job_gate.h): a shard moves to a new job or epoch
// only once the coordinator confirms it, a failed question judges no other
// claim, and a rejoining shard serves nothing until it is opened.
#include "server/job_gate.h"

#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <mutex>
#include <string>
#include <thread>

namespace gridsync {
namespace {

// Admits as the shard does: a claim told to wait (the question runs on the
// gate's own thread) looks again at its retry time, for up to 5 s.
Result<JobGate::Admission> Settled(JobGate& gate, uint64_t job, uint32_t epoch, uint32_t worker,
                                   JobGate::Clock::time_point received = JobGate::Clock::now()) {
  const auto deadline = JobGate::Clock::now() + std::chrono::seconds(5);
  for (;;) {
    auto admitted = gate.Admit(job, epoch, worker, received);
    if (!admitted.ok() || admitted->verdict != JobGate::Verdict::kWait ||
        JobGate::Clock::now() > deadline) {
      return admitted;
    }
    std::this_thread::sleep_until(admitted->retry_at);
  }
}

// The coordinator's state as a test sets it, read on the gate's thread.
class Cluster {
 public:
  explicit Cluster(JobState state) : state_(std::move(state)) {}
  void Set(JobState state) {
    std::lock_guard<std::mutex> lock(mu_);
    state_ = std::move(state);
  }
  JobState Get() {
    std::lock_guard<std::mutex> lock(mu_);
    return state_;
  }

 private:
  std::mutex mu_;
  JobState state_;
};

TEST(JobGateTest, EpochsMoveOnlyWhenTheCoordinatorConfirms) {
  Cluster cluster(JobState{1, 0, 0, {}});
  std::atomic<int> asked{0};
  // Questions at least 300 ms apart: the waits below stay inside that
  // window even on a busy machine.
  constexpr auto kInterval = std::chrono::milliseconds(300);
  JobGate gate(0, /*closed=*/false, kInterval);
  gate.SetSource([&]() -> Result<JobState> {
    ++asked;
    return cluster.Get();
  });
  auto first = Settled(gate, 1, 0, 0);
  ASSERT_TRUE(first.ok()) << first.status().ToString();
  EXPECT_EQ(first->verdict, JobGate::Verdict::kCurrent);
  // A message claiming an epoch the coordinator does not know is refused
  // (asked about once the 10 ms since the last question have passed).
  std::this_thread::sleep_for(kInterval + std::chrono::milliseconds(5));
  auto claimed = Settled(gate, 1, 1, 1);
  ASSERT_FALSE(claimed.ok());
  EXPECT_NE(claimed.status().message().find("not the cluster's"), std::string::npos)
      << claimed.status().ToString();
  EXPECT_EQ(gate.epoch(), 0u);
  // Claims that arrived before that answer are refused on it, whatever
  // they claim; ones that arrived since wait for the next question (10 ms
  // later), without asking and without sleeping: a flood of invented
  // futures costs one question per 10 ms and never holds up the shard.
  const int asked_before = asked.load();
  const auto earlier = JobGate::Clock::now() - std::chrono::seconds(1);
  EXPECT_FALSE(gate.Admit(1, 1, 1, earlier).ok());
  EXPECT_FALSE(gate.Admit(1, 7, 1, earlier).ok());
  for (uint32_t epoch : {3u, 2u, 1u}) {
    const auto start = JobGate::Clock::now();
    auto later = gate.Admit(1, epoch, 1);
    ASSERT_TRUE(later.ok()) << later.status().ToString();
    EXPECT_EQ(later->verdict, JobGate::Verdict::kWait);
    EXPECT_GT(later->retry_at, start);
    EXPECT_LE(later->retry_at, start + kInterval);
    EXPECT_LT(JobGate::Clock::now() - start, kInterval / 3) << "it slept";
  }
  EXPECT_EQ(asked, asked_before);
  // Once the next question may be asked, a waiting claim is asked about
  // and refused on the answer.
  std::this_thread::sleep_for(kInterval + std::chrono::milliseconds(5));
  const auto waited = JobGate::Clock::now() - std::chrono::milliseconds(1);
  EXPECT_FALSE(Settled(gate, 1, 3, 1, waited).ok());
  EXPECT_EQ(asked, asked_before + 1);
  EXPECT_FALSE(gate.Admit(1, 2, 1, waited).ok());
  EXPECT_EQ(asked, asked_before + 1);
  // A shard rejoined from step 150: the first message of epoch 1 rolls back.
  std::this_thread::sleep_for(kInterval + std::chrono::milliseconds(5));
  cluster.Set({1, 1, 150, {}});
  auto rolled = Settled(gate, 1, 1, 0);
  ASSERT_TRUE(rolled.ok()) << rolled.status().ToString();
  EXPECT_EQ(rolled->verdict, JobGate::Verdict::kRollBack);
  EXPECT_EQ(rolled->resume_step, 150u);
  EXPECT_EQ(gate.epoch(), 1u);
  auto again = gate.Admit(1, 1, 0);
  ASSERT_TRUE(again.ok());
  EXPECT_EQ(again->verdict, JobGate::Verdict::kCurrent);
  // The other worker, still at epoch 0, is refused by name.
  auto stale = gate.Admit(1, 0, 1);
  ASSERT_FALSE(stale.ok());
  EXPECT_NE(stale.status().message().find("worker 1"), std::string::npos);
  EXPECT_NE(stale.status().message().find("rolled back"), std::string::npos);
  // A fresh shard (job 0) does not take a claim behind the cluster's as
  // its job: the coordinator runs job 3, a leftover worker claims job 1.
  {
    JobGate fresh(1);
    fresh.SetSource([]() -> Result<JobState> { return JobState{3, 0, 0, {}}; });
    auto behind = Settled(fresh, 1, 0, 4);
    ASSERT_FALSE(behind.ok());
    EXPECT_NE(behind.status().message().find("job 1 of worker 4 is stale: the coordinator runs "
                                             "job 3"),
              std::string::npos)
        << behind.status().ToString();
    EXPECT_EQ(fresh.job(), 0u);
    auto current = fresh.Admit(3, 0, 0);
    ASSERT_TRUE(current.ok()) << current.status().ToString();
    EXPECT_EQ(fresh.job(), 3u);
  }
  // A new job starts afresh, at its own epoch 0.
  cluster.Set({2, 0, 0, {}});
  std::this_thread::sleep_for(kInterval + std::chrono::milliseconds(5));
  auto next = Settled(gate, 2, 0, 0);
  ASSERT_TRUE(next.ok());
  EXPECT_EQ(next->verdict, JobGate::Verdict::kNewJob);
  EXPECT_EQ(gate.job(), 2u);
  EXPECT_EQ(gate.epoch(), 0u);
  EXPECT_GE(asked, 2);
}

// A question the coordinator does not answer is no answer: the claims
// waiting with the one that asked wait for the next question instead of
// being refused on the state before (the legitimate workers of a new job
// failed while their coordinator restarted).
TEST(JobGateTest, AFailedQuestionJudgesNoOtherClaim) {
  constexpr auto kInterval = std::chrono::milliseconds(200);
  Cluster cluster(JobState{1, 0, 0, {}});
  std::atomic<bool> reachable{true};
  JobGate gate(0, /*closed=*/false, kInterval);
  gate.SetSource([&]() -> Result<JobState> {
    if (!reachable) return Status::Timeout("coordinator restarting");
    return cluster.Get();
  });
  ASSERT_TRUE(Settled(gate, 1, 0, 0).ok());
  std::this_thread::sleep_for(kInterval + std::chrono::milliseconds(5));
  const auto arrived = JobGate::Clock::now();
  reachable = false;
  auto first = Settled(gate, 2, 0, 0, arrived);
  ASSERT_FALSE(first.ok());
  EXPECT_NE(first.status().message().find("confirming job 2"), std::string::npos)
      << first.status().ToString();
  auto second = gate.Admit(2, 0, 1, arrived);
  ASSERT_TRUE(second.ok()) << "refused on the state before: " << second.status().ToString();
  EXPECT_EQ(second->verdict, JobGate::Verdict::kWait);
  reachable = true;
  cluster.Set({2, 0, 0, {}});
  std::this_thread::sleep_for(kInterval + std::chrono::milliseconds(5));
  auto third = Settled(gate, 2, 0, 1, arrived);
  ASSERT_TRUE(third.ok()) << third.status().ToString();
  EXPECT_EQ(third->verdict, JobGate::Verdict::kNewJob);
}

// The question is asked on the gate's own thread: a coordinator that was
// stopped (SIGSTOP) or cut off held the shard's serving thread for the
// client's reply timeout, up to 10 s, per question. Now a claim waiting on
// it looks again every few ms without blocking, the current epoch's
// messages are admitted meanwhile, one question is out however often the
// claim looks, and the answer, when it comes, decides the claim.
TEST(JobGateTest, AQuestionTheCoordinatorIsSlowToAnswerHoldsUpNoMessage) {
  std::mutex mu;
  std::condition_variable answer;
  bool release = false;
  std::atomic<int> asked{0};
  JobGate gate(0, /*closed=*/false, std::chrono::milliseconds(10));
  gate.SetSource([&]() -> Result<JobState> {
    const int question = ++asked;
    if (question == 1) return JobState{1, 0, 0, {}};
    std::unique_lock<std::mutex> lock(mu);
    answer.wait_for(lock, std::chrono::seconds(20), [&] { return release; });
    return JobState{1, 1, 100, {}};
  });
  auto first = Settled(gate, 1, 0, 0);
  ASSERT_TRUE(first.ok()) << first.status().ToString();
  ASSERT_EQ(first->verdict, JobGate::Verdict::kCurrent);
  std::this_thread::sleep_for(std::chrono::milliseconds(15));
  const auto arrived = JobGate::Clock::now();
  for (int look = 0; look < 40; ++look) {
    const auto start = JobGate::Clock::now();
    auto waiting = gate.Admit(1, 1, 1, arrived);
    ASSERT_TRUE(waiting.ok()) << waiting.status().ToString();
    ASSERT_EQ(waiting->verdict, JobGate::Verdict::kWait);
    EXPECT_LT(JobGate::Clock::now() - start, std::chrono::milliseconds(200))
        << "the serving thread waited for the coordinator";
    auto current = gate.Admit(1, 0, 0);
    ASSERT_TRUE(current.ok()) << current.status().ToString();
    EXPECT_EQ(current->verdict, JobGate::Verdict::kCurrent);
    std::this_thread::sleep_until(waiting->retry_at);
  }
  EXPECT_EQ(asked.load(), 2);
  {
    std::lock_guard<std::mutex> lock(mu);
    release = true;
  }
  answer.notify_all();
  auto rolled = Settled(gate, 1, 1, 1, arrived);
  ASSERT_TRUE(rolled.ok()) << rolled.status().ToString();
  EXPECT_EQ(rolled->verdict, JobGate::Verdict::kRollBack);
  EXPECT_EQ(rolled->resume_step, 100u);
  EXPECT_EQ(gate.epoch(), 1u);
}

TEST(JobGateTest, ARejoiningShardServesNothingUntilOpened) {
  JobGate gate(3, /*closed=*/true);
  gate.SetSource([]() -> Result<JobState> { return JobState{1, 2, 150, {}}; });
  auto refused = gate.Admit(1, 1, 0);  // queued before the shard died
  ASSERT_FALSE(refused.ok());
  EXPECT_NE(refused.status().message().find("rejoin from a checkpoint"), std::string::npos);
  gate.Open(1, 2);
  auto old = gate.Admit(1, 1, 0);
  ASSERT_FALSE(old.ok());
  auto current = gate.Admit(1, 2, 0);
  ASSERT_TRUE(current.ok());
  EXPECT_EQ(current->verdict, JobGate::Verdict::kCurrent);
}

}  // namespace
}  // namespace gridsync
