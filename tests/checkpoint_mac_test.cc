// Checkpoint files under CURVE carry a MAC keyed by the writing role's
// secret (common/checkpoint_mac_key.h): whoever can write checkpoint.dir
// without holding the key can no longer make files that load. Before, a
// step-100 .bin whose manifest's step was edited to 150 was accepted (a
// probe, note 67), and so was any state whose FNV checksum was recomputed.
#include <gtest/gtest.h>
#include <spdlog/fmt/fmt.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "common/checkpoint_files.h"
#include "common/checkpoint_mac_key.h"
#include "common/config.h"
#include "common/sharding.h"
#include "common/wire/curve.h"
#include "server/ps_shard.h"
#include "server/shard_checkpoint.h"
#include "server/shard_store.h"
#include "spec/run_spec.h"
#include "tests/checkpoint_forgery.h"
#include "tests/curve_test_keys.h"
#include "tests/test_util.h"

namespace gridsync {
namespace {

namespace fs = std::filesystem;

bool Contains(const std::string& text, const std::string& part) {
  return text.find(part) != std::string::npos;
}

CheckpointMacKey KeyOf(const wire::CurveKeyPair& pair) {
  auto key = CheckpointMacKey::FromCurveSecret(pair.secret_z85);
  EXPECT_TRUE(key.ok()) << key.status().ToString();
  return *key;
}

TEST(CheckpointMacKeyTest, DerivedFromTheRolesSecretAndNothingElse) {
  const auto a = *wire::GenerateCurveKeyPair();
  const auto b = *wire::GenerateCurveKeyPair();
  const std::string mac = KeyOf(a).Mac("fields", "bin");
  EXPECT_EQ(mac.size(), 64u);
  EXPECT_EQ(mac.find_first_not_of("0123456789abcdef"), std::string::npos) << mac;
  EXPECT_EQ(KeyOf(a).Mac("fields", "bin"), mac);  // every process of the role agrees
  EXPECT_NE(KeyOf(b).Mac("fields", "bin"), mac);
  EXPECT_NE(KeyOf(a).Mac("fields", "bim"), mac);
  EXPECT_NE(KeyOf(a).Mac("fieldsb", "in"), mac);  // the split between them counts
  const auto short_secret = CheckpointMacKey::FromCurveSecret(a.secret_z85.substr(1));
  ASSERT_FALSE(short_secret.ok());
  EXPECT_EQ(short_secret.status().code(), StatusCode::kInvalidArgument);
  EXPECT_TRUE(Contains(short_secret.status().message(), "39 characters; allowed: 40"))
      << short_secret.status().message();
}

class CheckpointMacTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = (fs::temp_directory_path() /
            ("gridsync-ckpt-mac-" + std::to_string(::getpid()) + "-" +
             ::testing::UnitTest::GetInstance()->current_test_info()->name()))
               .string();
    fs::remove_all(dir_);
    ASSERT_TRUE(WriteCheckpointPart(dir_, 100, "shard-0", data_, shape_, {}, run_, &key_).ok());
  }
  void TearDown() override { fs::remove_all(dir_); }

  std::string Path(uint64_t step, const char* ext) const {
    return dir_ + "/step-" + std::to_string(step) + "/shard-0" + ext;
  }
  nlohmann::json Manifest(uint64_t step) const {
    std::ifstream in(Path(step, ".json"));
    return nlohmann::json::parse(in);
  }
  void WriteManifest(uint64_t step, const nlohmann::json& doc) const {
    std::ofstream(Path(step, ".json")) << doc.dump();
  }
  Result<std::string> Read(uint64_t step, const CheckpointMacKey* key) const {
    return ReadCheckpointPart(dir_, step, "shard-0", shape_, std::nullopt, nullptr, key);
  }
  // The step-100 files copied to step `to`, the manifest's step edited to
  // match: what note 67's probe did by hand.
  void CopyAsStep(uint64_t to) const { testing::ForgeStep(dir_, "shard-0", 100, to); }

  const wire::CurveKeyPair shard_keys_ = *wire::GenerateCurveKeyPair();
  const CheckpointMacKey key_ = KeyOf(shard_keys_);
  std::string dir_;
  const std::string data_ = "thirty-two bytes of shard state!";
  const nlohmann::json shape_ = nlohmann::json::array({{8, 2}});
  const std::string run_ = "0123456789abcdef0123456789abcdef";
};

