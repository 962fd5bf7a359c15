// Reading a checkpoint's files trusts none of their bytes
// (common/checkpoint_files.h): a .bin of another size than its manifest (or
// the shard's state) says is refused before it is read, and a manifest that
// is no JSON object, lacks a field or holds one of the wrong type is refused
// with a Status naming the file and the field, never an exception (one
// aborted gridsync-ps at startup). Sizes are made with sparse files: a
// refusal that read them would take seconds and gigabytes.
#include "common/checkpoint_files.h"

#include <gtest/gtest.h>
#include <sched.h>
#include <spdlog/fmt/fmt.h>
#include <spdlog/sinks/ostream_sink.h>
#include <spdlog/spdlog.h>
#include <sys/mount.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <optional>
#include <sstream>

#include "common/sharding.h"
#include "server/shard_checkpoint.h"
#include "server/shard_store.h"
#include "tests/test_util.h"

namespace gridsync {
namespace {

namespace fs = std::filesystem;

class CheckpointFilesTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = (fs::temp_directory_path() /
            ("gridsync-ckpt-files-" + std::to_string(::getpid()) + "-" +
             ::testing::UnitTest::GetInstance()->current_test_info()->name()))
               .string();
    fs::remove_all(dir_);
    ASSERT_TRUE(WriteCheckpointPart(dir_, 5, "shard-0", data_, shape_).ok());
  }
  void TearDown() override { fs::remove_all(dir_); }

  std::string Path(const char* ext) const { return dir_ + "/step-5/shard-0" + ext; }
  Result<std::string> Read() const { return ReadCheckpointPart(dir_, 5, "shard-0", shape_); }
  void WriteManifest(const std::string& text) const { std::ofstream(Path(".json")) << text; }

  std::string dir_;
  const std::string data_ = "sixteen bytes!!!";
  const nlohmann::json shape_ = nlohmann::json::array({{8, 2}});
};

TEST_F(CheckpointFilesTest, TheFilesRoundTrip) {
  auto read = Read();
  ASSERT_TRUE(read.ok()) << read.status().ToString();
  EXPECT_EQ(*read, data_);
}

// A step the folder does not hold (a mistyped --resume-step) is NotFound
// naming the steps it does hold, not only a missing file.
TEST_F(CheckpointFilesTest, AStepNotHeldNamesTheHeldSteps) {
  ASSERT_TRUE(WriteCheckpointPart(dir_, 9, "shard-0", data_, shape_).ok());
  ASSERT_TRUE(WriteCheckpointPart(dir_, 7, "shard-1", data_, shape_).ok());  // not shard-0's
  const auto refused = ReadCheckpointPart(dir_, 6, "shard-0", shape_);
  ASSERT_FALSE(refused.ok());
  EXPECT_EQ(refused.status().code(), StatusCode::kNotFound);
  EXPECT_NE(refused.status().message().find("no checkpoint of step 6 for shard-0 in " + dir_ +
                                            "; allowed: a step it holds (5, 9)"),
            std::string::npos)
      << refused.status().ToString();
  const auto none = ReadCheckpointPart(dir_ + "/empty", 6, "shard-0", shape_);
  ASSERT_FALSE(none.ok());
  EXPECT_NE(none.status().message().find("allowed: a step it holds (none)"), std::string::npos)
      << none.status().ToString();
}

