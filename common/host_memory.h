// What this machine can still give a process: the kernel's MemAvailable
// (/proc/meminfo), and no more than the headroom of the process's memory
// cgroup (v1 memory.limit_in_bytes - usage, v2 memory.max - current, of its
// own cgroup and every ancestor): a systemd unit with MemoryMax= is killed
// by its cgroup long before the machine runs out. For what one process
// allocates, no more than its resource limits leave it either (RLIMIT_AS
// less its address space, RLIMIT_DATA less its data: `ulimit -v`,
// systemd's LimitAS=), which bound each process, not a machine's sum.
// Checks that refuse a run before it allocates compare their estimates
// with these.
//
// Thread safety: reads files; safe from any thread.
#pragma once

#include <cstdint>
#include <string>
#include <utility>

namespace gridsync {

// Bytes available to this process, or 0 when MemAvailable cannot be read
// (then no check refuses).
uint64_t AvailableMemoryBytes();
// The same, bounded by this process's RLIMIT_AS and RLIMIT_DATA headroom:
// for what this process itself will allocate (an image's decoding, a
// worker's model, a shard's partition). Under `ulimit -v` an image was
// refused as stb's "outofmem", naming no memory (a hostile probe).
uint64_t AvailableToThisProcessBytes();

// This process's memory from /proc/self/status, in bytes (0 where a line
// is missing).
struct ProcessMemory {
  uint64_t vm_size = 0;  // VmSize: address space
  uint64_t vm_data = 0;  // VmData: data segments and private mappings
  uint64_t rss = 0;      // VmRSS
  uint64_t hwm = 0;      // VmHWM: the peak of VmRSS
};
ProcessMemory ReadProcessMemory();

// The same from the given files (tests; resource limits are not read): `meminfo` as /proc/meminfo,
// `proc_cgroup` as /proc/self/cgroup, cgroup filesystems under
// `cgroup_root` (/sys/fs/cgroup: v1 controllers in sub-folders, v2 at the
// root or under unified/).
uint64_t AvailableMemoryBytesFrom(const std::string& meminfo, const std::string& proc_cgroup,
                                  const std::string& cgroup_root);

// `need` and `available` bytes as GiB with the fewest decimals, 1 to 3,
// that tell them apart (else as MiB with one), for refusals that compare
// them: "needs about 0.3 GiB but 0.3 GiB are available" read as a
// contradiction (a hostile probe). Returns {need, available}, units included.
std::pair<std::string, std::string> NeedAndAvailable(uint64_t need, uint64_t available);

}  // namespace gridsync
