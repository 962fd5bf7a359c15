// The parameter server end to end: real ZeroMQ shards, a real coordinator,
// workers as threads (in-process) or as processes (gridsync launch).
//
// The backbone: with bsp and no compression, a cluster ends with exactly the
// parameters of one process training on the same global batches (worker w's
// slice is that process's micro-batch w; the shards sum in rank order).
#include <capnp/message.h>
#include <capnp/serialize.h>
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <array>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <random>
#include <thread>

#include "common/config.h"
#include "common/coordinator_client.h"
#include "common/sharding.h"
#include "common/thread_pool.h"
#include "common/wire/gridsync.capnp.h"
#include "common/wire/message.h"
#include "kernels/cpu/adam.h"
#include "kernels/cpu/codec.h"
#include "kernels/cpu/error_feedback.h"
#include "kernels/cpu/hash_encoding.h"
#include "server/coordinator.h"
#include "server/in_process_cluster.h"
#include "server/ps_shard.h"
#include "tests/test_util.h"
#include "worker/collective/local_collective.h"
#include "worker/image_task.h"
#include "worker/model.h"
#include "worker/params_file.h"
#include "worker/sync/ps_session.h"
#include "worker/sync/train.h"
#include "worker/worker_adam.h"

namespace gridsync {
namespace {

using testing::ExpectBitIdentical;
using testing::ExpectWithinRounding;
using testing::SmallImage;
using namespace std::chrono_literals;
namespace fs = std::filesystem;

Config SmallConfig(int workers, int shards) {
  Config c = testing::SmallDistributedConfig(workers, GradientSyncMode::kPs, 12);
  c.ps.shards = shards;
  c.task.output = (fs::temp_directory_path() / "gridsync-ps-test").string();
  return c;
}


// A whole cluster in this process: coordinator and shards (InProcessCluster)
// plus worker threads.
struct Cluster {
  std::unique_ptr<InProcessCluster> servers;
  const Partition* partition = nullptr;
  std::vector<PsShard*> shards;
  Config config;

  static std::unique_ptr<Cluster> Start(Config config, int shards_to_start = -1) {
    auto cluster = std::make_unique<Cluster>();
    auto servers = InProcessCluster::Start(config, shards_to_start);
    EXPECT_TRUE(servers.ok()) << servers.status().ToString();
    cluster->servers = std::move(servers).value();
    cluster->config = cluster->servers->config();
    cluster->partition = &cluster->servers->partition();
    for (size_t s = 0; s < cluster->servers->n_shards(); ++s) cluster->shards.push_back(&cluster->servers->shard(s));
    return cluster;
  }

  // Runs every worker as a thread; returns their reports (rank order).
  std::vector<Result<TrainReport>> Train(const ImageTask& image, std::vector<int> throttle_ms = {},
                                         uint64_t eval_every = 0) {
    const int workers = config.distributed.world_size;
    std::vector<Result<TrainReport>> reports(workers, Status::Internal("not run"));
    std::vector<std::thread> threads;
    for (int w = 0; w < workers; ++w) {
      threads.emplace_back([&, w] {
        WorkerOptions options;
        options.rank = w;
        options.train.quiet = true;
        options.train.write_png = false;
        options.train.eval_every = eval_every;
        if (static_cast<size_t>(w) < throttle_ms.size()) options.throttle_ms = throttle_ms[w];
        reports[w] = TrainWorker(config, image, options);
      });
    }
    for (auto& t : threads) t.join();
    return reports;
  }
};

// A shard acknowledges a push before it applies the step that push
// completed (the worker prepares its next batch meanwhile), so a count read
// right after the ack may lag: wait, bounded, for it to reach `expected`.
uint64_t AppliedSteps(const PsShard& shard, uint64_t expected) {
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);
  while (shard.stats().applied_steps < expected && std::chrono::steady_clock::now() < deadline)
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  return shard.stats().applied_steps;
}

TrainReport SingleProcess(Config config, const ImageTask& image) {
  config.training.device = TrainingDevice::kCpu;  // the bit-for-bit reference
  config.training.gradient_accumulation = config.distributed.world_size;
  config.distributed.enable = false;
  config.distributed.world_size = 1;
  TrainOptions options;
  options.quiet = true;
  options.write_png = false;
  auto report = TrainImage(config, image, options);
  EXPECT_TRUE(report.ok()) << report.status().ToString();
  return std::move(report).value();
}

std::vector<float> SingleProcessParams(const Config& config, const ImageTask& image) {
  return FlattenParams(*SingleProcess(config, image).model);
}


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
        Config one = cluster->config;
        one.training.gradient_accumulation = one.distributed.world_size;
        one.distributed.enable = false;
        one.distributed.world_size = 1;
        TrainOptions options;
        options.quiet = true;
        options.write_png = false;
        options.eval_every = 4;
        auto local = TrainImage(one, image, options);
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
    ExpectBitIdentical(FlattenParams(*reports[0]->model), SingleProcessParams(cluster->config, image));
  }
}

TEST(PsClusterTest, UnevenWorkersAndShardsMatch) {
  const ImageTask image = SmallImage();
  Config config = SmallConfig(4, 3);
  config.training.steps = 5;
  auto cluster = Cluster::Start(config);
  auto reports = cluster->Train(image);
  for (auto& r : reports) ASSERT_TRUE(r.ok()) << r.status().ToString();
  ExpectBitIdentical(FlattenParams(*reports[0]->model), SingleProcessParams(cluster->config, image));
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
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  ASSERT_FALSE(reports[0].ok());
  EXPECT_EQ(reports[0].status().code(), StatusCode::kTimeout) << reports[0].status().ToString();
  EXPECT_NE(reports[0].status().message().find("shards [1]"), std::string::npos) << reports[0].status().ToString();
  EXPECT_LT(seconds, 10.0);
}

// ---- gradient_sync hybrid: reduce-scatter in the node, PS across nodes ----


// Hybrid workers as threads: nodes of the given sizes, in-process intra-node groups.
std::vector<Result<TrainReport>> TrainHybrid(Cluster& cluster, const ImageTask& image,
                                             const std::vector<int>& sizes,
                                             uint64_t eval_every = 0) {
  int workers = 0;
  for (int n : sizes) workers += n;
  std::vector<std::vector<std::unique_ptr<LocalCollective>>> intra;
  for (int n : sizes) intra.push_back(LocalCollective::CreateGroup(n, std::chrono::seconds(20), "intra"));
  std::vector<Result<TrainReport>> reports(static_cast<size_t>(workers), Status::Internal("not run"));
  std::vector<std::thread> threads;
  for (int w = 0; w < workers; ++w) {
    threads.emplace_back([&, w] {
      WorkerOptions options;
      options.rank = w;
      options.train.quiet = true;
      options.train.write_png = false;
      options.train.eval_every = eval_every;
      options.intra_group = [&](int node, int local, int) -> Result<Collective*> {
        return static_cast<Collective*>(intra[static_cast<size_t>(node)][static_cast<size_t>(local)].get());
      };
      reports[static_cast<size_t>(w)] = TrainWorker(cluster.config, image, options);
    });
  }
  for (auto& t : threads) t.join();
  return reports;
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
  EXPECT_LT(pushed[1], 0.7 * pushed[0]) << "topk pushed " << pushed[1] << " B/step, none " << pushed[0];
  EXPECT_LT(loss[1], 2.0 * loss[0]) << "topk loss " << loss[1] << ", none " << loss[0];
}

