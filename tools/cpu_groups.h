// CPU groups for the benchmarks' emulated hosts: cgroup v1 `cpu` groups of
// equal cpu.shares under /sys/fs/cgroup/cpu/gridsync-bench-<pid>/, one per
// emulated host. Under contention each group gets its share of the cores;
// time one leaves idle goes to the others (shares are work-conserving), so
// on this 2-core machine two groups emulate two hosts of one core each
// that lend each other what they do not use.
//
// Why: the load bench (bench_load.h) runs one shard against W worker
// threads on the same cores; at W = 128 the workers' threads took CPU from
// the shard that, on hosts of their own, they never could.
//
// Needs root and the v1 `cpu` controller (Debian 12 as this project runs
// it); Make says which is missing otherwise. Groups left by a process that
// was killed are removed by the next Make once their process is gone.
//
// Thread safety: one thread makes, joins and destroys.
#pragma once

#include <sys/types.h>

#include <memory>
#include <string>
#include <vector>

#include "common/status.h"

namespace gridsync::bench {

class CpuGroups {
 public:
  // Makes one group per name (each with cpu.shares 1024).
  static Result<std::unique_ptr<CpuGroups>> Make(const std::vector<std::string>& names);
  // Moves every thread of process `pid` into group `name`.
  Status Join(const std::string& name, pid_t pid);
  // Moves this process back to the root group and removes the groups
  // (a group whose processes have not exited yet is left, with a warning).
  ~CpuGroups();

  CpuGroups(const CpuGroups&) = delete;
  CpuGroups& operator=(const CpuGroups&) = delete;

  const std::string& path() const { return path_; }

 private:
  CpuGroups(std::string path, std::vector<std::string> names)
      : path_(std::move(path)), names_(std::move(names)) {}
  std::string path_;  // the parent folder of the groups
  std::vector<std::string> names_;
};

}  // namespace gridsync::bench