// A fresh run in a folder of an ended one replaces its checkpoints as it
// writes its own (a new job under units on a long-running coordinator);
// each step of another run that goes is logged, naming both runs. Steps of
// its own run go without a word.
TEST_F(CheckpointFilesTest, RemovingAnotherRunsStepIsLogged) {
  std::ostringstream out;
  auto previous = spdlog::default_logger();
  spdlog::set_default_logger(std::make_shared<spdlog::logger>(
      "ckpt", std::make_shared<spdlog::sinks::ostream_sink_mt>(out)));
  ASSERT_TRUE(WriteCheckpointPart(dir_, 7, "shard-0", data_, shape_, {}, "aaaa").ok());
  ASSERT_TRUE(WriteCheckpointPart(dir_, 10, "shard-0", data_, shape_, {}, "bbbb").ok());
  EXPECT_EQ(out.str().find("of step 7"), std::string::npos) << "step 7 is kept: " << out.str();
  ASSERT_TRUE(WriteCheckpointPart(dir_, 20, "shard-0", data_, shape_, {}, "bbbb").ok());
  ASSERT_TRUE(WriteCheckpointPart(dir_, 30, "shard-0", data_, shape_, {}, "bbbb").ok());
  spdlog::set_default_logger(previous);
  const std::string log = out.str();
  EXPECT_NE(log.find("removing shard-0's checkpoint of step 5 of another run (unnamed): this "
                     "run (bbbb)"),
            std::string::npos)
      << log;
  EXPECT_NE(log.find("checkpoint of step 7 of another run (aaaa)"), std::string::npos) << log;
  EXPECT_EQ(log.find("step 10"), std::string::npos) << "its own run's step: " << log;
  EXPECT_EQ(HeldSteps(dir_, "shard-0"), (std::vector<uint64_t>{20, 30}));
}

// A hostile fault probe: a disk that held two steps and not a third failed
// every checkpoint after the second for the rest of the run (the old steps
// went only after a new one was written), and left an empty folder for
// each. In a child with a mount namespace of its own: 2.5 MiB of tmpfs,
// steps of 1 MiB.
TEST(CheckpointFilesDiskTest, ADiskOfTwoStepsKeepsTakingCheckpoints) {
  const std::string dir =
      (fs::temp_directory_path() / ("gridsync-ckpt-disk-" + std::to_string(::getpid()))).string();
  fs::create_directories(dir);
  const pid_t child = ::fork();
  ASSERT_GE(child, 0);
  if (child == 0) {
    if (::unshare(CLONE_NEWNS) != 0 ||
        ::mount("none", "/", nullptr, MS_REC | MS_PRIVATE, nullptr) != 0 ||
        ::mount("none", dir.c_str(), "tmpfs", 0, "size=2560k") != 0) {
      ::_exit(77);
    }
    const std::string data(1 << 20, 'x');
    const nlohmann::json shape = nlohmann::json::array({{8, 2}});
    int failed = 0;
    for (uint64_t step : {50, 100, 150, 200, 250}) {
      // keep: the newest step every part holds, as a shard passes it.
      const std::vector<uint64_t> keep = {step - 50};
      if (!WriteCheckpointPart(dir, step, "shard-0", data, shape, keep, "").ok()) ++failed;
    }
    const bool kept = HeldSteps(dir, "shard-0") == std::vector<uint64_t>{200, 250};
    ::_exit(failed == 0 && kept && fs::exists(dir + "/step-250/shard-0.bin") ? 0 : 1);
  }
  int status = 0;
  ASSERT_EQ(::waitpid(child, &status, 0), child);
  fs::remove_all(dir);
  ASSERT_TRUE(WIFEXITED(status));
  if (WEXITSTATUS(status) == 77) GTEST_SKIP() << "no mount namespace or tmpfs here (needs root)";
  EXPECT_EQ(WEXITSTATUS(status), 0) << "a checkpoint failed, or the steps held are not 200, 250";
}

// A step folder that is a symbolic link is none of this folder's steps: a
// hostile probe linked another run's newest step in, the job resumed from
// it, and the cleanup of old steps deleted that run's files through the
// link. Neither resume, cleanup nor a write goes through one now.
TEST_F(CheckpointFilesTest, AStepFolderThatIsALinkIsNeitherReadNorWrittenNorRemoved) {
  const std::string other = dir_ + "-other";
  fs::remove_all(other);
  ASSERT_TRUE(WriteCheckpointPart(other, 20, "shard-0", data_, shape_, {}, "0123abcd").ok());
  fs::create_directory_symlink(other + "/step-20", dir_ + "/step-20");
  EXPECT_EQ(LatestCompleteStep(dir_, {"shard-0"}), 5u);
  EXPECT_EQ(HeldSteps(dir_, "shard-0"), (std::vector<uint64_t>{5}));
  // Cleanup (keeps 25 and 5) passes the link by; the linked run keeps its step.
  ASSERT_TRUE(WriteCheckpointPart(dir_, 25, "shard-0", data_, shape_).ok());
  EXPECT_TRUE(fs::exists(other + "/step-20/shard-0.json"));
  EXPECT_TRUE(fs::exists(other + "/step-20/shard-0.bin"));
  // A write of the linked step is refused, not made into the other folder.
  const Status write = WriteCheckpointPart(dir_, 20, "shard-0", data_, shape_);
  EXPECT_FALSE(write.ok());
  EXPECT_NE(write.message().find("step-20 is a symbolic link, not a folder of checkpoint.dir"),
            std::string::npos)
      << write.ToString();
  auto kept = ReadCheckpointPart(other, 20, "shard-0", shape_);
  ASSERT_TRUE(kept.ok()) << kept.status().ToString();
  fs::remove_all(other);
}

