// Tests for common/config: keys that are valid alone but not together, and
// values a cluster makes a no-op (noted, not refused). The rest of the
// validation: config_test.cc.
#include <sys/stat.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>

#include "tests/config_test_util.h"

namespace gridsync {
namespace {

TEST(ConfigCombinationTest, GradientAccumulationMustDivideBatchSize) {
  const std::string msg =
      ErrorOf(R"({"training": {"batch_size": 4096, "gradient_accumulation": 3}})");
  EXPECT_TRUE(Contains(msg,
                       "test.json: training.gradient_accumulation: 3 does not divide "
                       "training.batch_size 4096"));
  EXPECT_TRUE(
      Contains(msg, "allowed: a divisor of training.batch_size in 1..1024, nearest: 2 or 4"));
}

TEST(ConfigCombinationTest, MicroBatchMustHoldAtLeastOneSample) {
  const std::string msg = ErrorOf(R"({"training": {"batch_size": 2, "gradient_accumulation": 4}})");
  EXPECT_TRUE(
      Contains(msg, "training.gradient_accumulation: 4 does not divide training.batch_size 2"));
  EXPECT_TRUE(Contains(msg, "nearest: 2"));
}

TEST(ConfigCombinationTest, MpDimWithoutModelParallel) {
  const std::string msg = ErrorOf(R"({"distributed": {"mp_dim": "column"}})");
  EXPECT_TRUE(Contains(msg,
                       "test.json: distributed.mp_dim: \"column\" has no effect unless "
                       "distributed.model_parallel is true; allowed: distributed.mp_dim only with "
                       "distributed.model_parallel: true"));
  EXPECT_TRUE(Contains(ErrorOf(R"({"distributed": {"model_parallel": false, "mp_dim": "row"}})"),
                       "distributed.mp_dim: \"row\" has no effect"));
}

TEST(ConfigCombinationTest, HierarchicalNeedsANodeLevelStage) {
  const std::string msg =
      ErrorOf(R"({"distributed": {"hierarchical": true, "gradient_sync": "ps"}})");
  EXPECT_TRUE(Contains(msg,
                       "test.json: distributed.hierarchical: true needs a node-level stage, which "
                       "gradient_sync \"ps\" does not have; allowed: distributed.hierarchical: "
                       "true with gradient_sync \"nccl\""))
      << msg;
  const Config hybrid = ParseOk(
      R"({"distributed": {"enable": true, "hierarchical": true, "gradient_sync": "hybrid"}})");
  EXPECT_TRUE(hybrid.distributed.hierarchical);
  // hybrid is hierarchical by construction: the key is noted as changing
  // nothing (a probe found two runs equal bit for bit, without a word).
  ASSERT_EQ(hybrid.notes.lines.size(), 1u);
  EXPECT_TRUE(Contains(hybrid.notes.lines[0],
                       "distributed.hierarchical: true changes nothing under gradient_sync "
                       "\"hybrid\""))
      << hybrid.notes.lines[0];
  // Nor does security without a cluster.
  const Config single = ParseOk(R"({"security": {"mode": "curve", "keys_dir": "/nonexistent"}})");
  ASSERT_FALSE(single.notes.lines.empty());
  EXPECT_TRUE(Contains(single.notes.lines[0],
                       "security.mode \"curve\": no effect with distributed.enable false"))
      << single.notes.lines[0];
  EXPECT_TRUE(ParseOk(R"({"distributed": {"hierarchical": true}})").distributed.hierarchical);
}

// A hostile probe: under nccl with one worker these keys were taken
// without a word, while hierarchical there is noted (a group of one: Gloo
// returns at once, the buckets carry nothing); and hybrid's collective
// with one worker on every node.
TEST(ConfigCombinationTest, CollectiveKeysOfAGroupOfOneAreNoted) {
  const auto notes_of = [](const std::string& text) {
    std::string all;
    for (const std::string& line : ParseOk(text).notes.lines) all += line + "\n";
    return all;
  };
  const std::string one = notes_of(
      R"({"distributed": {"enable": true, "world_size": 1, "gradient_sync": "nccl",
          "collective": "gloo", "bucket_mb": 1}})");
  EXPECT_TRUE(Contains(one,
                       "distributed.collective \"gloo\", distributed.bucket_mb 1: no effect with "
                       "distributed.world_size 1"))
      << one;
  const std::string two = notes_of(
      R"({"distributed": {"enable": true, "world_size": 2, "gradient_sync": "nccl",
          "collective": "gloo", "bucket_mb": 1}})");
  EXPECT_FALSE(Contains(two, "collective")) << two;
  EXPECT_FALSE(Contains(two, "bucket_mb")) << two;
  const std::string single_worker_nodes = notes_of(
      R"({"distributed": {"enable": true, "world_size": 2, "gradient_sync": "hybrid",
          "collective": "gloo", "nodes": [{"name": "a", "workers": 1},
                                          {"name": "b", "workers": 1}]}})");
  EXPECT_TRUE(Contains(single_worker_nodes,
                       "distributed.collective \"gloo\": every node of distributed.nodes has one "
                       "worker"))
      << single_worker_nodes;
  const std::string a_pair = notes_of(
      R"({"distributed": {"enable": true, "world_size": 3, "gradient_sync": "hybrid",
          "collective": "gloo", "nodes": [{"name": "a", "workers": 2},
                                          {"name": "b", "workers": 1}]}})");
  EXPECT_FALSE(Contains(a_pair, "collective")) << a_pair;
}

