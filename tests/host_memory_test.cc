// What a process may still allocate: MemAvailable, bounded by the memory
// cgroups it runs in (a systemd unit's MemoryMax=), v1 and v2, ancestors
// included. Fake /proc and /sys trees in a temporary folder.
#include "common/host_memory.h"

#include <gtest/gtest.h>
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

TEST_F(HostMemoryTest, NoMemInfoMeansUnknown) {
  fs::remove(root_ / "meminfo");
  EXPECT_EQ(Available(), 0u);
}

}  // namespace
}  // namespace gridsync