// A write that crashed left its temporary file (WriteFileAtomically's
// <part>.bin.tmp-<pid>-<letters>, as large as the part's state) in the step
// folder, and the folder, never empty, was never removed: every crash
// mid-checkpoint kept a checkpoint's worth of disk for good. The part's
// own leftovers go with its files of that step; another part's stay (its
// writer may be writing now), and so does their folder.
TEST_F(CheckpointFilesTest, ACrashedWritesTemporaryFilesGoWithItsStep) {
  const auto plant = [&](const std::string& name) {
    fs::create_directories(fs::path(name).parent_path());
    std::ofstream(name) << "partial";
  };
  plant(dir_ + "/step-5/shard-0.bin.tmp-4242-abcdefgh");
  plant(dir_ + "/step-5/shard-0.json.tmp-4242-ijklmnop");
  plant(dir_ + "/step-5/shard-1.bin.tmp-77-qrstuvwx");
  plant(dir_ + "/step-5/shard-01.bin.tmp-78-qrstuvwx");   // another part, its name a prefix
  plant(dir_ + "/step-7/shard-0.bin.tmp-4243-yzabcdef");  // crashed at step 7's first write
  // Step 10 keeps 10 and 5; step 7, a later folder of no manifest, goes.
  ASSERT_TRUE(WriteCheckpointPart(dir_, 10, "shard-0", data_, shape_).ok());
  EXPECT_FALSE(fs::exists(dir_ + "/step-7"));
  EXPECT_TRUE(fs::exists(dir_ + "/step-5/shard-0.bin.tmp-4242-abcdefgh"));
  // Step 15 keeps 15 and 10: step 5's files and this part's leftovers go.
  ASSERT_TRUE(WriteCheckpointPart(dir_, 15, "shard-0", data_, shape_).ok());
  std::vector<std::string> left;
  for (const auto& entry : fs::directory_iterator(dir_ + "/step-5")) {
    left.push_back(entry.path().filename().string());
  }
  std::sort(left.begin(), left.end());
  EXPECT_EQ(left, (std::vector<std::string>{"shard-01.bin.tmp-78-qrstuvwx",
                                            "shard-1.bin.tmp-77-qrstuvwx"}));
  EXPECT_EQ(HeldSteps(dir_, "shard-0"), (std::vector<uint64_t>{10, 15}));
}

// gridsync checkpoints lists the newest steps and then runs the launcher's
// choice over them: through one IntactMemo each part's files of a step are
// read once (a shard's .bin is its whole state; the newest step's were
// read twice). The memo answers as the first read did.
TEST_F(CheckpointFilesTest, AnIntactMemoReadsEachPartOfAStepOnce) {
  IntactMemo memo;
  ASSERT_TRUE(memo.Check(dir_, 5, "shard-0", nullptr).ok());
  {
    std::fstream f(Path(".bin"), std::ios::in | std::ios::out | std::ios::binary);
    f.seekp(3);
    f.put('\x5a');
  }
  EXPECT_TRUE(memo.Check(dir_, 5, "shard-0", nullptr).ok()) << "read again";
  EXPECT_EQ(CheckCheckpointPartIntact(dir_, 5, "shard-0").code(), StatusCode::kCorruption);
  EXPECT_EQ(memo.Check(dir_, 6, "shard-0", nullptr).code(), StatusCode::kNotFound);
  IntactMemo fresh;
  EXPECT_EQ(NewestIntactCompleteStep(dir_, {"shard-0"}, 5, nullptr, nullptr, &fresh), 0u);
  EXPECT_EQ(NewestIntactCompleteStep(dir_, {"shard-0"}, 5, nullptr, nullptr, &memo), 5u);
}

