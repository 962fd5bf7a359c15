// What a process reads back when it restarts, against the defects the
// fuzz targets of these boundaries found (fuzz/shard_checkpoint_fuzz.cc,
// fuzz/worker_checkpoint_fuzz.cc, fuzz/params_file_fuzz.cc): a shard that
// owns no row of a table restores its state (a memcpy from a null vector was
// undefined behaviour, reported by UBSan); values no training makes (NaN,
// infinite or huge parameters, NaN moments, a negative v, NaN residuals) are
// refused naming the file, table and row instead of going into training;
// worker Adam's state is refused by its size before the tables' state is
// made; the params file is read only as a regular file.
#include <fcntl.h>
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cmath>
#include <cstring>
#include <filesystem>
#include <limits>

#include "common/checkpoint_files.h"
#include "common/sharding.h"
#include "common/state_bytes.h"
#include "kernels/cpu/error_feedback.h"
#include "server/shard_checkpoint.h"
#include "server/shard_store.h"
#include "worker/params_file.h"
#include "worker/worker_adam.h"

namespace gridsync {
namespace {

namespace fs = std::filesystem;

std::string TempDir() {
  const std::string dir = (fs::temp_directory_path() /
                           ("gridsync-restart-" + std::to_string(::getpid()) + "-" +
                            ::testing::UnitTest::GetInstance()->current_test_info()->name()))
                              .string();
  fs::remove_all(dir);
  fs::create_directories(dir);
  return dir;
}

// A level and an MLP matrix over two shards by rows: shard 1 owns no row of
// the level (one block of rows, dealt to shard 0).
Partition TwoTables() {
  return *Partition::Make({{"level0", 16, 2}, {"mlp0", 8, 4}}, 2, ModelParallelDim::kRow);
}

// Steps row 0 of every table the shard owns, so its state is not all zero.
void Step(ShardStore* store, const Partition& partition) {
  store->PrepareStep();
  for (uint32_t t = 0; t < partition.n_tables(); ++t) {
    if (partition.Owner(t, 0, 0) != store->shard()) continue;
    const std::vector<uint32_t> rows = {0};
    const std::vector<float> values(store->table_width(t), 0.5f);
    wire::Block block;
    block.table = t;
    block.width = store->table_width(t);
    block.row_count = 1;
    block.rows = rows;
    block.values = values;
    store->ApplyDirect(block, 0, 1);
  }
}

Status LoadState(const std::string& dir, const Partition& partition, uint32_t shard,
                 const std::string& state) {
  ShardStore shapes(partition, shard, AdamHyper{});
  nlohmann::json shape = nlohmann::json::array();
  for (uint32_t t = 0; t < shapes.n_tables(); ++t) {
    shape.push_back({shapes.table_rows(t), shapes.table_width(t)});
  }
  // Written as a forger would: manifest, size and checksum all agree.
  EXPECT_TRUE(WriteCheckpointPart(dir, 3, ShardPart(shard), state, shape).ok());
  ShardStore store(partition, shard, AdamHyper{});
  return LoadShardCheckpoint(dir, shard, 3, &store);
}

TEST(RestartFilesTest, AShardOwningNoRowOfATableRestoresItsState) {
  const std::string dir = TempDir();
  const Partition partition = TwoTables();
  ASSERT_EQ(partition.LocalRows(1, 0), 0u) << "shard 1 must own no row of level0";
  ShardStore store(partition, 1, AdamHyper{});
  Step(&store, partition);
  ASSERT_TRUE(WriteShardCheckpoint(dir, 1, 3, store).ok());
  ShardStore restored(partition, 1, AdamHyper{});
  const Status loaded = LoadShardCheckpoint(dir, 1, 3, &restored);
  ASSERT_TRUE(loaded.ok()) << loaded.ToString();
  std::string want, got;
  store.AppendState(&want);
  restored.AppendState(&got);
  EXPECT_EQ(got, want);
  fs::remove_all(dir);
}

TEST(RestartFilesTest, ShardValuesNoTrainingMakesAreRefusedNamingTheValue) {
  const std::string dir = TempDir();
  const Partition partition = TwoTables();
  ShardStore store(partition, 0, AdamHyper{});
  Step(&store, partition);
  std::string state;
  store.AppendState(&state);
  ASSERT_TRUE(LoadState(dir, partition, 0, state).ok());
  // Table 0's arrays: params, m, v (rows x 2 floats each), then step counts.
  const size_t n = store.table_rows(0) * store.table_width(0);
  const float nan = std::numeric_limits<float>::quiet_NaN();
  const float inf = std::numeric_limits<float>::infinity();
  const struct {
    size_t index;  // float index into the state
    float value;
    const char* words;
  } forged[] = {
      {3, nan, "table 0: parameter 3 of local row 1, column 1 is nan; allowed: finite and at most"},
      {0, 1e16f, "table 0: parameter 0 of local row 0, column 0 is 1e+16"},
      {0, -inf, "is -inf; allowed: finite"},
      {n + 2, inf, "table 0: Adam's m at row 1, column 0 is inf; allowed: a finite value"},
      {2 * n + 5, -1.0f,
       "table 0: Adam's v at row 2, column 1 is -1.000000; allowed: a finite "
       "value of at least 0"},
      {2 * n + 1, nan, "Adam's v at row 0, column 1 is nan"},
  };
  for (const auto& f : forged) {
    std::string bad = state;
    std::memcpy(bad.data() + f.index * sizeof(float), &f.value, sizeof(float));
    const Status refused = LoadState(dir, partition, 0, bad);
    EXPECT_EQ(refused.code(), StatusCode::kCorruption) << refused.ToString();
    EXPECT_NE(refused.message().find(f.words), std::string::npos) << refused.ToString();
    EXPECT_NE(refused.message().find("shard-0.bin"), std::string::npos) << refused.ToString();
  }
  fs::remove_all(dir);
}

TEST(RestartFilesTest, WorkerStateValuesNoTrainingMakesAreRefused) {
  // A residual that is not finite.
  cpu::ErrorFeedback feedback;
  const uint32_t rows[] = {2, 5};
  const float values[] = {0.5f, std::numeric_limits<float>::quiet_NaN(), 1.0f, 2.0f};
  feedback.Assign(uint64_t{1} << 32, 2, rows, 2, values);
  std::string residuals;
  feedback.AppendState(&residuals);
  cpu::ErrorFeedback restored;
  std::string_view in = residuals;
  const Status refused = restored.RestoreState(&in);
  EXPECT_EQ(refused.code(), StatusCode::kCorruption) << refused.ToString();
  EXPECT_NE(refused.message().find(
                "table 1 (columns from 0), row 2 holds the residual nan; allowed: finite values"),
            std::string::npos)
      << refused.ToString();
  EXPECT_EQ(restored.Keys().size(), 0u) << "a refused state leaves nothing";

  // Worker Adam: a negative v; and a state too short for the tables it
  // flags, refused by its size.
  const Partition partition = TwoTables();
  WorkerAdam adam(partition, AdamHyper{});
  adam.State(1)->v[3] = -0.25f;
  std::string state;
  adam.AppendState(&state);
  std::string_view adam_in = state;
  const Status negative = WorkerAdam(partition, AdamHyper{}).RestoreState(&adam_in, 5);
  EXPECT_EQ(negative.code(), StatusCode::kCorruption) << negative.ToString();
  EXPECT_NE(negative.message().find("worker Adam: table 1: Adam's v at row 0, column 3 is "
                                    "-0.250000; allowed: a finite value of at least 0"),
            std::string::npos)
      << negative.ToString();
  const std::string flags = "\1\1";
  std::string_view short_in = flags;
  const Status too_short = WorkerAdam(partition, AdamHyper{}).RestoreState(&short_in, 5);
  EXPECT_EQ(too_short.code(), StatusCode::kCorruption) << too_short.ToString();
  EXPECT_NE(too_short.message().find("is shorter than its 16 rows (1 bytes left; allowed: 320)"),
            std::string::npos)
      << too_short.ToString();
}

TEST(RestartFilesTest, TheParamsFileIsReadOnlyAsARegularFileOfWholeFloats) {
  const std::string dir = TempDir();
  const std::string path = dir + "/params.bin";
  const std::vector<float> floats = {1.0f, -2.5f, 3.0f};
  {
    std::string bytes(sizeof(float) * floats.size(), '\0');
    std::memcpy(bytes.data(), floats.data(), bytes.size());
    ASSERT_TRUE(WriteFileAtomically(path, bytes).ok());
  }
  auto read = ReadParams(path);
  ASSERT_TRUE(read.ok()) << read.status().ToString();
  EXPECT_EQ(*read, floats);
  fs::resize_file(path, 10);
  read = ReadParams(path);
  EXPECT_EQ(read.status().code(), StatusCode::kCorruption);
  EXPECT_NE(read.status().message().find("10 bytes, not whole float32s; allowed: a multiple of 4"),
            std::string::npos)
      << read.status().ToString();

  // A folder (it seemed to hold 2^63 - 1 bytes), a FIFO (it was waited on
  // with no writer: held open here so that a failing build does not hang),
  // a device (/dev/zero read as no parameters at all).
  fs::remove(path);
  fs::create_directory(path);
  read = ReadParams(path);
  EXPECT_EQ(read.status().code(), StatusCode::kIOError) << read.status().ToString();
  EXPECT_NE(read.status().message().find(path + " is no regular file"), std::string::npos)
      << read.status().ToString();
  fs::remove(path);
  ASSERT_EQ(::mkfifo(path.c_str(), 0600), 0);
  const int held = ::open(path.c_str(), O_RDWR | O_NONBLOCK);
  ASSERT_GE(held, 0);
  read = ReadParams(path);
  ::close(held);
  EXPECT_EQ(read.status().code(), StatusCode::kIOError) << read.status().ToString();
  EXPECT_NE(read.status().message().find(path + " is no regular file"), std::string::npos)
      << read.status().ToString();
  fs::remove(path);
  fs::create_symlink("/dev/zero", path);
  read = ReadParams(path);
  EXPECT_EQ(read.status().code(), StatusCode::kIOError) << read.status().ToString();
  fs::remove_all(dir);
}

}  // namespace
}  // namespace gridsync
