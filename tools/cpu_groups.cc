// CpuGroups (cpu_groups.h).
//
// Thread safety: see cpu_groups.h.
#include "tools/cpu_groups.h"

#include <signal.h>
#include <spdlog/spdlog.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <string>

namespace gridsync::bench {
namespace {

constexpr const char* kCpuRoot = "/sys/fs/cgroup/cpu";
constexpr const char* kPrefix = "gridsync-bench-";

Status WriteValue(const std::string& file, const std::string& value) {
  std::ofstream out(file);
  out << value << std::flush;
  if (!out) {
    return Status::IOError("cannot write '" + value + "' to " + file + ": " + std::strerror(errno));
  }
  return Status::OK();
}

// Removes the groups under `parent` (and the folder), moving no process:
// rmdir fails on a group that still has tasks.
bool RemoveGroups(const std::filesystem::path& parent) {
  std::error_code ec;
  bool all = true;
  for (const auto& entry : std::filesystem::directory_iterator(parent, ec)) {
    if (entry.is_directory() && ::rmdir(entry.path().c_str()) != 0) all = false;
  }
  return ::rmdir(parent.c_str()) == 0 && all;
}

// Groups of processes that are gone (killed before their destructor ran).
void RemoveStaleGroups() {
  std::error_code ec;
  for (const auto& entry : std::filesystem::directory_iterator(kCpuRoot, ec)) {
    const std::string name = entry.path().filename().string();
    if (!entry.is_directory() || name.rfind(kPrefix, 0) != 0) continue;
    const std::string pid_text = name.substr(std::strlen(kPrefix));
    if (pid_text.empty() || pid_text.find_first_not_of("0123456789") != std::string::npos) continue;
    const pid_t pid = static_cast<pid_t>(std::stol(pid_text));
    if (::kill(pid, 0) == 0 || errno != ESRCH) continue;  // alive (or not ours to probe)
    if (RemoveGroups(entry.path())) spdlog::info("removed the stale CPU groups {}", name);
  }
}

}  // namespace

Result<std::unique_ptr<CpuGroups>> CpuGroups::Make(const std::vector<std::string>& names) {
  if (!std::filesystem::exists(std::string(kCpuRoot) + "/cpu.shares")) {
    return Status::Unsupported(
        std::string("no cgroup v1 cpu controller at ") + kCpuRoot +
        "; allowed: a host that mounts it (Debian 12 does), or a run without the emulated hosts");
  }
  if (::geteuid() != 0) {
    return Status::Unsupported("CPU groups need root (they are made under " +
                               std::string(kCpuRoot) +
                               "); allowed: run as root, or without the emulated hosts");
  }
  RemoveStaleGroups();
  const std::string path = std::string(kCpuRoot) + "/" + kPrefix + std::to_string(::getpid());
  std::error_code ec;
  std::filesystem::create_directory(path, ec);
  if (ec) return Status::IOError("cannot make " + path + ": " + ec.message());
  std::unique_ptr<CpuGroups> groups(new CpuGroups(path, {}));
  for (const std::string& name : names) {
    const std::string group = path + "/" + name;
    std::filesystem::create_directory(group, ec);
    if (ec) return Status::IOError("cannot make " + group + ": " + ec.message());
    groups->names_.push_back(name);
    GRIDSYNC_RETURN_IF_ERROR(WriteValue(group + "/cpu.shares", "1024"));
  }
  return groups;
}

Status CpuGroups::Join(const std::string& name, pid_t pid) {
  return WriteValue(path_ + "/" + name + "/cgroup.procs", std::to_string(pid));
}

CpuGroups::~CpuGroups() {
  // This process first: its own group cannot go while it is in it.
  if (!WriteValue(std::string(kCpuRoot) + "/cgroup.procs", std::to_string(::getpid())).ok())
    spdlog::warn("could not move this process back to the root CPU group");
  if (!RemoveGroups(path_))
    spdlog::warn("CPU groups under {} still hold processes; left for the next run to remove",
                 path_);
}

}  // namespace gridsync::bench
