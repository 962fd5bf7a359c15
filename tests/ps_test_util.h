// What the parameter-server tests share (ps_test.cc, ps_shard_test.cc,
// ps_optimizer_test.cc): an in-process cluster with worker threads, the
// single-process reference, a raw client that says what a hostile peer
// could, and one worker joined by hand.
#pragma once

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
#include "tests/single_process.h"
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

inline Config SmallConfig(int workers, int shards) {
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
    for (size_t s = 0; s < cluster->servers->n_shards(); ++s)
      cluster->shards.push_back(&cluster->servers->shard(s));
    return cluster;
  }

  // Runs every worker as a thread; returns their reports (rank order).
  // `intra_group`: hybrid's node collectives handed in (WorkerOptions).
  std::vector<Result<TrainReport>> Train(const ImageTask& image, std::vector<int> throttle_ms = {},
                                         uint64_t eval_every = 0,
                                         decltype(WorkerOptions::intra_group) intra_group = {}) {
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
        options.intra_group = intra_group;
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
inline uint64_t AppliedSteps(const PsShard& shard, uint64_t expected) {
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);
  while (shard.stats().applied_steps < expected && std::chrono::steady_clock::now() < deadline)
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  return shard.stats().applied_steps;
}

using testing::SingleProcess;
using testing::TrainSingleProcess;

inline std::vector<float> SingleProcessParams(const Config& config, const ImageTask& image) {
  return FlattenParams(*SingleProcess(config, image).model);
}

// A message about row 1 of table 0 (width 2) from worker `rank` of
// `num_workers` in job `job`: a pull for `min_version`, or a push (or init)
// of the values {1, -1} for `step`.
inline std::vector<zmq::message_t> RowOneMessage(wire::Kind kind, uint64_t request_id, uint64_t job,
                                                 uint64_t min_version, uint32_t rank = 0,
                                                 uint32_t num_workers = 1, uint64_t step = 0) {
  wire::OutHeader h;
  h.kind = kind;
  h.request_id = request_id;
  h.worker_rank = rank;
  h.num_workers = num_workers;
  h.min_version = min_version;
  h.job = job;
  h.step = step;
  wire::OutBlock b;
  b.table = 0;
  b.width = 2;
  b.rows = {1};
  b.row_count = 1;
  if (kind != wire::Kind::kPull) b.values = {1.0f, -1.0f};
  std::vector<wire::OutBlock> blocks;
  blocks.push_back(std::move(b));
  return wire::Encode(h, std::move(blocks));
}

// The table shapes wire::Decode checks messages against.
inline std::vector<wire::TableShape> ShapesOf(const Partition& partition) {
  std::vector<wire::TableShape> shapes;
  for (uint32_t t = 0; t < partition.n_tables(); ++t)
    shapes.push_back({partition.table(t).rows, partition.table(t).width});
  return shapes;
}

class RawClient {
 public:
  explicit RawClient(const std::string& endpoint) : socket_(context_, zmq::socket_type::dealer) {
    socket_.set(zmq::sockopt::linger, 0);
    socket_.connect(endpoint);
  }
  // Sends raw frames and returns the decoded reply.
  Result<wire::Message> Exchange(std::vector<zmq::message_t> frames,
                                 const std::vector<wire::TableShape>& shapes) {
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
inline std::vector<zmq::message_t> PullOfTable0(const Partition& partition, uint64_t request_id,
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

inline std::vector<zmq::message_t> Frames(std::initializer_list<std::string> parts) {
  std::vector<zmq::message_t> frames;
  for (const auto& p : parts) frames.emplace_back(p.data(), p.size());
  return frames;
}

// One shard serving one table of `rows` rows x 2 floats for one worker,
// its options adjusted by `adjust`. The partition outlives the shard
// (which refers to it).
struct OneTableShard {
  std::unique_ptr<Partition> partition;
  std::unique_ptr<PsShard> shard;
};
template <typename Adjust>
OneTableShard StartOneTableShard(uint64_t rows, Consistency consistency, Adjust adjust) {
  OneTableShard one;
  const std::vector<TableInfo> tables = {{"level", rows, 2}};
  auto partition = Partition::Make(tables, 1, ModelParallelDim::kRow);
  EXPECT_TRUE(partition.ok()) << partition.status().ToString();
  if (!partition.ok()) return one;
  one.partition = std::make_unique<Partition>(std::move(partition).value());
  ShardOptions options;
  options.endpoint = "tcp://127.0.0.1:0";
  options.workers = 1;
  options.consistency = consistency;
  adjust(options);
  auto shard = PsShard::Start(*one.partition, options);
  EXPECT_TRUE(shard.ok()) << shard.status().ToString();
  if (shard.ok()) one.shard = std::move(shard).value();
  return one;
}

// Sends `times` messages of frames of assorted sizes on `socket` (a DEALER
// connected to a shard), short and long ZMTP frames and an empty one, and
// reads each reply (an error: they are no gridsync messages); false when a
// reply did not come.
inline bool ExchangeAssortedFrames(zmq::socket_t& socket, int times) {
  for (int i = 0; i < times; ++i) {
    auto frames = Frames({std::string(10, 'a'), std::string(255, 'b'), std::string(256, 'c'),
                          std::string(70000 + i, 'd'), std::string()});
    if (!wire::SendMultipart(socket, frames).ok()) return false;
    if (!wire::ReceiveMultipart(socket, 3000, wire::Limits{}).ok()) return false;
  }
  return true;
}

// A header of `kind` listing one sparse block of one row and no payload
// frames: the 144-byte message that used to crash a shard (a stats header
// whose block passed Decode without row ids, then reached the ownership check).
inline std::vector<zmq::message_t> HeaderWithOneSparseBlock(wire::schema::MessageKind kind) {
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
    // One worker: the image is its job's alone (sent as its pixels' digest).
    static const ImageTask image = ImageTask::FromPixels(2, 2, std::vector<float>(12, 0.5f));
    one.session = JoinPsCluster(one.spec, image, **one.model, options);
    return one;
  }
};

}  // namespace
}  // namespace gridsync
