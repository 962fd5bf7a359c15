#include "common/host_memory.h"

#include <spdlog/fmt/fmt.h>
#include <sys/resource.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

namespace gridsync {
namespace {

// A cgroup file's number; "max" (v2) or no file is no limit.
bool ReadBytes(const std::filesystem::path& path, uint64_t* out) {
  std::ifstream in(path);
  std::string word;
  if (!(in >> word) || word == "max") return false;
  try {
    *out = std::stoull(word);
  } catch (const std::exception&) {
    return false;
  }
  return true;
}

// The headroom of the cgroup at `dir` (relative to `mount`) and of each
// ancestor: the least of limit - usage over those with a limit.
uint64_t Headroom(const std::filesystem::path& mount, std::string dir, const char* limit_file,
                  const char* usage_file) {
  uint64_t headroom = UINT64_MAX;
  for (;;) {
    const std::filesystem::path at = mount / std::filesystem::path(dir).relative_path();
    uint64_t limit = 0, usage = 0;
    // v1 reports "no limit" as a number near 2^63 (rounded to a page).
    if (ReadBytes(at / limit_file, &limit) && limit < (uint64_t{1} << 62)) {
      ReadBytes(at / usage_file, &usage);
      headroom = std::min(headroom, limit > usage ? limit - usage : 0);
    }
    if (dir.empty() || dir == "/") break;
    const size_t slash = dir.find_last_of('/');
    dir = slash == std::string::npos || slash == 0 ? "/" : dir.substr(0, slash);
  }
  return headroom;
}

// What the process's resource limits still allow it to map: RLIMIT_AS
// less its address space (VmSize), RLIMIT_DATA less its data (VmData).
// UINT64_MAX without limits. A process started under `ulimit -v` was
// refused an image as stb's "outofmem", which named neither the memory
// nor the limit (a hostile probe).
uint64_t LimitHeadroom() {
  uint64_t headroom = UINT64_MAX;
  const ProcessMemory memory = ReadProcessMemory();
  const auto bound = [&](int resource, uint64_t used) {
    rlimit limit{};
    if (getrlimit(resource, &limit) != 0 || limit.rlim_cur == RLIM_INFINITY) return;
    const uint64_t cap = limit.rlim_cur;
    // At least a byte: 0 means "unknown" to the checks, which then refuse nothing.
    headroom = std::min(headroom, cap > used ? cap - used : uint64_t{1});
  };
  bound(RLIMIT_AS, memory.vm_size);
  bound(RLIMIT_DATA, memory.vm_data);
  return headroom;
}

}  // namespace

uint64_t AvailableMemoryBytesFrom(const std::string& meminfo, const std::string& proc_cgroup,
                                  const std::string& cgroup_root) {
  uint64_t available = 0;
  {
    std::ifstream in(meminfo);
    std::string key, unit;
    uint64_t kib = 0;
    while (in >> key >> kib >> unit) {
      if (key == "MemAvailable:") {
        available = kib * 1024;
        break;
      }
    }
  }
  if (available == 0) return 0;
  // Lines "id:controllers:path"; v1's memory controller, or v2's "0::".
  std::ifstream in(proc_cgroup);
  std::string line;
  const std::filesystem::path root(cgroup_root);
  while (std::getline(in, line)) {
    const size_t a = line.find(':'), b = a == std::string::npos ? a : line.find(':', a + 1);
    if (b == std::string::npos) continue;
    const std::string controllers = line.substr(a + 1, b - a - 1), path = line.substr(b + 1);
    std::vector<std::string> names;
    std::stringstream split(controllers);
    for (std::string name; std::getline(split, name, ',');) names.push_back(name);
    if (std::find(names.begin(), names.end(), "memory") != names.end()) {
      available = std::min(available, Headroom(root / "memory", path, "memory.limit_in_bytes",
                                               "memory.usage_in_bytes"));
    } else if (line.rfind("0::", 0) == 0) {
      for (const char* mount : {"", "unified"}) {
        available =
            std::min(available, Headroom(root / mount, path, "memory.max", "memory.current"));
      }
    }
  }
  return available;
}

uint64_t AvailableMemoryBytes() {
  return AvailableMemoryBytesFrom("/proc/meminfo", "/proc/self/cgroup", "/sys/fs/cgroup");
}

ProcessMemory ReadProcessMemory() {
  ProcessMemory memory;
  std::ifstream in("/proc/self/status");
  std::string line;
  while (std::getline(in, line)) {
    std::istringstream fields(line);
    std::string key;
    uint64_t kib = 0;
    if (!(fields >> key >> kib)) continue;
    if (key == "VmSize:") memory.vm_size = kib << 10;
    if (key == "VmData:") memory.vm_data = kib << 10;
    if (key == "VmRSS:") memory.rss = kib << 10;
    if (key == "VmHWM:") memory.hwm = kib << 10;
  }
  return memory;
}

uint64_t AvailableToThisProcessBytes() {
  const uint64_t available = AvailableMemoryBytes();
  return available == 0 ? 0 : std::min(available, LimitHeadroom());
}

std::pair<std::string, std::string> NeedAndAvailable(uint64_t need, uint64_t available) {
  constexpr double kGiB = 1073741824.0, kMiB = 1048576.0;
  const double a = static_cast<double>(need), b = static_cast<double>(available);
  for (int decimals = 1; decimals <= 3; ++decimals) {
    std::string x = fmt::format("{:.{}f} GiB", a / kGiB, decimals);
    std::string y = fmt::format("{:.{}f} GiB", b / kGiB, decimals);
    if (x != y) return {std::move(x), std::move(y)};
  }
  return {fmt::format("{:.1f} MiB", a / kMiB), fmt::format("{:.1f} MiB", b / kMiB)};
}

}  // namespace gridsync
