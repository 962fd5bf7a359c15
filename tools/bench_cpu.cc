// CPU time for the benches (bench_cpu.h).
#include "tools/bench_cpu.h"

#include <sched.h>
#include <sys/resource.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <fstream>
#include <string>

namespace gridsync::bench {

CpuTimes ReadCpu() {
  CpuTimes t;
  std::ifstream stat("/proc/stat");
  std::string cpu;
  uint64_t user = 0, nice = 0, system = 0, idle = 0, iowait = 0, irq = 0, softirq = 0, steal = 0;
  stat >> cpu >> user >> nice >> system >> idle >> iowait >> irq >> softirq >> steal;
  const double tick = static_cast<double>(sysconf(_SC_CLK_TCK));
  t.host_busy = cpu == "cpu" && tick > 0
                    ? static_cast<double>(user + nice + system + irq + softirq + steal) / tick
                    : std::nan("");
  t.self = SelfCpuSeconds();
  return t;
}

double SelfCpuSeconds() {
  rusage usage{};
  if (getrusage(RUSAGE_SELF, &usage) != 0) return 0;
  auto seconds = [](const timeval& tv) {
    return static_cast<double>(tv.tv_sec) + static_cast<double>(tv.tv_usec) * 1e-6;
  };
  return seconds(usage.ru_utime) + seconds(usage.ru_stime);
}

CpuUse CpuBetween(const CpuTimes& before, const CpuTimes& after) {
  CpuUse use;
  use.self_seconds = after.self - before.self;
  const double other = (after.host_busy - before.host_busy) - use.self_seconds;
  use.other_seconds = std::isnan(other) ? other : std::max(0.0, other);
  return use;
}

int UsableCores() {
  const long online = std::max(1L, sysconf(_SC_NPROCESSORS_ONLN));
  cpu_set_t mask;
  CPU_ZERO(&mask);
  if (sched_getaffinity(0, sizeof(mask), &mask) != 0) return static_cast<int>(online);
  return static_cast<int>(std::clamp<long>(CPU_COUNT(&mask), 1, online));
}

}  // namespace gridsync::bench