// gridsync launch --resume checks every part's files of a step before
// anything starts, without the shapes only the parts' processes know, and
// looks below a step whose files are damaged.
TEST_F(CheckpointFilesTest, IntactFilesAreCheckedWithoutTheShapeAndOlderStepsFound) {
  ASSERT_TRUE(WriteCheckpointPart(dir_, 9, "shard-0", data_, shape_).ok());
  EXPECT_TRUE(CheckCheckpointPartIntact(dir_, 9, "shard-0").ok());
  {
    std::fstream bin(dir_ + "/step-9/shard-0.bin", std::ios::in | std::ios::out | std::ios::binary);
    bin.seekp(3);
    bin.put('\xff');
  }
  const Status damaged = CheckCheckpointPartIntact(dir_, 9, "shard-0");
  EXPECT_EQ(damaged.code(), StatusCode::kCorruption) << damaged.ToString();
  EXPECT_NE(damaged.message().find("checksum"), std::string::npos) << damaged.ToString();
  EXPECT_TRUE(CheckCheckpointPartIntact(dir_, 5, "shard-0").ok());
  EXPECT_EQ(CheckCheckpointPartIntact(dir_, 7, "shard-0").code(), StatusCode::kNotFound);
  EXPECT_EQ(LatestCompleteStep(dir_, {"shard-0"}), 9u);
  EXPECT_EQ(LatestCompleteStep(dir_, {"shard-0"}, 9), 5u);
  EXPECT_EQ(LatestCompleteStep(dir_, {"shard-0"}, 5), 0u);
  // A manifest whose .bin is gone is damage too (the .bin is written first),
  // and setting the files aside leaves them for a look, no longer a step.
  fs::remove(dir_ + "/step-5/shard-0.bin");
  EXPECT_EQ(CheckCheckpointPartIntact(dir_, 5, "shard-0").code(), StatusCode::kCorruption);
  ASSERT_TRUE(SetPartAside(dir_, 9, "shard-0").ok());
  EXPECT_TRUE(fs::exists(dir_ + "/step-9/shard-0.bin.damaged"));
  EXPECT_TRUE(fs::exists(dir_ + "/step-9/shard-0.json.damaged"));
  EXPECT_EQ(HeldSteps(dir_, "shard-0"), (std::vector<uint64_t>{5}));
}

// A manifest or .bin that is no regular file (a folder, a FIFO) is damage,
// passed over for the older intact step like a bad checksum: a manifest
// that was a folder refused the whole resume (exit 3) where step 5 was
// intact, and such a .bin kept its step for the shard to fail on at start
// (a hostile probe). A FIFO is judged without being opened.
TEST_F(CheckpointFilesTest, AManifestOrBinThatIsNoFileIsDamage) {
  ASSERT_TRUE(WriteCheckpointPart(dir_, 9, "shard-0", data_, shape_).ok());
  ASSERT_TRUE(WriteCheckpointPart(dir_, 9, "shard-1", data_, shape_).ok());
  fs::remove(dir_ + "/step-9/shard-0.json");
  fs::create_directory(dir_ + "/step-9/shard-0.json");
  fs::remove(dir_ + "/step-9/shard-1.bin");
  ASSERT_EQ(::mkfifo((dir_ + "/step-9/shard-1.bin").c_str(), 0600), 0);
  const Status manifest = CheckCheckpointPartIntact(dir_, 9, "shard-0");
  EXPECT_EQ(manifest.code(), StatusCode::kCorruption) << manifest.ToString();
  EXPECT_NE(manifest.message().find("shard-0.json is a folder, where gridsync writes a file"),
            std::string::npos)
      << manifest.ToString();
  const Status bin = CheckCheckpointPartIntact(dir_, 9, "shard-1");
  EXPECT_EQ(bin.code(), StatusCode::kCorruption) << bin.ToString();
  EXPECT_NE(bin.message().find("shard-1.bin is a FIFO"), std::string::npos) << bin.ToString();
  ASSERT_TRUE(WriteCheckpointPart(dir_, 5, "shard-1", data_, shape_).ok());
  std::vector<DamagedPart> damaged;
  EXPECT_EQ(NewestIntactCompleteStep(dir_, {"shard-0", "shard-1"}, 9, &damaged), 5u);
  ASSERT_EQ(damaged.size(), 1u);
  EXPECT_EQ(damaged[0].step, 9u);
}

