// The job gate (server/job_gate.h): a shard moves to a new job or epoch
// only once the coordinator confirms it, a failed question judges no other
// claim, and a rejoining shard serves nothing until it is opened.
#include "server/job_gate.h"

#include <gtest/gtest.h>

#include <chrono>
#include <string>
#include <thread>

namespace gridsync {
namespace {

TEST(JobGateTest, EpochsMoveOnlyWhenTheCoordinatorConfirms) {
  JobState cluster{1, 0, 0, {}};
  int asked = 0;
  // Questions at least 300 ms apart: the waits below stay inside that
  // window even on a busy machine.
  constexpr auto kInterval = std::chrono::milliseconds(300);
  JobGate gate(0, /*closed=*/false, kInterval);
  gate.SetSource([&]() -> Result<JobState> {
    ++asked;
    return cluster;
  });
  auto first = gate.Admit(1, 0, 0);
  ASSERT_TRUE(first.ok()) << first.status().ToString();
  EXPECT_EQ(first->verdict, JobGate::Verdict::kCurrent);
  // A message claiming an epoch the coordinator does not know is refused
  // (asked about once the 10 ms since the last question have passed).
  std::this_thread::sleep_for(kInterval + std::chrono::milliseconds(5));
  auto claimed = gate.Admit(1, 1, 1);
  ASSERT_FALSE(claimed.ok());
  EXPECT_NE(claimed.status().message().find("not the cluster's"), std::string::npos)
      << claimed.status().ToString();
  EXPECT_EQ(gate.epoch(), 0u);
  // Claims that arrived before that answer are refused on it, whatever
  // they claim; ones that arrived since wait for the next question (10 ms
  // later), without asking and without sleeping: a flood of invented
  // futures costs one question per 10 ms and never holds up the shard.
  const int asked_before = asked;
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
  EXPECT_FALSE(gate.Admit(1, 3, 1, waited).ok());
  EXPECT_EQ(asked, asked_before + 1);
  EXPECT_FALSE(gate.Admit(1, 2, 1, waited).ok());
  EXPECT_EQ(asked, asked_before + 1);
  // A shard rejoined from step 150: the first message of epoch 1 rolls back.
  std::this_thread::sleep_for(kInterval + std::chrono::milliseconds(5));
  cluster = {1, 1, 150, {}};
  auto rolled = gate.Admit(1, 1, 0);
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
    auto behind = fresh.Admit(1, 0, 4);
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
  cluster = {2, 0, 0, {}};
  std::this_thread::sleep_for(kInterval + std::chrono::milliseconds(5));
  auto next = gate.Admit(2, 0, 0);
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
  JobState cluster{1, 0, 0, {}};
  bool reachable = true;
  JobGate gate(0, /*closed=*/false, kInterval);
  gate.SetSource([&]() -> Result<JobState> {
    if (!reachable) return Status::Timeout("coordinator restarting");
    return cluster;
  });
  ASSERT_TRUE(gate.Admit(1, 0, 0).ok());
  std::this_thread::sleep_for(kInterval + std::chrono::milliseconds(5));
  const auto arrived = JobGate::Clock::now();
  reachable = false;
  auto first = gate.Admit(2, 0, 0, arrived);
  ASSERT_FALSE(first.ok());
  EXPECT_NE(first.status().message().find("confirming job 2"), std::string::npos)
      << first.status().ToString();
  auto second = gate.Admit(2, 0, 1, arrived);
  ASSERT_TRUE(second.ok()) << "refused on the state before: " << second.status().ToString();
  EXPECT_EQ(second->verdict, JobGate::Verdict::kWait);
  reachable = true;
  cluster = {2, 0, 0, {}};
  std::this_thread::sleep_for(kInterval + std::chrono::milliseconds(5));
  auto third = gate.Admit(2, 0, 1, arrived);
  ASSERT_TRUE(third.ok()) << third.status().ToString();
  EXPECT_EQ(third->verdict, JobGate::Verdict::kNewJob);
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