// ---- Malformed input over a real socket ----

// The table shapes wire::Decode checks messages against.
std::vector<wire::TableShape> ShapesOf(const Partition& partition) {
  std::vector<wire::TableShape> shapes;
  for (uint32_t t = 0; t < partition.n_tables(); ++t) shapes.push_back({partition.table(t).rows, partition.table(t).width});
  return shapes;
}

class RawClient {
 public:
  explicit RawClient(const std::string& endpoint) : socket_(context_, zmq::socket_type::dealer) {
    socket_.set(zmq::sockopt::linger, 0);
    socket_.connect(endpoint);
  }
  // Sends raw frames and returns the decoded reply.
  Result<wire::Message> Exchange(std::vector<zmq::message_t> frames, const std::vector<wire::TableShape>& shapes) {
    GRIDSYNC_RETURN_IF_ERROR(wire::SendMultipart(socket_, frames));
    GRIDSYNC_ASSIGN_OR_RETURN(reply_, wire::ReceiveMultipart(socket_, 5000, wire::Limits{}));
    return wire::Decode(reply_, shapes, wire::Limits{});
  }

 private:
  zmq::context_t context_{1};
  zmq::socket_t socket_;
  std::vector<zmq::message_t> reply_;
};

// A pull of every row of table 0.
std::vector<zmq::message_t> PullOfTable0(const Partition& partition, uint64_t request_id,
                                         uint32_t num_workers, uint64_t job = 0) {
  wire::OutHeader h;
  h.kind = wire::Kind::kPull;
  h.job = job;
  h.request_id = request_id;
  h.num_workers = num_workers;
  wire::OutBlock b;
  b.table = 0;
  b.dense = true;
  b.width = partition.table(0).width;
  b.row_count = static_cast<uint32_t>(partition.table(0).rows);
  std::vector<wire::OutBlock> blocks;
  blocks.push_back(std::move(b));
  return wire::Encode(h, std::move(blocks));
}

std::vector<zmq::message_t> Frames(std::initializer_list<std::string> parts) {
  std::vector<zmq::message_t> frames;
  for (const auto& p : parts) frames.emplace_back(p.data(), p.size());
  return frames;
}

// A header of `kind` listing one sparse block of one row and no payload
// frames: the 144-byte message that used to crash a shard (a stats header
// whose block passed Decode without row ids, then reached the ownership check).
std::vector<zmq::message_t> HeaderWithOneSparseBlock(wire::schema::MessageKind kind) {
  capnp::MallocMessageBuilder builder;
  auto h = builder.initRoot<wire::schema::Header>();
  h.setVersion(wire::kProtocolVersion);
  h.setKind(kind);
  h.setRequestId(7);
  h.setNumWorkers(1);
  auto b = h.initBlocks(1)[0];
  b.setTable(0);
  b.setRowCount(1);
  b.setWidth(2);
  auto words = capnp::messageToFlatArray(builder);
  auto bytes = words.asBytes();
  std::vector<zmq::message_t> frames;
  frames.emplace_back(bytes.begin(), bytes.size());
  return frames;
}

