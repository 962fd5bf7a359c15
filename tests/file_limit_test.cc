// RaiseOpenFileLimit (common/file_limit.h): raises the soft open-files
// limit up to what is asked and the hard limit allows, and never lowers it.
#include "common/file_limit.h"

#include <gtest/gtest.h>
#include <sys/resource.h>

namespace gridsync {
namespace {

class FileLimitTest : public ::testing::Test {
 protected:
  void SetUp() override { ASSERT_EQ(getrlimit(RLIMIT_NOFILE, &saved_), 0); }
  void TearDown() override { setrlimit(RLIMIT_NOFILE, &saved_); }

  // Lowers the soft limit (always allowed) and returns the hard one.
  static uint64_t SetSoft(rlim_t soft) {
    rlimit limit{};
    EXPECT_EQ(getrlimit(RLIMIT_NOFILE, &limit), 0);
    limit.rlim_cur = soft;
    EXPECT_EQ(setrlimit(RLIMIT_NOFILE, &limit), 0);
    return limit.rlim_max == RLIM_INFINITY ? UINT64_MAX : limit.rlim_max;
  }
  static uint64_t Soft() {
    rlimit limit{};
    EXPECT_EQ(getrlimit(RLIMIT_NOFILE, &limit), 0);
    return limit.rlim_cur;
  }

  rlimit saved_{};
};

TEST_F(FileLimitTest, RaisesToWhatIsAsked) {
  const uint64_t hard = SetSoft(64);
  if (hard < 200) GTEST_SKIP() << "skipped: the hard open-files limit is " << hard;
  const FileLimit got = RaiseOpenFileLimit(200);
  EXPECT_EQ(got.before, 64u);
  EXPECT_EQ(got.after, 200u);
  EXPECT_EQ(got.hard, hard);
  EXPECT_TRUE(got.raised());
  EXPECT_EQ(Soft(), 200u);
}

TEST_F(FileLimitTest, RaisesToTheHardLimitByDefault) {
  const uint64_t hard = SetSoft(64);
  if (hard <= 64) GTEST_SKIP() << "skipped: the hard open-files limit is " << hard;
  const FileLimit got = RaiseOpenFileLimit();
  EXPECT_EQ(got.after, hard);
  EXPECT_EQ(Soft(), hard);
}

TEST_F(FileLimitTest, NeverLowersNorPassesTheHardLimit) {
  const uint64_t hard = SetSoft(128);
  FileLimit got = RaiseOpenFileLimit(100);
  EXPECT_EQ(got.after, 128u);
  EXPECT_FALSE(got.raised());
  EXPECT_EQ(Soft(), 128u);
  if (hard == UINT64_MAX) return;
  got = RaiseOpenFileLimit(hard + 1000);
  EXPECT_EQ(got.after, hard);
  EXPECT_EQ(Soft(), hard);
}

}  // namespace
}  // namespace gridsync
