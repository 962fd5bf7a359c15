// ScopedFileSizeLimit: while it lives, this process may not grow a file
// past `bytes` (RLIMIT_FSIZE; writes fail with EFBIG, SIGXFSZ ignored), so a
// test can make a real write fail the way a full disk does, without root,
// a mount or a file name the code under test must use.
//
// Thread safety: the limit and the signal disposition are process-wide;
// make one at a time, on the test's thread.
#pragma once

#include <gtest/gtest.h>
#include <sys/resource.h>

#include <csignal>

namespace gridsync {

class ScopedFileSizeLimit {
 public:
  explicit ScopedFileSizeLimit(rlim_t bytes) {
    EXPECT_EQ(getrlimit(RLIMIT_FSIZE, &old_), 0);
    old_handler_ = std::signal(SIGXFSZ, SIG_IGN);
    rlimit limit = old_;
    limit.rlim_cur = bytes;
    EXPECT_EQ(setrlimit(RLIMIT_FSIZE, &limit), 0);
  }
  ~ScopedFileSizeLimit() {
    EXPECT_EQ(setrlimit(RLIMIT_FSIZE, &old_), 0);
    std::signal(SIGXFSZ, old_handler_);
  }
  ScopedFileSizeLimit(const ScopedFileSizeLimit&) = delete;
  ScopedFileSizeLimit& operator=(const ScopedFileSizeLimit&) = delete;

 private:
  rlimit old_{};
  void (*old_handler_)(int) = SIG_DFL;
};

}  // namespace gridsync