TEST(PsShardTest, MalformedInputGetsErrorAndChangesNothing) {
  const ImageTask image = SmallImage();
  auto cluster = Cluster::Start(SmallConfig(1, 1));
  const Partition& partition = *cluster->partition;
  const std::vector<wire::TableShape> shapes = ShapesOf(partition);
  RawClient raw(cluster->shards[0]->endpoint());

  auto pull_table0 = [&]() -> std::vector<float> {
    auto reply = raw.Exchange(PullOfTable0(partition, 99, 0), shapes);
    EXPECT_TRUE(reply.ok()) << reply.status().ToString();
    if (!reply.ok() || reply->blocks.empty()) return {};
    return std::vector<float>(reply->blocks[0].values.begin(), reply->blocks[0].values.end());
  };
  const auto before = pull_table0();
  ASSERT_FALSE(before.empty());

  auto push_with = [&](auto mutate) {
    wire::OutHeader h;
    h.kind = wire::Kind::kPush;
    h.step = 0;
    h.request_id = 7;
    h.num_workers = 1;
    wire::OutBlock b;
    b.table = 0;
    b.width = partition.table(0).width;
    b.rows = {1, 2, 3};
    b.row_count = 3;
    b.values.assign(3 * b.width, 0.5f);
    mutate(h, b);
    std::vector<wire::OutBlock> blocks;
    blocks.push_back(std::move(b));
    return wire::Encode(h, std::move(blocks));
  };

  struct Case {
    std::string name;
    std::vector<zmq::message_t> frames;
    std::string expect;  // a piece of the error text
    // The refusal names the request whenever the header is readable (0: it is not).
    uint64_t request_id = 7;
  };
  std::vector<Case> cases;
  cases.push_back({"random bytes", Frames({std::string("\x13\x37garbage-not-capnp-at-all", 25)}), "", 0});
  {
    auto f = push_with([](auto&, auto&) {});
    std::string header(static_cast<const char*>(f[0].data()), f[0].size() / 2);
    f[0] = zmq::message_t(header.data(), header.size());
    cases.push_back({"truncated header", std::move(f), "", 0});
  }
  cases.push_back({"unknown table", push_with([](auto&, auto& b) { b.table = 999; }), "table"});
  cases.push_back({"row out of range", push_with([&](auto&, auto& b) { b.rows = {1, 2, 1u << 30}; }), "row"});
  cases.push_back({"rows not ascending", push_with([](auto&, auto& b) { b.rows = {3, 2, 1}; }), "ascending"});
  {
    // The values frame one float short of rows x width.
    auto f = push_with([](auto&, auto&) {});
    f.back() = zmq::message_t(f.back().data(), f.back().size() - 4);
    cases.push_back({"lengths disagree", std::move(f), "bytes"});
  }
  cases.push_back({"NaN value", push_with([](auto&, auto& b) { b.values[1] = std::nanf(""); }), "finite"});
  cases.push_back({"infinite value", push_with([](auto&, auto& b) { b.values[0] = INFINITY; }), "finite"});
  cases.push_back({"wrong worker count", push_with([](auto& h, auto&) { h.num_workers = 5; }), "worker"});
  cases.push_back({"step far ahead", push_with([](auto& h, auto&) { h.step = 40; }), "step"});
  {
    auto f = push_with([](auto&, auto&) {});
    f.pop_back();  // the values frame
    cases.push_back({"missing frame", std::move(f), "frame"});
  }
  {
    // A header from a future protocol version.
    auto f = push_with([](auto&, auto&) {});
    std::string bytes(static_cast<const char*>(f[0].data()), f[0].size());
    bool patched = false;
    for (size_t i = 0; i + 1 < bytes.size() && !patched; ++i) {
      if (bytes[i] == 1 && bytes[i + 1] == 0 && i % 2 == 0 && i >= 16) {
        bytes[i] = 9;
        patched = true;
      }
    }
    f[0] = zmq::message_t(bytes.data(), bytes.size());
    if (patched) cases.push_back({"wrong version", std::move(f), "", 0});
  }
  {
    // More frames than any valid message has.
    std::vector<zmq::message_t> f;
    for (uint32_t i = 0; i < wire::Limits{}.max_frames() + 5; ++i) f.emplace_back("x", 1);
    cases.push_back({"too many frames", std::move(f), "frames", 0});
  }
  // Every kind, with one sparse block and no frames: kinds without blocks
  // are refused for listing one, the others for the missing frames, and a
  // pullReply (rows implied) for being no request.
  using MK = wire::schema::MessageKind;
  for (MK kind : {MK::PUSH, MK::PUSH_ACK, MK::PULL, MK::PULL_REPLY, MK::ERROR, MK::STATS,
                  MK::STATS_REPLY, MK::INIT}) {
    const auto k = static_cast<wire::Kind>(kind);
    std::string expect = wire::LayoutOf(k).blocks ? (wire::LayoutOf(k).row_ids ? "frames" : "values")
                                                  : "allowed: none";
    if (k == wire::Kind::kPullReply) expect = "frames";
    cases.push_back({std::string("one sparse block on a ") + wire::KindName(k),
                     HeaderWithOneSparseBlock(kind), expect});
  }
  {
    // A pullReply with its values frame decodes (its rows are the request's),
    // so the shard refuses it for its kind, before any block is used.
    auto f = HeaderWithOneSparseBlock(MK::PULL_REPLY);
    const std::vector<float> values(2, 1.0f);
    f.emplace_back(values.data(), values.size() * sizeof(float));
    cases.push_back({"pullReply to a shard", std::move(f), "does not accept pullReply"});
  }
  for (auto& c : cases) {
    auto reply = raw.Exchange(std::move(c.frames), shapes);
    ASSERT_TRUE(reply.ok()) << c.name << ": " << reply.status().ToString();
    EXPECT_EQ(reply->kind, wire::Kind::kError) << c.name;
    EXPECT_EQ(reply->request_id, c.request_id) << c.name;
    EXPECT_FALSE(reply->error.ok()) << c.name;
    EXPECT_FALSE(reply->error.message().empty()) << c.name;
    if (!c.expect.empty()) {
      EXPECT_NE(reply->error.message().find(c.expect), std::string::npos) << c.name << ": " << reply->error.message();
    }
  }
  EXPECT_GE(cluster->shards[0]->stats().errors, cases.size());
  EXPECT_EQ(AppliedSteps(*cluster->shards[0], 0u), 0u);
  EXPECT_EQ(pull_table0(), before) << "a refused message changed the shard";

  // A good client still trains against the same shard afterwards.
  auto reports = cluster->Train(image);
  ASSERT_TRUE(reports[0].ok()) << reports[0].status().ToString();
  EXPECT_EQ(AppliedSteps(*cluster->shards[0], 12u), 12u);
  ExpectBitIdentical(FlattenParams(*reports[0]->model), SingleProcessParams(cluster->config, image));
}

