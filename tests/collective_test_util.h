// What the collective tests share (collective_test.cc,
// collective_failure_test.cc): per-rank values and their sums, ranks as
// threads, unique group names, uneven counts, a group of either backend,
// and the check of every operation.
#pragma once

#include <fcntl.h>
#include <gtest/gtest.h>
#include <poll.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <csignal>
#include <cstring>
#include <functional>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <thread>
#include <vector>

#include "common/coordinator_client.h"
#include "common/store.h"
#include "server/coordinator.h"
#include "worker/collective/buckets.h"
#include "worker/collective/collective.h"
#include "worker/collective/factory.h"
#include "worker/collective/gloo_collective.h"
#include "worker/collective/half_format.h"
#include "worker/collective/local_collective.h"
#include "worker/collective/nccl_collective.h"

namespace gridsync {
namespace {

using namespace std::chrono_literals;
using Clock = std::chrono::steady_clock;

#define EXPECT_CONTAINS(haystack, needle)                          \
  EXPECT_NE(std::string(haystack).find(needle), std::string::npos) \
      << "expected \"" << (needle) << "\" in: " << (haystack)

inline double SecondsSince(Clock::time_point start) {
  return std::chrono::duration<double>(Clock::now() - start).count();
}

// Exact in float, and so are sums of a few of them.
inline float Value(int rank, size_t i) {
  return static_cast<float>(static_cast<int>((i * 7 + static_cast<size_t>(rank) * 13) % 61) - 30) *
         0.25f;
}

inline float SumOverRanks(int size, size_t i) {
  float sum = 0.0f;
  for (int r = 0; r < size; ++r) sum += Value(r, i);
  return sum;
}

// Runs body(rank) for rank 0..n-1, each on its own thread.
inline void RunRanks(int n, const std::function<void(int)>& body) {
  std::vector<std::thread> threads;
  threads.reserve(static_cast<size_t>(n));
  for (int r = 0; r < n; ++r) threads.emplace_back(body, r);
  for (auto& thread : threads) thread.join();
}

inline std::string UniqueGroup(const std::string& base) {
  static std::atomic<int> next{0};
  return base + "-" + std::to_string(next++);
}

// Uneven per-rank counts summing to n; with 3 or more ranks, rank 1 gets 0.
inline std::vector<size_t> UnevenCounts(size_t n, int size) {
  std::vector<size_t> weights(static_cast<size_t>(size));
  size_t total_weight = 0;
  for (int r = 0; r < size; ++r) {
    weights[static_cast<size_t>(r)] = (r == 1 && size >= 3) ? 0 : static_cast<size_t>(r + 1);
    total_weight += weights[static_cast<size_t>(r)];
  }
  std::vector<size_t> counts(static_cast<size_t>(size));
  size_t used = 0;
  for (size_t r = 0; r < counts.size(); ++r) {
    counts[r] = n * weights[r] / total_weight;
    used += counts[r];
  }
  counts[0] += n - used;
  return counts;
}

// kSealedGloo: Gloo with every message sealed (security.curve's groups).
enum class Backend { kLocal, kGloo, kSealedGloo };

inline std::string BackendName(Backend backend) {
  return backend == Backend::kLocal ? "local" : backend == Backend::kGloo ? "gloo" : "sealedgloo";
}

// What name() says: a sealed group is still the Gloo backend.
inline std::string CollectiveName(Backend backend) {
  return backend == Backend::kLocal ? "local" : "gloo";
}

// The workers' key of a test cluster: any 40 characters stand for worker.key.
inline std::shared_ptr<const CollectiveSeal> TestSeal(char fill = 'w') {
  auto seal = CollectiveSeal::FromCurveSecret(std::string(40, fill));
  EXPECT_TRUE(seal.ok()) << seal.status().ToString();
  return std::make_shared<const CollectiveSeal>(*seal);
}

// The ranks of one group; Gloo ranks rendezvous concurrently through `store`.
inline std::vector<std::unique_ptr<Collective>> MakeGroup(Backend backend, int size,
                                                          std::chrono::milliseconds timeout,
                                                          const std::string& group, Store* store) {
  std::vector<std::unique_ptr<Collective>> ranks;
  if (backend == Backend::kLocal) {
    for (auto& rank : LocalCollective::CreateGroup(size, timeout, group))
      ranks.push_back(std::move(rank));
    return ranks;
  }
  std::vector<std::optional<Result<std::unique_ptr<Collective>>>> made(static_cast<size_t>(size));
  RunRanks(size, [&](int r) {
    GlooCollectiveOptions options;
    options.timeout = timeout;
    if (backend == Backend::kSealedGloo) options.seal = TestSeal();
    made[static_cast<size_t>(r)].emplace(NewGlooCollective(store, r, size, group, options));
  });
  for (auto& result : made) {
    if (!result->ok()) {
      ADD_FAILURE() << "creating the gloo group: " << result->status().ToString();
      return {};
    }
    ranks.push_back(std::move(*result).value());
  }
  return ranks;
}

// ---- Correctness of every operation, for 2, 3 and 4 ranks ----

// Runs every operation at every size on rank `c`; returns "" or what was wrong.
inline std::string ExerciseAllOperations(Collective& c) {
  const int size = c.size();
  const int rank = c.rank();
  std::string errors;
  auto fail = [&](const std::string& what) { errors += what + "\n"; };
  for (size_t n : {size_t{0}, size_t{1}, size_t{1000}, size_t{1} << 20}) {
    const std::string at = " (n=" + std::to_string(n) + ", rank " + std::to_string(rank) + ")";
    {  // all-reduce
      std::vector<float> data(n);
      for (size_t i = 0; i < n; ++i) data[i] = Value(rank, i);
      Status status = c.AllReduceSum(data.data(), n);
      if (!status.ok()) fail("AllReduceSum" + at + ": " + status.ToString());
      size_t wrong = 0;
      for (size_t i = 0; i < n; ++i) wrong += data[i] != SumOverRanks(size, i);
      if (wrong != 0) fail("AllReduceSum" + at + ": #wrong " + std::to_string(wrong));
    }
    const auto counts = UnevenCounts(n, size);
    const auto offsets = CollectiveOffsets(counts);
    const size_t mine = counts[static_cast<size_t>(rank)];
    {  // reduce-scatter, uneven
      std::vector<float> in(n);
      for (size_t i = 0; i < n; ++i) in[i] = Value(rank, i);
      std::vector<float> out(mine, -100.0f);
      Status status = c.ReduceScatterSum(in.data(), out.data(), counts);
      if (!status.ok()) fail("ReduceScatterSum" + at + ": " + status.ToString());
      size_t wrong = 0;
      for (size_t j = 0; j < mine; ++j)
        wrong += out[j] != SumOverRanks(size, offsets[static_cast<size_t>(rank)] + j);
      if (wrong != 0) fail("ReduceScatterSum" + at + ": #wrong " + std::to_string(wrong));
    }
    {  // all-gather v, uneven
      std::vector<float> in(mine);
      for (size_t j = 0; j < mine; ++j) in[j] = Value(rank, j);
      std::vector<float> out(n, -100.0f);
      Status status = c.AllGatherV(in.data(), counts, out.data());
      if (!status.ok()) fail("AllGatherV" + at + ": " + status.ToString());
      size_t wrong = 0;
      for (int q = 0; q < size; ++q) {
        for (size_t j = 0; j < counts[static_cast<size_t>(q)]; ++j) {
          wrong += out[offsets[static_cast<size_t>(q)] + j] != Value(q, j);
        }
      }
      if (wrong != 0) fail("AllGatherV" + at + ": #wrong " + std::to_string(wrong));
    }
    {  // all-gather, even
      const size_t count = n / static_cast<size_t>(size);
      std::vector<float> in(count);
      for (size_t j = 0; j < count; ++j) in[j] = Value(rank, j);
      std::vector<float> out(count * static_cast<size_t>(size), -100.0f);
      Status status = c.AllGather(in.data(), count, out.data());
      if (!status.ok()) fail("AllGather" + at + ": " + status.ToString());
      size_t wrong = 0;
      for (int q = 0; q < size; ++q) {
        for (size_t j = 0; j < count; ++j)
          wrong += out[static_cast<size_t>(q) * count + j] != Value(q, j);
      }
      if (wrong != 0) fail("AllGather" + at + ": #wrong " + std::to_string(wrong));
    }
    {  // broadcast from the last rank
      const int root = size - 1;
      std::vector<float> data(n, -100.0f);
      if (rank == root) {
        for (size_t i = 0; i < n; ++i) data[i] = Value(root, i);
      }
      Status status = c.Broadcast(data.data(), n, root);
      if (!status.ok()) fail("Broadcast" + at + ": " + status.ToString());
      size_t wrong = 0;
      for (size_t i = 0; i < n; ++i) wrong += data[i] != Value(root, i);
      if (wrong != 0) fail("Broadcast" + at + ": #wrong " + std::to_string(wrong));
    }
    Status status = c.Barrier();
    if (!status.ok()) fail("Barrier" + at + ": " + status.ToString());
  }
  return errors;
}

}  // namespace
}  // namespace gridsync
