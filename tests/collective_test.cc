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
//
// Here: every operation on both backends, bucketed and 16-bit all-reduce,
// the factory and NCCL. Timeouts, dead peers and forked ranks:
// collective_failure_test.cc.
#include "tests/collective_test_util.h"

namespace gridsync {
namespace {

class CollectiveCorrectness : public ::testing::TestWithParam<std::tuple<Backend, int>> {};

TEST_P(CollectiveCorrectness, EveryOperationEverySize) {
  const auto [backend, size] = GetParam();
  HashStore store;
  auto ranks = MakeGroup(backend, size, 20s, UniqueGroup("correct"), &store);
  ASSERT_EQ(ranks.size(), static_cast<size_t>(size));
  EXPECT_EQ(ranks[0]->name(), CollectiveName(backend));
  std::vector<std::string> errors(static_cast<size_t>(size));
  RunRanks(size, [&](int r) {
    EXPECT_EQ(ranks[static_cast<size_t>(r)]->rank(), r);
    EXPECT_EQ(ranks[static_cast<size_t>(r)]->size(), size);
    errors[static_cast<size_t>(r)] = ExerciseAllOperations(*ranks[static_cast<size_t>(r)]);
  });
  for (int r = 0; r < size; ++r) EXPECT_EQ(errors[static_cast<size_t>(r)], "") << "rank " << r;
}

INSTANTIATE_TEST_SUITE_P(Backends, CollectiveCorrectness,
                         ::testing::Combine(::testing::Values(Backend::kLocal, Backend::kGloo,
                                                              Backend::kSealedGloo),
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
      statuses[static_cast<size_t>(r)] =
          BucketedAllReduceSum(*ranks[static_cast<size_t>(r)], tensors, 7, options);
      base = 0;
      for (const auto& t : storage) {
        for (size_t i = 0; i < t.size(); ++i)
          wrong[static_cast<size_t>(r)] += t[i] != SumOverRanks(kSize, base + i);
        base += t.size();
      }
    });
    for (int r = 0; r < kSize; ++r) {
      EXPECT_TRUE(statuses[static_cast<size_t>(r)].ok())
          << statuses[static_cast<size_t>(r)].ToString();
      EXPECT_EQ(wrong[static_cast<size_t>(r)], 0u)
          << "rank " << r << ", bucket_bytes " << bucket_bytes;
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
    statuses[static_cast<size_t>(r)] =
        BucketedAllReduceSum(*ranks[static_cast<size_t>(r)], tensors, 12);
  });
  EXPECT_LT(SecondsSince(start), 4.0) << "the mismatch must fail fast, not at the timeout";
  for (int r = 0; r < kSize; ++r) {
    const Status& status = statuses[static_cast<size_t>(r)];
    EXPECT_EQ(status.code(), StatusCode::kInvalidArgument) << status.ToString();
    EXPECT_CONTAINS(status.message(), "bucket 0 at step 12");
    EXPECT_CONTAINS(status.message(),
                    "elements in the bucket: rank 1 has 4196, ranks 0, 2 have 8292");
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
    statuses[static_cast<size_t>(r)] =
        BucketedAllReduceSum(*ranks[static_cast<size_t>(r)], tensors, 3);
  });
  for (const auto& status : statuses) {
    EXPECT_EQ(status.code(), StatusCode::kInvalidArgument) << status.ToString();
    EXPECT_CONTAINS(status.message(), "tensor layout hash");
    EXPECT_EQ(status.message().find("elements in the bucket"), std::string::npos)
        << status.message();
  }
}

INSTANTIATE_TEST_SUITE_P(Backends, CollectiveBackends,
                         ::testing::Values(Backend::kLocal, Backend::kGloo, Backend::kSealedGloo),
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
  EXPECT_NE(PlanBuckets({100, 200}, 1 << 20)[0].layout_hash,
            PlanBuckets({200, 100}, 1 << 20)[0].layout_hash);
  EXPECT_TRUE(PlanBuckets({0, 0}, 1 << 20).empty());
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
    RunRanks(2, [&](int r) {
      made[static_cast<size_t>(r)].emplace(
          MakeCollective("auto", &store, r, 2, "factory-auto", 5s));
    });
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
  // A build without NCCL refuses whatever the machine has installed.
  if (!loaded.ok() && loaded.message().find("no NCCL support") != std::string::npos)
    GTEST_SKIP() << loaded.ToString();
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
