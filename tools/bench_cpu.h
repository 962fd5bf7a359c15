// CPU time for the benches: what this process and the whole host spent,
// read before and after a timed phase. Over the phase they tell how many
// cores the measured work kept busy (so how far it is from what the cores
// could give) and how much of the host went to other processes (a build or
// a neighbour on the VM), which moves latencies as much as the code does.
//
// Thread safety: ReadCpu is reentrant.
#pragma once

namespace gridsync::bench {

struct CpuTimes {
  // Seconds every core of the host was busy (/proc/stat); NaN when it
  // could not be read (out of file descriptors, say).
  double host_busy = 0;
  double self = 0;  // seconds this process's threads ran, user + system (getrusage)
};

CpuTimes ReadCpu();
// Seconds this process's threads ran, user + system (getrusage); 0 when
// it cannot be read.
double SelfCpuSeconds();

// The cores' worth of CPU between two readings, `seconds` apart: this
// process's, and the rest of the host's (never negative).
struct CpuUse {
  double self_seconds = 0;
  double other_seconds = 0;  // NaN when either reading of the host failed
};
CpuUse CpuBetween(const CpuTimes& before, const CpuTimes& after);

// The cores this process may run on (at least 1): its affinity mask's,
// at most the host's online cores. A run under taskset or a cpuset gets
// what it was given, not the host's count. (A CPU quota, cgroup cpu.max,
// is not counted: it caps time, not cores.)
int UsableCores();

}  // namespace gridsync::bench