TEST_F(CheckpointMacTest, TheFilesLoadWithTheKeyAndWithout) {
  EXPECT_TRUE(Manifest(100).contains("mac"));
  auto with = Read(100, &key_);
  ASSERT_TRUE(with.ok()) << with.status().ToString();
  EXPECT_EQ(*with, data_);
  // A process without the role's secret (gridsync launch choosing a step)
  // reads them as before, checksum and all.
  auto without = Read(100, nullptr);
  ASSERT_TRUE(without.ok()) << without.status().ToString();
  EXPECT_TRUE(CheckCheckpointPartIntact(dir_, 100, "shard-0").ok());
}

TEST_F(CheckpointMacTest, AManifestWhoseStepWasEditedIsRefused) {
  CopyAsStep(150);
  const auto read = Read(150, &key_);
  ASSERT_FALSE(read.ok());
  EXPECT_EQ(read.status().code(), StatusCode::kCorruption);
  EXPECT_TRUE(Contains(read.status().message(), Path(150, ".json") + ": its mac does not match"))
      << read.status().message();
  EXPECT_TRUE(Contains(read.status().message(), "allowed: files written by this job's processes"))
      << read.status().message();
  // Without CURVE there is nothing to check it with: the limit the header
  // states (the checksum finds damage, not forgery).
  EXPECT_TRUE(Read(150, nullptr).ok());
}

TEST_F(CheckpointMacTest, AForgedStateWithItsChecksumRecomputedIsRefused) {
  const std::string forged = "thirty-two bytes of forged data!";
  ASSERT_EQ(forged.size(), data_.size());
  std::ofstream(Path(100, ".bin"), std::ios::binary | std::ios::trunc) << forged;
  nlohmann::json doc = Manifest(100);
  doc["fnv1a64"] = fmt::format("{:016x}", Fnv1a64(forged));
  WriteManifest(100, doc);
  ASSERT_TRUE(Read(100, nullptr).ok());  // the checksum alone is satisfied
  const auto read = Read(100, &key_);
  ASSERT_FALSE(read.ok());
  EXPECT_EQ(read.status().code(), StatusCode::kCorruption) << read.status().ToString();
  EXPECT_TRUE(Contains(read.status().message(), "its mac does not match"))
      << read.status().message();
}

TEST_F(CheckpointMacTest, AnotherRunNamedInTheManifestIsRefused) {
  nlohmann::json doc = Manifest(100);
  doc["run"] = "fedcba9876543210fedcba9876543210";
  WriteManifest(100, doc);
  const auto read = Read(100, &key_);
  ASSERT_FALSE(read.ok());
  EXPECT_EQ(read.status().code(), StatusCode::kCorruption) << read.status().ToString();
}

TEST_F(CheckpointMacTest, FilesOfAnotherKeyAreRefused) {
  const CheckpointMacKey other = KeyOf(*wire::GenerateCurveKeyPair());
  const auto read = Read(100, &other);
  ASSERT_FALSE(read.ok());
  EXPECT_EQ(read.status().code(), StatusCode::kCorruption) << read.status().ToString();
  EXPECT_TRUE(Contains(read.status().message(), "written with other keys"))
      << read.status().message();
}

TEST_F(CheckpointMacTest, AManifestWithoutAMacIsRefusedUnderCurve) {
  nlohmann::json doc = Manifest(100);
  doc.erase("mac");
  WriteManifest(100, doc);
  EXPECT_TRUE(Read(100, nullptr).ok());
  const auto read = Read(100, &key_);
  ASSERT_FALSE(read.ok());
  // Damage, as a wrong mac: a forgery stripped of its mac must not stand
  // as a step every process then refuses (files of a run without CURVE
  // are set aside the same way, the message saying how to resume them).
  EXPECT_EQ(read.status().code(), StatusCode::kCorruption) << read.status().ToString();
  EXPECT_TRUE(Contains(read.status().message(), "resume files without one with security.mode"))
      << read.status().message();
  EXPECT_TRUE(Contains(read.status().message(), "no mac, while security.curve is on"))
      << read.status().message();
}