// The peak of this process's resident memory, in bytes, since the last
// ResetPeakRss (/proc/self/status's VmHWM).
uint64_t PeakRssBytes() {
  std::ifstream status("/proc/self/status");
  std::string line;
  while (std::getline(status, line)) {
    if (line.rfind("VmHWM:", 0) == 0) return std::stoull(line.substr(6)) * 1024;
  }
  return 0;
}
bool ResetPeakRss() { return static_cast<bool>(std::ofstream("/proc/self/clear_refs") << "5"); }

// The intact check (gridsync checkpoints, launch --resume) read the whole
// .bin into memory to hash it: a forged manifest claiming a sparse file of
// gigabytes took that much memory (6 GiB: 6.3 GB resident, a hostile
// probe), and one of 20 GB would call the OOM killer. It is hashed in
// pieces now, MAC included.
TEST_F(CheckpointFilesTest, TheIntactCheckHashesABinOfAnySizeInLittleMemory) {
  constexpr uint64_t kClaimed = uint64_t{320} << 20;
  nlohmann::json manifest;
  std::ifstream(Path(".json")) >> manifest;
  manifest["bytes"] = kClaimed;
  WriteManifest(manifest.dump());
  fs::resize_file(Path(".bin"), kClaimed);  // sparse: no disk taken
  if (!ResetPeakRss()) GTEST_SKIP() << "cannot reset the peak RSS (/proc/self/clear_refs)";
  const uint64_t before = PeakRssBytes();
  const Status checked = CheckCheckpointPartIntact(dir_, 5, "shard-0");
  const uint64_t peak = PeakRssBytes();
  EXPECT_EQ(checked.code(), StatusCode::kCorruption) << checked.ToString();
  EXPECT_NE(checked.message().find("checksum"), std::string::npos) << checked.ToString();
  EXPECT_LT(peak, before + (uint64_t{64} << 20))
      << "the check of a " << kClaimed << "-byte .bin took " << (peak - before) << " bytes";
}

// What a folder without a step to resume from holds is named: a changed
// ps.shards read only "no complete checkpoint ... from each of the 3
// shards", and a FIFO there read the same.
TEST_F(CheckpointFilesTest, WhatAFolderHoldsIsDescribed) {
  ASSERT_TRUE(WriteCheckpointPart(dir_, 5, "shard-1", data_, shape_).ok());
  ASSERT_TRUE(WriteCheckpointPart(dir_, 9, "shard-0", data_, shape_).ok());
  EXPECT_EQ(DescribeHeldParts(dir_), dir_ + " holds step 9 (shard-0); step 5 (shard-0, shard-1)");
  EXPECT_EQ(DescribeHeldParts(dir_ + "/step-5/shard-0.json"),
            dir_ + "/step-5/shard-0.json is a regular file, not a folder");
  EXPECT_NE(DescribeHeldParts(dir_ + "/none").find("No such file or directory"), std::string::npos);
  // A copy named "step-009" read as step 9 through stoull while StepDir(9)
  // is another folder, and was passed over without a word. Such names are
  // not steps, and the description names them.
  fs::rename(dir_ + "/step-9", dir_ + "/step-009");
  fs::create_directory(dir_ + "/step-+7");
  EXPECT_EQ(HeldSteps(dir_, "shard-0"), (std::vector<uint64_t>{5}));
  EXPECT_EQ(DescribeHeldParts(dir_),
            dir_ +
                " holds step 5 (shard-0, shard-1); ignored, as not a step folder gridsync writes "
                "(step-N, a folder, N without leading zeros): \"step-+7\", \"step-009\"");
}

