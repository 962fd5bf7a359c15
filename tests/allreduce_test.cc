// gradient_sync "nccl" on CPU: all-reduce training over the Collective seam
// (the rank-ordered in-process twin, and real Gloo), flat and hierarchical,
// batch splitting, and failure handling.
#include <fcntl.h>
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <array>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <thread>

#include "common/config.h"
#include "common/store.h"
#include "kernels/cuda/cuda_kernels.h"
#include "kernels/cuda/device_trainer.h"
#include "tests/allreduce_test_util.h"
#include "tests/single_process.h"
#include "tests/test_util.h"
#include "worker/batch_split.h"
#include "worker/collective/factory.h"
#include "worker/collective/local_collective.h"
#include "worker/host_trainer.h"
#include "worker/image_task.h"
#include "worker/model.h"
#include "worker/params_file.h"
#include "worker/sync/ps_session.h"
#include "worker/sync/train.h"

namespace gridsync {
namespace {

using testing::ExpectBitIdentical;
using testing::ExpectWithinRounding;
using testing::SmallImage;
namespace fs = std::filesystem;
using std::chrono::milliseconds;

Config SmallConfig(int workers) {
  Config c = testing::SmallDistributedConfig(workers, GradientSyncMode::kNccl, 8);
  c.distributed.bucket_mb = 0.25;  // several buckets per step
  return c;
}

using testing::RunLocal;
using testing::SingleProcess;

WorkerOptions Quiet() {
  WorkerOptions options;
  options.train.quiet = true;
  options.train.write_png = false;
  return options;
}

// Runs every worker as a thread over one real group (flat) of `kind`
// ("gloo", or "nccl": rank r on device r).
// `twin`: the model trains on the device trainer's CPU twin, its gradients
// staged as a GPU's would be (worker/host_trainer.h).
std::vector<Result<TrainReport>> RunGloo(const Config& config, const ImageTask& image,
                                         const std::string& kind = "gloo", bool twin = false) {
  const int world = config.distributed.world_size;
  HashStore store;
  std::vector<Result<TrainReport>> reports(static_cast<size_t>(world), Status::Internal("not run"));
  std::vector<std::thread> threads;
  for (int r = 0; r < world; ++r) {
    threads.emplace_back([&, r] {
      CollectiveEndpoint endpoint;
      endpoint.cuda_device = r;
      auto flat = MakeCollective(kind, &store, r, world, "flat", milliseconds(20000), endpoint);
      if (!flat.ok()) {
        reports[static_cast<size_t>(r)] = flat.status();
        return;
      }
      AllReduceGroups groups;
      groups.flat = flat->get();
      WorkerOptions options = Quiet();
      ThreadPool twin_pool(1);
      if (twin) {
        options.make_trainer =
            [&](const RunSpec& spec,
                const HashGridModel& model) -> Result<std::unique_ptr<cuda::DeviceTrainer>> {
          GRIDSYNC_ASSIGN_OR_RETURN(auto trainer, HostTrainer::Create(spec, model, &twin_pool,
                                                                      /*as_if_on_device=*/true));
          return std::unique_ptr<cuda::DeviceTrainer>(std::move(trainer));
        };
      }
      reports[static_cast<size_t>(r)] = TrainImageAllReduce(config, image, r, groups, options);
    });
  }
  for (auto& t : threads) t.join();
  return reports;
}

TEST(AllReduceTest, FlatRankOrderedMatchesSingleProcessBitForBit) {
  const ImageTask image = SmallImage();
  const Config config = SmallConfig(2);
  auto reports = RunLocal(config, image);
  for (auto& r : reports) ASSERT_TRUE(r.ok()) << r.status().ToString();
  const auto local = SingleProcess(config, image);
  ExpectBitIdentical(FlattenParams(*reports[0]->model), FlattenParams(*local.model));
  // Every replica took the same steps.
  ExpectBitIdentical(FlattenParams(*reports[1]->model), FlattenParams(*local.model));
  EXPECT_EQ(reports[0]->psnr, local.psnr);
}

TEST(AllReduceTest, HierarchicalTwoNodesOfTwoAndOnePlusThree) {
  const ImageTask image = SmallImage();
  for (const auto& sizes : std::vector<std::vector<int>>{{2, 2}, {1, 3}}) {
    Config config = SmallConfig(4);
    config.distributed.hierarchical = true;
    for (size_t n = 0; n < sizes.size(); ++n) {
      NodeConfig node;
      node.name = std::string("node") +
                  std::to_string(n);  // (a GCC 12 -Wrestrict false positive on "n" + ...)
      node.workers = sizes[n];
      config.distributed.nodes.push_back(node);
    }
    auto reports = RunLocal(config, image);
    for (auto& r : reports) ASSERT_TRUE(r.ok()) << r.status().ToString();
    const auto local = SingleProcess(config, image);
    ExpectWithinRounding(FlattenParams(*reports[0]->model), FlattenParams(*local.model),
                         testing::InitialParams(config));
    // All replicas agree exactly: they all received the same sums.
    for (size_t r = 1; r < reports.size(); ++r) {
      ExpectBitIdentical(FlattenParams(*reports[r]->model), FlattenParams(*reports[0]->model));
    }
  }
}

TEST(AllReduceTest, GlooFlatMatchesSingleProcess) {
  const ImageTask image = SmallImage();
  Config config = SmallConfig(3);
  config.training.batch_size = 3072;
  auto reports = RunGloo(config, image);
  for (auto& r : reports) ASSERT_TRUE(r.ok()) << r.status().ToString();
  const auto local = SingleProcess(config, image);
  ExpectWithinRounding(FlattenParams(*reports[0]->model), FlattenParams(*local.model),
                       testing::InitialParams(config));
  ExpectBitIdentical(FlattenParams(*reports[2]->model), FlattenParams(*reports[0]->model));
}

// The device all-reduce over real Gloo, its gradients staged out of the
// "device" and back bucket by bucket as the backward pass finishes them (the
// CPU twin standing in for the GPU): the same parameters as the host path
// over Gloo, bit for bit, in one bucket or one per level.
TEST(AllReduceTest, TheDeviceAllReduceStagedOverGlooMatchesTheHostPath) {
  const ImageTask image = SmallImage();
  // bucket_mb 0.001: a bucket per level, each copied out and summed alone.
  for (const auto& [mixed, bucket_mb] : {std::pair{false, 25.0}, std::pair{true, 25.0},
                                         std::pair{false, 0.001}, std::pair{true, 0.001}}) {
    SCOPED_TRACE(::testing::Message() << "mixed " << mixed << ", bucket_mb " << bucket_mb);
    Config config = SmallConfig(2);
    config.training.mixed_precision = mixed;
    config.distributed.bucket_mb = bucket_mb;
    auto host = RunGloo(config, image);
    auto twin = RunGloo(config, image, "gloo", /*twin=*/true);
    for (auto& r : host) ASSERT_TRUE(r.ok()) << r.status().ToString();
    for (auto& r : twin) ASSERT_TRUE(r.ok()) << r.status().ToString();
    EXPECT_EQ(twin[0]->device, "the CPU twin");
    ExpectBitIdentical(FlattenParams(*twin[0]->model), FlattenParams(*host[0]->model));
    ExpectBitIdentical(FlattenParams(*twin[1]->model), FlattenParams(*host[1]->model));
    EXPECT_EQ(twin[0]->bytes_pushed_per_step, host[0]->bytes_pushed_per_step);
  }
}

// The model on GPUs over real collectives: NCCL across two ranks when two
// devices exist (the all-reduce reads the device gradient buffers), else
// Gloo across two ranks sharing the one device (the gradients staged
// through host memory). Within rounding of one CPU process; the replicas
// stay identical. Skips without a device.
TEST(AllReduceTest, TheGpuModelOverRealCollectivesMatchesOneProcess) {
  std::string reason;
  if (!cuda::Available(&reason)) GTEST_SKIP() << reason;
  // Local rank 1 maps to device 1 only where there are two.
  const auto second = cuda::DeviceForLocalRank(1);
  const bool two_devices = second.ok() && *second == 1;
  const ImageTask image = SmallImage();
  for (bool mixed : {false, true}) {
    Config config = SmallConfig(2);
    config.training.device = TrainingDevice::kCuda;
    config.training.mixed_precision = mixed;
    auto reports = RunGloo(config, image, two_devices ? "nccl" : "gloo");
    for (auto& r : reports) ASSERT_TRUE(r.ok()) << r.status().ToString();
    EXPECT_NE(reports[0]->device, "CPU");
    const auto local = SingleProcess(config, image);
    ExpectWithinRounding(FlattenParams(*reports[0]->model), FlattenParams(*local.model),
                         testing::InitialParams(config), 0.05, 0.05);
    ExpectBitIdentical(FlattenParams(*reports[1]->model), FlattenParams(*reports[0]->model));
  }
}

// compression.codec fp16/bf16 under nccl: half the bytes of the fp32
// all-reduce, every replica identical, and the model ends within 16-bit
// rounding of the fp32 run (error feedback keeps what rounding drops). The
// Gloo run exercises the real 16-bit ring; mixed precision the shared
// overflow decision.
TEST(AllReduceTest, SixteenBitAllReduceHalvesTheBytesAndTrainsAsFp32) {
  const ImageTask image = SmallImage();
  Config fp32 = SmallConfig(2);
  fp32.training.steps = 40;
  // The fp32 all-reduce, with fp32 and with mixed-precision compute.
  std::vector<Result<TrainReport>> references[2];
  for (int mixed = 0; mixed < 2; ++mixed) {
    Config config = fp32;
    config.training.mixed_precision = mixed == 1;
    references[mixed] = RunLocal(config, image);
    for (auto& r : references[mixed]) ASSERT_TRUE(r.ok()) << r.status().ToString();
  }
  const double fp32_bytes = references[0][0]->bytes_pushed_per_step;
  struct Case {
    const char* codec;
    bool gloo;
    bool mixed;
  };
  for (const Case& c : {Case{"fp16", false, false}, Case{"bf16", false, false},
                        Case{"fp16", true, false}, Case{"fp16", false, true}}) {
    SCOPED_TRACE(std::string(c.codec) + (c.gloo ? " gloo" : " local") + (c.mixed ? " mixed" : ""));
    Config config = fp32;
    config.compression.codec = c.codec;
    config.training.mixed_precision = c.mixed;
    std::vector<Result<TrainReport>> reports;
    if (!c.gloo) {
      reports = RunLocal(config, image);
    } else {
      reports = RunGloo(config, image);
    }
    for (auto& r : reports) ASSERT_TRUE(r.ok()) << r.status().ToString();
    ExpectBitIdentical(FlattenParams(*reports[1]->model), FlattenParams(*reports[0]->model));
    const double bytes = reports[0]->bytes_pushed_per_step;
    EXPECT_LT(bytes, 0.51 * fp32_bytes) << bytes << " against fp32's " << fp32_bytes;
    EXPECT_GT(bytes, 0.49 * fp32_bytes) << bytes << " against fp32's " << fp32_bytes;
    const TrainReport& reference = *references[c.mixed ? 1 : 0][0];
    EXPECT_NEAR(reports[0]->psnr, reference.psnr, 0.2);
    // Rounding each summed gradient to 16 bits nudges every Adam step, so
    // most parameters end more than 1e-4 away (no bound on that count); the
    // RMS difference stays a small fraction of the distance trained.
    // Measured: fp16 0.3%, bf16 2.1% (mixed: the same against the mixed
    // fp32 all-reduce); a worker's missing share is far larger.
    ExpectWithinRounding(FlattenParams(*reports[0]->model), FlattenParams(*reference.model),
                         testing::InitialParams(config),
                         std::string(c.codec) == "fp16" ? 0.01 : 0.04, 1.0);
  }
}

TEST(BatchSplitTest, EvenWeightedAndAdaptiveKeepTheGlobalBatch) {
  Config config = SmallConfig(4);
  config.training.batch_size = 1001;
  BatchSplit even(config.distributed, config.training.batch_size);
  EXPECT_EQ(even.counts(), (std::vector<uint64_t>{251, 250, 250, 250}));
  EXPECT_EQ(even.begin(3), 751u);
  config.distributed.batch_splitting = BatchSplitting::kWeighted;
  config.distributed.nodes = {{.name = "fast", .workers = 1, .weight = 3.0, .host = ""},
                              {.name = "slow", .workers = 3, .host = ""}};
  BatchSplit weighted(config.distributed, 1000);
  // Node "fast" takes 3/4 of the batch; "slow" splits 1/4 over three workers.
  EXPECT_EQ(weighted.count(0), 750u);
  EXPECT_EQ(weighted.count(1) + weighted.count(2) + weighted.count(3), 250u);
  BatchSplit adaptive(SmallConfig(2).distributed, 1000);
  EXPECT_TRUE(adaptive.Rebalance({300.0, 100.0}));
  EXPECT_EQ(adaptive.count(0), 750u);
  EXPECT_EQ(adaptive.count(1), 250u);
  EXPECT_EQ(adaptive.count(0) + adaptive.count(1), 1000u);
  EXPECT_FALSE(adaptive.Rebalance({300.0, 100.0}));
  EXPECT_TRUE(adaptive.Rebalance({1.0, 0.0}));  // a stalled worker still keeps one sample
  EXPECT_EQ(adaptive.count(1), 1u);
}

// Every worker keeps at least one sample; what that floor deals beyond the
// batch is taken back from the largest shares, ties to the lower rank. A
// hostile config of 65536 one-worker nodes took the linear search per
// sample (and a node lookup per rank) over a minute in check-config.
TEST(BatchSplitTest, TheOneSampleFloorIsTakenBackFromTheLargestShares) {
  EXPECT_EQ(BatchSplit::Apportion(10, {100, 1, 1, 1, 1, 1, 1, 1, 1, 1}),
            (std::vector<uint64_t>(10, 1)));
  EXPECT_EQ(BatchSplit::Apportion(7, {10, 10, 0.01, 0.01, 0.01, 0.01}),
            (std::vector<uint64_t>{1, 2, 1, 1, 1, 1}));  // 3, 3 to 2, 3 to 2, 2 to 1, 2
  Config config = SmallConfig(1);
  const int n = 65536;
  config.distributed.world_size = n;
  config.distributed.batch_splitting = BatchSplitting::kWeighted;
  config.distributed.nodes.assign(n, {.name = "n", .workers = 1, .weight = 1e-6, .host = ""});
  config.distributed.nodes[0].weight = 1e6;
  BatchSplit split(config.distributed, 2 * n);
  uint64_t total = 0;
  for (int r = 0; r < n; ++r) total += split.count(r);
  EXPECT_EQ(total, uint64_t{2} * n);
  EXPECT_EQ(split.count(0), uint64_t{n} + 1);
  EXPECT_EQ(split.count(n - 1), 1u);
}

TEST(AllReduceTest, AdaptiveMovesSamplesToTheFasterWorker) {
  const ImageTask image = SmallImage();
  Config config = SmallConfig(2);
  config.distributed.batch_splitting = BatchSplitting::kAdaptive;
  config.distributed.adaptive_interval = 3;
  config.training.steps = 10;
  auto reports = RunLocal(config, image, [](int r, WorkerOptions* o) {
    if (r == 1) o->throttle_ms = 60;  // worker 1 is slow
  });
  for (auto& r : reports) ASSERT_TRUE(r.ok()) << r.status().ToString();
  const auto& counts = reports[0]->split_counts;
  ASSERT_EQ(counts.size(), 2u);
  EXPECT_EQ(counts[0] + counts[1], 4096u);
  EXPECT_GT(counts[0], counts[1] * 2) << counts[0] << " vs " << counts[1];
  EXPECT_EQ(reports[1]->split_counts, counts);  // every worker computed the same split
}

TEST(AllReduceTest, WeightedSplitTrainsAndKeepsTheBatch) {
  const ImageTask image = SmallImage();
  Config config = SmallConfig(3);
  config.training.batch_size = 3000;
  config.distributed.batch_splitting = BatchSplitting::kWeighted;
  config.distributed.nodes = {{.name = "a", .workers = 1, .weight = 2.0, .host = ""},
                              {.name = "b", .workers = 2, .host = ""}};
  auto reports = RunLocal(config, image);
  for (auto& r : reports) ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_EQ(reports[0]->split_counts, (std::vector<uint64_t>{2000, 500, 500}));
  // Gradients are weighted by samples: the same maths as one process.
  const auto local = SingleProcess(config, image);
  ExpectWithinRounding(FlattenParams(*reports[0]->model), FlattenParams(*local.model),
                       testing::InitialParams(config));
}

TEST(AllReduceTest, ShapeMismatchGivesAClearError) {
  const ImageTask image = SmallImage();
  Config a = SmallConfig(2);
  Config b = a;
  b.network.n_neurons = 16;  // a different MLP: different tensor sizes
  const auto timeout = milliseconds(5000);
  auto flat = LocalCollective::CreateGroup(2, timeout, "flat");
  std::vector<Result<TrainReport>> reports(2, Status::Internal("not run"));
  std::thread t0([&] {
    AllReduceGroups g;
    g.flat = flat[0].get();
    reports[0] = TrainImageAllReduce(a, image, 0, g, Quiet());
  });
  std::thread t1([&] {
    AllReduceGroups g;
    g.flat = flat[1].get();
    reports[1] = TrainImageAllReduce(b, image, 1, g, Quiet());
  });
  t0.join();
  t1.join();
  for (auto& r : reports) {
    ASSERT_FALSE(r.ok());
    EXPECT_NE(r.status().message().find("rank"), std::string::npos) << r.status().ToString();
    EXPECT_NE(r.status().message().find("bucket"), std::string::npos) << r.status().ToString();
  }
}

// ---- Multi-process: a worker killed in the middle of training ----

// Below the kernel's ephemeral range (32768 and up), where outgoing
// connections would take a port at random.
int FreePortBase() { return 24000 + (getpid() % 400) * 10; }

pid_t Spawn(const std::vector<std::string>& argv, const std::string& log) {
  const pid_t pid = fork();
  if (pid == 0) {
    const int fd = ::open(log.c_str(), O_CREAT | O_WRONLY | O_TRUNC, 0644);
    dup2(fd, 1);
    dup2(fd, 2);
    std::vector<char*> args;
    for (const auto& a : argv) args.push_back(const_cast<char*>(a.c_str()));
    args.push_back(nullptr);
    execv(args[0], args.data());
    _exit(127);
  }
  return pid;
}

std::string ReadFile(const std::string& path) {
  std::ifstream in(path);
  return std::string(std::istreambuf_iterator<char>(in), {});
}

TEST(AllReduceProcessTest, KilledWorkerMakesTheOthersFailWithinTheTimeout) {
  const char* build = std::getenv("GRIDSYNC_BUILD_DIR");
  const std::string dir = build ? build : "build";
  Config config = SmallConfig(3);
  config.distributed.master_addr = "127.0.0.1";
  config.distributed.master_port = FreePortBase();
  config.distributed.collective = CollectiveKind::kGloo;
  config.distributed.timeout_s = 3;
  config.training.steps = 100000;  // runs until killed
  config.task.image = kDefaultImagePath;
  const fs::path tmp = fs::temp_directory_path() / ("gridsync-kill-" + std::to_string(getpid()));
  fs::create_directories(tmp);
  const std::string path = (tmp / "config.json").string();
  std::ofstream(path) << config.ToJson().dump(2);
  const pid_t coordinator =
      Spawn({dir + "/server/gridsync-coordinator", "--config", path}, (tmp / "c.log").string());
  std::vector<pid_t> workers;
  for (int r = 0; r < 3; ++r) {
    workers.push_back(
        Spawn({dir + "/worker/gridsync-worker", "--config", path, "--rank", std::to_string(r)},
              (tmp / ("w" + std::to_string(r) + ".log")).string()));
  }
  // Let them rendezvous and train a few steps, then kill worker 2 outright.
  std::this_thread::sleep_for(std::chrono::seconds(4));
  ASSERT_EQ(kill(workers[2], SIGKILL), 0);
  const auto killed_at = std::chrono::steady_clock::now();
  int status = 0;
  waitpid(workers[2], &status, 0);
  for (int r = 0; r < 2; ++r) {
    // Each survivor must exit on its own, with an error, within the timeout
    // plus a margin; a hang is killed after 20 s and fails the test.
    bool exited = false;
    while (std::chrono::steady_clock::now() - killed_at < std::chrono::seconds(20)) {
      if (waitpid(workers[r], &status, WNOHANG) == workers[r]) {
        exited = true;
        break;
      }
      std::this_thread::sleep_for(milliseconds(50));
    }
    if (!exited) {
      kill(workers[r], SIGKILL);
      waitpid(workers[r], &status, 0);
    }
    EXPECT_TRUE(exited) << "worker " << r << " hung after its peer died";
    EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) != 0) << "worker " << r;
    const std::string log = ReadFile((tmp / ("w" + std::to_string(r) + ".log")).string());
    EXPECT_NE(log.find("training failed"), std::string::npos) << log;
  }
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - killed_at).count();
  EXPECT_LT(seconds, 3.0 + 10.0);
  kill(coordinator, SIGTERM);
  waitpid(coordinator, &status, 0);
}

}  // namespace
}  // namespace gridsync