// A probe: an interval longer than the run was taken without a word, and
// the run wrote no checkpoint.
TEST(ConfigCombinationTest, ACheckpointIntervalPastTheRunIsNoted) {
  const Config c = ParseOk(R"({"training": {"steps": 5}, "checkpoint": {"every_steps": 1000000}})");
  ASSERT_EQ(c.notes.lines.size(), 1u);
  EXPECT_TRUE(Contains(c.notes.lines[0],
                       "checkpoint.every_steps 1000000 is more than "
                       "training.steps 5: this run writes no checkpoint"))
      << c.notes.lines[0];
  EXPECT_TRUE(ParseOk(R"({"training": {"steps": 5}, "checkpoint": {"every_steps": 5}})")
                  .notes.lines.empty());
}

// Adam on the shards behind a sign or sparsifying codec trains 9 to 17 dB
// worse (measured): noted with the way out, for ps and hybrid alone.
TEST(ConfigCombinationTest, ShardAdamBehindALossyCodecIsNoted) {
  const char* base = R"({"distributed": {"enable": true, "world_size": 2, "gradient_sync": "%s"},
                         "ps": {"optimizer": "%s"}, "compression": {"codec": "%s"}})";
  const auto parse = [&](const char* mode, const char* optimizer, const char* codec) {
    char text[512];
    std::snprintf(text, sizeof text, base, mode, optimizer, codec);
    return ParseOk(text);
  };
  for (const char* mode : {"ps", "hybrid"}) {
    const Config c = parse(mode, "shard", "onebit");
    ASSERT_EQ(c.notes.lines.size(), 1u) << mode;
    for (const char* want : {"ps.optimizer \"shard\" with compression.codec \"onebit\"", "17 dB",
                             "ps.optimizer \"auto\" or \"worker\""}) {
      EXPECT_TRUE(Contains(c.notes.lines[0], want)) << want << " in: " << c.notes.lines[0];
    }
  }
  EXPECT_EQ(parse("ps", "shard", "topk").notes.lines.size(), 1u);
  EXPECT_EQ(parse("ps", "shard", "randomk").notes.lines.size(), 1u);
  // Measured close to the uncompressed run, or Adam on the workers.
  for (const char* codec : {"int8", "qsgd", "fp16", "none"})
    EXPECT_TRUE(parse("ps", "shard", codec).notes.lines.empty()) << codec;
  for (const char* optimizer : {"auto", "worker"})
    EXPECT_TRUE(parse("ps", optimizer, "onebit").notes.lines.empty()) << optimizer;
}

TEST(ConfigCombinationTest, DynamicResolutionStepsNeedDynamicResolution) {
  const std::string msg = ErrorOf(R"({"training": {"dynamic_resolution_steps": 500}})");
  EXPECT_TRUE(Contains(msg,
                       "test.json: training.dynamic_resolution_steps: 500 has no effect unless "
                       "training.dynamic_resolution is true; allowed: 0 while "
                       "training.dynamic_resolution is false"));
  const Config c =
      ParseOk(R"({"training": {"dynamic_resolution": true, "dynamic_resolution_steps": 500}})");
  EXPECT_EQ(c.training.dynamic_resolution_steps, 500);
}