TEST_F(CheckpointFilesTest, ABinLargerThanItsManifestSaysIsRefusedUnread) {
  // 5 GiB of holes: read, it would take seconds and more memory than the
  // test has; refused by its size, it takes neither.
  fs::resize_file(Path(".bin"), uint64_t{5} << 30);
  const auto refused = Read();
  ASSERT_FALSE(refused.ok());
  EXPECT_EQ(refused.status().code(), StatusCode::kCorruption);
  EXPECT_NE(refused.status().message().find("shard-0.bin: 5368709120 bytes; the manifest says 16"),
            std::string::npos)
      << refused.status().ToString();
}

TEST_F(CheckpointFilesTest, ABinShorterThanItsManifestSaysIsRefused) {
  fs::resize_file(Path(".bin"), 9);
  const auto refused = Read();
  ASSERT_FALSE(refused.ok());
  EXPECT_EQ(refused.status().code(), StatusCode::kCorruption);
  EXPECT_NE(refused.status().message().find("shard-0.bin: 9 bytes; the manifest says 16"),
            std::string::npos)
      << refused.status().ToString();
}

TEST_F(CheckpointFilesTest, ABinOfAnotherSizeThanTheShardsStateIsRefusedUnread) {
  const Config config = testing::SmallDistributedConfig(1, GradientSyncMode::kPs, 4);
  const Partition partition =
      *Partition::Make(testing::SpecOf(config).model.tables, 2, ModelParallelDim::kRow);
  ShardStore store(partition, 0, AdamHyper{});
  ASSERT_TRUE(WriteShardCheckpoint(dir_, 0, 7, store).ok());
  const std::string base = dir_ + "/step-7/shard-0";
  std::ifstream in(base + ".json");
  auto manifest = nlohmann::json::parse(in);
  // A manifest and a .bin that agree with each other on 6 GiB, not with the
  // partition: refused before the 6 GiB are read.
  const uint64_t huge = uint64_t{6} << 30;
  manifest["bytes"] = huge;
  std::ofstream(base + ".json") << manifest.dump();
  fs::resize_file(base + ".bin", huge);
  ShardStore loaded(partition, 0, AdamHyper{});
  const Status refused = LoadShardCheckpoint(dir_, 0, 7, &loaded);
  EXPECT_EQ(refused.code(), StatusCode::kInvalidArgument) << refused.ToString();
  EXPECT_NE(refused.message().find(fmt::format("shard-0.bin: {} bytes; this process's state is {} "
                                               "bytes",
                                               huge, store.StateBytes())),
            std::string::npos)
      << refused.ToString();
  std::string state;
  store.AppendState(&state);
  EXPECT_EQ(store.StateBytes(), state.size());
}

