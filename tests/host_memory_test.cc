// What a process may still allocate: MemAvailable, bounded by the memory
// cgroups it runs in (a systemd unit's MemoryMax=), v1 and v2, ancestors
// included. Fake /proc and /sys trees in a temporary folder.
#include "common/host_memory.h"

#include <gtest/gtest.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <string>

namespace gridsync {
namespace {

namespace fs = std::filesystem;

class HostMemoryTest : public ::testing::Test {
 protected:
  void SetUp() override {
    root_ = fs::temp_directory_path() / ("gridsync-mem-" + std::to_string(::getpid()));
    fs::remove_all(root_);
    fs::create_directories(root_);
    Write("meminfo", "MemTotal:       32000000 kB\nMemAvailable:   20000000 kB\n");
  }
  void TearDown() override { fs::remove_all(root_); }
  void Write(const std::string& relative, const std::string& text) {
    const fs::path path = root_ / relative;
    fs::create_directories(path.parent_path());
    std::ofstream(path) << text;
  }
  uint64_t Available() {
    return AvailableMemoryBytesFrom((root_ / "meminfo").string(), (root_ / "cgroup").string(),
                                    (root_ / "sys").string());
  }
  fs::path root_;
};

constexpr uint64_t kMemAvailable = uint64_t{20000000} * 1024;

TEST_F(HostMemoryTest, WithoutALimitItIsMemAvailable) {
  Write("cgroup", "4:memory:/user.slice\n0::/user.slice\n");
  Write("sys/memory/user.slice/memory.limit_in_bytes", "9223372036854771712\n");
  Write("sys/user.slice/memory.max", "max\n");
  EXPECT_EQ(Available(), kMemAvailable);
}

TEST_F(HostMemoryTest, AV1LimitOfTheCgroupOrAnAncestorBounds) {
  Write("cgroup", "4:memory:/system.slice/gridsync-ps@0.service\n");
  Write("sys/memory/system.slice/gridsync-ps@0.service/memory.limit_in_bytes", "8589934592\n");
  Write("sys/memory/system.slice/gridsync-ps@0.service/memory.usage_in_bytes", "1073741824\n");
  EXPECT_EQ(Available(), uint64_t{7} << 30);
  Write("sys/memory/system.slice/memory.limit_in_bytes", "4294967296\n");
  Write("sys/memory/system.slice/memory.usage_in_bytes", "3221225472\n");
  EXPECT_EQ(Available(), uint64_t{1} << 30);
}

TEST_F(HostMemoryTest, AV2MemoryMaxBounds) {
  Write("cgroup", "0::/system.slice/gridsync-ps@0.service\n");
  Write("sys/system.slice/gridsync-ps@0.service/memory.max", "8589934592\n");
  Write("sys/system.slice/gridsync-ps@0.service/memory.current", "536870912\n");
  EXPECT_EQ(Available(), (uint64_t{8} << 30) - (uint64_t{1} << 29));
  // Hybrid hierarchies mount v2 under unified/.
  Write("sys/unified/system.slice/memory.max", "2147483648\n");
  Write("sys/unified/system.slice/memory.current", "0\n");
  EXPECT_EQ(Available(), uint64_t{2} << 30);
}

// A hostile probe: under `ulimit -v` an image was refused as stb's
// "outofmem". The process's own limit now bounds what is available, so the
// checks before decoding name the memory. In a child: limits stay there.
TEST(HostMemoryLimitTest, AnAddressSpaceLimitBoundsThisProcessNotTheMachine) {
  const uint64_t unlimited = AvailableMemoryBytes();
  if (unlimited == 0) GTEST_SKIP() << "MemAvailable unreadable here";
  const pid_t child = ::fork();
  ASSERT_GE(child, 0);
  if (child == 0) {
    // 64 MiB past what the process maps now.
    uint64_t vm_size = 0;
    std::ifstream in("/proc/self/status");
    for (std::string line; std::getline(in, line);) {
      if (line.rfind("VmSize:", 0) == 0) vm_size = std::stoull(line.substr(7)) * 1024;
    }
    const rlimit limit{vm_size + (uint64_t{64} << 20), vm_size + (uint64_t{64} << 20)};
    if (vm_size == 0 || ::setrlimit(RLIMIT_AS, &limit) != 0) ::_exit(2);
    // This process's own allocations are bounded by it; a machine's sum
    // (processes each with a limit of their own) is not.
    const uint64_t bounded = AvailableToThisProcessBytes();
    if (!(bounded > 0 && bounded <= (uint64_t{64} << 20))) ::_exit(1);
    ::_exit(unlimited < (uint64_t{256} << 20) || AvailableMemoryBytes() > (uint64_t{128} << 20)
                ? 0
                : 3);
  }
  int status = 0;
  ASSERT_EQ(::waitpid(child, &status, 0), child);
  ASSERT_TRUE(WIFEXITED(status));
  EXPECT_EQ(WEXITSTATUS(status), 0)
      << "1: not bounded by the limit; 2: could not set it; 3: the machine's figure was";
}

TEST_F(HostMemoryTest, NoMemInfoMeansUnknown) {
  fs::remove(root_ / "meminfo");
  EXPECT_EQ(Available(), 0u);
}

// A refusal comparing two sizes prints them apart: "needs about 0.3 GiB but
// 0.3 GiB are available" read as a contradiction (a hostile probe).
TEST(NeedAndAvailableTest, TheTwoSizesAlwaysDiffer) {
  constexpr uint64_t kMiB = uint64_t{1} << 20;
  EXPECT_EQ(NeedAndAvailable(3 * (uint64_t{1} << 30), uint64_t{1} << 30),
            std::make_pair(std::string("3.0 GiB"), std::string("1.0 GiB")));
  EXPECT_EQ(NeedAndAvailable(330 * kMiB, 300 * kMiB),
            std::make_pair(std::string("0.32 GiB"), std::string("0.29 GiB")));
  EXPECT_EQ(NeedAndAvailable(301 * kMiB, 300 * kMiB),
            std::make_pair(std::string("0.294 GiB"), std::string("0.293 GiB")));
  EXPECT_EQ(NeedAndAvailable(300 * kMiB + kMiB / 2, 300 * kMiB),
            std::make_pair(std::string("300.5 MiB"), std::string("300.0 MiB")));
}

}  // namespace
}  // namespace gridsync
