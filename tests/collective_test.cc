// The collective seam (worker/collective): LocalCollective and Gloo with
// ranks as threads in one process (HashStore rendezvous), Gloo with ranks as
// forked processes that rendezvous through the real coordinator
// (CoordinatorStore) and one of which is killed with SIGKILL, the bucketed
// all-reduce with its check headers, the factory, and NCCL (skipped, saying
// why, without a GPU).
//
// Values are multiples of 0.25 in [-7.5, 7.5], so sums of up to four ranks
// are exact in float whatever order a backend sums in: results are compared
// exactly, and reported as a count of wrong elements (nccl-tests' #wrong).
#include "worker/collective/collective.h"

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
#include "worker/collective/factory.h"
#include "worker/collective/gloo_collective.h"
#include "worker/collective/half_format.h"
#include "worker/collective/local_collective.h"
#include "worker/collective/nccl_collective.h"

namespace gridsync {
namespace {

using namespace std::chrono_literals;
using Clock = std::chrono::steady_clock;

#define EXPECT_CONTAINS(haystack, needle)                                                    \
  EXPECT_NE(std::string(haystack).find(needle), std::string::npos)                           \
      << "expected \"" << (needle) << "\" in: " << (haystack)

double SecondsSince(Clock::time_point start) {
  return std::chrono::duration<double>(Clock::now() - start).count();
}

// Exact in float, and so are sums of a few of them.
float Value(int rank, size_t i) {
  return static_cast<float>(static_cast<int>((i * 7 + static_cast<size_t>(rank) * 13) % 61) - 30) * 0.25f;
}

float SumOverRanks(int size, size_t i) {
  float sum = 0.0f;
  for (int r = 0; r < size; ++r) sum += Value(r, i);
  return sum;
}

// Runs body(rank) for rank 0..n-1, each on its own thread.
void RunRanks(int n, const std::function<void(int)>& body) {
  std::vector<std::thread> threads;
  threads.reserve(static_cast<size_t>(n));
  for (int r = 0; r < n; ++r) threads.emplace_back(body, r);
  for (auto& thread : threads) thread.join();
}

std::string UniqueGroup(const std::string& base) {
  static std::atomic<int> next{0};
  return base + "-" + std::to_string(next++);
}

// Uneven per-rank counts summing to n; with 3 or more ranks, rank 1 gets 0.
std::vector<size_t> UnevenCounts(size_t n, int size) {
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

enum class Backend { kLocal, kGloo };

std::string BackendName(Backend backend) { return backend == Backend::kLocal ? "local" : "gloo"; }

// The ranks of one group; Gloo ranks rendezvous concurrently through `store`.
std::vector<std::unique_ptr<Collective>> MakeGroup(Backend backend, int size, std::chrono::milliseconds timeout,
                                                   const std::string& group, Store* store) {
  std::vector<std::unique_ptr<Collective>> ranks;
  if (backend == Backend::kLocal) {
    for (auto& rank : LocalCollective::CreateGroup(size, timeout, group)) ranks.push_back(std::move(rank));
    return ranks;
  }
  std::vector<std::optional<Result<std::unique_ptr<Collective>>>> made(static_cast<size_t>(size));
  RunRanks(size, [&](int r) {
    GlooCollectiveOptions options;
    options.timeout = timeout;
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
std::string ExerciseAllOperations(Collective& c) {
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
      for (size_t j = 0; j < mine; ++j) wrong += out[j] != SumOverRanks(size, offsets[static_cast<size_t>(rank)] + j);
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
        for (size_t j = 0; j < count; ++j) wrong += out[static_cast<size_t>(q) * count + j] != Value(q, j);
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

class CollectiveCorrectness : public ::testing::TestWithParam<std::tuple<Backend, int>> {};

TEST_P(CollectiveCorrectness, EveryOperationEverySize) {
  const auto [backend, size] = GetParam();
  HashStore store;
  auto ranks = MakeGroup(backend, size, 20s, UniqueGroup("correct"), &store);
  ASSERT_EQ(ranks.size(), static_cast<size_t>(size));
  EXPECT_EQ(ranks[0]->name(), BackendName(backend));
  std::vector<std::string> errors(static_cast<size_t>(size));
  RunRanks(size, [&](int r) {
    EXPECT_EQ(ranks[static_cast<size_t>(r)]->rank(), r);
    EXPECT_EQ(ranks[static_cast<size_t>(r)]->size(), size);
    errors[static_cast<size_t>(r)] = ExerciseAllOperations(*ranks[static_cast<size_t>(r)]);
  });
  for (int r = 0; r < size; ++r) EXPECT_EQ(errors[static_cast<size_t>(r)], "") << "rank " << r;
}

INSTANTIATE_TEST_SUITE_P(Backends, CollectiveCorrectness,
                         ::testing::Combine(::testing::Values(Backend::kLocal, Backend::kGloo),
                                            ::testing::Values(2, 3, 4)),
                         [](const auto& p) {
                           return BackendName(std::get<0>(p.param)) + "_" +
                                  std::to_string(std::get<1>(p.param)) + "ranks";
                         });

class CollectiveBackends : public ::testing::TestWithParam<Backend> {};

TEST_P(CollectiveBackends, BarrierWaitsForEveryRank) {
  constexpr int kSize = 3;
  HashStore store;
  auto ranks = MakeGroup(GetParam(), kSize, 10s, UniqueGroup("barrier"), &store);
  ASSERT_EQ(ranks.size(), static_cast<size_t>(kSize));
  std::atomic<int> arrived{0};
  std::atomic<int> early{0};
  RunRanks(kSize, [&](int r) {
    std::this_thread::sleep_for(std::chrono::milliseconds(100 * r));
    arrived++;
    EXPECT_TRUE(ranks[static_cast<size_t>(r)]->Barrier().ok());
    if (arrived.load() != kSize) early++;
  });
  EXPECT_EQ(early.load(), 0) << "a rank left the barrier before every rank entered it";
}

// Only NCCL can enqueue a sum behind a device event (the overlapped
// backward pass); the host backends say so and stay usable.
TEST_P(CollectiveBackends, EnqueueingBehindADeviceEventIsRefusedNamingNccl) {
  constexpr int kSize = 2;
  HashStore store;
  auto ranks = MakeGroup(GetParam(), kSize, 10s, UniqueGroup("enqueue"), &store);
  ASSERT_EQ(ranks.size(), static_cast<size_t>(kSize));
  RunRanks(kSize, [&](int r) {
    Collective& c = *ranks[static_cast<size_t>(r)];
    EXPECT_FALSE(c.enqueues_on_device());
    std::vector<float> data(4, 1.0f);
    const std::span<float> buffers[] = {data};
    const Status refused = c.EnqueueAllReduceSumGroup(buffers, nullptr);
    EXPECT_EQ(refused.code(), StatusCode::kUnsupported) << refused.ToString();
    EXPECT_NE(refused.message().find("nccl"), std::string::npos) << refused.ToString();
    EXPECT_TRUE(c.WaitEnqueued().ok());
    EXPECT_TRUE(c.AllReduceSum(data.data(), data.size()).ok());
    EXPECT_EQ(data[0], static_cast<float>(kSize));
  });
}

TEST_P(CollectiveBackends, BadArgumentsAreRefusedWithoutBreakingTheGroup) {
  constexpr int kSize = 2;
  HashStore store;
  auto ranks = MakeGroup(GetParam(), kSize, 10s, UniqueGroup("args"), &store);
  ASSERT_EQ(ranks.size(), static_cast<size_t>(kSize));
  float x = 1.0f;
  Status status = ranks[0]->Broadcast(&x, 1, 5);
  EXPECT_EQ(status.code(), StatusCode::kInvalidArgument) << status.ToString();
  EXPECT_CONTAINS(status.message(), "root 5 is not a rank");
  status = ranks[0]->ReduceScatterSum(&x, &x, {1});
  EXPECT_EQ(status.code(), StatusCode::kInvalidArgument) << status.ToString();
  EXPECT_CONTAINS(status.message(), "1 counts given, the group has 2 ranks");
  status = ranks[1]->AllReduceSum(nullptr, 3);
  EXPECT_EQ(status.code(), StatusCode::kInvalidArgument) << status.ToString();
  // The group still works.
  RunRanks(kSize, [&](int r) {
    float v = static_cast<float>(r + 1);
    EXPECT_TRUE(ranks[static_cast<size_t>(r)]->AllReduceSum(&v, 1).ok());
    EXPECT_EQ(v, 3.0f);
  });
}

// ---- Bucketed all-reduce ----

std::vector<size_t> ManyTensorSizes() {
  std::vector<size_t> sizes = {0, 1, 1000, 3, 5000, 17, size_t{1} << 14, 2, 0, 4099};
  uint32_t x = 12345;
  for (int i = 0; i < 30; ++i) {
    x = x * 1664525u + 1013904223u;
    sizes.push_back(x % 3000);
  }
  return sizes;
}

TEST_P(CollectiveBackends, BucketedAllReduceOfManyTensorsEqualsPlainSum) {
  constexpr int kSize = 3;
  HashStore store;
  auto ranks = MakeGroup(GetParam(), kSize, 10s, UniqueGroup("buckets"), &store);
  ASSERT_EQ(ranks.size(), static_cast<size_t>(kSize));
  const auto sizes = ManyTensorSizes();
  for (size_t bucket_bytes : {size_t{16} << 10, size_t{10002}, kDefaultBucketBytes}) {
    std::vector<size_t> wrong(kSize, 0);
    std::vector<Status> statuses(kSize);
    RunRanks(kSize, [&](int r) {
      // Tensor t, element i holds Value(r, base_t + i): distinct everywhere.
      std::vector<std::vector<float>> storage;
      std::vector<std::span<float>> tensors;
      size_t base = 0;
      for (size_t size : sizes) {
        storage.emplace_back(size);
        for (size_t i = 0; i < size; ++i) storage.back()[i] = Value(r, base + i);
        base += size;
      }
      for (auto& t : storage) tensors.emplace_back(t);
      BucketOptions options;
      options.bucket_bytes = bucket_bytes;
      statuses[static_cast<size_t>(r)] = BucketedAllReduceSum(*ranks[static_cast<size_t>(r)], tensors, 7, options);
      base = 0;
      for (const auto& t : storage) {
        for (size_t i = 0; i < t.size(); ++i) wrong[static_cast<size_t>(r)] += t[i] != SumOverRanks(kSize, base + i);
        base += t.size();
      }
    });
    for (int r = 0; r < kSize; ++r) {
      EXPECT_TRUE(statuses[static_cast<size_t>(r)].ok()) << statuses[static_cast<size_t>(r)].ToString();
      EXPECT_EQ(wrong[static_cast<size_t>(r)], 0u) << "rank " << r << ", bucket_bytes " << bucket_bytes;
    }
  }
}

// 16-bit sums: small integers are exact in fp16 and bf16, so the sum is
// exact whatever the order; every rank must then hold the same bits, and a
// value that needs rounding must come back rounded to the format.
TEST_P(CollectiveBackends, HalfAllReduceSumsSixteenBitValuesOnEveryRank) {
  constexpr int kSize = 3;
  HashStore store;
  auto ranks = MakeGroup(GetParam(), kSize, 10s, UniqueGroup("half"), &store);
  ASSERT_EQ(ranks.size(), static_cast<size_t>(kSize));
  for (HalfFormat format : {HalfFormat::kFp16, HalfFormat::kBf16}) {
    for (size_t n : {size_t{0}, size_t{1}, size_t{1000}, size_t{70001}}) {
      std::vector<std::vector<uint16_t>> out(kSize);
      std::vector<Status> statuses(kSize);
      RunRanks(kSize, [&](int r) {
        auto& data = out[static_cast<size_t>(r)];
        data.resize(n);
        for (size_t i = 0; i < n; ++i)
          data[i] = FloatToHalf(format, static_cast<float>(r + static_cast<int>(i % 7) - 3));
        statuses[static_cast<size_t>(r)] =
            ranks[static_cast<size_t>(r)]->AllReduceSumHalf(data.data(), n, format);
      });
      size_t wrong = 0;
      for (int r = 0; r < kSize; ++r) {
        ASSERT_TRUE(statuses[static_cast<size_t>(r)].ok())
            << statuses[static_cast<size_t>(r)].ToString();
        EXPECT_EQ(out[static_cast<size_t>(r)], out[0]) << "rank " << r << " differs from rank 0";
      }
      for (size_t i = 0; i < n; ++i)
        wrong += HalfToFloat(format, out[0][i]) !=
                 static_cast<float>(3 * (static_cast<int>(i % 7) - 3) + 3);
      EXPECT_EQ(wrong, 0u) << ToString(format) << ", n " << n;
    }
    // big + 1 is not a 16-bit value (the spacing there is 2) and rounds to
    // even, big: rank order (Local) rounds twice to big; an order that adds
    // 1 + 1 first reaches big + 2. Either way every rank holds the same bits.
    const float big = format == HalfFormat::kFp16 ? 2048.0f : 256.0f;
    std::vector<std::vector<uint16_t>> out(kSize, std::vector<uint16_t>(1));
    RunRanks(kSize, [&](int r) {
      out[static_cast<size_t>(r)][0] = FloatToHalf(format, r == 0 ? big : 1.0f);
      EXPECT_TRUE(ranks[static_cast<size_t>(r)]
                      ->AllReduceSumHalf(out[static_cast<size_t>(r)].data(), 1, format)
                      .ok());
    });
    for (int r = 1; r < kSize; ++r) EXPECT_EQ(out[static_cast<size_t>(r)], out[0]);
    const float sum = HalfToFloat(format, out[0][0]);
    EXPECT_TRUE(sum == big || sum == big + 2.0f) << sum;
    if (GetParam() == Backend::kLocal) {
      EXPECT_EQ(sum, big) << "rank order rounds each partial sum";
    }
  }
}

// Rank 1 has a tensor of another size: every rank must say so, not hang.
TEST_P(CollectiveBackends, BucketShapeMismatchFailsOnEveryRank) {
  constexpr int kSize = 3;
  HashStore store;
  auto ranks = MakeGroup(GetParam(), kSize, 5s, UniqueGroup("mismatch"), &store);
  ASSERT_EQ(ranks.size(), static_cast<size_t>(kSize));
  std::vector<Status> statuses(kSize);
  const auto start = Clock::now();
  RunRanks(kSize, [&](int r) {
    std::vector<float> a(100, 1.0f);
    std::vector<float> b(r == 1 ? 4096 : 8192, 1.0f);
    std::vector<std::span<float>> tensors = {a, b};
    statuses[static_cast<size_t>(r)] = BucketedAllReduceSum(*ranks[static_cast<size_t>(r)], tensors, 12);
  });
  EXPECT_LT(SecondsSince(start), 4.0) << "the mismatch must fail fast, not at the timeout";
  for (int r = 0; r < kSize; ++r) {
    const Status& status = statuses[static_cast<size_t>(r)];
    EXPECT_EQ(status.code(), StatusCode::kInvalidArgument) << status.ToString();
    EXPECT_CONTAINS(status.message(), "bucket 0 at step 12");
    EXPECT_CONTAINS(status.message(), "elements in the bucket: rank 1 has 4196, ranks 0, 2 have 8292");
    EXPECT_CONTAINS(status.message(), "this is rank " + std::to_string(r));
  }
}

// Same element count, different tensor shapes: the layout hash catches it.
TEST_P(CollectiveBackends, BucketLayoutMismatchWithEqualCountsFails) {
  constexpr int kSize = 2;
  HashStore store;
  auto ranks = MakeGroup(GetParam(), kSize, 5s, UniqueGroup("layout"), &store);
  ASSERT_EQ(ranks.size(), static_cast<size_t>(kSize));
  std::vector<Status> statuses(kSize);
  RunRanks(kSize, [&](int r) {
    std::vector<float> a(r == 0 ? 100 : 200, 1.0f);
    std::vector<float> b(r == 0 ? 200 : 100, 1.0f);
    std::vector<std::span<float>> tensors = {a, b};
    statuses[static_cast<size_t>(r)] = BucketedAllReduceSum(*ranks[static_cast<size_t>(r)], tensors, 3);
  });
  for (const auto& status : statuses) {
    EXPECT_EQ(status.code(), StatusCode::kInvalidArgument) << status.ToString();
    EXPECT_CONTAINS(status.message(), "tensor layout hash");
    EXPECT_EQ(status.message().find("elements in the bucket"), std::string::npos) << status.message();
  }
}

INSTANTIATE_TEST_SUITE_P(Backends, CollectiveBackends, ::testing::Values(Backend::kLocal, Backend::kGloo),
                         [](const auto& p) { return BackendName(p.param); });

TEST(BucketPlan, FixedOrderBucketsOfAtMostBucketBytes) {
  const auto sizes = ManyTensorSizes();
  size_t total = 0;
  for (size_t s : sizes) total += s;
  const size_t bucket_bytes = 16 << 10;
  const auto buckets = PlanBuckets(sizes, bucket_bytes);
  ASSERT_FALSE(buckets.empty());
  // Pieces walk the tensors in order, without gaps or overlaps.
  size_t tensor = 0;
  size_t offset = 0;
  size_t seen = 0;
  for (const auto& bucket : buckets) {
    EXPECT_LE(bucket.elements * sizeof(float), bucket_bytes);
    EXPECT_GT(bucket.elements, 0u);
    size_t in_bucket = 0;
    for (const auto& piece : bucket.pieces) {
      while (tensor < sizes.size() && offset == sizes[tensor]) {
        ++tensor;
        offset = 0;
      }
      ASSERT_LT(tensor, sizes.size());
      EXPECT_EQ(piece.tensor, tensor);
      EXPECT_EQ(piece.offset, offset);
      offset += piece.count;
      in_bucket += piece.count;
    }
    EXPECT_EQ(in_bucket, bucket.elements);
    seen += in_bucket;
  }
  EXPECT_EQ(seen, total);
  EXPECT_EQ(buckets.size(), (total * sizeof(float) + bucket_bytes - 1) / bucket_bytes);
  // Deterministic, and the layout hash depends on the shapes.
  EXPECT_EQ(PlanBuckets(sizes, bucket_bytes)[0].layout_hash, buckets[0].layout_hash);
  EXPECT_NE(PlanBuckets({100, 200}, 1 << 20)[0].layout_hash, PlanBuckets({200, 100}, 1 << 20)[0].layout_hash);
  EXPECT_TRUE(PlanBuckets({0, 0}, 1 << 20).empty());
}

// ---- LocalCollective: determinism and its failure model ----

TEST(LocalCollective, SumsInRankOrderBitForBit) {
  constexpr int kSize = 4;
  auto ranks = LocalCollective::CreateGroup(kSize, 5s, "order");
  // Values whose float sum depends on the order: (1e8 + 1) - 1e8 + ... .
  const float inputs[kSize] = {1e8f, 1.0f, -1e8f, 1.0f};
  float expected = inputs[0];
  for (int r = 1; r < kSize; ++r) expected += inputs[r];
  std::vector<float> results(kSize);
  RunRanks(kSize, [&](int r) {
    float v = inputs[r];
    EXPECT_TRUE(ranks[static_cast<size_t>(r)]->AllReduceSum(&v, 1).ok());
    results[static_cast<size_t>(r)] = v;
  });
  for (float v : results) EXPECT_EQ(v, expected);  // ((1e8 + 1) - 1e8) + 1 = 1 in float
  EXPECT_EQ(expected, 1.0f);
}

TEST(LocalCollective, EveryOperationTimesOutNamingTheMissingRank) {
  const std::vector<std::pair<std::string, std::function<Status(Collective&)>>> ops = {
      {"AllReduceSum", [](Collective& c) { std::vector<float> d(10); return c.AllReduceSum(d.data(), d.size()); }},
      {"ReduceScatterSum",
       [](Collective& c) {
         std::vector<float> in(6), out(2);
         return c.ReduceScatterSum(in.data(), out.data(), {2, 2, 2});
       }},
      {"AllGatherV",
       [](Collective& c) {
         std::vector<float> in(2), out(6);
         return c.AllGatherV(in.data(), {2, 2, 2}, out.data());
       }},
      {"Broadcast", [](Collective& c) { std::vector<float> d(10); return c.Broadcast(d.data(), d.size(), 2); }},
      {"Barrier", [](Collective& c) { return c.Barrier(); }},
  };
  for (const auto& [name, op] : ops) {
    auto ranks = LocalCollective::CreateGroup(3, 300ms, "timeouts");
    std::vector<Status> statuses(2);
    const auto start = Clock::now();
    RunRanks(2, [&, &op = op](int r) { statuses[static_cast<size_t>(r)] = op(*ranks[static_cast<size_t>(r)]); });
    EXPECT_LT(SecondsSince(start), 1.5) << name;
    // The rank that gives up first names rank 2; the other says the group
    // broke because of it, naming rank 2 as well.
    for (const auto& status : statuses) {
      EXPECT_EQ(status.code(), StatusCode::kTimeout) << status.ToString();
      EXPECT_CONTAINS(status.message(), name);
      EXPECT_CONTAINS(status.message(), "missing ranks: 2");
    }
    // The group is broken from now on.
    Status later = ranks[0]->Barrier();
    EXPECT_FALSE(later.ok());
    EXPECT_CONTAINS(later.message(), "broken by an earlier failure");
  }
}

TEST(LocalCollective, DisagreeingCallsFailOnEveryRank) {
  auto ranks = LocalCollective::CreateGroup(2, 5s, "disagree");
  std::vector<Status> statuses(2);
  RunRanks(2, [&](int r) {
    std::vector<float> d(10 + static_cast<size_t>(r));
    statuses[static_cast<size_t>(r)] = ranks[static_cast<size_t>(r)]->AllReduceSum(d.data(), d.size());
  });
  for (const auto& status : statuses) {
    EXPECT_EQ(status.code(), StatusCode::kInvalidArgument) << status.ToString();
    EXPECT_CONTAINS(status.message(), "rank 0 called AllReduceSum(10 floats); rank 1 called AllReduceSum(11 floats)");
  }
}

TEST(LocalCollective, DestroyedOrAbortedPeerFailsPendingOperations) {
  {
    auto ranks = LocalCollective::CreateGroup(2, 10s, "leave");
    Status status;
    const auto start = Clock::now();
    std::thread waiter([&] {
      float v = 1.0f;
      status = ranks[0]->AllReduceSum(&v, 1);
    });
    std::this_thread::sleep_for(100ms);
    ranks[1].reset();  // what a dead process is to Gloo
    waiter.join();
    EXPECT_LT(SecondsSince(start), 2.0);
    EXPECT_EQ(status.code(), StatusCode::kIOError) << status.ToString();
    EXPECT_CONTAINS(status.message(), "rank 1 left group 'leave'");
  }
  {
    auto ranks = LocalCollective::CreateGroup(3, 10s, "abort");
    std::vector<Status> statuses(2);
    std::thread waiters([&] { RunRanks(2, [&](int r) { statuses[static_cast<size_t>(r)] = ranks[static_cast<size_t>(r)]->Barrier(); }); });
    std::this_thread::sleep_for(100ms);
    ranks[2]->Abort("injected fault");
    waiters.join();
    for (const auto& status : statuses) EXPECT_CONTAINS(status.ToString(), "injected fault");
  }
}

// ---- Gloo: rendezvous, groups, timeouts (ranks as threads) ----

TEST(GlooCollective, RankThatNeverJoinsFailsRendezvousNamingIt) {
  HashStore store;
  const std::string group = UniqueGroup("nojoin");
  std::vector<std::optional<Result<std::unique_ptr<Collective>>>> made(2);
  const auto start = Clock::now();
  RunRanks(2, [&](int r) {
    GlooCollectiveOptions options;
    options.timeout = 2s;
    made[static_cast<size_t>(r)].emplace(NewGlooCollective(&store, r, 3, group, options));
  });
  const double seconds = SecondsSince(start);
  EXPECT_LT(seconds, 2.0 + 1.5);
  for (auto& result : made) {
    ASSERT_FALSE(result->ok());
    EXPECT_EQ(result->status().code(), StatusCode::kTimeout) << result->status().ToString();
    EXPECT_CONTAINS(result->status().message(), "ranks that did not join: 2");
    EXPECT_CONTAINS(result->status().message(), "group '" + group + "'");
  }
}

TEST(GlooCollective, EveryOperationTimesOutWhenAPeerStalls) {
  const std::vector<std::pair<std::string, std::function<Status(Collective&)>>> ops = {
      {"AllReduceSum",
       [](Collective& c) { std::vector<float> d(1000); return c.AllReduceSum(d.data(), d.size()); }},
      {"ReduceScatterSum",
       [](Collective& c) {
         std::vector<float> in(600), out(200);
         return c.ReduceScatterSum(in.data(), out.data(), {200, 200, 200});
       }},
      {"AllGatherV",
       [](Collective& c) {
         std::vector<float> in(200), out(600);
         return c.AllGatherV(in.data(), {200, 200, 200}, out.data());
       }},
      {"Broadcast", [](Collective& c) { std::vector<float> d(1000); return c.Broadcast(d.data(), d.size(), 2); }},
      {"Barrier", [](Collective& c) { return c.Barrier(); }},
  };
  for (const auto& [name, op] : ops) {
    HashStore store;
    const std::string group = UniqueGroup("stall");
    auto ranks = MakeGroup(Backend::kGloo, 3, 1s, group, &store);
    ASSERT_EQ(ranks.size(), 3u);
    std::vector<Status> statuses(2);
    std::vector<double> seconds(2);
    // Rank 2 stays alive but never enters the operation.
    RunRanks(2, [&, &op = op](int r) {
      const auto start = Clock::now();
      statuses[static_cast<size_t>(r)] = op(*ranks[static_cast<size_t>(r)]);
      seconds[static_cast<size_t>(r)] = SecondsSince(start);
    });
    for (int r = 0; r < 2; ++r) {
      const Status& status = statuses[static_cast<size_t>(r)];
      EXPECT_FALSE(status.ok()) << name << " on rank " << r;
      EXPECT_TRUE(status.code() == StatusCode::kTimeout || status.code() == StatusCode::kIOError) << status.ToString();
      EXPECT_CONTAINS(status.message(), "gloo " + name);
      EXPECT_CONTAINS(status.message(), "group '" + group + "' (rank " + std::to_string(r) + " of 3)");
      EXPECT_LT(seconds[static_cast<size_t>(r)], 1.0 + 1.5) << name;
    }
    // The first rank to give up reports the timeout; Gloo then closes its
    // pairs, so the other may see the connection close first.
    EXPECT_TRUE(statuses[0].code() == StatusCode::kTimeout || statuses[1].code() == StatusCode::kTimeout)
        << statuses[0].ToString() << " / " << statuses[1].ToString();
    Status later = ranks[0]->Barrier();
    EXPECT_CONTAINS(later.message(), "broken by an earlier failure");
  }
}

TEST(GlooCollective, SeveralGroupsShareOneStore) {
  HashStore store;
  // A flat group of 4 and two "intra-node" pairs, all through one store.
  std::vector<std::unique_ptr<Collective>> flat(4), pair(4);
  std::vector<Status> statuses(4);
  RunRanks(4, [&](int r) {
    GlooCollectiveOptions options;
    options.timeout = 10s;
    auto f = NewGlooCollective(&store, r, 4, "flat-g1", options);
    auto p = NewGlooCollective(&store, r % 2, 2, "node" + std::to_string(r / 2) + "-g1", options);
    if (!f.ok() || !p.ok()) {
      statuses[static_cast<size_t>(r)] = f.ok() ? p.status() : f.status();
      return;
    }
    flat[static_cast<size_t>(r)] = std::move(f).value();
    pair[static_cast<size_t>(r)] = std::move(p).value();
    float a = static_cast<float>(r);
    float b = static_cast<float>(r);
    Status s1 = flat[static_cast<size_t>(r)]->AllReduceSum(&a, 1);
    Status s2 = pair[static_cast<size_t>(r)]->AllReduceSum(&b, 1);
    statuses[static_cast<size_t>(r)] = s1.ok() ? s2 : s1;
    EXPECT_EQ(a, 6.0f);
    EXPECT_EQ(b, r < 2 ? 1.0f : 5.0f);
  });
  for (const auto& status : statuses) EXPECT_TRUE(status.ok()) << status.ToString();
}

// ---- Gloo: ranks as forked processes, rendezvous through the coordinator ----

struct Child {
  pid_t pid = -1;
  int result_fd = -1;    // the child's report
  int progress_fd = -1;  // optional: the child writes a byte when asked
};

struct Outcome {
  bool exited = false;
  int exit_code = -1;
  int signal = 0;
  std::string report;
};

// Forks a child that runs body(progress_fd) and reports the returned text.
Child Spawn(const std::function<std::string(int progress_fd)>& body) {
  int result[2];
  int progress[2];
  if (pipe(result) != 0 || pipe(progress) != 0) {
    ADD_FAILURE() << "pipe: " << std::strerror(errno);
    return {};
  }
  const pid_t pid = fork();
  if (pid == 0) {
    prctl(PR_SET_PDEATHSIG, SIGKILL);  // never outlive the test
    close(result[0]);
    close(progress[0]);
    const std::string report = body(progress[1]);
    size_t written = 0;
    while (written < report.size()) {
      const ssize_t n = write(result[1], report.data() + written, report.size() - written);
      if (n < 0 && errno == EINTR) continue;
      if (n <= 0) break;
      written += static_cast<size_t>(n);
    }
    _exit(0);  // no gtest teardown in the child
  }
  close(result[1]);
  close(progress[1]);
  if (pid < 0) ADD_FAILURE() << "fork: " << std::strerror(errno);
  return Child{pid, result[0], progress[0]};
}

// Waits for the child until `deadline`, then kills it.
Outcome Reap(Child& child, Clock::time_point deadline) {
  Outcome outcome;
  int status = 0;
  for (;;) {
    const pid_t done = waitpid(child.pid, &status, WNOHANG);
    if (done == child.pid) break;
    if (Clock::now() > deadline) {
      kill(child.pid, SIGKILL);
      waitpid(child.pid, &status, 0);
      ADD_FAILURE() << "child " << child.pid << " hung; killed";
      break;
    }
    std::this_thread::sleep_for(10ms);
  }
  outcome.exited = WIFEXITED(status);
  outcome.exit_code = outcome.exited ? WEXITSTATUS(status) : -1;
  outcome.signal = WIFSIGNALED(status) ? WTERMSIG(status) : 0;
  char buffer[4096];
  ssize_t n;
  while ((n = read(child.result_fd, buffer, sizeof(buffer))) > 0) outcome.report.append(buffer, static_cast<size_t>(n));
  close(child.result_fd);
  close(child.progress_fd);
  return outcome;
}

class GlooMultiProcess : public ::testing::Test {
 protected:
  void SetUp() override {
    CoordinatorOptions options;
    options.port = 0;
    auto started = Coordinator::Start(options);
    ASSERT_TRUE(started.ok()) << started.status().ToString();
    coordinator_ = std::move(started).value();
  }
  void TearDown() override {
    if (coordinator_) coordinator_->Stop();
  }

  // In the child: a CoordinatorStore and a Gloo rank of `group`.
  struct Joined {
    std::unique_ptr<CoordinatorClient> client;
    std::unique_ptr<CoordinatorStore> store;
    std::unique_ptr<Collective> collective;
    Status status;
  };
  Joined Join(int rank, int size, const std::string& group, std::chrono::milliseconds timeout) {
    Joined joined;
    auto client = CoordinatorClient::Connect("127.0.0.1", coordinator_->port(), 5s);
    if (!client.ok()) {
      joined.status = client.status();
      return joined;
    }
    joined.client = std::move(client).value();
    joined.store = std::make_unique<CoordinatorStore>(joined.client.get());
    GlooCollectiveOptions options;
    options.timeout = timeout;
    auto made = NewGlooCollective(joined.store.get(), rank, size, group, options);
    if (!made.ok()) {
      joined.status = made.status();
      return joined;
    }
    joined.collective = std::move(made).value();
    return joined;
  }

  std::unique_ptr<Coordinator> coordinator_;
};

TEST_F(GlooMultiProcess, OperationsAcrossProcesses) {
  constexpr int kSize = 3;
  const std::string group = UniqueGroup("procs");
  std::vector<Child> children;
  for (int r = 0; r < kSize; ++r) {
    children.push_back(Spawn([&, r](int) -> std::string {
      Joined joined = Join(r, kSize, group, 10s);
      if (!joined.status.ok()) return "join: " + joined.status.ToString();
      return ExerciseAllOperations(*joined.collective);
    }));
  }
  const auto deadline = Clock::now() + 20s;
  for (int r = 0; r < kSize; ++r) {
    Outcome outcome = Reap(children[static_cast<size_t>(r)], deadline);
    EXPECT_TRUE(outcome.exited && outcome.exit_code == 0) << "rank " << r << " signal " << outcome.signal;
    EXPECT_EQ(outcome.report, "") << "rank " << r;
  }
}

TEST_F(GlooMultiProcess, RankThatNeverJoinsFailsTheOthersWithinTheTimeout) {
  const std::string group = UniqueGroup("procs-nojoin");
  std::vector<Child> children;
  const auto start = Clock::now();
  for (int r = 0; r < 2; ++r) {  // rank 2 of 3 never starts
    children.push_back(Spawn([&, r](int) -> std::string {
      Joined joined = Join(r, 3, group, 2s);
      return joined.status.ok() ? std::string("joined without rank 2") : joined.status.ToString();
    }));
  }
  for (auto& child : children) {
    Outcome outcome = Reap(child, start + 10s);
    EXPECT_TRUE(outcome.exited);
    EXPECT_CONTAINS(outcome.report, "Timeout");
    EXPECT_CONTAINS(outcome.report, "ranks that did not join: 2");
  }
  EXPECT_LT(SecondsSince(start), 2.0 + 2.0);
}

TEST_F(GlooMultiProcess, SigkilledRankFailsTheOthersWithinTheTimeout) {
  constexpr int kSize = 3;
  constexpr auto kTimeout = 2s;
  const std::string group = UniqueGroup("procs-kill");
  std::vector<Child> children;
  for (int r = 0; r < kSize; ++r) {
    children.push_back(Spawn([&, r](int progress_fd) -> std::string {
      Joined joined = Join(r, kSize, group, kTimeout);
      if (!joined.status.ok()) return "join: " + joined.status.ToString();
      std::vector<float> data(size_t{1} << 18);
      for (int it = 0; it < 1000000; ++it) {
        std::fill(data.begin(), data.end(), 1.0f);
        Status status = joined.collective->AllReduceSum(data.data(), data.size());
        if (!status.ok()) return "failed after " + std::to_string(it) + " all-reduces: " + status.ToString();
        if (it == 3 && write(progress_fd, "x", 1) != 1) return "progress pipe";
      }
      return "never failed";
    }));
  }
  // Once rank 2 has done a few all-reduces, kill it in the middle of the run.
  pollfd ready{children[2].progress_fd, POLLIN, 0};
  ASSERT_EQ(poll(&ready, 1, 15000), 1) << "rank 2 made no progress";
  ASSERT_EQ(kill(children[2].pid, SIGKILL), 0);
  const auto killed = Clock::now();
  Outcome victim = Reap(children[2], killed + 5s);
  EXPECT_EQ(victim.signal, SIGKILL);
  for (int r = 0; r < 2; ++r) {
    Outcome outcome = Reap(children[static_cast<size_t>(r)], killed + 10s);
    EXPECT_TRUE(outcome.exited) << "rank " << r << " signal " << outcome.signal;
    EXPECT_CONTAINS(outcome.report, "failed after");
    EXPECT_CONTAINS(outcome.report, "gloo AllReduceSum(262144 floats) in group '" + group + "' (rank " +
                                        std::to_string(r) + " of 3)");
  }
  EXPECT_LT(SecondsSince(killed), 2.0 + 2.0) << "the survivors must fail within the timeout";
}

// ---- Factory and NCCL ----

TEST(MakeCollective, PicksABackendByName) {
  HashStore store;
  auto bogus = MakeCollective("mpi", &store, 0, 1, "factory", 1s);
  ASSERT_FALSE(bogus.ok());
  EXPECT_EQ(bogus.status().code(), StatusCode::kInvalidArgument);
  EXPECT_CONTAINS(bogus.status().message(), "allowed: auto, gloo, nccl");

  std::string reason;
  const bool nccl = NcclAvailable(&reason);
  auto resolved = ResolveCollectiveKind("auto");
  ASSERT_TRUE(resolved.ok());
  EXPECT_EQ(*resolved, nccl ? "nccl" : "gloo");

  if (!nccl) {
    // "auto" falls back to Gloo; two ranks through the factory.
    std::vector<std::optional<Result<std::unique_ptr<Collective>>>> made(2);
    RunRanks(2, [&](int r) { made[static_cast<size_t>(r)].emplace(MakeCollective("auto", &store, r, 2, "factory-auto", 5s)); });
    for (auto& m : made) {
      ASSERT_TRUE(m->ok()) << m->status().ToString();
      EXPECT_EQ(m->value()->name(), "gloo");
    }
    RunRanks(2, [&](int r) {
      float v = 2.0f;
      EXPECT_TRUE((*made[static_cast<size_t>(r)]).value()->AllReduceSum(&v, 1).ok());
      EXPECT_EQ(v, 4.0f);
    });
    auto forced = MakeCollective("nccl", &store, 0, 1, "factory-nccl", 1s);
    ASSERT_FALSE(forced.ok());
    EXPECT_EQ(forced.status().code(), StatusCode::kUnsupported) << forced.status().ToString();
  }
}

// NCCL is loaded at run time, not linked: where its library is installed
// (this build machine has CUDA's), it loads with every function gridsync
// calls; elsewhere the reason names the library.
TEST(NcclCollective, TheLibraryLoadsAtRunTimeOrSaysWhyNot) {
  const Status loaded = LoadNcclLibrary();
  if (access("/usr/local/cuda/lib/libnccl.so.2", F_OK) == 0 ||
      access("/usr/lib/x86_64-linux-gnu/libnccl.so.2", F_OK) == 0) {
    EXPECT_TRUE(loaded.ok()) << loaded.ToString();
  } else if (!loaded.ok()) {
    EXPECT_EQ(loaded.code(), StatusCode::kUnsupported);
    EXPECT_CONTAINS(loaded.message(), "NCCL");
  }
}

TEST(NcclCollective, RunsOnAGpuOrSaysWhyNot) {
  std::string reason;
  if (!NcclAvailable(&reason)) {
    // Creation must fail cleanly, saying why, rather than crash or hang.
    HashStore store;
    NcclCollectiveOptions options;
    options.timeout = 1s;
    auto made = NewNcclCollective(&store, 0, 1, "nccl-probe", options);
    ASSERT_FALSE(made.ok());
    EXPECT_EQ(made.status().code(), StatusCode::kUnsupported) << made.status().ToString();
    EXPECT_TRUE(made.status().message().find("no CUDA device") != std::string::npos ||
                made.status().message().find("no NCCL support") != std::string::npos)
        << made.status().ToString();
    EXPECT_FALSE(reason.empty());
    GTEST_SKIP() << "NCCL needs a CUDA device: " << reason;
  }
  // One GPU here: a group of one, on host buffers (staged through the device).
  HashStore store;
  NcclCollectiveOptions options;
  options.timeout = 20s;
  auto made = NewNcclCollective(&store, 0, 1, UniqueGroup("nccl"), options);
  ASSERT_TRUE(made.ok()) << made.status().ToString();
  EXPECT_EQ((*made)->name(), "nccl");
  EXPECT_EQ(ExerciseAllOperations(**made), "");
  std::vector<float> a(1000, 1.0f), b(3000, 2.0f);
  std::vector<std::span<float>> tensors = {a, b};
  EXPECT_TRUE(BucketedAllReduceSum(**made, tensors, 1).ok());
  EXPECT_EQ(a[999], 1.0f);
  // Rank 0 of 2 without its peer: initialisation times out naming rank 1.
  options.timeout = 3s;
  const auto start = Clock::now();
  auto lonely = NewNcclCollective(&store, 0, 2, UniqueGroup("nccl-lonely"), options);
  ASSERT_FALSE(lonely.ok());
  EXPECT_EQ(lonely.status().code(), StatusCode::kTimeout) << lonely.status().ToString();
  EXPECT_CONTAINS(lonely.status().message(), "ranks that did not join: 1");
  EXPECT_LT(SecondsSince(start), 3.0 + 2.0);
}

}  // namespace
}  // namespace gridsync