// Black-box fuzzing of a live shard over its real socket: thousands of
// mutated real messages (bit flips, truncations, dropped and duplicated
// frames). The shard must stay up and keep answering a good client.
TEST(PsShardTest, MutatedRealMessagesNeverStopTheShard) {
  auto cluster = Cluster::Start(SmallConfig(2, 1));
  const Partition& partition = *cluster->partition;
  const std::vector<wire::TableShape> shapes = ShapesOf(partition);
  std::vector<std::vector<zmq::message_t>> seeds;
  for (wire::Kind kind :
       {wire::Kind::kPush, wire::Kind::kPull, wire::Kind::kInit, wire::Kind::kStats}) {
    wire::OutHeader h;
    h.kind = kind;
    h.request_id = 5;
    h.num_workers = 2;
    h.job = 1;  // the cluster's: a mutated job number must change nothing
    std::vector<wire::OutBlock> blocks;
    if (kind != wire::Kind::kStats) {
      wire::OutBlock b;
      b.table = 0;
      b.width = partition.table(0).width;
      b.rows = {1, 2, 3, 40};
      b.row_count = 4;
      if (wire::KindCarriesValues(kind)) b.values.assign(4 * b.width, 0.25f);
      blocks.push_back(std::move(b));
    }
    seeds.push_back(wire::Encode(h, std::move(blocks)));
  }
  std::mt19937 rng(7);
  zmq::context_t context(1);
  zmq::socket_t socket(context, zmq::socket_type::dealer);
  socket.set(zmq::sockopt::linger, 0);
  socket.connect(cluster->shards[0]->endpoint());
  int sent = 0;
  for (int round = 0; round < 3000; ++round) {
    const auto& seed = seeds[rng() % seeds.size()];
    std::vector<zmq::message_t> frames;
    for (const auto& f : seed) frames.emplace_back(f.data(), f.size());
    switch (rng() % 4) {
      case 0: {  // bit flips anywhere
        auto& f = frames[rng() % frames.size()];
        for (int k = 0; k < 1 + static_cast<int>(rng() % 4) && f.size() > 0; ++k) {
          static_cast<uint8_t*>(f.data())[rng() % f.size()] ^=
              static_cast<uint8_t>(1u << (rng() % 8));
        }
        break;
      }
      case 1: {  // truncate a frame
        auto& f = frames[rng() % frames.size()];
        f = zmq::message_t(f.data(), f.size() == 0 ? 0 : rng() % f.size());
        break;
      }
      case 2:  // drop the last frame
        if (frames.size() > 1) frames.pop_back();
        break;
      default:  // duplicate a frame
        frames.emplace_back(frames.back().data(), frames.back().size());
    }
    ASSERT_TRUE(wire::SendMultipart(socket, frames).ok());
    ++sent;
    // Drain whatever came back; a push that happens to stay valid waits
    // for the other worker and gets no reply yet.
    while (wire::ReceiveMultipart(socket, 0, wire::Limits{}).ok()) {
    }
  }
  // Still serving: stats and a pull from a fresh client.
  RawClient good(cluster->shards[0]->endpoint());
  wire::OutHeader stats;
  stats.kind = wire::Kind::kStats;
  stats.request_id = 1;
  auto reply = good.Exchange(wire::Encode(stats, {}), shapes);
  ASSERT_TRUE(reply.ok()) << reply.status().ToString();
  EXPECT_EQ(reply->kind, wire::Kind::kStatsReply);
  // Most mutations are refused; the shard may still be working through the
  // last ones (another socket), so wait for its count to get there.
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(5);
  while (cluster->shards[0]->stats().errors <= static_cast<uint64_t>(sent) / 4 &&
         std::chrono::steady_clock::now() < deadline) {
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  EXPECT_GT(cluster->shards[0]->stats().errors, static_cast<uint64_t>(sent) / 4);
  auto pulled = good.Exchange(PullOfTable0(partition, 2, 2, /*job=*/1), shapes);
  ASSERT_TRUE(pulled.ok()) << pulled.status().ToString();
  EXPECT_EQ(pulled->kind, wire::Kind::kPullReply) << pulled->error.ToString();
}

// compression.pull: shards answer pulls with encoded deltas against each
// worker's replica (two-way compression). Pulls shrink by the codec's ratio
// and training stays where pull-uncompressed training goes: what a codec
// holds back is re-sent by the next pull of the row.
TEST(PsCompressionTest, DeltaPullsShrinkPullsAndTrainAsWell) {
  const ImageTask image = SmallImage();
  for (const char* codec : {"onebit", "topk", "fp16"}) {
    double pulled[2] = {0, 0}, psnr[2] = {0, 0};
    for (int pull = 0; pull < 2; ++pull) {
      Config config = SmallConfig(2, 2);
      config.compression.codec = codec;
      config.compression.ratio = 0.1;
      config.compression.min_bytes = 0;
      config.compression.pull = pull == 1;
      config.training.steps = 30;
      auto cluster = Cluster::Start(config);
      auto reports = cluster->Train(image);
      for (auto& r : reports) ASSERT_TRUE(r.ok()) << codec << ": " << r.status().ToString();
      pulled[pull] = reports[0]->bytes_pulled_per_step;
      psnr[pull] = reports[0]->psnr;
    }
    EXPECT_LT(pulled[1] * (std::string(codec) == "fp16" ? 1.7 : 3.0), pulled[0])
        << codec << ": pulled " << pulled[1] << " B/step with delta pulls, " << pulled[0]
        << " without";
    // 30 steps is the worst case: parameters move fastest early, so the
    // replica lags most (at 200 steps onebit loses 0.65 dB, README).
    EXPECT_NEAR(psnr[1], psnr[0], 1.0) << codec;
  }
}

TEST(PsCompressionTest, CompressedPushesTrainAndNeverTouchUntouchedRows) {
  const ImageTask image = SmallImage();
  for (const char* codec : {"onebit", "topk", "int8", "randomk"}) {
    Config config = SmallConfig(2, 2);
    config.compression.codec = codec;
    config.compression.ratio = 0.1;
    config.compression.min_bytes = 0;
    config.training.steps = 10;
    auto cluster = Cluster::Start(config);
    auto reports = cluster->Train(image);
    for (auto& r : reports) ASSERT_TRUE(r.ok()) << codec << ": " << r.status().ToString();
    // The rows any batch of the run read: the only rows allowed to move.
    auto initial = HashGridModel::Create(testing::SpecOf(cluster->config).model);
    ASSERT_TRUE(initial.ok());
    const auto& layout = (*initial)->layout();
    std::vector<uint8_t> read(layout.total_rows(), 0);
    ThreadPool pool(1);
    cpu::GridBatchLookup lookup;
    const size_t batch = static_cast<size_t>(config.training.batch_size);
    std::vector<float> pos(batch * 2), target(batch * 3);
    for (int step = 0; step < config.training.steps; ++step) {
      image.SampleBatch(config.training.seed, static_cast<uint64_t>(step), 0, batch, pos.data(), target.data());
      cpu::HashGridLookup(layout, pos.data(), batch, layout.n_levels(), &lookup, &pool);
      for (uint32_t l = 0; l < layout.n_levels(); ++l) {
        for (size_t i = 0; i < batch * lookup.corners; ++i) {
          read[layout.level(l).row_offset + lookup.rows[lookup.Index(l, 0) + i]] = 1;
        }
      }
    }
    const auto& before = (*initial)->grid_params();
    const auto& after = reports[0]->model->grid_params();
    size_t moved = 0, moved_unread = 0;
    for (uint64_t row = 0; row < layout.total_rows(); ++row) {
      for (uint32_t f = 0; f < layout.features(); ++f) {
        const size_t at = row * layout.features() + f;
        if (before[at] != after[at]) {
          ++moved;
          moved_unread += read[row] == 0;
        }
      }
    }
    EXPECT_GT(moved, 0u) << codec;
    // Lossy codecs with error feedback deliver what they held back as one more step.
    EXPECT_TRUE(reports[0]->flushed_residuals) << codec;
    for (auto* shard : cluster->shards) {
      EXPECT_EQ(AppliedSteps(*shard, static_cast<uint64_t>(config.training.steps) + 1),
                static_cast<uint64_t>(config.training.steps) + 1)
          << codec;
    }
    EXPECT_EQ(moved_unread, 0u) << codec << ": rows no batch touched received updates";
    EXPECT_LT(reports[0]->bytes_pushed_per_step, SmallConfig(2, 2).training.batch_size * 64.0) << codec;
  }
}

TEST(PsCompressionTest, MalformedCompressedPayloadIsRefusedAndChangesNothing) {
  auto cluster = Cluster::Start(SmallConfig(1, 1));
  const Partition& partition = *cluster->partition;
  const std::vector<wire::TableShape> shapes = ShapesOf(partition);
  RawClient raw(cluster->shards[0]->endpoint());
  auto push = [&](auto mutate) {
    wire::OutHeader h;
    h.kind = wire::Kind::kPush;
    h.request_id = 3;
    h.num_workers = 1;
    wire::OutBlock b;
    b.table = 0;
    b.width = partition.table(0).width;
    b.rows = {1, 2, 3, 4};
    b.row_count = 4;
    b.codec.codec = Codec::kOnebit;
    std::vector<float> values(8, 0.25f);
    b.payload.resize(EncodedSize(b.codec, values.size()));
    cpu::Encode(b.codec, values.data(), values.size(), 0, b.payload.data());
    mutate(b);
    std::vector<wire::OutBlock> blocks;
    blocks.push_back(std::move(b));
    return wire::Encode(h, std::move(blocks));
  };
  // A NaN scale in an otherwise well-formed onebit payload.
  auto nan_scale = push([](wire::OutBlock& b) {
    const float nan = std::nanf("");
    std::memcpy(b.payload.data(), &nan, sizeof(nan));
  });
  auto reply = raw.Exchange(std::move(nan_scale), shapes);
  ASSERT_TRUE(reply.ok()) << reply.status().ToString();
  EXPECT_EQ(reply->kind, wire::Kind::kError);
  EXPECT_NE(reply->error.message().find("onebit"), std::string::npos) << reply->error.message();
  // A payload one byte short.
  auto frames = push([](wire::OutBlock&) {});
  frames.back() = zmq::message_t(frames.back().data(), frames.back().size() - 1);
  reply = raw.Exchange(std::move(frames), shapes);
  ASSERT_TRUE(reply.ok());
  EXPECT_EQ(reply->kind, wire::Kind::kError);
  EXPECT_EQ(AppliedSteps(*cluster->shards[0], 0u), 0u);
  // A well-formed compressed push is accepted and applied.
  reply = raw.Exchange(push([](wire::OutBlock&) {}), shapes);
  ASSERT_TRUE(reply.ok());
  EXPECT_EQ(reply->kind, wire::Kind::kPushAck) << reply->error.ToString();
  EXPECT_EQ(AppliedSteps(*cluster->shards[0], 1u), 1u);
}

// ---- ps.optimizer = worker: Adam on the workers, updates on the wire ----

TEST(WorkerAdamTest, UpdatesAreTheNegatedAdamStepAndZeroRowsAreDropped) {
  const std::vector<TableInfo> tables = {{"grid", 100, 2}, {"mlp", 3, 4}};
  auto partition = Partition::Make(tables, 1, ModelParallelDim::kRow);
  ASSERT_TRUE(partition.ok());
  AdamHyper hyper;
  WorkerAdam adam(*partition, hyper);
  // Reference: Adam applied in place, as on a shard.
  cpu::AdamTable ref_grid, ref_mlp;
  ref_grid.Resize(100, 2);
  ref_mlp.Resize(3, 4);
  std::vector<float> params_grid(200, 0.5f), params_mlp(12, -0.25f);
  std::mt19937 rng(7);
  std::normal_distribution<float> normal(0.0f, 1e-3f);
  for (int step = 0; step < 5; ++step) {
    const std::vector<uint32_t> rows = {3, 17, 42, 99};
    std::vector<float> grad(rows.size() * 2);
    for (auto& g : grad) g = normal(rng);
    grad[2] = grad[3] = 0.0f;  // row 17: no gradient, must not step
    std::vector<float> mlp_grad(12);
    for (auto& g : mlp_grad) g = step == 2 ? 0.0f : normal(rng);  // dense: steps anyway
    const auto updates = adam.ToUpdates({{0, false, rows.data(), rows.size(), grad.data()},
                                         {1, true, nullptr, 0, mlp_grad.data()}});
    ASSERT_EQ(updates.size(), 2u);
    ASSERT_EQ(updates[0].row_count, 3u);
    EXPECT_EQ(updates[0].rows[0], 3u);
    EXPECT_EQ(updates[0].rows[1], 42u);
    EXPECT_EQ(updates[0].rows[2], 99u);
    EXPECT_TRUE(updates[1].dense);
    SparseRows sparse;
    sparse.width = 2;
    sparse.rows = rows;
    sparse.values = grad;
    const std::vector<float> before_grid = params_grid;
    const std::vector<float> before_mlp = params_mlp;
    cpu::AdamUpdateRows(hyper, sparse, 1.0f, params_grid.data(), &ref_grid);
    cpu::AdamUpdateDense(hyper, mlp_grad.data(), 3, 1.0f, params_mlp.data(), &ref_mlp);
    for (size_t i = 0; i < 3; ++i) {
      for (uint32_t f = 0; f < 2; ++f) {
        const size_t at = size_t{updates[0].rows[i]} * 2 + f;
        const float applied = before_grid[at] + updates[0].values[i * 2 + f];
        EXPECT_EQ(applied, params_grid[at]) << "step " << step << " row " << updates[0].rows[i];
      }
    }
    EXPECT_EQ(params_grid[34], 0.5f);  // row 17 untouched
    for (size_t i = 0; i < 12; ++i) EXPECT_EQ(before_mlp[i] + updates[1].values[i], params_mlp[i]) << i;
  }
  EXPECT_GT(adam.StateBytes(), 0u);
}

TEST(PsWorkerOptimizerTest, OneWorkerEndsBitForBitWhereAdamOnTheShardEnds) {
  const ImageTask image = SmallImage();
  std::vector<std::vector<float>> params;
  for (OptimizerPlacement where : {OptimizerPlacement::kShard, OptimizerPlacement::kWorker}) {
    Config config = SmallConfig(1, 2);
    config.ps.optimizer = where;
    auto cluster = Cluster::Start(config);
    auto reports = cluster->Train(image);
    ASSERT_TRUE(reports[0].ok()) << reports[0].status().ToString();
    EXPECT_FALSE(reports[0]->flushed_residuals);  // no codec: nothing held back
    params.push_back(FlattenParams(*reports[0]->model));
  }
  ExpectBitIdentical(params[0], params[1]);
}

TEST(PsWorkerOptimizerTest, TwoWorkersTrainAsWellAsAdamOnTheShard) {
  const ImageTask image = SmallImage();
  std::vector<double> loss;
  for (OptimizerPlacement where : {OptimizerPlacement::kShard, OptimizerPlacement::kWorker}) {
    Config config = SmallConfig(2, 2);
    config.training.steps = 40;
    config.ps.optimizer = where;
    auto cluster = Cluster::Start(config);
    auto reports = cluster->Train(image);
    for (auto& r : reports) ASSERT_TRUE(r.ok()) << r.status().ToString();
    loss.push_back(reports[0]->final_loss);
  }
  // Each worker normalises its own half-batch gradient: not the same
  // numbers as Adam on the sum, but the same progress.
  EXPECT_LT(loss[1], 1.25 * loss[0]) << "shard " << loss[0] << " worker " << loss[1];
}

// Worker-side Adam, the codec with its error feedback and the pending
// updates run on the training threads (tables and feedback keys in
// parallel): the run is the same bit for bit with one thread or three.
TEST(PsWorkerOptimizerTest, TrainingThreadsChangeNoBitOfACompressedRun) {
  const ImageTask image = SmallImage();
  std::vector<std::vector<float>> params;
  for (int threads : {1, 3}) {
    Config config = SmallConfig(2, 2);
    config.training.steps = 20;
    config.training.threads = threads;
    config.ps.optimizer = OptimizerPlacement::kWorker;
    config.compression.codec = "onebit";
    config.compression.error_feedback = true;
    auto cluster = Cluster::Start(config);
    auto reports = cluster->Train(image);
    for (auto& r : reports) ASSERT_TRUE(r.ok()) << r.status().ToString();
    params.push_back(FlattenParams(*reports[0]->model));
  }
  ExpectBitIdentical(params[0], params[1]);
}

TEST(PsWorkerOptimizerTest, ShardAveragesUpdatesOverThePushesListingTheRow) {
  Config config = SmallConfig(2, 1);
  config.ps.optimizer = OptimizerPlacement::kWorker;
  auto cluster = Cluster::Start(config);
  const Partition& partition = *cluster->partition;
  const std::vector<wire::TableShape> shapes = ShapesOf(partition);
  RawClient raw(cluster->shards[0]->endpoint());
  auto push = [&](uint32_t worker, std::vector<uint32_t> rows, std::vector<float> values,
                  wire::PushValues kind = wire::PushValues::kUpdates) {
    wire::OutHeader h;
    h.kind = wire::Kind::kPush;
    h.request_id = 10 + worker;
    h.worker_rank = worker;
    h.num_workers = 2;
    h.push_values = kind;
    wire::OutBlock b;
    b.table = 0;
    b.width = 2;
    b.row_count = static_cast<uint32_t>(rows.size());
    b.rows = std::move(rows);
    b.values = std::move(values);
    std::vector<wire::OutBlock> blocks;
    blocks.push_back(std::move(b));
    return raw.Exchange(wire::Encode(h, std::move(blocks)), shapes);
  };
  // Gradients where updates are expected: refused, naming both.
  auto refused = push(0, {1}, {1.0f, 1.0f}, wire::PushValues::kGradients);
  ASSERT_TRUE(refused.ok());
  ASSERT_EQ(refused->kind, wire::Kind::kError);
  EXPECT_NE(refused->error.message().find("carries gradients"), std::string::npos) << refused->error.message();
  EXPECT_NE(refused->error.message().find("allowed: updates"), std::string::npos) << refused->error.message();
  // Worker 0 lists rows 1 and 2, worker 1 rows 2 and 3 (zero for row 3 still counts:
  // a worker that touched a row but whose codec held its update back).
  auto a = push(0, {1, 2}, {1.0f, 2.0f, 3.0f, 4.0f});
  auto b = push(1, {2, 3}, {5.0f, 8.0f, 0.0f, 0.0f});
  ASSERT_TRUE(a.ok() && b.ok());
  ASSERT_EQ(a->kind, wire::Kind::kPushAck) << a->error.ToString();
  ASSERT_EQ(b->kind, wire::Kind::kPushAck) << b->error.ToString();
  wire::OutHeader h;
  h.kind = wire::Kind::kPull;
  h.request_id = 20;
  h.min_version = 1;
  wire::OutBlock q;
  q.table = 0;
  q.width = 2;
  q.rows = {0, 1, 2, 3};
  q.row_count = 4;
  std::vector<wire::OutBlock> blocks;
  blocks.push_back(std::move(q));
  auto reply = raw.Exchange(wire::Encode(h, std::move(blocks)), shapes);
  ASSERT_TRUE(reply.ok()) << reply.status().ToString();
  ASSERT_EQ(reply->kind, wire::Kind::kPullReply) << reply->error.ToString();
  const auto& v = reply->blocks[0].values;
  const std::vector<float> expected = {0, 0, 1, 2, (3 + 5) / 2.0f, (4 + 8) / 2.0f, 0, 0};
  ASSERT_EQ(v.size(), expected.size());
  for (size_t i = 0; i < expected.size(); ++i) EXPECT_EQ(v[i], expected[i]) << i;

  // And a shard running Adam refuses updates.
  auto adam_cluster = Cluster::Start(SmallConfig(1, 1));
  RawClient adam_raw(adam_cluster->shards[0]->endpoint());
  wire::OutHeader u;
  u.kind = wire::Kind::kPush;
  u.request_id = 1;
  u.num_workers = 1;
  u.push_values = wire::PushValues::kUpdates;
  auto no = adam_raw.Exchange(wire::Encode(u, {}), shapes);
  ASSERT_TRUE(no.ok());
  ASSERT_EQ(no->kind, wire::Kind::kError);
  EXPECT_NE(no->error.message().find("carries updates; allowed: gradients"), std::string::npos)
      << no->error.message();
  EXPECT_EQ(AppliedSteps(*adam_cluster->shards[0], 0u), 0u);
}

// A long-running shard (a systemd unit) serves job after job: once the
// coordinator's job moved on, the new job's first message starts the shard
// afresh, an older job's worker is refused by name, and a message claiming a
// job the coordinator does not run changes nothing.
TEST(PsShardTest, ANewJobStartsAfreshAndAStaleWorkerIsRefusedByName) {
  auto cluster = Cluster::Start(SmallConfig(1, 1));
  const std::vector<wire::TableShape> shapes = ShapesOf(*cluster->partition);
  RawClient raw(cluster->shards[0]->endpoint());
  auto send = [&](wire::Kind kind, uint64_t job, uint64_t min_version) {
    wire::OutHeader h;
    h.kind = kind;
    h.request_id = 7;
    h.num_workers = 1;
    h.min_version = min_version;
    h.job = job;
    wire::OutBlock b;
    b.table = 0;
    b.width = 2;
    b.rows = {1};
    b.row_count = 1;
    if (kind != wire::Kind::kPull) b.values = {1.0f, -1.0f};
    std::vector<wire::OutBlock> blocks;
    blocks.push_back(std::move(b));
    return raw.Exchange(wire::Encode(h, std::move(blocks)), shapes);
  };
  auto expect_refused = [&](const Result<wire::Message>& reply, const std::string& text) {
    ASSERT_TRUE(reply.ok()) << reply.status().ToString();
    ASSERT_EQ(reply->kind, wire::Kind::kError);
    EXPECT_NE(reply->error.message().find(text), std::string::npos) << reply->error.message();
  };
  auto pushed = send(wire::Kind::kPush, 1, 0);
  ASSERT_TRUE(pushed.ok());
  ASSERT_EQ(pushed->kind, wire::Kind::kPushAck) << pushed->error.ToString();
  auto first = send(wire::Kind::kPull, 1, 1);
  ASSERT_TRUE(first.ok());
  ASSERT_EQ(first->kind, wire::Kind::kPullReply) << first->error.ToString();
  EXPECT_NE(first->blocks[0].values[0], 0.0f) << "job 1 stepped row 1";
  EXPECT_EQ(AppliedSteps(*cluster->shards[0], 1u), 1u);

  // Job 2 has not begun: claiming it changes nothing.
  expect_refused(send(wire::Kind::kPull, 2, 0), "job 2 of worker 0 is not the cluster's");
  EXPECT_EQ(cluster->shards[0]->stats().applied_steps, 1u);

  // A worker of job 1 passes 'init' and leaves: the coordinator starts job 2.
  const uint16_t port = static_cast<uint16_t>(cluster->config.distributed.master_port);
  {
    auto worker = CoordinatorClient::Connect("127.0.0.1", port, 2s, {}, Role::kWorker);
    ASSERT_TRUE(worker.ok()) << worker.status().ToString();
    RegisterInfo info;
    info.role = Role::kWorker;
    info.node = "node0";
    info.tables = testing::SpecOf(cluster->config).model.tables;
    auto registered = (*worker)->Register(info, 2s);
    ASSERT_TRUE(registered.ok()) << registered.status().ToString();
    ASSERT_TRUE((*worker)->Barrier("init", 1, "worker-0", 2s).ok());
  }
  auto observer = CoordinatorClient::Connect("127.0.0.1", port, 2s);
  ASSERT_TRUE(observer.ok());
  const auto deadline = std::chrono::steady_clock::now() + 3s;
  uint64_t job = 1;
  while (job < 2 && std::chrono::steady_clock::now() < deadline) {
    auto map = (*observer)->GetMap(false, 0ms);
    ASSERT_TRUE(map.ok()) << map.status().ToString();
    job = map->job;
    std::this_thread::sleep_for(10ms);
  }
  ASSERT_EQ(job, 2u) << "the coordinator did not start job 2 when job 1's worker left";

  // Job 2's first message: version 0, parameters as before any job.
  auto fresh = send(wire::Kind::kPull, 2, 0);
  ASSERT_TRUE(fresh.ok());
  ASSERT_EQ(fresh->kind, wire::Kind::kPullReply) << fresh->error.ToString();
  EXPECT_EQ(fresh->blocks[0].values[0], 0.0f);
  EXPECT_EQ(fresh->blocks[0].values[1], 0.0f);
  EXPECT_EQ(cluster->shards[0]->stats().applied_steps, 0u);

  // A worker left over from job 1: refused, by rank and job.
  expect_refused(send(wire::Kind::kPush, 1, 0), "worker 0 of job 1 is stale");
  expect_refused(send(wire::Kind::kPush, 1, 0), "serves job 2");
  EXPECT_EQ(cluster->shards[0]->stats().applied_steps, 0u) << "the stale push changed nothing";
  // Job 2 trains on.
  auto next = send(wire::Kind::kPush, 2, 0);
  ASSERT_TRUE(next.ok());
  EXPECT_EQ(next->kind, wire::Kind::kPushAck) << next->error.ToString();
  EXPECT_EQ(AppliedSteps(*cluster->shards[0], 1u), 1u);
}

// A cluster and one worker joined to it by hand (rank 0), for tests that
// drive the PS client directly.
struct OneWorker {
  std::unique_ptr<Cluster> cluster;
  RunSpec spec;
  Result<std::unique_ptr<HashGridModel>> model = Status::Internal("not made");
  Result<PsSession> session = Status::Internal("not joined");

  static OneWorker Join(const Config& config) {
    OneWorker one;
    one.cluster = Cluster::Start(config);
    one.spec = testing::SpecOf(one.cluster->config);
    one.model = HashGridModel::Create(one.spec.model);
    if (!one.model.ok()) return one;
    WorkerOptions options;
    options.rank = 0;
    options.train.quiet = true;
    one.session = JoinPsCluster(one.spec, **one.model, options);
    return one;
  }
};

TEST(PsWorkerOptimizerTest, FlushDeliversExactlyWhatErrorFeedbackHeld) {
  Config config = SmallConfig(1, 2);
  config.compression.codec = "topk";
  config.compression.ratio = 0.05;
  config.compression.min_bytes = 0;
  OneWorker one = OneWorker::Join(config);
  ASSERT_TRUE(one.session.ok()) << one.session.status().ToString();
  auto& model = one.model;
  auto& session = one.session;
  PsClient& ps = *session->ps;
  ASSERT_TRUE(ps.optimizer_on_worker());
  const auto& layout = (*model)->layout();
  const uint32_t F = layout.features();
  std::mt19937 rng(3);
  std::normal_distribution<float> normal(0.0f, 1e-3f);
  const int steps = 6;
  for (int step = 0; step < steps; ++step) {
    std::vector<std::vector<uint32_t>> rows(layout.n_levels());
    std::vector<std::vector<float>> values(layout.n_levels());
    std::vector<TableRowsRef> push;
    for (uint32_t l = 0; l < layout.n_levels(); ++l) {
      for (uint32_t r = static_cast<uint32_t>(step); r < layout.level(l).rows; r += 7) rows[l].push_back(r);
      for (size_t i = 0; i < rows[l].size() * F; ++i) values[l].push_back(normal(rng));
      push.push_back({l, false, rows[l].data(), rows[l].size(), values[l].data()});
    }
    ASSERT_TRUE(ps.Push(wire::Kind::kPush, static_cast<uint64_t>(step), push).ok());
  }
  ASSERT_GT(ps.error_feedback().Entries(), 0u);
  // What the shards hold, and what this worker still holds back.
  ASSERT_TRUE(PullAllParams(ps, **model, steps).ok());
  const std::vector<float> held_at_shards = (*model)->grid_params();
  std::vector<float> expected = held_at_shards;
  for (uint32_t l = 0; l < layout.n_levels(); ++l) {
    for (uint32_t r = 0; r < layout.level(l).rows; ++r) {
      const float* residual = ps.PendingUpdate(l, 0, r);
      if (residual == nullptr) continue;
      for (uint32_t f = 0; f < F; ++f) expected[(layout.level(l).row_offset + r) * F + f] += residual[f];
    }
  }
  ASSERT_NE(expected, held_at_shards);
  // A pull with the pending view shows the same numbers the flush will make real.
  std::vector<TablePullRef> all;
  for (uint32_t l = 0; l < layout.n_levels(); ++l) {
    all.push_back({l, true, nullptr, 0, (*model)->grid_params().data() + layout.level(l).row_offset * F});
  }
  ASSERT_TRUE(ps.SendPull(steps, all).ok());
  ASSERT_TRUE(ps.ReceivePull().ok());
  ps.AddPendingUpdates(all);
  ExpectBitIdentical((*model)->grid_params(), expected);

  auto flushed = ps.FlushResiduals(steps, steps);
  ASSERT_TRUE(flushed.ok()) << flushed.status().ToString();
  EXPECT_TRUE(*flushed);
  EXPECT_EQ(ps.error_feedback().Entries(), 0u);
  ASSERT_TRUE(PullAllParams(ps, **model, steps + 1).ok());
  ExpectBitIdentical((*model)->grid_params(), expected);
  for (auto* shard : one.cluster->shards)
    EXPECT_EQ(AppliedSteps(*shard, static_cast<uint64_t>(steps) + 1),
              static_cast<uint64_t>(steps) + 1);
}

// Error feedback keeps residuals per (table, column slice). Under column
// partitioning a table 512 wide has slices at columns 0 and 256; the old key
// table * 256 + col_begin gave table t's second slice the key of table t+1's
// first, so two MLP tables shared residuals. After one topk push of known
// gradients, every residual must be either the gradient itself (a value topk
// did not keep) or zero (a kept value), for every slice of every table.
TEST(PsCompressionTest, WideTablesKeepTheirOwnResidualsUnderColumnPartitioning) {
  Config config = SmallConfig(1, 2);
  config.network.n_neurons = 512;
  config.distributed.model_parallel = true;
  config.distributed.mp_dim = ModelParallelDim::kColumn;
  config.compression.codec = "topk";
  config.compression.ratio = 0.05;
  config.compression.min_bytes = 0;
  config.compression.error_feedback = true;
  config.ps.optimizer = OptimizerPlacement::kShard;
  OneWorker one = OneWorker::Join(config);
  ASSERT_TRUE(one.session.ok()) << one.session.status().ToString();
  auto& model = one.model;
  auto& session = one.session;
  PsClient& ps = *session->ps;
  const uint32_t levels = (*model)->layout().n_levels();
  const auto& weights = (*model)->mlp_weights();
  std::mt19937 rng(5);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::vector<std::vector<float>> grads;
  std::vector<TableRowsRef> push;
  for (size_t i = 0; i < weights.size(); ++i) {
    grads.emplace_back(static_cast<size_t>(weights[i].size()));
    for (float& g : grads.back()) g = normal(rng);
    push.push_back({levels + static_cast<uint32_t>(i), true, nullptr, 0, grads.back().data()});
  }
  ASSERT_TRUE(ps.Push(wire::Kind::kPush, 0, push).ok());
  const Partition& partition = *session->partition;
  size_t wide = 0, checked = 0, equal = 0, wrong = 0;
  for (size_t i = 0; i < weights.size(); ++i) {
    const uint32_t t = levels + static_cast<uint32_t>(i);
    const uint32_t width = partition.table(t).width;
    if (partition.ColumnGroups(t) > 1) ++wide;
    for (uint32_t g = 0; g < partition.ColumnGroups(t); ++g) {
      const uint32_t col = partition.ColBegin(t, g);
      for (uint32_t r = 0; r < partition.table(t).rows; ++r) {
        const float* residual = ps.PendingUpdate(t, col, r);
        if (residual == nullptr) continue;
        for (uint32_t f = 0; f < partition.ColWidth(t); ++f) {
          const float sent = grads[i][size_t{r} * width + col + f];
          ++checked;
          if (residual[f] == sent) {
            ++equal;
          } else if (residual[f] != 0.0f) {
            ++wrong;
          }
        }
      }
    }
  }
  ASSERT_GE(wide, 2u) << "the test needs two consecutive tables cut into column slices";
  EXPECT_EQ(wrong, 0u) << "residuals of another table or slice: " << wrong << " of " << checked;
  EXPECT_GT(equal, checked * 9 / 10) << "topk at 5% keeps most values back";
}

TEST(PsShardTest, RowsOfAnotherShardAreRefused) {
  Config config = SmallConfig(1, 2);
  auto cluster = Cluster::Start(config);
  const Partition& partition = *cluster->partition;
  const std::vector<wire::TableShape> shapes = ShapesOf(partition);
  // Find a table whose first block belongs to shard 1 and send it to shard 0.
  uint32_t table = 0;
  while (partition.Owner(table, 0, 0) != 1) ++table;
  RawClient raw(cluster->shards[0]->endpoint());
  wire::OutHeader h;
  h.kind = wire::Kind::kPull;
  wire::OutBlock b;
  b.table = table;
  b.width = partition.table(table).width;
  b.rows = {0};
  b.row_count = 1;
  std::vector<wire::OutBlock> blocks;
  blocks.push_back(std::move(b));
  auto reply = raw.Exchange(wire::Encode(h, std::move(blocks)), shapes);
  ASSERT_TRUE(reply.ok());
  EXPECT_EQ(reply->kind, wire::Kind::kError);
  EXPECT_NE(reply->error.message().find("belongs to shard 1"), std::string::npos) << reply->error.message();
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
  const fs::path path = fs::temp_directory_path() / (name + "-" + std::to_string(getpid()) + ".json");
  std::ofstream(path) << c.ToJson().dump(2);
  return path.string();
}

// Whether a gridsync server or worker whose command line names `needle` is
// still running. The pattern cannot match the shell running pgrep itself.
bool ProcessesWithArgument(const std::string& needle) {
  FILE* pipe = popen(("pgrep -f -- 'gridsync-(ps|worker|coordinator) .*" + needle + "'").c_str(), "r");
  std::array<char, 256> buf;
  bool any = pipe && std::fgets(buf.data(), buf.size(), pipe) != nullptr;
  if (pipe) pclose(pipe);
  return any;
}

TEST(PsLaunchTest, MultiProcessBspMatchesSingleProcessBitForBit) {
  Config config = SmallConfig(2, 2);
  config.distributed.master_port = FreePortBase();
  config.task.image = kDefaultImagePath;
  config.task.output = (fs::temp_directory_path() / ("gridsync-launch-" + std::to_string(getpid()))).string();
  const std::string path = WriteConfig(config, "ps-backbone");
  const std::string dump = config.task.output + "/params.bin";
  const auto run = Launch(path, {"--rank0-arg=--dump-params", "--rank0-arg=" + dump});
  ASSERT_EQ(run.exit_code, 0) << run.output;
  EXPECT_NE(run.output.find("[ps-1]"), std::string::npos);
  EXPECT_NE(run.output.find("[worker-1]"), std::string::npos);
  EXPECT_NE(run.output.find("pushed per step"), std::string::npos) << run.output;
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
  config.task.image = "/nonexistent/image.png";  // every worker fails to load it
  const std::string path = WriteConfig(config, "ps-fail");
  const auto start = std::chrono::steady_clock::now();
  const auto run = Launch(path, {});
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  EXPECT_NE(run.exit_code, 0) << run.output;
  EXPECT_NE(run.output.find("failed: exit status 2"), std::string::npos) << run.output;
  EXPECT_NE(run.output.find("/nonexistent/image.png"), std::string::npos) << run.output;
  EXPECT_LT(seconds, 25.0);
  EXPECT_FALSE(ProcessesWithArgument(path)) << "orphan processes remain";
}

}  // namespace
}  // namespace gridsync
