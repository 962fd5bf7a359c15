// The backbone of every sync mode: a cluster ends where one process ends.
// Every gradient_sync mode x {fp32, mixed precision} x {gradient
// accumulation 1, 2} trains the same global batches as one process with
// gradient_accumulation = workers x accumulation, and is compared to it:
//   - bit for bit where the reduction order is the same (fp32, accumulation
//     1, nccl over the rank-ordered LocalCollective and ps with bsp);
//   - otherwise within rounding (tests/test_util.h's ExpectWithinRounding):
//     the RMS difference from the single process is at most 2% of the RMS
//     distance the single process moved the parameters, and at most 0.1% of
//     the parameters (5% under mixed precision) differ by more than 1e-4.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <iterator>
#include <thread>

#include "kernels/cuda/cuda_kernels.h"
#include "server/in_process_cluster.h"
#include "tests/single_process.h"
#include "tests/test_util.h"
#include "worker/collective/local_collective.h"
#include "worker/host_trainer.h"
#include "worker/params_file.h"
#include "worker/sync/train.h"

namespace gridsync {
namespace {

constexpr double kRelativeBound = 0.02;

enum class Mode { kNccl, kPs, kHybrid };
const char* Name(Mode m) { return m == Mode::kNccl ? "nccl" : m == Mode::kPs ? "ps" : "hybrid"; }

Config BackboneConfig(Mode mode, bool mixed, int accumulation) {
  Config c = testing::SmallDistributedConfig(
      2,
      mode == Mode::kNccl ? GradientSyncMode::kNccl
                          : (mode == Mode::kPs ? GradientSyncMode::kPs : GradientSyncMode::kHybrid),
      8);
  c.training.mixed_precision = mixed;
  c.training.gradient_accumulation = accumulation;
  c.ps.shards = 2;
  c.task.output = (std::filesystem::temp_directory_path() / "gridsync-backbone-test").string();
  if (mode == Mode::kHybrid) {
    // One node of two: the intra-node reduce-scatter and the PS both work.
    NodeConfig node;
    node.name = "node0";
    node.workers = 2;
    c.distributed.nodes.push_back(node);
  }
  return c;
}

std::string ReadBytes(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
}

WorkerOptions Quiet(int rank) {
  WorkerOptions options;
  options.rank = rank;
  options.train.quiet = true;
  options.train.write_png = false;
  return options;
}

using testing::TrainSingleProcess;

// `twin`: every worker's model trains on the device trainer's CPU twin
// (worker/host_trainer.h), through the device sync paths.
std::vector<Result<TrainReport>> RunCluster(Mode mode, const Config& config, const ImageTask& image,
                                            bool twin = false) {
  const int world = config.distributed.world_size;
  std::vector<Result<TrainReport>> reports(static_cast<size_t>(world), Status::Internal("not run"));
  std::vector<std::thread> threads;
  const auto timeout = std::chrono::seconds(20);
  auto group = LocalCollective::CreateGroup(world, timeout, mode == Mode::kNccl ? "flat" : "intra");
  std::unique_ptr<InProcessCluster> servers;
  Config run = config;
  if (mode != Mode::kNccl) {
    auto started = InProcessCluster::Start(config);
    EXPECT_TRUE(started.ok()) << started.status().ToString();
    if (!started.ok()) return reports;
    servers = std::move(started).value();
    run = servers->config();
  }
  for (int r = 0; r < world; ++r) {
    threads.emplace_back([&, r] {
      WorkerOptions options = Quiet(r);
      ThreadPool twin_pool(1);
      if (twin) {
        options.make_trainer =
            [&](const RunSpec& spec,
                const HashGridModel& model) -> Result<std::unique_ptr<cuda::DeviceTrainer>> {
          GRIDSYNC_ASSIGN_OR_RETURN(auto trainer, HostTrainer::Create(spec, model, &twin_pool));
          return std::unique_ptr<cuda::DeviceTrainer>(std::move(trainer));
        };
      }
      if (mode == Mode::kNccl) {
        AllReduceGroups groups;
        groups.flat = group[static_cast<size_t>(r)].get();
        reports[static_cast<size_t>(r)] = TrainImageAllReduce(run, image, r, groups, options);
        return;
      }
      options.intra_group = [&](int, int local, int) -> Result<Collective*> {
        return static_cast<Collective*>(group[static_cast<size_t>(local)].get());
      };
      reports[static_cast<size_t>(r)] = TrainWorker(run, image, options);
    });
  }
  for (auto& t : threads) t.join();
  return reports;
}

TEST(BackboneTest, EveryModeAndPrecisionAndAccumulationEndsWhereOneProcessEnds) {
  const ImageTask image = testing::SmallImage();
  for (Mode mode : {Mode::kNccl, Mode::kPs, Mode::kHybrid}) {
    for (bool mixed : {false, true}) {
      for (int accumulation : {1, 2}) {
        const Config config = BackboneConfig(mode, mixed, accumulation);
        const std::string what = std::string(Name(mode)) + (mixed ? " mixed" : " fp32") +
                                 " accumulation " + std::to_string(accumulation);
        auto reports = RunCluster(mode, config, image);
        for (auto& r : reports) ASSERT_TRUE(r.ok()) << what << ": " << r.status().ToString();
        auto local = TrainSingleProcess(config, image);
        ASSERT_TRUE(local.ok()) << local.status().ToString();
        const auto cluster = FlattenParams(*reports[0]->model);
        const auto alone = FlattenParams(*local->model);
        // Every report means the same: the global samples, this worker's share.
        EXPECT_EQ(reports[0]->samples, local->samples) << what;
        EXPECT_EQ(reports[0]->my_samples + reports[1]->my_samples, local->samples) << what;
        const bool exact = !mixed && accumulation == 1 && mode != Mode::kHybrid;
        if (exact) {
          testing::ExpectBitIdentical(cluster, alone);
          EXPECT_EQ(reports[0]->psnr, local->psnr) << what;
          continue;
        }
        // Mixed precision rounds each worker's share through fp16 rather than
        // their sum: more near-zero rows flip sign (measured: 0.8% RMS, 2.2%
        // of parameters beyond 1e-4, against 0.2% and 0.02% in fp32).
        testing::ExpectWithinRounding(cluster, alone, testing::InitialParams(config),
                                      kRelativeBound, mixed ? 0.05 : 0.001);
      }
    }
  }
}

// The device sync paths (device_allreduce_sync.h, device_staged_sync.h)
// with the device trainer's CPU twin: the same run as the host paths, bit
// for bit where the gradient is summed in the same order (one micro-batch:
// the twin accumulates micro-batches into one buffer, the host loop adds
// separately summed parts). nccl flat runs the device all-reduce, in one
// grid bucket or one per level ("buckets"); nccl
// model_parallel and fp16, ps and hybrid stage their rows through the twin,
// and encode their pushes through its EncodeBlock (onebit: Adam on the
// workers), or the grid's blocks stay on the twin and are encoded there,
// residuals and worker Adam included ("... shard", "... worker"; in hybrid
// every codec run: the node's sum runs on the twin's gradients).
TEST(BackboneTest, TheDevicePathsOnTheCpuTwinEndWhereTheHostPathsEnd) {
  const ImageTask image = testing::SmallImage();
  struct Case {
    Mode mode;
    bool mixed;
    int accumulation;
    const char* variant;
  };
  const Case cases[] = {
      {Mode::kNccl, false, 1, ""},
      {Mode::kNccl, true, 1, ""},
      {Mode::kNccl, false, 2, ""},
      {Mode::kNccl, false, 1, "model_parallel"},
      {Mode::kNccl, false, 1, "fp16"},
      {Mode::kPs, false, 1, ""},
      {Mode::kPs, true, 1, ""},
      {Mode::kPs, false, 1, "onebit"},
      {Mode::kPs, false, 1, "onebit shard"},
      {Mode::kPs, true, 1, "onebit shard"},
      {Mode::kPs, false, 1, "onebit worker"},
      {Mode::kPs, true, 1, "topk worker"},
      {Mode::kHybrid, false, 1, ""},
      {Mode::kHybrid, true, 2, ""},
      {Mode::kNccl, true, 1, "buckets"},
      {Mode::kNccl, true, 2, "buckets"},
      {Mode::kHybrid, false, 1, "onebit"},
      {Mode::kHybrid, true, 1, "onebit shard"},
      {Mode::kHybrid, false, 1, "onebit worker"},
      {Mode::kHybrid, true, 1, "topk worker"},
  };
  for (const Case& c : cases) {
    Config config = BackboneConfig(c.mode, c.mixed, c.accumulation);
    const std::string variant = c.variant;
    if (variant == "model_parallel") config.distributed.model_parallel = true;
    if (variant == "fp16") config.compression.codec = "fp16";
    if (variant == "onebit") config.compression.codec = "onebit";
    // In ps, the grid's push blocks stay on the device and are encoded
    // there (EncodePushBlock, residuals on the device), every block of them
    // (min_bytes 0); with Adam on the worker it runs there too
    // (GridWorkerAdam), and topk masks its momentum there.
    const bool on_device =
        variant == "onebit shard" || variant == "onebit worker" || variant == "topk worker";
    if (on_device) {
      config.compression.codec = variant == "topk worker" ? "topk" : "onebit";
      config.compression.ratio = 0.25;
      config.compression.min_bytes = 0;
      config.ps.optimizer =
          variant == "onebit shard" ? OptimizerPlacement::kShard : OptimizerPlacement::kWorker;
    }
    // A bucket per level: the backward pass reduced level by level.
    if (variant == "buckets") config.distributed.bucket_mb = 0.001;
    const std::string what = std::string(Name(c.mode)) + (c.mixed ? " mixed" : " fp32") +
                             " accumulation " + std::to_string(c.accumulation) + " " + variant;
    // Those also write checkpoints (every 4 of the 8 steps): the workers'
    // residuals and Adam's state, copied back from the twin, are the host's
    // bytes.
    const std::string checkpoints =
        (std::filesystem::temp_directory_path() / "gridsync-backbone-ckpt").string();
    std::filesystem::remove_all(checkpoints);
    Config host_config = config, twin_config = config;
    if (on_device) {
      host_config.checkpoint.every_steps = twin_config.checkpoint.every_steps = 4;
      host_config.checkpoint.dir = checkpoints + "/host";
      twin_config.checkpoint.dir = checkpoints + "/twin";
    }
    auto host = RunCluster(c.mode, host_config, image);
    auto twin = RunCluster(c.mode, twin_config, image, /*twin=*/true);
    if (on_device) {
      for (const char* part : {"step-4/worker-0.bin", "step-8/worker-1.bin"}) {
        const std::string a = ReadBytes(host_config.checkpoint.dir + "/" + part);
        const std::string b = ReadBytes(twin_config.checkpoint.dir + "/" + part);
        EXPECT_GT(a.size(), 64u) << what << " " << part;
        EXPECT_TRUE(a == b) << what << " " << part << ": the twin's checkpoint differs";
      }
    }
    std::filesystem::remove_all(checkpoints);
    for (auto& r : host) ASSERT_TRUE(r.ok()) << what << " host: " << r.status().ToString();
    for (auto& r : twin) ASSERT_TRUE(r.ok()) << what << " twin: " << r.status().ToString();
    EXPECT_EQ(twin[0]->device, "the CPU twin") << what;
    EXPECT_EQ(host[0]->device, "CPU") << what;
    EXPECT_EQ(twin[0]->my_samples + twin[1]->my_samples, host[0]->samples) << what;
    const auto a = FlattenParams(*twin[0]->model);
    const auto b = FlattenParams(*host[0]->model);
    if (c.accumulation == 1) {
      SCOPED_TRACE(what);
      testing::ExpectBitIdentical(a, b);
      EXPECT_EQ(twin[0]->psnr, host[0]->psnr) << what;
    } else {
      testing::ExpectWithinRounding(a, b, testing::InitialParams(config), kRelativeBound,
                                    c.mixed ? 0.05 : 0.001);
    }
  }
}

// Every sync mode with the model on a real GPU (both ranks on the devices
// this host has, local rank modulo their count) ends within rounding of one
// process on the CPU: atomics in the encoding's backward pass and cuBLAS's
// order make it inexact. nccl over the in-process collective stages the
// device gradients through host memory; ps and hybrid stage rows.
TEST(BackboneTest, EveryModeOnTheGpuEndsNearOneProcess) {
  std::string reason;
  if (!cuda::Available(&reason)) GTEST_SKIP() << reason;
  const ImageTask image = testing::SmallImage();
  for (Mode mode : {Mode::kNccl, Mode::kPs, Mode::kHybrid}) {
    for (bool mixed : {false, true}) {
      Config config = BackboneConfig(mode, mixed, 1);
      config.training.device = TrainingDevice::kCuda;
      const std::string what = std::string(Name(mode)) + (mixed ? " mixed" : " fp32");
      auto reports = RunCluster(mode, config, image);
      for (auto& r : reports) ASSERT_TRUE(r.ok()) << what << ": " << r.status().ToString();
      EXPECT_NE(reports[0]->device, "CPU") << what;
      auto local = TrainSingleProcess(config, image);
      ASSERT_TRUE(local.ok()) << local.status().ToString();
      EXPECT_NEAR(reports[0]->psnr, local->psnr, mixed ? 0.3 : 0.1) << what;
      testing::ExpectWithinRounding(FlattenParams(*reports[0]->model), FlattenParams(*local->model),
                                    testing::InitialParams(config), 0.05, 0.05);
    }
  }
}

// The GPU's own ways: ps and hybrid pushes compressed by the codecs' CUDA
// twins (the grid's blocks encoded on the device before the copy, the
// MLP's through the PS client's BlockEncoder) end near the same run's
// pushes compressed on the CPU; nccl with a bucket per level (the
// all-reduce overlapping the backward pass) ends near one process.
TEST(BackboneTest, DeviceCodecsAndOverlappedBucketsOnTheGpuEndNearTheCpu) {
  std::string reason;
  if (!cuda::Available(&reason)) GTEST_SKIP() << reason;
  const ImageTask image = testing::SmallImage();
  // Adam on the workers (auto with a codec) or on the shards: either way
  // the grid's blocks are encoded on the device before the copy, with the
  // residuals (and worker Adam's grid state) there.
  for (OptimizerPlacement optimizer : {OptimizerPlacement::kAuto, OptimizerPlacement::kShard}) {
    Config config = BackboneConfig(Mode::kPs, false, 1);
    config.compression.codec = "onebit";
    config.compression.min_bytes = 0;
    config.ps.optimizer = optimizer;
    const std::string what = "ps onebit, ps.optimizer " + std::string(ToString(optimizer));
    auto cpu = RunCluster(Mode::kPs, config, image);
    config.training.device = TrainingDevice::kCuda;
    auto gpu = RunCluster(Mode::kPs, config, image);
    for (auto& r : cpu) ASSERT_TRUE(r.ok()) << what << " cpu: " << r.status().ToString();
    for (auto& r : gpu) ASSERT_TRUE(r.ok()) << what << " gpu: " << r.status().ToString();
    EXPECT_NE(gpu[0]->device, "CPU");
    EXPECT_NEAR(gpu[0]->psnr, cpu[0]->psnr, 0.3) << what;
  }
  // hybrid: the node's sum on the devices (NCCL's reduce-scatter where the
  // workers' collective is NCCL; here the in-process one, through pinned
  // copies), and the slice's blocks encoded there.
  for (bool mixed : {false, true}) {
    Config config = BackboneConfig(Mode::kHybrid, mixed, 1);
    config.compression.codec = "onebit";
    config.compression.min_bytes = 0;
    const std::string what = std::string("hybrid onebit") + (mixed ? " mixed" : " fp32");
    auto cpu = RunCluster(Mode::kHybrid, config, image);
    config.training.device = TrainingDevice::kCuda;
    auto gpu = RunCluster(Mode::kHybrid, config, image);
    for (auto& r : cpu) ASSERT_TRUE(r.ok()) << what << " cpu: " << r.status().ToString();
    for (auto& r : gpu) ASSERT_TRUE(r.ok()) << what << " gpu: " << r.status().ToString();
    EXPECT_NE(gpu[0]->device, "CPU");
    EXPECT_NEAR(gpu[0]->psnr, cpu[0]->psnr, 0.3) << what;
  }
  {
    Config config = BackboneConfig(Mode::kNccl, false, 1);
    config.distributed.bucket_mb = 0.001;
    config.training.device = TrainingDevice::kCuda;
    auto gpu = RunCluster(Mode::kNccl, config, image);
    for (auto& r : gpu) ASSERT_TRUE(r.ok()) << "nccl buckets: " << r.status().ToString();
    auto local = TrainSingleProcess(config, image);
    ASSERT_TRUE(local.ok()) << local.status().ToString();
    EXPECT_NEAR(gpu[0]->psnr, local->psnr, 0.1);
    testing::ExpectWithinRounding(FlattenParams(*gpu[0]->model), FlattenParams(*local->model),
                                  testing::InitialParams(config), 0.05, 0.05);
  }
}

}  // namespace
}  // namespace gridsync
