// gridsync-bench allreduce (bench_allreduce.cc): what its two sides share.
// The sweep's sizes and limits, the arguments, one size's plan and result,
// the values every rank contributes and their exact sum, and the two sides:
// gridsync's ranks as forked processes (bench_allreduce_ranks.cc) and the
// PyTorch peer (bench_allreduce_torch.cc). Internal to gridsync-bench.
//
// Thread safety: each side is driven by one thread.
#pragma once

#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdint>
#include <cstring>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "common/status.h"
#include "tools/bench_pipe.h"
#include "tools/bench_stats.h"

namespace gridsync::bench::allreduce {

using Clock = std::chrono::steady_clock;

inline constexpr uint64_t kElementBytes = sizeof(float);
inline constexpr uint64_t kMinCount = 2;
inline constexpr uint64_t kMinBytes = kMinCount * kElementBytes;
// Each rank holds two buffers of the largest size (the data and its reset
// copy); this keeps a typo from asking for tens of GB per rank.
inline constexpr uint64_t kMaxBytesAllowed = uint64_t{4} << 30;
inline constexpr int kMaxRanks = 64;
// --iters 0 (auto): iters = 8 GiB / size, clamped to 10..1000. Small sizes
// get many iterations (each costs ~0.1-0.2 ms), the largest few, so that the
// default sweep takes about a minute per side on a 2-core host (~1 GB/s).
inline constexpr uint64_t kAutoItersBytes = uint64_t{8} << 30;
inline constexpr int kAutoItersMin = 10;
inline constexpr int kAutoItersMax = 1000;
inline constexpr int kMaxIters = 1000000;  // each timing is kept (8 B) until the median
inline constexpr uint64_t kRatioMinBytes = uint64_t{1} << 20;
inline constexpr double kTargetRatio = 0.95;
inline constexpr char kGroup[] = "bench-allreduce";
inline constexpr char kPeerScript[] = "/tools/peers/torch_allreduce.py";

struct AllReduceArgs {
  int ranks = 2;
  uint64_t min_bytes = 8;
  uint64_t max_bytes = uint64_t{256} << 20;
  int iters = 0;  // 0: auto
  int warmup = 5;
  int rounds = 8;
  double timeout_s = 120;
  std::string json_out;
  std::string python = "/usr/bin/python3";
  // gridsync's ranks seal every message, as security.curve's groups do
  // (worker/collective/collective_seal.h), under a key of this run; the
  // peer stays plain (torch's gloo cannot seal).
  bool sealed = false;
  std::string seal_secret;  // 40 characters, made by RunAllReduce
};

struct SizePlan {
  uint64_t count = 0;
  int iters = 0;
  uint64_t bytes() const { return count * kElementBytes; }
};

// One side's result for one size.
struct Measured {
  double time_us = 0;  // rank 0's median
  uint64_t wrong = 0;  // summed over the ranks
};

inline float Contribution(int rank, uint64_t i) {
  return static_cast<float>(rank + 1 + static_cast<int>(i % 7));
}

// Sum over r < ranks of (r + 1) + p = ranks (ranks + 1) / 2 + ranks p.
inline float ExpectedSum(int ranks, uint64_t i) {
  return static_cast<float>(ranks * (ranks + 1) / 2 + ranks * static_cast<int>(i % 7));
}

inline double AlgBw(uint64_t bytes, double us) {
  return us > 0 ? static_cast<double>(bytes) / (us * 1e-6) / 1e9 : 0.0;
}

inline double BusBw(double algbw, int ranks) { return algbw * 2.0 * (ranks - 1) / ranks; }

// The split of a size's iterations into rounds (the peer does the same).
inline int RoundsFor(const SizePlan& p, int rounds) { return std::min(rounds, p.iters); }
inline int RoundIters(const SizePlan& p, int rounds, int j) {
  return p.iters / rounds + (j < p.iters % rounds ? 1 : 0);
}
inline int RoundWarmup(int warmup, int j) { return j == 0 ? warmup : std::min(1, warmup); }

// gridsync's side: one forked process per rank, each joining a Gloo group
// through the coordinator and timing its all-reduces.
class GridsyncRanks {
 public:
  // Forks the ranks (before this process starts any thread).
  static Result<std::unique_ptr<GridsyncRanks>> Fork(const AllReduceArgs& args,
                                                     const std::vector<SizePlan>& plans);
  virtual ~GridsyncRanks() = default;
  // Lets the ranks join the Gloo group through the coordinator on `port`.
  virtual Status Start(uint16_t port) = 0;
  // One round of plans[index]; `last`: the round after which results count.
  virtual Result<Measured> RunRound(size_t index, int round, bool last) = 0;
  virtual Status Finish() = 0;
};

// The PyTorch peer: tools/peers/torch_allreduce.py run through a pipe.
class TorchPeer {
 public:
  static Result<std::unique_ptr<TorchPeer>> Start(const AllReduceArgs& args,
                                                  const std::vector<SizePlan>& plans,
                                                  const std::string& script);
  virtual ~TorchPeer() = default;
  // Waits until every peer rank has joined; returns the torch version.
  virtual Result<std::string> ReadStart() = 0;
  virtual Result<Measured> RunRound(size_t index, int round, bool last, uint64_t count) = 0;
  virtual Status Finish() = 0;
};

}  // namespace gridsync::bench::allreduce