TEST_F(CheckpointFilesTest, ManifestsOfTheWrongShapeAreRefusedNamingTheField) {
  const std::string good = fmt::format(
      R"({{"step":5,"part":"shard-0","shape":[[8,2]],"bytes":16,"fnv1a64":"{}"}})",
      nlohmann::json::parse(std::ifstream(Path(".json")))["fnv1a64"].get<std::string>());
  auto with = [&](const std::string& from, const std::string& to) {
    std::string text = good;
    const size_t at = text.find(from);
    EXPECT_NE(at, std::string::npos) << from;
    return text.replace(at, from.size(), to);
  };
  const std::string deep = std::string(100000, '[') + std::string(100000, ']');
  const std::vector<std::pair<std::string, std::string>> damaged = {
      {with(R"("step":5)", R"("step":"5")"),
       R"(step is a string ("5"); allowed: an unsigned integer)"},
      {with(R"("step":5)", R"("step":-5)"), "step is the number -5; allowed: an unsigned integer"},
      {with(R"("step":5,)", ""), "step is missing; allowed: an unsigned integer"},
      {with(R"("step":5)", R"("step":6)"), "step is 6; allowed: 5"},
      {with(R"("part":"shard-0")", R"("part":0)"), "part is the number 0; allowed: a string"},
      {with(R"("part":"shard-0")", R"("part":"shard-1")"), R"(part is "shard-1")"},
      {with(R"("shape":[[8,2]],)", ""), "shape is missing"},
      {with(R"("bytes":16)", R"("bytes":16.0)"), "bytes is the number 16.0"},
      {with(R"("bytes":16)", R"("bytes":null)"), "bytes is null; allowed: an unsigned integer"},
      {with(R"("bytes":16,)", ""), "bytes is missing"},
      {with(R"("fnv1a64":")", R"("fnv1a64":7,"x":")"), "fnv1a64 is the number 7"},
      {with(R"("fnv1a64":")", R"("fnv1a64":"7)"), "fnv1a64 is a string (\"7"},
      {with(R"("shape":[[8,2]])", R"("shape":)" + deep), "nests deeper than 8 levels"},
      // A second "bytes": the parser kept the last one silently.
      {with(R"("bytes":16)", R"("bytes":16,"bytes":32)"),
       R"(key "bytes" appears twice in one object; allowed: each key once)"},
      {with(R"("shape":[[8,2]])", R"("shape":[{"a":1,"a":2}])"), R"(key "a" appears twice)"},
      {"[5, \"shard-0\"]", "the file is an array; allowed: a JSON object"},
      {"\"shard-0\"", "the file is a string"},
      {good.substr(0, good.size() - 1), "the file is not JSON"},
      {"", "the file is not JSON"},
  };
  for (const auto& [text, words] : damaged) {
    WriteManifest(text);
    std::optional<Result<std::string>> refused;
    EXPECT_NO_THROW(refused.emplace(Read())) << text.substr(0, 200);
    ASSERT_TRUE(refused.has_value());
    ASSERT_FALSE(refused->ok()) << text.substr(0, 200);
    const std::string& message = refused->status().message();
    EXPECT_NE(message.find(Path(".json") + ": "), std::string::npos) << message;
    EXPECT_NE(message.find(words), std::string::npos) << message;
    EXPECT_NE(message.find("allowed: "), std::string::npos) << message;
    EXPECT_LT(message.size(), 1000u) << "a message echoing the file";
  }
  WriteManifest(good);
  EXPECT_TRUE(Read().ok()) << "the table's manifests differ from a good one only as they say";
}

TEST_F(CheckpointFilesTest, AManifestBeyondTheBoundIsRefusedUnread) {
  fs::resize_file(Path(".json"), uint64_t{3} << 30);
  const auto refused = Read();
  ASSERT_FALSE(refused.ok());
  EXPECT_NE(
      refused.status().message().find(fmt::format(
          "shard-0.json: the file holds 3221225472 bytes; allowed: at most {}", kMaxManifestBytes)),
      std::string::npos)
      << refused.status().ToString();
}

TEST_F(CheckpointFilesTest, AFileThatChangedSinceItsSizeWasTakenIsRefused) {
  const std::string path = Path(".bin");
  auto read = ReadFileOfSize(path, 16);
  ASSERT_TRUE(read.ok()) << read.status().ToString();
  EXPECT_EQ(*read, data_);
  const auto shorter = ReadFileOfSize(path, 17);
  ASSERT_FALSE(shorter.ok());
  EXPECT_NE(shorter.status().message().find(path + ": 16 bytes where its size said 17"),
            std::string::npos)
      << shorter.status().ToString();
  const auto longer = ReadFileOfSize(path, 15);
  ASSERT_FALSE(longer.ok());
  EXPECT_NE(longer.status().message().find(path + ": more bytes where its size said 15"),
            std::string::npos)
      << longer.status().ToString();
  EXPECT_EQ(FileSize(dir_ + "/nothing").status().code(), StatusCode::kNotFound);
  EXPECT_EQ(FileSize(dir_).status().code(), StatusCode::kIOError) << "a folder";
}

}  // namespace
}  // namespace gridsync
