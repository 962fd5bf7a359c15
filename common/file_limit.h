// The open-files limit of a process that serves many connections. A shard
// holds a descriptor per worker connection (and ZeroMQ more per socket),
// the coordinator one per member. Linux starts a process at a soft limit
// of 1024 (systemd's default too) under a hard limit that is usually far
// higher, and past the soft one ZeroMQ drops connections at accept without
// a word: a shard started by hand would lose its 1000th worker as a
// timeout. Servers raise the soft limit to the hard one at start, as Go's
// runtime and nginx's worker_rlimit_nofile do; the systemd units set
// LimitNOFILE as well.
//
// Thread safety: changes a process-wide limit; call it from main before
// starting threads.
#pragma once

#include <cstdint>

namespace gridsync {

struct FileLimit {
  uint64_t before = 0;  // the soft limit found (UINT64_MAX: unlimited)
  uint64_t after = 0;   // ... and the one left
  uint64_t hard = 0;    // the hard limit (UINT64_MAX: unlimited)
  bool raised() const { return after > before; }
};

// Raises the soft RLIMIT_NOFILE to `want` (0: to the hard limit), never
// past the hard limit and never lowering it. A limit that cannot be read
// reads 0 everywhere.
FileLimit RaiseOpenFileLimit(uint64_t want = 0);

// What a server's main calls once logging is up: the soft limit raised to
// the hard one, logged (info) when it moved.
void RaiseOpenFileLimitForServing();

}  // namespace gridsync
