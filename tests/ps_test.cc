// The parameter server end to end: real ZeroMQ shards, a real coordinator,
// workers as threads (in-process) or as processes (gridsync launch).
//
// The backbone: with bsp and no compression, a cluster ends with exactly the
// parameters of one process training on the same global batches (worker w's
// slice is that process's micro-batch w; the shards sum in rank order).
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <array>
#include <cstring>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <random>
#include <thread>

#include <gtest/gtest.h>

#include "common/config.h"
#include "common/coordinator_client.h"
#include "common/sharding.h"
#include "common/wire/message.h"
#include "kernels/model_tables.h"
#include "server/coordinator.h"
#include "server/in_process_cluster.h"
#include "server/ps_shard.h"
#include "common/thread_pool.h"
#include "kernels/cpu/codec.h"
#include "kernels/cpu/hash_encoding.h"
#include "worker/collective/local_collective.h"
#include "worker/hybrid_trainer.h"
#include "worker/image_task.h"
#include "worker/model.h"
#include "worker/ps_trainer.h"
#include "worker/trainer.h"
#include "tests/test_util.h"

namespace gridsync {
namespace {

using testing::ExpectBitIdentical;
using testing::ExpectWithinRounding;
using testing::SmallImage;
namespace fs = std::filesystem;

Config SmallConfig(int workers, int shards) {
  Config c = testing::SmallDistributedConfig(workers, GradientSync::kPs, 12);
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
  std::vector<Result<TrainReport>> Train(const ImageTask& image, std::vector<int> throttle_ms = {}) {
    const int workers = config.distributed.world_size;
    std::vector<Result<TrainReport>> reports(workers, Status::Internal("not run"));
    std::vector<std::thread> threads;
    for (int w = 0; w < workers; ++w) {
      threads.emplace_back([&, w] {
        PsWorkerOptions options;
        options.rank = w;
        options.train.quiet = true;
        options.train.write_png = false;
        if (static_cast<size_t>(w) < throttle_ms.size()) options.throttle_ms = throttle_ms[w];
        reports[w] = TrainImagePs(config, image, options);
      });
    }
    for (auto& t : threads) t.join();
    return reports;
  }
};

TrainReport SingleProcess(Config config, const ImageTask& image) {
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
  EXPECT_EQ(cluster->shards[0]->stats().applied_steps, 12u);
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
  // updates, so it trails bsp a little but must clearly learn.
  const double local = SingleProcess(cluster->config, image).psnr;
  EXPECT_GT(reports[0]->psnr, local - 3.0) << "single-process PSNR " << local;
  EXPECT_EQ(cluster->shards[0]->stats().applied_steps, 60u);  // every push applied on arrival
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


TEST(HybridTest, NodesOfTwoAndTwoAndOfOneAndThreeMatchSingleProcess) {
  const ImageTask image = SmallImage();
  for (const auto& sizes : std::vector<std::vector<int>>{{2, 2}, {1, 3}}) {
    Config config = SmallConfig(4, 2);
    config.distributed.gradient_sync = GradientSync::kHybrid;
    config.training.steps = 8;
    for (size_t n = 0; n < sizes.size(); ++n) {
      NodeConfig node;
      node.name = std::string("node") + std::to_string(n);
      node.workers = sizes[n];
      config.distributed.nodes.push_back(node);
    }
    auto cluster = Cluster::Start(config);
    std::vector<std::vector<std::unique_ptr<LocalCollective>>> intra;
    for (int n : sizes) intra.push_back(LocalCollective::CreateGroup(n, std::chrono::seconds(20), "intra"));
    std::vector<Result<TrainReport>> reports(4, Status::Internal("not run"));
    std::vector<std::thread> threads;
    for (int w = 0; w < 4; ++w) {
      threads.emplace_back([&, w] {
        HybridWorkerOptions options;
        options.ps.rank = w;
        options.ps.train.quiet = true;
        options.ps.train.write_png = false;
        options.intra_group = [&](PsSession&, int node, int local, int) -> Result<Collective*> {
          return static_cast<Collective*>(intra[static_cast<size_t>(node)][static_cast<size_t>(local)].get());
        };
        reports[static_cast<size_t>(w)] = TrainImageHybrid(cluster->config, image, options);
      });
    }
    for (auto& t : threads) t.join();
    for (auto& r : reports) ASSERT_TRUE(r.ok()) << r.status().ToString();
    EXPECT_GT(reports[0]->bytes_pushed_per_step, 0);
    ExpectWithinRounding(FlattenParams(*reports[0]->model), SingleProcessParams(cluster->config, image),
                         config.training.steps, config.training.learning_rate);
  }
}

// ---- Malformed input over a real socket ----

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

std::vector<zmq::message_t> Frames(std::initializer_list<std::string> parts) {
  std::vector<zmq::message_t> frames;
  for (const auto& p : parts) frames.emplace_back(p.data(), p.size());
  return frames;
}

TEST(PsShardTest, MalformedInputGetsErrorAndChangesNothing) {
  const ImageTask image = SmallImage();
  auto cluster = Cluster::Start(SmallConfig(1, 1));
  const Partition& partition = *cluster->partition;
  std::vector<wire::TableShape> shapes;
  for (uint32_t t = 0; t < partition.n_tables(); ++t) shapes.push_back({partition.table(t).rows, partition.table(t).width});
  RawClient raw(cluster->shards[0]->endpoint());

  auto pull_table0 = [&]() -> std::vector<float> {
    wire::OutHeader h;
    h.kind = wire::Kind::kPull;
    h.request_id = 99;
    wire::OutBlock b;
    b.table = 0;
    b.dense = true;
    b.width = partition.table(0).width;
    b.row_count = static_cast<uint32_t>(partition.table(0).rows);
    std::vector<wire::OutBlock> blocks;
    blocks.push_back(std::move(b));
    auto reply = raw.Exchange(wire::Encode(h, std::move(blocks)), shapes);
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
  };
  std::vector<Case> cases;
  cases.push_back({"random bytes", Frames({std::string("\x13\x37garbage-not-capnp-at-all", 25)}), ""});
  {
    auto f = push_with([](auto&, auto&) {});
    std::string header(static_cast<const char*>(f[0].data()), f[0].size() / 2);
    f[0] = zmq::message_t(header.data(), header.size());
    cases.push_back({"truncated header", std::move(f), ""});
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
    if (patched) cases.push_back({"wrong version", std::move(f), ""});
  }
  {
    // More frames than any valid message has.
    std::vector<zmq::message_t> f;
    for (uint32_t i = 0; i < wire::Limits{}.max_frames() + 5; ++i) f.emplace_back("x", 1);
    cases.push_back({"too many frames", std::move(f), "frames"});
  }
  for (auto& c : cases) {
    auto reply = raw.Exchange(std::move(c.frames), shapes);
    ASSERT_TRUE(reply.ok()) << c.name << ": " << reply.status().ToString();
    EXPECT_EQ(reply->kind, wire::Kind::kError) << c.name;
    EXPECT_FALSE(reply->error.ok()) << c.name;
    EXPECT_FALSE(reply->error.message().empty()) << c.name;
    if (!c.expect.empty()) {
      EXPECT_NE(reply->error.message().find(c.expect), std::string::npos) << c.name << ": " << reply->error.message();
    }
  }
  EXPECT_GE(cluster->shards[0]->stats().errors, cases.size());
  EXPECT_EQ(cluster->shards[0]->stats().applied_steps, 0u);
  EXPECT_EQ(pull_table0(), before) << "a refused message changed the shard";

  // A good client still trains against the same shard afterwards.
  auto reports = cluster->Train(image);
  ASSERT_TRUE(reports[0].ok()) << reports[0].status().ToString();
  EXPECT_EQ(cluster->shards[0]->stats().applied_steps, 12u);
  ExpectBitIdentical(FlattenParams(*reports[0]->model), SingleProcessParams(cluster->config, image));
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
    auto initial = HashGridModel::Create(cluster->config, 2, 3);
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
    EXPECT_EQ(moved_unread, 0u) << codec << ": rows no batch touched received updates";
    EXPECT_LT(reports[0]->bytes_pushed_per_step, SmallConfig(2, 2).training.batch_size * 64.0) << codec;
  }
}

TEST(PsCompressionTest, MalformedCompressedPayloadIsRefusedAndChangesNothing) {
  auto cluster = Cluster::Start(SmallConfig(1, 1));
  const Partition& partition = *cluster->partition;
  std::vector<wire::TableShape> shapes;
  for (uint32_t t = 0; t < partition.n_tables(); ++t) shapes.push_back({partition.table(t).rows, partition.table(t).width});
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
  EXPECT_EQ(cluster->shards[0]->stats().applied_steps, 0u);
  // A well-formed compressed push is accepted and applied.
  reply = raw.Exchange(push([](wire::OutBlock&) {}), shapes);
  ASSERT_TRUE(reply.ok());
  EXPECT_EQ(reply->kind, wire::Kind::kPushAck) << reply->error.ToString();
  EXPECT_EQ(cluster->shards[0]->stats().applied_steps, 1u);
}

TEST(PsShardTest, RowsOfAnotherShardAreRefused) {
  Config config = SmallConfig(1, 2);
  auto cluster = Cluster::Start(config);
  const Partition& partition = *cluster->partition;
  std::vector<wire::TableShape> shapes;
  for (uint32_t t = 0; t < partition.n_tables(); ++t) shapes.push_back({partition.table(t).rows, partition.table(t).width});
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
int FreePortBase() { return 20000 + (getpid() % 2000) * 10; }

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
