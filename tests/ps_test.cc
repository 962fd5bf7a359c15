// The parameter server end to end: real ZeroMQ shards, a real coordinator,
// workers as threads (in-process) or as processes (gridsync launch).
//
// The backbone: with bsp and no compression, a cluster ends with exactly the
// parameters of one process training on the same global batches (worker w's
// slice is that process's micro-batch w; the shards sum in rank order).
//
// Here: clusters in ps and hybrid against one process, and the real binaries
// under gridsync launch. The shard against hostile input:
// ps_shard_test.cc; compression and Adam on the workers:
// ps_optimizer_test.cc.
#include <unistd.h>

#include "tests/loopback_listener.h"
#include "tests/ps_test_util.h"

namespace gridsync {
namespace {

TEST(PsClusterTest, BspInProcessMatchesSingleProcessBitForBit) {
  const ImageTask image = SmallImage();
  auto cluster = Cluster::Start(SmallConfig(2, 2));
  auto reports = cluster->Train(image);
  for (auto& r : reports) ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_EQ(reports[0]->max_staleness, 0u);
  EXPECT_GT(reports[0]->bytes_pushed_per_step, 0);
  const TrainReport local = SingleProcess(cluster->config, image);
  ExpectBitIdentical(FlattenParams(*reports[0]->model), FlattenParams(*local.model));
  EXPECT_EQ(reports[0]->psnr, local.psnr);
  EXPECT_EQ(AppliedSteps(*cluster->shards[0], 12u), 12u);
}

// Evaluations in the middle of a run (--eval-every, the PSNR-against-time
// curve): the model holder pulls the whole model first, so every evaluation
// sees exactly the single process's model at that step, and training goes
// on unchanged: the final parameters are those of a run without them.
TEST(PsClusterTest, EvaluationsMidRunSeeTheSingleProcessModelAndChangeNothing) {
  const ImageTask image = SmallImage();
  // Uncompressed; onebit (Adam on the workers, their pending updates added
  // to what they pull); onebit with delta pulls as well.
  for (int variant = 0; variant < 3; ++variant) {
    const bool delta_pulls = variant == 2;
    SCOPED_TRACE(variant == 0 ? "uncompressed" : delta_pulls ? "onebit, delta pulls" : "onebit");
    Config config = SmallConfig(2, 2);
    if (variant > 0) {
      config.compression.codec = "onebit";
      config.compression.min_bytes = 0;
      config.compression.pull = delta_pulls;
    }
    std::vector<float> plain;
    double plain_pulled = 0, plain_pushed = 0;
    for (uint64_t every : {uint64_t{0}, uint64_t{4}}) {
      auto cluster = Cluster::Start(config);
      auto reports = cluster->Train(image, {}, every);
      for (auto& r : reports) ASSERT_TRUE(r.ok()) << r.status().ToString();
      if (every == 0) {
        plain = FlattenParams(*reports[0]->model);
        plain_pulled = reports[0]->bytes_pulled_per_step;
        plain_pushed = reports[0]->bytes_pushed_per_step;
        EXPECT_TRUE(reports[0]->psnr_curve.empty());
        continue;
      }
      // The evaluations' whole pulls are not training traffic.
      EXPECT_EQ(reports[0]->bytes_pushed_per_step, plain_pushed);
      EXPECT_EQ(reports[0]->bytes_pulled_per_step, plain_pulled);
      // The evaluations pull into a copy and leave the shards' replica of
      // the worker alone: the run is the same, bit for bit, also with lossy
      // delta pulls and Adam on the workers.
      ExpectBitIdentical(FlattenParams(*reports[0]->model), plain);
      ASSERT_EQ(reports[0]->psnr_curve.size(), 3u);  // steps 4, 8, 12 of 12
      EXPECT_TRUE(reports[1]->psnr_curve.empty()) << "only the model holder evaluates";
      double last_seconds = 0;
      for (const auto& point : reports[0]->psnr_curve) {
        EXPECT_EQ(point.step % 4, 0u);
        EXPECT_GT(point.seconds, last_seconds);
        EXPECT_LE(point.seconds, reports[0]->train_seconds);
        last_seconds = point.seconds;
      }
      if (variant == 0) {
        // (With a codec the end of the run flushes the residuals: one more
        // step after the last evaluation.)
        EXPECT_EQ(reports[0]->psnr_curve.back().psnr, reports[0]->psnr);
        // The single process evaluated after the same steps.
        auto local = TrainSingleProcess(cluster->config, image, /*eval_every=*/4);
        ASSERT_TRUE(local.ok()) << local.status().ToString();
        ASSERT_EQ(local->psnr_curve.size(), 3u);
        for (size_t i = 0; i < 3; ++i)
          EXPECT_EQ(reports[0]->psnr_curve[i].psnr, local->psnr_curve[i].psnr)
              << "step " << 4 * (i + 1);
      }
    }
  }
}

TEST(PsClusterTest, ColumnAndBothPartitionsAlsoMatchBitForBit) {
  const ImageTask image = SmallImage();
  for (ModelParallelDim dim : {ModelParallelDim::kColumn, ModelParallelDim::kBoth}) {
    Config config = SmallConfig(2, 2);
    config.distributed.model_parallel = true;
    config.distributed.mp_dim = dim;
    config.training.steps = 6;
    auto cluster = Cluster::Start(config);
    auto reports = cluster->Train(image);
    for (auto& r : reports) ASSERT_TRUE(r.ok()) << r.status().ToString();
    ExpectBitIdentical(FlattenParams(*reports[0]->model),
                       SingleProcessParams(cluster->config, image));
  }
}

TEST(PsClusterTest, UnevenWorkersAndShardsMatch) {
  const ImageTask image = SmallImage();
  Config config = SmallConfig(4, 3);
  config.training.steps = 5;
  auto cluster = Cluster::Start(config);
  auto reports = cluster->Train(image);
  for (auto& r : reports) ASSERT_TRUE(r.ok()) << r.status().ToString();
  ExpectBitIdentical(FlattenParams(*reports[0]->model),
                     SingleProcessParams(cluster->config, image));
}

TEST(PsClusterTest, SspNeverExceedsItsBound) {
  const ImageTask image = SmallImage();
  for (int bound : {1, 3}) {
    Config config = SmallConfig(2, 2);
    config.ps.consistency = Consistency::kSsp;
    config.ps.staleness = bound;
    config.training.steps = 16;
    auto cluster = Cluster::Start(config);
    // Worker 1 is slow, so worker 0 runs ahead as far as the bound lets it.
    auto reports = cluster->Train(image, {0, 15});
    for (auto& r : reports) {
      ASSERT_TRUE(r.ok()) << r.status().ToString();
      EXPECT_LE(r->max_staleness, static_cast<uint64_t>(bound));
    }
    EXPECT_EQ(reports[0]->max_staleness, static_cast<uint64_t>(bound))
        << "the fast worker should have used its full staleness allowance";
  }
}

TEST(PsClusterTest, AsyncTrains) {
  const ImageTask image = SmallImage();
  Config config = SmallConfig(2, 1);
  config.ps.consistency = Consistency::kAsync;
  config.training.steps = 30;
  auto cluster = Cluster::Start(config);
  auto reports = cluster->Train(image);
  for (auto& r : reports) ASSERT_TRUE(r.ok()) << r.status().ToString();
  // Async reads parameters up to a step stale and applies half-batch
  // updates (at half the learning rate), so it may trail bsp a little.
  const double local = SingleProcess(cluster->config, image).psnr;
  EXPECT_GT(reports[0]->psnr, local - 3.0) << "single-process PSNR " << local;
  EXPECT_EQ(AppliedSteps(*cluster->shards[0], 60u), 60u);  // every push applied on arrival
}

// Staleness that costs no accuracy: with a slow worker, so the fast one
// really reads stale parameters, ssp (bound 2) and async end within 1 dB of
// bsp. Before pushes were applied on arrival and reads held the worker's
// own last push, ssp at bound 1 ended 15 dB below bsp on configs/local.json.
TEST(PsClusterTest, StaleModesTrainAsWellAsBsp) {
  const ImageTask image = SmallImage();
  Config config = SmallConfig(2, 2);
  config.training.steps = 60;
  auto bsp = Cluster::Start(config);
  auto bsp_reports = bsp->Train(image);
  ASSERT_TRUE(bsp_reports[0].ok()) << bsp_reports[0].status().ToString();
  for (Consistency c : {Consistency::kSsp, Consistency::kAsync}) {
    Config stale = config;
    stale.ps.consistency = c;
    auto cluster = Cluster::Start(stale);
    auto reports = cluster->Train(image, {0, 3});
    for (auto& r : reports) ASSERT_TRUE(r.ok()) << r.status().ToString();
    EXPECT_GT(reports[0]->max_staleness, 0u) << "the fast worker never read stale parameters";
    EXPECT_GT(reports[0]->psnr, bsp_reports[0]->psnr - 1.0)
        << (c == Consistency::kSsp ? "ssp" : "async") << " against bsp " << bsp_reports[0]->psnr;
  }
}

TEST(PsClusterTest, MissingShardFailsWithTimeoutNamingIt) {
  const ImageTask image = SmallImage();
  Config config = SmallConfig(1, 2);
  config.distributed.timeout_s = 1.5;
  auto cluster = Cluster::Start(config, /*shards_to_start=*/1);
  const auto start = std::chrono::steady_clock::now();
  auto reports = cluster->Train(image);
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  ASSERT_FALSE(reports[0].ok());
  EXPECT_EQ(reports[0].status().code(), StatusCode::kTimeout) << reports[0].status().ToString();
  EXPECT_NE(reports[0].status().message().find("shards [1]"), std::string::npos)
      << reports[0].status().ToString();
  EXPECT_LT(seconds, 10.0);
}

// ---- gradient_sync hybrid: reduce-scatter in the node, PS across nodes ----

// Hybrid workers as threads: nodes of the given sizes, in-process intra-node groups.
std::vector<Result<TrainReport>> TrainHybrid(Cluster& cluster, const ImageTask& image,
                                             const std::vector<int>& sizes,
                                             uint64_t eval_every = 0) {
  std::vector<std::vector<std::unique_ptr<LocalCollective>>> intra;
  for (int n : sizes)
    intra.push_back(LocalCollective::CreateGroup(n, std::chrono::seconds(20), "intra"));
  return cluster.Train(image, {}, eval_every, [&](int node, int local, int) -> Result<Collective*> {
    return static_cast<Collective*>(
        intra[static_cast<size_t>(node)][static_cast<size_t>(local)].get());
  });
}

Config HybridConfig(const std::vector<int>& sizes) {
  int workers = 0;
  for (int n : sizes) workers += n;
  Config config = SmallConfig(workers, 2);
  config.distributed.gradient_sync = GradientSyncMode::kHybrid;
  config.training.steps = 8;
  for (size_t n = 0; n < sizes.size(); ++n) {
    NodeConfig node;
    node.name = std::string("node") + std::to_string(n);
    node.workers = sizes[n];
    config.distributed.nodes.push_back(node);
  }
  return config;
}

TEST(HybridTest, NodesOfTwoAndTwoAndOfOneAndThreeMatchSingleProcess) {
  const ImageTask image = SmallImage();
  for (const auto& sizes : std::vector<std::vector<int>>{{2, 2}, {1, 3}}) {
    const Config config = HybridConfig(sizes);
    auto cluster = Cluster::Start(config);
    auto reports = TrainHybrid(*cluster, image, sizes);
    for (auto& r : reports) ASSERT_TRUE(r.ok()) << r.status().ToString();
    EXPECT_GT(reports[0]->bytes_pushed_per_step, 0);
    ExpectWithinRounding(FlattenParams(*reports[0]->model),
                         SingleProcessParams(cluster->config, image),
                         testing::InitialParams(cluster->config));
  }
}

// The evaluations of a hybrid run (rank 0 pulls the whole model into a
// copy) see the single process's model and change nothing.
TEST(HybridTest, EvaluationsMidRunChangeNothing) {
  const ImageTask image = SmallImage();
  const std::vector<int> sizes = {2, 2};
  std::vector<float> plain;
  for (uint64_t every : {uint64_t{0}, uint64_t{4}}) {
    auto cluster = Cluster::Start(HybridConfig(sizes));
    auto reports = TrainHybrid(*cluster, image, sizes, every);
    for (auto& r : reports) ASSERT_TRUE(r.ok()) << r.status().ToString();
    if (every == 0) {
      plain = FlattenParams(*reports[0]->model);
      continue;
    }
    ExpectBitIdentical(FlattenParams(*reports[0]->model), plain);
    ASSERT_EQ(reports[0]->psnr_curve.size(), 2u);  // steps 4 and 8 of 8
    EXPECT_EQ(reports[0]->psnr_curve.back().psnr, reports[0]->psnr);
    EXPECT_TRUE(reports[1]->psnr_curve.empty());
  }
}

TEST(HybridTest, TopkAcrossNodesTrainsWithAdamOnTheSliceOwnersAndFlushes) {
  const ImageTask image = SmallImage();
  const std::vector<int> sizes = {2, 2};
  std::vector<double> loss, pushed;
  for (const char* codec : {"none", "topk"}) {
    Config config = HybridConfig(sizes);
    config.training.steps = 30;
    config.compression.codec = codec;
    config.compression.ratio = 0.1;
    config.compression.min_bytes = 0;
    auto cluster = Cluster::Start(config);
    auto reports = TrainHybrid(*cluster, image, sizes);
    for (auto& r : reports) ASSERT_TRUE(r.ok()) << codec << ": " << r.status().ToString();
    const bool lossy = std::string(codec) != "none";
    EXPECT_EQ(reports[0]->flushed_residuals, lossy) << codec;
    for (auto* shard : cluster->shards) {
      EXPECT_EQ(AppliedSteps(*shard, 30u + (lossy ? 1 : 0)), 30u + (lossy ? 1 : 0)) << codec;
    }
    ASSERT_TRUE(std::isfinite(reports[0]->psnr)) << codec;
    loss.push_back(reports[0]->final_loss);
    pushed.push_back(reports[0]->bytes_pushed_per_step);
  }
  EXPECT_LT(pushed[1], 0.7 * pushed[0])
      << "topk pushed " << pushed[1] << " B/step, none " << pushed[0];
  EXPECT_LT(loss[1], 2.0 * loss[0]) << "topk loss " << loss[1] << ", none " << loss[0];
}

// ---- Multi-process: the real binaries under gridsync launch ----

struct Launched {
  int exit_code;
  std::string output;
};

Launched Launch(const std::string& config_path, const std::vector<std::string>& args) {
  const char* build = std::getenv("GRIDSYNC_BUILD_DIR");
  std::string cmd = std::string(build ? build : "build") + "/tools/gridsync launch " + config_path;
  for (const auto& a : args) cmd += " '" + a + "'";
  cmd += " 2>&1";
  FILE* pipe = popen(cmd.c_str(), "r");
  std::string out;
  std::array<char, 4096> buf;
  while (pipe && std::fgets(buf.data(), buf.size(), pipe)) out += buf.data();
  const int status = pipe ? pclose(pipe) : -1;
  return {WIFEXITED(status) ? WEXITSTATUS(status) : -1, out};
}

// A port range per test process, so parallel ctest runs do not collide.
// Below the kernel's ephemeral range (32768 and up), where outgoing
// connections would take a port at random.
int FreePortBase() { return 20000 + (getpid() % 400) * 10; }

std::string WriteConfig(const Config& c, const std::string& name) {
  const fs::path path =
      fs::temp_directory_path() / (name + "-" + std::to_string(getpid()) + ".json");
  std::ofstream(path) << c.ToJson().dump(2);
  return path.string();
}

// Whether a gridsync server or worker whose command line names `needle` is
// still running. The pattern cannot match the shell running pgrep itself.
bool ProcessesWithArgument(const std::string& needle) {
  FILE* pipe =
      popen(("pgrep -f -- 'gridsync-(ps|worker|coordinator) .*" + needle + "'").c_str(), "r");
  std::array<char, 256> buf;
  bool any = pipe && std::fgets(buf.data(), buf.size(), pipe) != nullptr;
  if (pipe) pclose(pipe);
  return any;
}

TEST(PsLaunchTest, MultiProcessBspMatchesSingleProcessBitForBit) {
  Config config = SmallConfig(2, 2);
  config.distributed.master_port = FreePortBase();
  // A key with no effect under ps with mp_dim "row" (a config note): launch
  // prints the note once, not once per process.
  config.distributed.model_parallel = true;
  config.task.image = kDefaultImagePath;
  config.task.output =
      (fs::temp_directory_path() / ("gridsync-launch-" + std::to_string(getpid()))).string();
  const std::string path = WriteConfig(config, "ps-backbone");
  const std::string dump = config.task.output + "/params.bin";
  const auto run = Launch(path, {"--rank0-arg=--dump-params", "--rank0-arg=" + dump});
  ASSERT_EQ(run.exit_code, 0) << run.output;
  EXPECT_NE(run.output.find("[ps-1]"), std::string::npos);
  EXPECT_NE(run.output.find("[worker-1]"), std::string::npos);
  EXPECT_NE(run.output.find("pushed per step"), std::string::npos) << run.output;
  const std::string note = "note: distributed.model_parallel";
  const size_t first_note = run.output.find(note);
  ASSERT_NE(first_note, std::string::npos) << run.output;
  EXPECT_EQ(run.output.find(note, first_note + 1), std::string::npos) << "the note repeats:\n"
                                                                      << run.output;
  EXPECT_NE(run.output.find("gridsync launch: " + path + ": " + note), std::string::npos)
      << run.output;
  auto params = ReadParams(dump);
  ASSERT_TRUE(params.ok()) << params.status().ToString();
  auto image = ImageTask::Load(kDefaultImagePath);
  ASSERT_TRUE(image.ok());
  ExpectBitIdentical(*params, SingleProcessParams(config, *image));
  EXPECT_FALSE(ProcessesWithArgument(path)) << "orphan processes remain";
}

TEST(PsLaunchTest, FailingWorkerStopsEveryoneWithNonZeroExit) {
  Config config = SmallConfig(2, 2);
  config.distributed.master_port = FreePortBase() + 5;
  config.distributed.timeout_s = 30;
  const std::string path = WriteConfig(config, "ps-fail");
  const auto start = std::chrono::steady_clock::now();
  // Worker 0 fails once everything has started: its metrics port is taken.
  // (What a start can check first, a bad flag or the image, launch refuses
  // before it starts anything: cli_test.)
  uint16_t taken_port = 0;
  const int taken = testing::ListenOnLoopback(&taken_port);
  ASSERT_GE(taken, 0);
  const std::string port = std::to_string(taken_port);
  const auto run = Launch(path, {"--rank0-arg=--metrics-port", "--rank0-arg=" + port});
  ::close(taken);
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  EXPECT_NE(run.exit_code, 0) << run.output;
  EXPECT_NE(run.output.find("failed: exit status 1; stopping the others"), std::string::npos)
      << run.output;
  EXPECT_NE(run.output.find(port), std::string::npos) << run.output;
  EXPECT_LT(seconds, 25.0);
  EXPECT_FALSE(ProcessesWithArgument(path)) << "orphan processes remain";
}

}  // namespace
}  // namespace gridsync