TEST_F(CheckpointMacTest, AMalformedMacIsRefusedNamingTheField) {
  for (const nlohmann::json& mac :
       {nlohmann::json("zz"), nlohmann::json(7), nlohmann::json(std::string(64, 'A'))}) {
    nlohmann::json doc = Manifest(100);
    doc["mac"] = mac;
    WriteManifest(100, doc);
    for (const CheckpointMacKey* key : {&key_, static_cast<const CheckpointMacKey*>(nullptr)}) {
      const auto read = Read(100, key);
      ASSERT_FALSE(read.ok()) << mac.dump();
      EXPECT_EQ(read.status().code(), StatusCode::kCorruption);
      EXPECT_TRUE(Contains(read.status().message(), "mac is ")) << read.status().message();
      EXPECT_TRUE(Contains(read.status().message(), "allowed: 64 lowercase hex digits"))
          << read.status().message();
    }
  }
}

// The key each role's processes derive from config.security: the shards'
// and the workers' differ, and there is none without CURVE.
TEST_F(CheckpointMacTest, EachRoleHasItsOwnKeyUnderCurveAndNoneWithout) {
  const std::string keys = dir_ + "/keys";
  ASSERT_NO_FATAL_FAILURE(testing::WriteTestKeys(keys, {"shard", "worker"}));
  Config config;
  config.security.curve = true;
  config.security.keys_dir = keys;
  auto shard = wire::CheckpointMacKeyFor(config, "shard");
  auto worker = wire::CheckpointMacKeyFor(config, "worker");
  ASSERT_TRUE(shard.ok()) << shard.status().ToString();
  ASSERT_TRUE(worker.ok()) << worker.status().ToString();
  ASSERT_TRUE(shard->has_value() && worker->has_value());
  EXPECT_NE((**shard).Mac("f", "b"), (**worker).Mac("f", "b"));
  ASSERT_TRUE(WriteCheckpointPart(dir_, 200, "shard-0", data_, shape_, {}, run_, &**shard).ok());
  EXPECT_TRUE(Read(200, &**shard).ok());
  EXPECT_EQ(Read(200, &**worker).status().code(), StatusCode::kCorruption);
  // A role whose key file is missing is refused by name.
  auto observer = wire::CheckpointMacKeyFor(config, "observer");
  ASSERT_FALSE(observer.ok());
  EXPECT_TRUE(Contains(observer.status().message(), "observer.key")) << observer.status().message();
  config.security.curve = false;
  auto off = wire::CheckpointMacKeyFor(config, "shard");
  ASSERT_TRUE(off.ok());
  EXPECT_FALSE(off->has_value());
}

// The processes take the key from their config: a shard resolved from a
// CURVE config (ShardOptionsFor, as gridsync-ps resolves its options)
// refuses to start from a forged step and starts from the authentic one.
TEST_F(CheckpointMacTest, AShardResolvedUnderCurveRefusesToStartFromAForgedStep) {
  const std::string keys = dir_ + "/keys";
  ASSERT_NO_FATAL_FAILURE(testing::WriteTestKeys(keys));
  Config config = testing::SmallDistributedConfig(1, GradientSyncMode::kPs, 6);
  config.security.curve = true;
  config.security.keys_dir = keys;
  config.checkpoint.dir = dir_ + "/ckpt";
  auto spec = RunSpec::Resolve(config);
  ASSERT_TRUE(spec.ok()) << spec.status().ToString();
  auto options = ShardOptionsFor(*spec, 0);
  ASSERT_TRUE(options.ok()) << options.status().ToString();
  ASSERT_TRUE(options->checkpoint_key.has_value());
  auto partition = Partition::Make(spec->model.tables, 1, spec->sync.partition_dim);
  ASSERT_TRUE(partition.ok()) << partition.status().ToString();
  ShardStore store(*partition, 0, spec->model.adam, spec->sync.optimizer_on_workers);
  ASSERT_TRUE(WriteShardCheckpoint(config.checkpoint.dir, 0, 100, store, {}, run_,
                                   &*options->checkpoint_key)
                  .ok());
  testing::ForgeStep(config.checkpoint.dir, ShardPart(0), 100, 150);

  options->endpoint = "tcp://127.0.0.1:0";
  options->resume_step = 150;
  auto forged = PsShard::Start(*partition, *options);
  ASSERT_FALSE(forged.ok());
  EXPECT_EQ(forged.status().code(), StatusCode::kCorruption) << forged.status().ToString();
  EXPECT_TRUE(Contains(forged.status().message(), "its mac does not match"))
      << forged.status().message();
  options->resume_step = 100;
  auto authentic = PsShard::Start(*partition, *options);
  ASSERT_TRUE(authentic.ok()) << authentic.status().ToString();
  (*authentic)->Stop();
}

}  // namespace
}  // namespace gridsync