TEST(ConfigCombinationTest, WorldSizeNeedsEnable) {
  const std::string msg = ErrorOf(R"({"distributed": {"world_size": 4}})");
  EXPECT_TRUE(Contains(msg,
                       "test.json: distributed.world_size: 4 needs distributed.enable true; "
                       "allowed: 1 while distributed.enable is false"));
  EXPECT_EQ(ParseOk(R"({"distributed": {"enable": true, "world_size": 4}})").distributed.world_size,
            4);
}

TEST(ConfigCombinationTest, KeysTheModeDoesNotReadAreNotedNotRefused) {
  // One file runs every mode by a --set, so a ps section under nccl is said,
  // not refused; the note names the keys and what would read them.
  const Config nccl = ParseOk(
      R"({"distributed": {"enable": true, "world_size": 2, "gradient_sync": "nccl"},
          "ps": {"shards": 2, "threads": 4}})");
  ASSERT_EQ(nccl.notes.lines.size(), 1u);
  EXPECT_TRUE(Contains(nccl.notes.lines[0],
                       "ps.shards, ps.threads: no effect with "
                       "distributed.gradient_sync \"nccl\""))
      << nccl.notes.lines[0];
  EXPECT_TRUE(Contains(nccl.notes.lines[0], "used with gradient_sync \"ps\" or \"hybrid\""));

  const Config single = ParseOk(R"({"distributed": {"master_port": 29600}, "ps": {"shards": 2}})");
  ASSERT_EQ(single.notes.lines.size(), 2u);
  EXPECT_TRUE(Contains(single.notes.lines[0],
                       "distributed.master_port: no effect with "
                       "distributed.enable false"))
      << single.notes.lines[0];
  EXPECT_TRUE(Contains(single.notes.lines[1], "ps.shards: no effect"));

  // Keys the mode reads give no note; notes do not change what is equal.
  const Config ps = ParseOk(
      R"({"distributed": {"enable": true, "world_size": 2, "gradient_sync": "ps"},
          "ps": {"shards": 2}})");
  EXPECT_TRUE(ps.notes.lines.empty());
  EXPECT_TRUE(ParseOk(R"({"distributed": {"enable": false}})").notes.lines.empty());
  EXPECT_EQ(ParseOk(R"({"ps": {"shards": 1}})"), ParseOk("{}"));
  // A key at its default changes nothing in any mode: the resolved config
  // check-config prints (every key of both sections) loads without notes.
  EXPECT_TRUE(ParseOk(R"({"ps": {"shards": 1, "threads": 2}})").notes.lines.empty());
  for (const Config& c : {ParseOk("{}"), nccl}) {
    const Config again = ParseOk(c.ToJson().dump());
    EXPECT_EQ(again.notes.lines, c.notes.lines) << c.ToJson().dump();
  }
}

