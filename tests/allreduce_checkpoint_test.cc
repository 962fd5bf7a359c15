// Checkpoints under gradient_sync "nccl": each worker's part (the model and
// its Adam state, replicated or its model_parallel slice) written every
// checkpoint.every_steps, a run resumed from one ending bit for bit where
// the uninterrupted run ends, and the refusals (no checkpoints to resume
// from, a damaged or foreign part, the settings whose state is not
// checkpointed).
#include <gtest/gtest.h>
#include <unistd.h>

#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <limits>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "common/checkpoint_files.h"
#include "common/config.h"
#include "tests/allreduce_test_util.h"
#include "tests/test_util.h"
#include "worker/image_task.h"
#include "worker/params_file.h"
#include "worker/sync/train.h"

namespace gridsync {
namespace {

namespace fs = std::filesystem;
using testing::ExpectBitIdentical;
using testing::SmallImage;

struct TempDir {
  explicit TempDir(const std::string& name)
      : path((fs::temp_directory_path() / (name + "-" + std::to_string(::getpid()))).string()) {
    fs::remove_all(path);
  }
  ~TempDir() { fs::remove_all(path); }
  const std::string path;
};

Config CheckpointedConfig(const std::string& dir, bool model_parallel) {
  Config c = testing::SmallDistributedConfig(2, GradientSyncMode::kNccl, 12);
  c.checkpoint.every_steps = 4;
  c.checkpoint.dir = dir;
  c.distributed.model_parallel = model_parallel;
  return c;
}

// Every worker from `start_step`, as threads (tests/allreduce_test_util.h).
std::vector<Result<TrainReport>> RunWorkers(const Config& config, const ImageTask& image,
                                            uint64_t start_step) {
  return testing::RunLocal(config, image,
                           [start_step](int, WorkerOptions* o) { o->start_step = start_step; });
}

TEST(AllReduceCheckpointTest, AResumedRunEndsBitForBitWhereTheUninterruptedOneEnds) {
  const ImageTask image = SmallImage();
  for (const bool model_parallel : {false, true}) {
    SCOPED_TRACE(model_parallel ? "model_parallel" : "replicated");
    TempDir dir("gridsync-nccl-ckpt");
    const Config config = CheckpointedConfig(dir.path, model_parallel);
    ASSERT_TRUE(config.CheckRunnable(false).ok()) << config.CheckRunnable(false).ToString();
    auto whole = RunWorkers(config, image, 0);
    for (auto& r : whole) ASSERT_TRUE(r.ok()) << r.status().ToString();
    const std::vector<float> end = FlattenParams(*whole[0]->model);
    ExpectBitIdentical(FlattenParams(*whole[1]->model), end);
    // Steps 4, 8 and 12 were written; each part keeps its two newest.
    for (const char* part : {"worker-0", "worker-1"})
      EXPECT_EQ(HeldSteps(dir.path, part), (std::vector<uint64_t>{8, 12})) << part;
    EXPECT_EQ(LatestCompleteStep(dir.path, {"worker-0", "worker-1"}), 12u);

    // From step 8: the model and Adam's state (m, v and per-row step
    // counts; under model_parallel each worker's own slice) must be those
    // of step 8, or the last 4 steps go elsewhere.
    auto resumed = RunWorkers(config, image, 8);
    for (auto& r : resumed) ASSERT_TRUE(r.ok()) << r.status().ToString();
    ExpectBitIdentical(FlattenParams(*resumed[0]->model), end);
    ExpectBitIdentical(FlattenParams(*resumed[1]->model), end);

    // Writing checkpoints moves nothing: the run without them ends there
    // too.
    Config plain = config;
    plain.checkpoint.every_steps = 0;
    auto unchecked = RunWorkers(plain, image, 0);
    ASSERT_TRUE(unchecked[0].ok()) << unchecked[0].status().ToString();
    ExpectBitIdentical(FlattenParams(*unchecked[0]->model), end);
  }
}

TEST(AllReduceCheckpointTest, AResumeWithoutItsCheckpointOrFromAnotherRunIsRefused) {
  const ImageTask image = SmallImage();
  TempDir dir("gridsync-nccl-refuse");
  // Resuming with checkpoints off: there is no state to resume from; the
  // old behaviour (a fresh model at step 8) would train the wrong model.
  {
    Config off = CheckpointedConfig(dir.path, false);
    off.checkpoint.every_steps = 0;
    auto reports = RunWorkers(off, image, 8);
    ASSERT_FALSE(reports[0].ok());
    EXPECT_NE(reports[0].status().message().find("checkpoint.every_steps is 0"), std::string::npos)
        << reports[0].status().ToString();
  }
  Config config = CheckpointedConfig(dir.path, false);
  // A worker that refuses leaves its peer waiting in the first all-reduce
  // until the timeout (a launcher stops it at once).
  config.distributed.timeout_s = 3;
  for (auto& r : RunWorkers(config, image, 0)) ASSERT_TRUE(r.ok()) << r.status().ToString();
  // No checkpoint of step 4 is left (steps 8 and 12 are): named.
  {
    auto reports = RunWorkers(config, image, 4);
    ASSERT_FALSE(reports[0].ok());
    EXPECT_NE(reports[0].status().ToString().find("step-4"), std::string::npos)
        << reports[0].status().ToString();
  }
  // A replicated run's parts are not a model_parallel run's: the manifest
  // says so before a byte of the state is read.
  {
    auto reports = RunWorkers(CheckpointedConfig(dir.path, true), image, 8);
    ASSERT_FALSE(reports[0].ok());
    EXPECT_NE(reports[0].status().ToString().find("model_parallel"), std::string::npos)
        << reports[0].status().ToString();
  }
  // A forged part (its checksum right) whose first parameter is NaN:
  // refused, naming the file and the parameter, before training takes it.
  {
    const std::string bin = dir.path + "/step-12/worker-0.bin";
    std::ifstream in(bin, std::ios::binary);
    std::string data((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    std::ifstream manifest(dir.path + "/step-12/worker-0.json");
    const auto shape = nlohmann::json::parse(manifest)["shape"];
    const float nan = std::numeric_limits<float>::quiet_NaN();
    std::memcpy(data.data(), &nan, sizeof(nan));
    ASSERT_TRUE(WriteCheckpointPart(dir.path, 12, "worker-0", data, shape).ok());
    auto reports = RunWorkers(config, image, 12);
    ASSERT_FALSE(reports[0].ok());
    EXPECT_NE(reports[0].status().ToString().find("the grid, parameter 0, is nan"),
              std::string::npos)
        << reports[0].status().ToString();
  }
  // A damaged part: refused by its checksum, naming the file.
  {
    const std::string bin = dir.path + "/step-8/worker-1.bin";
    std::fstream file(bin, std::ios::in | std::ios::out | std::ios::binary);
    ASSERT_TRUE(file.is_open());
    file.seekp(100);
    file.put('\x7f');
    file.close();
    auto reports = RunWorkers(config, image, 8);
    ASSERT_FALSE(reports[1].ok());
    EXPECT_EQ(reports[1].status().code(), StatusCode::kCorruption)
        << reports[1].status().ToString();
    EXPECT_NE(reports[1].status().ToString().find("worker-1"), std::string::npos)
        << reports[1].status().ToString();
  }
}

TEST(AllReduceCheckpointTest, CheckpointsAreRefusedWhereTheirStateIsNotCheckpointed) {
  // Each case: the distributed, training and compression sections.
  auto parse = [](const std::string& distributed, const std::string& training,
                  const std::string& compression) {
    auto c =
        Config::Parse(R"({"distributed": {"enable": true, "gradient_sync": "nccl")" + distributed +
                          R"(}, "training": {)" + training + R"(}, "compression": {)" +
                          compression + R"(}, "checkpoint": {"every_steps": 10}})",
                      "ckpt");
    EXPECT_TRUE(c.ok()) << c.status().ToString();
    return std::move(c).value();
  };
  const std::string cpu = R"("device": "cpu")";
  // Allowed: the model trained on the CPU, with or without model_parallel
  // or a 16-bit all-reduce that keeps no residuals.
  for (const Config& c : {parse("", cpu, ""), parse(R"(, "model_parallel": true)", cpu, ""),
                          parse("", cpu, R"("codec": "fp16", "error_feedback": false)")}) {
    const Status s = c.CheckRunnable(false);
    EXPECT_TRUE(s.ok()) << s.ToString();
  }
  // Refused, naming the key and what is allowed: a model that may train on
  // a GPU (auto may pick one) and residuals of the 16-bit all-reduce.
  for (const Config& c : {parse("", "", ""), parse("", R"("device": "cuda")", ""),
                          parse("", cpu, R"("codec": "bf16", "error_feedback": true)")}) {
    const Status s = c.CheckRunnable(false);
    EXPECT_EQ(s.code(), StatusCode::kUnsupported) << s.ToString();
    EXPECT_NE(s.message().find("checkpoint.every_steps=10"), std::string::npos) << s.ToString();
    EXPECT_NE(s.message().find("allowed now"), std::string::npos) << s.ToString();
  }
  // A standalone run keeps no checkpoints.
  const Status standalone = parse("", cpu, "").CheckRunnable(true);
  EXPECT_EQ(standalone.code(), StatusCode::kUnsupported) << standalone.ToString();
}

}  // namespace
}  // namespace gridsync
