// A fixed-bucket latency histogram for the hot paths (a shard's apply): one
// relaxed atomic increment per observation, read at scrape time by the
// metrics endpoint (ops/metrics.h) without stopping the writer.
//
// Buckets: upper bounds 0.1 ms x 2^k, k = 0..15 (0.1 ms .. 3.3 s), plus +Inf.
//
// Thread safety: Observe from any thread; Read from any thread (a read may
// miss observations in flight).
#pragma once

#include <array>
#include <atomic>
#include <cstdint>
#include <vector>

namespace gridsync {

class LatencyHistogram {
 public:
  static constexpr int kBuckets = 16;
  static double UpperBound(int bucket) { return 1e-4 * static_cast<double>(1u << bucket); }

  void Observe(double seconds) {
    int b = 0;
    while (b < kBuckets && seconds > UpperBound(b)) ++b;
    counts_[static_cast<size_t>(b)].fetch_add(1, std::memory_order_relaxed);
    // Sum in microseconds: an integer, so it can be atomic without a CAS loop.
    sum_us_.fetch_add(static_cast<uint64_t>(seconds * 1e6), std::memory_order_relaxed);
  }

  struct Snapshot {
    std::vector<uint64_t> counts;  // per bucket, the last one +Inf (not cumulative)
    double sum_seconds = 0;
    uint64_t total() const {
      uint64_t n = 0;
      for (uint64_t c : counts) n += c;
      return n;
    }
  };
  Snapshot Read() const {
    Snapshot s;
    for (const auto& c : counts_) s.counts.push_back(c.load(std::memory_order_relaxed));
    s.sum_seconds = static_cast<double>(sum_us_.load(std::memory_order_relaxed)) / 1e6;
    return s;
  }

 private:
  std::array<std::atomic<uint64_t>, kBuckets + 1> counts_{};
  std::atomic<uint64_t> sum_us_{0};
};

}  // namespace gridsync