TEST(ConfigCombinationTest, ValuesTheClusterMakesANoOpAreNoted) {
  const auto only_note = [](const Config& c, const std::string& text) {
    EXPECT_EQ(c.notes.lines.size(), 1u);
    EXPECT_TRUE(!c.notes.lines.empty() && Contains(c.notes.lines[0], text))
        << (c.notes.lines.empty() ? "no note" : c.notes.lines[0]);
  };
  only_note(ParseOk(R"({"security": {"keys_dir": "/etc/gridsync/keys"}})"),
            "security.keys_dir: no effect: the cluster runs on one machine");
  const std::string ps =
      R"({"distributed": {"enable": true, "world_size": 2, "gradient_sync": "ps",
                          "model_parallel": true)";
  only_note(ParseOk(ps + R"(}, "ps": {"shards": 2}})"),
            "with mp_dim \"row\" the PS tables are split by rows, as without it");
  EXPECT_TRUE(ParseOk(ps + R"(, "mp_dim": "column"}, "ps": {"shards": 2}})").notes.lines.empty());
  // A column split no table's width takes is the row split (a hostile
  // probe: 1 shard, or 5 against widths 2, 64 and 3); it only names the
  // shards' checkpoints otherwise.
  for (const char* dim_shards :
       {R"("column"}, "ps": {"shards": 1}})", R"("column"}, "ps": {"shards": 5}})",
        R"("both"}, "ps": {"shards": 5}})"}) {
    only_note(ParseOk(ps + R"(, "mp_dim": )" + dim_shards),
              "splits into the shards' column groups, so the PS tables are split by rows");
  }
  EXPECT_TRUE(ParseOk(ps + R"(, "mp_dim": "both"}, "ps": {"shards": 6}})").notes.lines.empty());
  // Under nccl the workers hold the slices (the same Partition, cut in
  // world_size parts): 5 workers split no table's columns either, and were
  // not noted (a hostile probe).
  const std::string sliced =
      R"({"training": {"batch_size": 16380}, "distributed": {"enable": true, "gradient_sync": )"
      R"("nccl", "model_parallel": true, "mp_dim": )";
  only_note(ParseOk(sliced + R"("column", "world_size": 5}})"),
            "with mp_dim \"column\" and distributed.world_size 5 no table's width (2, 3, 64 "
            "floats) splits into the workers' column groups, so the workers' slices are split by "
            "rows");
  EXPECT_TRUE(ParseOk(sliced + R"("column", "world_size": 2}})").notes.lines.empty());
  // What else depends on model_parallel keeps it from being noted: under
  // nccl it shards Adam's state and names the checkpoints' layout even for
  // one worker.
  EXPECT_TRUE(
      ParseOk(R"({"distributed": {"enable": true, "world_size": 1, "model_parallel": true}})")
          .notes.lines.empty());
  EXPECT_TRUE(
      ParseOk(R"({"distributed": {"enable": true, "world_size": 2, "model_parallel": true}})")
          .notes.lines.empty());
  // A hostile probe's keys that did nothing without a word.
  only_note(ParseOk(R"({"checkpoint": {"dir": "/tmp/elsewhere"}})"),
            "checkpoint.dir \"/tmp/elsewhere\": this run writes no checkpoint "
            "(checkpoint.every_steps 0");
  EXPECT_TRUE(ParseOk(R"({"checkpoint": {"dir": "/tmp/elsewhere", "every_steps": 5}})")
                  .notes.lines.empty());
  only_note(ParseOk(R"({"training": {"steps": 100, "dynamic_resolution": true,
                                     "dynamic_resolution_steps": 101}})"),
            "training.dynamic_resolution_steps 101 is more than training.steps 100: the finest "
            "hash-grid levels never turn on");
  EXPECT_TRUE(ParseOk(R"({"training": {"steps": 100, "dynamic_resolution": true,
                                       "dynamic_resolution_steps": 100}})")
                  .notes.lines.empty());
  only_note(ParseOk(R"({"encoding": {"n_levels": 1}, "training": {"dynamic_resolution": true}})"),
            "training.dynamic_resolution true with encoding.n_levels 1: the one level is on from "
            "the first step");
  EXPECT_TRUE(ParseOk(R"({"encoding": {"n_levels": 2}, "training": {"dynamic_resolution": true}})")
                  .notes.lines.empty());
  const std::string codec =
      R"({"distributed": {"enable": true, "world_size": 2, "gradient_sync": "ps"},
      "encoding": {"n_levels": 2, "log2_hashmap_size": 10}, "compression": {"codec": "onebit",
      "min_bytes": )";
  only_note(ParseOk(codec + "100000}}"),
            "compression.min_bytes 100000 is more than the model's largest table (at most 16384 "
            "bytes)");
  // Past the largest table (the 4 x 64 x 64 hidden matrix) and below the
  // whole model (32 KiB): a hostile probe's 8 MiB on the default model.
  only_note(ParseOk(codec + "20000}}"), "nothing is ever compressed");
  EXPECT_TRUE(ParseOk(codec + "16384}}").notes.lines.empty());
  // Under nccl the 16-bit all-reduce takes the whole grid as one tensor:
  // the whole model (34560 bytes) bounds it.
  const std::string nccl = R"({"distributed": {"enable": true, "world_size": 2,
      "gradient_sync": "nccl"}, "encoding": {"n_levels": 2, "log2_hashmap_size": 10},
      "compression": {"codec": "fp16", "min_bytes": )";
  EXPECT_TRUE(ParseOk(nccl + "20000}}").notes.lines.empty());
  only_note(ParseOk(nccl + "40000}}"),
            "compression.min_bytes 40000 is more than the whole model (at most 34560 bytes)");
  only_note(ParseOk(R"({"distributed": {"enable": true, "world_size": 2},
                        "compression": {"codec": "int8", "block": 1}})"),
            "compression.block 1: int8 sends a 4-byte scale with every value");
  EXPECT_TRUE(ParseOk(R"({"distributed": {"enable": true, "world_size": 2},
                          "compression": {"codec": "int8", "block": 2}})")
                  .notes.lines.empty());
  only_note(ParseOk(R"({"distributed": {"enable": true, "world_size": 2, "gradient_sync": "ps"},
                        "compression": {"codec": "fp16", "block": 1}})"),
            "compression.block 1: fp16 sends a 2-byte exponent with every value");
  const std::string one = R"({"distributed": {"enable": true, "world_size": 1, )";
  only_note(ParseOk(one + R"("batch_splitting": "adaptive"}})"),
            "distributed.batch_splitting \"adaptive\": no effect with distributed.world_size 1");
  only_note(ParseOk(one + R"("gradient_sync": "nccl", "hierarchical": true}})"),
            "distributed.hierarchical true: no effect with distributed.world_size 1");
  // One worker is never ahead of another (a hostile probe: the same bits).
  only_note(ParseOk(one + R"("gradient_sync": "ps"}, "ps": {"consistency": "async"}})"),
            "ps.consistency \"async\": no effect with distributed.world_size 1");
  only_note(ParseOk(one + R"("gradient_sync": "hybrid"}, "ps": {"consistency": "ssp",
                                                                "staleness": 5}})"),
            "ps.consistency \"ssp\": no effect with distributed.world_size 1");
  // With checkpoints on they are refused (Config::CheckRunnable), which says it.
  EXPECT_TRUE(ParseOk(one + R"("gradient_sync": "ps"}, "ps": {"consistency": "async"},
                                "checkpoint": {"every_steps": 10}})")
                  .notes.lines.empty());
  // Splits that come out even (a hostile probe: the medium seed's weighted
  // with no nodes), and an adaptive split that never rebalances.
  const std::string two = R"({"distributed": {"enable": true, "world_size": 3, )";
  only_note(ParseOk(two + R"("batch_splitting": "weighted", "nodes": [
                          {"name": "a", "workers": 1, "weight": 2},
                          {"name": "b", "workers": 2, "weight": 4}]}})"),
            "every worker's share (its node's weight over the node's workers) is the same");
  // Without nodes the workers' measured speeds split it: no note.
  EXPECT_TRUE(ParseOk(two + R"("batch_splitting": "weighted"}})").notes.lines.empty());
  EXPECT_TRUE(ParseOk(two + R"("batch_splitting": "weighted", "nodes": [
                          {"name": "a", "workers": 1, "weight": 2},
                          {"name": "b", "workers": 2, "weight": 1}]}})")
                  .notes.lines.empty());
  only_note(ParseOk(two + R"("batch_splitting": "adaptive", "adaptive_interval": 299},
                             "training": {"steps": 300}})"),
            "distributed.adaptive_interval 299 with training.steps 300: a new split takes "
            "effect from the step after next, so none does");
  EXPECT_TRUE(ParseOk(two + R"("batch_splitting": "adaptive", "adaptive_interval": 298},
                             "training": {"steps": 300}})")
                  .notes.lines.empty());
  // The resolved config (check-config's print, every key named) loads again
  // without notes: the derived checkpoint folder is not one.
  const Config printed = ParseOk(ParseOk(R"({"task": {"output": "out/x"}})").ToJson().dump());
  EXPECT_TRUE(printed.notes.lines.empty()) << printed.notes.lines[0];
  // One process alone loads no key: curve there is noted, and needs no folder.
  only_note(ParseOk(R"({"security": {"mode": "curve"}})"),
            "security.mode \"curve\": no effect with distributed.enable false");
}

TEST(ConfigCombinationTest, NoFollowUpErrorWhenAPartIsInvalid) {
  // batch_size is invalid on its own; the divisibility check must not pile on.
  const std::string msg =
      ErrorOf(R"({"training": {"batch_size": "4096", "gradient_accumulation": 3}})");
  EXPECT_EQ(CountLines(msg), 1u) << msg;
  EXPECT_TRUE(Contains(msg, "training.batch_size: wrong type"));
  // A misspelt codec, or a keys_dir of the wrong type: the options beside
  // them were blamed for a value the user never wrote (a hostile probe).
  const std::string codec =
      ErrorOf(R"({"compression": {"codec": "topkk", "ratio": 0.5, "pull": true}})");
  EXPECT_EQ(CountLines(codec), 1u) << codec;
  EXPECT_TRUE(Contains(codec, "compression.codec: unknown value \"topkk\"")) << codec;
  const std::string keys = ErrorOf(R"({"security": {"mode": "off", "keys_dir": null}})");
  EXPECT_EQ(CountLines(keys), 1u) << keys;
  EXPECT_TRUE(Contains(keys, "security.keys_dir: wrong type")) << keys;
}

}  // namespace
}  // namespace gridsync
