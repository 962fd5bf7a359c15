// Tests for common/config, continued: --set overrides, ToJson and its round
// trip, the keys of nodes, the PS, metrics and compression, and keys refused
// where they would do nothing (what a config can run, and the enums' names:
// config_runnable_test.cc, in the same binary).
#include <map>

#include "tests/config_test_util.h"

namespace gridsync {
namespace {

TEST(ConfigOverrideTest, ValuesParsedAsJsonOrTakenAsStrings) {
  const Config c = ParseOk(
      R"({"training": {"steps": 100}})",
      {"distributed.master_addr=127.0.0.1", "training.steps=5", "training.mixed_precision=true",
       "training.learning_rate=0.5", "task.output=\"123\"", "task.image=/tmp/a b.png"});
  EXPECT_EQ(c.distributed.master_addr, "127.0.0.1");
  EXPECT_EQ(c.training.steps, 5);
  EXPECT_TRUE(c.training.mixed_precision);
  EXPECT_DOUBLE_EQ(c.training.learning_rate, 0.5);
  EXPECT_EQ(c.task.output, "123");
  EXPECT_EQ(c.task.image, "/tmp/a b.png");
}

TEST(ConfigOverrideTest, LaterOverrideWinsAndMissingSectionIsCreated) {
  const Config c = ParseOk("{}", {"network.n_neurons=16", "network.n_neurons=32"});
  EXPECT_EQ(c.network.n_neurons, 32);
}

TEST(ConfigOverrideTest, OverrideCanFixAnInvalidFileValue) {
  const Config c = ParseOk(R"({"distributed": {"world_size": 4}})", {"distributed.enable=true"});
  EXPECT_TRUE(c.distributed.enable);
}

TEST(ConfigOverrideTest, MissingEqualsIsAnError) {
  const std::string msg = ErrorOf("{}", {"training.steps"});
  EXPECT_TRUE(Contains(msg,
                       "test.json: --set \"training.steps\": missing '='; allowed: "
                       "section.key=value"));
}

TEST(ConfigOverrideTest, EmptyKeySegmentIsAnError) {
  const std::string msg = ErrorOf("{}", {"training..steps=5"});
  EXPECT_TRUE(Contains(msg, "--set \"training..steps=5\": empty key in path \"training..steps\""));
  EXPECT_TRUE(Contains(ErrorOf("{}", {"=5"}), "--set \"=5\": empty key"));
}

TEST(ConfigOverrideTest, UnknownKeysCaughtByNormalCheck) {
  const std::string msg = ErrorOf("{}", {"training.stepz=5"});
  EXPECT_TRUE(Contains(msg, "test.json: training.stepz: unknown key (did you mean \"steps\"?)"));
  EXPECT_TRUE(Contains(ErrorOf("{}", {"trainig.steps=5"}), "test.json: trainig: unknown key"));
}

TEST(ConfigOverrideTest, OverrideValuesAreValidated) {
  const std::string msg = ErrorOf("{}", {"training.steps=abc"});
  EXPECT_TRUE(Contains(msg,
                       "training.steps: wrong type: expected an integer, got \"abc\" (string); "
                       "allowed: integers 1..10000000"));
}

TEST(ConfigOverrideTest, DescendingIntoAValueIsAnError) {
  const std::string msg = ErrorOf("{}", {"training.steps=5", "training.steps.x=1"});
  EXPECT_TRUE(Contains(msg,
                       "--set \"training.steps.x=1\": training.steps is 5 (integer), not a "
                       "section"));
}

// A section the file holds as null stays refused (a hostile probe: any
// --set into it made it an object, and the file passed).
TEST(ConfigOverrideTest, ANullSectionInTheFileIsNotMadeASection) {
  const std::string msg = ErrorOf(R"({"training": null})", {"training.steps=5"});
  EXPECT_TRUE(Contains(msg, "--set \"training.steps=5\": training is null (null), not a section"))
      << msg;
  EXPECT_TRUE(Contains(msg, "training: wrong type: expected an object, got null")) << msg;
}

TEST(ConfigOverrideTest, InvalidUtf8IsAnError) {
  EXPECT_TRUE(Contains(ErrorOf("{}", {"task.output=\xff"}), "not valid UTF-8"));
}

// --- ToJson ------------------------------------------------------------------------------------

// (Which keys it prints: PrintsExactlyTheKeysTheParserReads.)
TEST(ConfigToJsonTest, EnumsPrintAsStrings) {
  Result<Config> c = Config::LoadFile("configs/distributed_large.json");
  ASSERT_TRUE(c.ok()) << c.status().ToString();
  const nlohmann::json j = c->ToJson();
  EXPECT_EQ(j["compression"]["codec"], "none");
  EXPECT_EQ(j["ps"]["consistency"], "bsp");
  EXPECT_EQ(j["ps"]["optimizer"], "auto");
  EXPECT_EQ(j["distributed"]["gradient_sync"], "nccl");
  EXPECT_EQ(j["distributed"]["batch_splitting"], "adaptive");
  EXPECT_EQ(j["distributed"]["mp_dim"], "both");
  EXPECT_EQ(j["task"]["type"], "image");
  EXPECT_EQ(j["encoding"]["log2_hashmap_size"], 22);
  EXPECT_EQ(j["training"]["seed"], 1337u);
}

// The keys ToJson prints are exactly the keys Parse reads, per section:
// both lists come from the code (the parser names what it reads in its
// unknown-key error), none is kept by hand.
TEST(ConfigToJsonTest, PrintsExactlyTheKeysTheParserReads) {
  auto allowed_keys = [](const std::string& section) {
    const std::string msg = ErrorOf("{\"" + section + "\": {\"zzz\": 1}}");
    const std::string marker = "allowed: keys of " + section + ": ";
    const size_t at = msg.find(marker);
    EXPECT_NE(at, std::string::npos) << msg;
    std::set<std::string> keys;
    std::string rest = at == std::string::npos ? "" : msg.substr(at + marker.size());
    rest = rest.substr(0, rest.find('\n'));
    size_t start = 0;
    while (start <= rest.size()) {
      const size_t comma = rest.find(", ", start);
      keys.insert(
          rest.substr(start, comma == std::string::npos ? std::string::npos : comma - start));
      if (comma == std::string::npos) break;
      start = comma + 2;
    }
    return keys;
  };
  // Conditional keys print only where they apply, so no one config prints
  // them all: every config below prints only keys the parser reads and
  // loads again, and together they switch on every conditional key (ssp
  // staleness, a given ps.host, mp_dim with model parallelism, nodes, node
  // weights under nccl's weighted split, the adaptive
  // interval, each codec's own options; the bucket size where the
  // all-reduce is bucketed).
  const char* configs[] = {
      R"({"distributed": {"enable": true, "world_size": 2, "gradient_sync": "nccl",
                          "batch_splitting": "weighted", "model_parallel": true,
                          "mp_dim": "column",
                          "nodes": [{"name": "a", "workers": 1}, {"name": "b", "workers": 1}]},
          "ps": {"consistency": "ssp", "staleness": 3, "host": "127.0.0.1", "base_port": 26000},
          "compression": {"codec": "topk"}, "security": {"keys_dir": "/etc/gridsync/keys"}})",
      R"({"distributed": {"batch_splitting": "adaptive", "gradient_sync": "hybrid"},
          "compression": {"codec": "qsgd"}})",
      R"({"distributed": {"gradient_sync": "ps"}, "compression": {"codec": "int8"}})",
      R"({"distributed": {"gradient_sync": "nccl", "bucket_mb": 8}})",
  };
  std::map<std::string, std::set<std::string>> printed;
  for (const char* text : configs) {
    const nlohmann::json j = ParseOk(text).ToJson();
    EXPECT_TRUE(Config::Parse(j.dump(), "printed").ok()) << j.dump();
    for (const auto& [section, value] : j.items()) {
      const std::set<std::string> allowed = allowed_keys(section);
      for (const auto& [key, v] : value.items()) {
        EXPECT_EQ(allowed.count(key), 1u) << section << "." << key << " is printed, not read";
        printed[section].insert(key);
      }
    }
  }
  for (const auto& [section, keys] : printed) EXPECT_EQ(keys, allowed_keys(section)) << section;
  EXPECT_EQ(printed.size(), 10u);
}

TEST(ConfigMetricsTest, PortsMustFitAndStayClearOfTheClusters) {
  const Config ok =
      ParseOk(R"({"distributed": {"master_port": 29500}, "metrics": {"port": 9400}})");
  EXPECT_EQ(ok.metrics.port, 9400);
  for (const char* bad : {R"({"distributed": {"master_port": 29500}, "metrics": {"port": 29499}})",
                          R"({"metrics": {"port": 65535}})", R"({"metrics": {"port": -1}})",
                          R"({"metrics": {"prot": 9400}})"}) {
    auto parsed = Config::Parse(bad, "metrics.json");
    ASSERT_FALSE(parsed.ok()) << bad;
    EXPECT_NE(parsed.status().message().find("metrics."), std::string::npos)
        << parsed.status().message();
  }
}

TEST(ConfigToJsonTest, MpDimOmittedWithoutModelParallel) {
  const nlohmann::json j = Config{}.ToJson();
  EXPECT_FALSE(j["distributed"].contains("mp_dim"));
  EXPECT_TRUE(j["distributed"].contains("model_parallel"));
}

TEST(ConfigNodesTest, NodesAssignRanksAndMustSumToWorldSize) {
  const Config c = ParseOk(R"({"distributed": {"enable": true, "world_size": 4, "nodes": [
      {"name": "a", "workers": 1, "weight": 2.0}, {"name": "b", "workers": 3}],
      "batch_splitting": "weighted"}})");
  ASSERT_EQ(c.distributed.nodes.size(), 2u);
  EXPECT_EQ(c.distributed.NodeOf(0), 0);
  EXPECT_EQ(c.distributed.NodeOf(1), 1);
  EXPECT_EQ(c.distributed.NodeOf(3), 1);
  EXPECT_EQ(c.distributed.LocalRankOf(3), 2);
  EXPECT_EQ(c.distributed.nodes[0].weight, 2.0);
  EXPECT_EQ(c.distributed.nodes[1].weight, 1.0);
  EXPECT_EQ(Config::Parse(c.ToJson().dump(), "rt")->distributed.nodes.size(), 2u);
  const std::string sum = ErrorOf(R"({"distributed": {"enable": true, "world_size": 4,
      "nodes": [{"name": "a", "workers": 1}]}})");
  EXPECT_TRUE(Contains(sum, "distributed.nodes")) << sum;
  EXPECT_TRUE(Contains(sum, "add up to 1")) << sum;
  const std::string dup = ErrorOf(R"({"distributed": {"enable": true, "world_size": 2,
      "nodes": [{"name": "a"}, {"name": "a"}]}})");
  EXPECT_TRUE(Contains(dup, "duplicate node name")) << dup;
  const std::string type = ErrorOf(R"({"distributed": {"nodes": 3}})");
  EXPECT_TRUE(Contains(type, "expected an array")) << type;
  const std::string unknown = ErrorOf(R"({"distributed": {"enable": true, "world_size": 1,
      "nodes": [{"name": "a", "gpus": 1}]}})");
  EXPECT_TRUE(Contains(unknown, "distributed.nodes[0].gpus")) << unknown;
  const Config single = ParseOk(R"({"distributed": {"enable": true, "world_size": 3}})");
  EXPECT_EQ(single.distributed.ResolvedNodes().size(), 1u);
  EXPECT_EQ(single.distributed.LocalRankOf(2), 2);
}

TEST(ConfigPsTest, KeysValidateAndStalenessNeedsSsp) {
  const Config c =
      ParseOk(R"({"ps": {"shards": 4, "consistency": "ssp", "staleness": 3, "threads": 2,
                                      "host": "127.0.0.1", "base_port": 31000}})");
  EXPECT_EQ(c.ps.shards, 4);
  EXPECT_EQ(c.ps.consistency, Consistency::kSsp);
  EXPECT_EQ(c.ps.staleness, 3);
  EXPECT_EQ(c.ps.base_port, 31000);
  EXPECT_EQ(c.ToJson()["ps"]["staleness"], 3);
  const std::string staleness = ErrorOf(R"({"ps": {"consistency": "bsp", "staleness": 2}})");
  EXPECT_TRUE(Contains(staleness, "ps.staleness")) << staleness;
  EXPECT_TRUE(Contains(staleness, "ssp")) << staleness;
  const std::string shards = ErrorOf(R"({"ps": {"shards": 0}})");
  EXPECT_TRUE(Contains(shards, "ps.shards")) << shards;
  EXPECT_TRUE(Contains(shards, "1..256")) << shards;
  const std::string consistency = ErrorOf(R"({"ps": {"consistency": "eventual"}})");
  EXPECT_TRUE(Contains(consistency, "bsp")) << consistency;
  const std::string timeout = ErrorOf(R"({"distributed": {"timeout_s": 0}})");
  EXPECT_TRUE(Contains(timeout, "distributed.timeout_s")) << timeout;
  // Below a millisecond it became 0 ms; below a second no job could start
  // (a shard connects before the coordinator listens); buckets below 1 KiB
  // made millions of all-reduces a step, and no step ended.
  for (const char* value : {"0.0001", "0.05", "0.999"}) {
    const std::string tiny =
        ErrorOf(std::string(R"({"distributed": {"timeout_s": )") + value + "}}");
    EXPECT_TRUE(Contains(tiny, std::string("distributed.timeout_s: out of range: ") + value +
                                   "; allowed: finite numbers in [1, 3600]"))
        << tiny;
  }
  const std::string bucket = ErrorOf(R"({"distributed": {"gradient_sync": "nccl",
      "bucket_mb": 1e-30}})");
  EXPECT_TRUE(Contains(bucket,
                       "distributed.bucket_mb: out of range: 1e-30; allowed: finite "
                       "numbers in [0.001, 4096]"))
      << bucket;
  // An unknown key of a node lists every key a node takes.
  const std::string node = ErrorOf(R"({"distributed": {"nodes": [{"name": "a", "shard": 1}]}})");
  EXPECT_TRUE(Contains(node, "\"shards\"")) << node;
}

TEST(ConfigPsTest, OptimizerPlacementResolves) {
  EXPECT_EQ(Config{}.ps.optimizer, OptimizerPlacement::kAuto);
  EXPECT_FALSE(Config{}.OptimizerOnWorkers());  // codec none: Adam on the shards
  // (Codecs that only round: CodecsThatOnlyRoundHoldNothingBack.)
  for (const char* codec : {"qsgd", "onebit", "topk", "randomk"}) {
    Config c = ParseOk(std::string(R"({"compression": {"codec": ")") + codec + R"("}})");
    EXPECT_TRUE(c.OptimizerOnWorkers()) << codec;
    c.ps.optimizer = OptimizerPlacement::kShard;
    EXPECT_FALSE(c.OptimizerOnWorkers()) << codec;
  }
  const Config worker = ParseOk(R"({"ps": {"optimizer": "worker"}})");
  EXPECT_TRUE(worker.OptimizerOnWorkers());
  EXPECT_EQ(worker.ToJson()["ps"]["optimizer"], "worker");
  const std::string bad = ErrorOf(R"({"ps": {"optimizer": "server"}})");
  EXPECT_TRUE(Contains(bad, "ps.optimizer")) << bad;
  EXPECT_TRUE(Contains(bad, "auto")) << bad;
  EXPECT_TRUE(Contains(bad, "shard")) << bad;
  EXPECT_TRUE(Contains(bad, "worker")) << bad;
}

TEST(ConfigCompressionTest, ErrorFeedbackDefaultFollowsTheCodec) {
  // (fp16, bf16, int8: CodecsThatOnlyRoundHoldNothingBack.)
  for (const char* codec : {"none", "onebit", "topk"}) {
    const Config c = ParseOk(std::string(R"({"compression": {"codec": ")") + codec + R"("}})");
    EXPECT_TRUE(c.compression.error_feedback) << codec;
  }
  for (const char* codec : {"qsgd", "randomk"}) {
    const Config c = ParseOk(std::string(R"({"compression": {"codec": ")") + codec + R"("}})");
    EXPECT_FALSE(c.compression.error_feedback) << codec;
    EXPECT_EQ(c.ToJson()["compression"]["error_feedback"], false) << codec;
    // Fed back, their residual diverges (a hostile probe: randomk's loss
    // reached 1e14): refused, saying so.
    const std::string on =
        std::string(R"({"compression": {"error_feedback": true, "codec": ")") + codec + R"("}})";
    const Result<Config> refused = Config::Parse(on, "test");
    ASSERT_FALSE(refused.ok()) << codec;
    EXPECT_NE(refused.status().message().find("compression.error_feedback: true with "
                                              "compression.codec \"" +
                                              std::string(codec) + "\" diverges"),
              std::string::npos)
        << refused.status().ToString();
  }
  const Config off = ParseOk(R"({"compression": {"codec": "topk", "error_feedback": false}})");
  EXPECT_FALSE(off.compression.error_feedback);
}

// The codecs that only round leave error feedback off, under every mode;
// under ps and hybrid Adam then stays on the shards, as an uncompressed run
// has it (each of them keeps a small gradient's bits: bf16 by fp32's
// exponent, int8 and fp16 by a scale per block). Asked for, error feedback
// is on and Adam moves to the workers.
TEST(ConfigCompressionTest, CodecsThatOnlyRoundHoldNothingBack) {
  const auto parse = [](const std::string& sync, const std::string& codec,
                        const std::string& extra) {
    return ParseOk(R"({"distributed": {"gradient_sync": ")" + sync +
                   R"("}, "compression": {"codec": ")" + codec + "\"" + extra + "}}");
  };
  for (const char* sync : {"ps", "hybrid"}) {
    for (const char* codec : {"fp16", "bf16", "int8"}) {
      const Config c = parse(sync, codec, "");
      EXPECT_FALSE(c.compression.error_feedback) << sync << " " << codec;
      EXPECT_EQ(c.ToJson()["compression"]["error_feedback"], false) << sync << " " << codec;
      EXPECT_FALSE(c.OptimizerOnWorkers()) << sync << " " << codec;
      const Config fed = parse(sync, codec, R"(, "error_feedback": true)");
      EXPECT_TRUE(fed.compression.error_feedback) << sync << " " << codec;
      EXPECT_TRUE(fed.OptimizerOnWorkers()) << sync << " " << codec;
      Config worker = c;
      worker.ps.optimizer = OptimizerPlacement::kWorker;
      EXPECT_TRUE(worker.OptimizerOnWorkers()) << sync << " " << codec;
      Config shard = c;
      shard.ps.optimizer = OptimizerPlacement::kShard;
      EXPECT_FALSE(shard.OptimizerOnWorkers()) << sync << " " << codec;
    }
    for (const char* codec : {"onebit", "topk"}) {
      const Config c = parse(sync, codec, "");
      EXPECT_TRUE(c.compression.error_feedback) << sync << " " << codec;
      EXPECT_TRUE(c.OptimizerOnWorkers()) << sync << " " << codec;
      // Without error feedback they still hold values back (or drop them).
      EXPECT_TRUE(parse(sync, codec, R"(, "error_feedback": false)").OptimizerOnWorkers())
          << sync << " " << codec;
    }
    for (const char* codec : {"qsgd", "randomk"})
      EXPECT_TRUE(parse(sync, codec, "").OptimizerOnWorkers()) << sync << " " << codec;
  }
  for (const char* codec : {"fp16", "bf16"}) {
    EXPECT_FALSE(parse("nccl", codec, "").compression.error_feedback) << codec;
    EXPECT_TRUE(parse("nccl", codec, R"(, "error_feedback": true)").compression.error_feedback)
        << codec;
  }
}

TEST(ConfigToJsonTest, RoundTrip) {
  std::vector<Config> configs = {
      ParseOk("{}"), ParseOk(R"({"training": {"seed": 18446744073709551615, "learning_rate": 0.1,
                  "dynamic_resolution": true, "dynamic_resolution_steps": 77},
                  "encoding": {"per_level_scale": 1.3819128799677045},
                  "task": {"type": "nerf", "output": "输出"}})")};
  for (const char* path : {"configs/distributed_small.json", "configs/distributed_medium.json",
                           "configs/distributed_large.json"}) {
    Result<Config> c = Config::LoadFile(path);
    ASSERT_TRUE(c.ok()) << c.status().ToString();
    configs.push_back(*c);
  }
  for (const Config& original : configs) {
    const std::string text = original.ToJson().dump(2);
    Result<Config> again = Config::Parse(text, "roundtrip.json");
    ASSERT_TRUE(again.ok()) << again.status().ToString() << "\n" << text;
    // Every field, not the printer against itself (only the source name differs).
    Config reparsed = *again;
    reparsed.source = original.source;
    EXPECT_TRUE(reparsed == original) << text;
    EXPECT_EQ(again->training.seed, original.training.seed);
    EXPECT_EQ(again->encoding.per_level_scale, original.encoding.per_level_scale);
    EXPECT_EQ(again->distributed.mp_dim, original.distributed.mp_dim);
  }
}

}  // namespace
// Issue: text after a NUL byte used to be ignored, so garbage was accepted.
TEST(ConfigHostileTest, NulByteIsRefused) {
  const std::string text = std::string(R"({"training": {"steps": 5}})") + '\0' + "garbage";
  auto c = Config::Parse(text, "nul.json");
  ASSERT_FALSE(c.ok());
  EXPECT_TRUE(Contains(c.status().message(), "NUL")) << c.status().message();
}

// Issue: 100k unknown keys took 9.5 s (a linear duplicate search per key)
// and reported every one. Now: a bounded report naming the count.
TEST(ConfigHostileTest, ManyUnknownKeysGiveABoundedReport) {
  std::string text = R"({"training": {)";
  for (int i = 0; i < 100000; ++i) text += (i ? ",\"k" : "\"k") + std::to_string(i) + "\": 1";
  text += "}}";
  auto c = Config::Parse(text, "many.json");
  ASSERT_FALSE(c.ok());
  const std::string& m = c.status().message();
  EXPECT_TRUE(Contains(m, "99980 more unknown keys")) << m.substr(0, 400);
  EXPECT_LE(std::count(m.begin(), m.end(), '\n'), 25);
}

// Hostile probes: a key holding a NUL cut every binary's printed report
// at that key (printf), a newline forged a line, a 15 MB key was echoed
// whole (and its edit distance to every known key took 8 s), and a million
// nested duplicate keys took minutes (a path built per duplicate).
TEST(ConfigHostileTest, HostileKeysAreQuotedShortAndCheap) {
  // The keys hold JSON escapes: a backslash, then u0000 or n.
  auto nul = Config::Parse(R"({"encoding": {"n_levels\)"
                           "u0000\": 1, \"a\\nb: OK\": 2}, \"training\": {\"steps\": 0}}",
                           "k.json");
  ASSERT_FALSE(nul.ok());
  const std::string& m = nul.status().message();
  EXPECT_EQ(m.find('\0'), std::string::npos);
  EXPECT_TRUE(Contains(m, R"(encoding."n_levels\)"
                          "u0000\": unknown key"))
      << m;
  EXPECT_TRUE(Contains(m, R"(encoding."a\nb: OK": unknown key)")) << m;
  EXPECT_TRUE(Contains(m, "training.steps: out of range")) << m;
  EXPECT_EQ(std::count(m.begin(), m.end(), '\n'), 2) << m;

  const std::string long_key(4 << 20, 'k');
  const auto start = std::chrono::steady_clock::now();
  auto big = Config::Parse(R"({"training": {")" + long_key + R"(": 1, ")" + long_key +
                               R"(": 2}, "network": {")" + long_key + R"(": 1}})",
                           "big.json");
  ASSERT_FALSE(big.ok());
  EXPECT_LT(big.status().message().size(), 2000u);
  EXPECT_TRUE(Contains(big.status().message(), "duplicate key")) << big.status().message();
  EXPECT_TRUE(Contains(big.status().message(), "unknown key")) << big.status().message();

  constexpr int kDepth = 20000;
  std::string deep = R"({"training": )";
  for (int i = 0; i < kDepth; ++i) deep += R"({"a": 1, "a": )";
  deep.append("1").append(kDepth, '}').append("}");
  auto nested = Config::Parse(deep, "deep.json");
  ASSERT_FALSE(nested.ok());
  EXPECT_TRUE(Contains(nested.status().message(), "more problems not listed"));
  // Quadratic, the nested duplicates alone took about 2 s here; linear,
  // all of this takes a fraction of that even under sanitizers.
  EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::seconds(20));
}

// A hostile probe: a 16 MiB config of "[" took 2.8 GB to parse (a frame
// of the duplicate-key finder and a node of the document per level). Deeper
// than 64 levels of objects and arrays is refused, and what lies deeper is
// not kept; a --set value likewise.
TEST(ConfigHostileTest, NestingDeeperThanTheLimitIsRefusedWithoutBuildingIt) {
  const std::string open(1 << 20, '[');
  auto unclosed = Config::Parse(open, "deep.json");
  ASSERT_FALSE(unclosed.ok());
  EXPECT_TRUE(Contains(unclosed.status().message(), "nested deeper than 64 levels"))
      << unclosed.status().message().substr(0, 500);
  // Appended piece by piece: operator+ here trips GCC 12's -Wrestrict
  // false positive.
  const auto nest = [](int levels) {
    std::string text = R"({"training": {"x": )";
    text.append(levels, '[').append(levels, ']').append("}}");
    return text;
  };
  auto deep = Config::Parse(nest(70), "deep.json");
  ASSERT_FALSE(deep.ok());
  EXPECT_TRUE(Contains(deep.status().message(), "training.x[0]")) << deep.status().message();
  EXPECT_TRUE(Contains(deep.status().message(), "at most 64 levels")) << deep.status().message();
  // Within the limit only the unknown key is refused.
  auto shallow = Config::Parse(nest(60), "shallow.json");
  ASSERT_FALSE(shallow.ok());
  EXPECT_FALSE(Contains(shallow.status().message(), "nested deeper")) << shallow.status().message();
  EXPECT_TRUE(Contains(shallow.status().message(), "training.x: unknown key"))
      << shallow.status().message();
  std::string value = "training=";
  value.append(100, '[').append("1").append(100, ']');
  auto set = Config::Parse("{}", "o.json", {value});
  ASSERT_FALSE(set.ok());
  EXPECT_TRUE(Contains(set.status().message(), "nested deeper than 64 levels"))
      << set.status().message();
}

// An MLP without hidden layers has no width: n_neurons there did nothing.
TEST(ConfigKeysTest, AWidthWithoutHiddenLayersIsRefused) {
  const std::string msg = ErrorOf(R"({"network": {"n_neurons": 1024, "n_hidden_layers": 0}})");
  EXPECT_TRUE(Contains(msg, "network.n_neurons: 1024 has no effect with network.n_hidden_layers 0"))
      << msg;
  const Config linear = ParseOk(R"({"network": {"n_hidden_layers": 0}})");
  EXPECT_FALSE(linear.ToJson()["network"].contains("n_neurons"));
  EXPECT_TRUE(Config::Parse(linear.ToJson().dump(), "printed").ok());
}

// --set with an object value: duplicate keys are refused as in a file, and
// the value merges into the section instead of dropping the file's other
// keys of it without a word.
TEST(ConfigOverrideTest, AnObjectValueMergesAndItsDuplicatesAreRefused) {
  const Config c = ParseOk(R"({"training": {"batch_size": 1024, "learning_rate": 0.5}})",
                           {R"(training={"threads": 1, "steps": 7})"});
  EXPECT_EQ(c.training.batch_size, 1024);
  EXPECT_DOUBLE_EQ(c.training.learning_rate, 0.5);
  EXPECT_EQ(c.training.threads, 1);
  EXPECT_EQ(c.training.steps, 7);
  auto twice = Config::Parse("{}", "o.json", {R"(training={"steps": 3, "steps": 4})"});
  ASSERT_FALSE(twice.ok());
  EXPECT_TRUE(Contains(twice.status().message(), "training.steps: duplicate key"))
      << twice.status().message();
  auto nodes = Config::Parse("{}", "o.json",
                             {R"(distributed.nodes=[{"name": "a", "name": "b", "workers": 1}])"});
  ASSERT_FALSE(nodes.ok());
  EXPECT_TRUE(Contains(nodes.status().message(), "distributed.nodes[0].name: duplicate key"))
      << nodes.status().message();
}

// A key never silently does nothing: pull compression needs a codec.
TEST(ConfigHostileTest, PullCompressionWithoutACodecIsRefused) {
  auto c = Config::Parse(R"({"compression": {"pull": true}})", "pull.json");
  ASSERT_FALSE(c.ok());
  EXPECT_TRUE(Contains(c.status().message(), "compression.pull")) << c.status().message();
  EXPECT_TRUE(Config::Parse(R"({"compression": {"pull": true, "codec": "onebit"}})", "ok").ok());
}

}  // namespace gridsync

namespace gridsync {
namespace {

// A key that only some settings read is refused under the others, naming
// the key, the setting that makes it inert and where it applies; where it
// applies it loads.
TEST(ConfigKeysTest, KeysThatOnlySomeSettingsReadAreRefusedElsewhere) {
  struct Case {
    const char* inert;   // refused
    const char* active;  // the same key where it applies
    const char* key;
  };
  const Case cases[] = {
      {R"({"compression": {"codec": "onebit", "ratio": 0.1}})",
       R"({"compression": {"codec": "topk", "ratio": 0.1}})", "compression.ratio"},
      {R"({"compression": {"codec": "topk", "bits": 3}})",
       R"({"compression": {"codec": "qsgd", "bits": 3}})", "compression.bits"},
      {R"({"compression": {"codec": "qsgd", "block": 64}})",
       R"({"compression": {"codec": "int8", "block": 64}})", "compression.block"},
      {R"({"compression": {"codec": "bf16", "block": 64}})",
       R"({"compression": {"codec": "fp16", "block": 64}})", "compression.block"},
      {R"({"compression": {"error_feedback": false}})",
       R"({"compression": {"codec": "onebit", "error_feedback": false}})",
       "compression.error_feedback"},
      {R"({"compression": {"codec": "none", "min_bytes": 0}})",
       R"({"compression": {"codec": "fp16", "min_bytes": 0}})", "compression.min_bytes"},
      {R"({"distributed": {"batch_splitting": "weighted", "adaptive_interval": 5}})",
       R"({"distributed": {"batch_splitting": "adaptive", "adaptive_interval": 5}})",
       "distributed.adaptive_interval"},
      {R"({"distributed": {"gradient_sync": "ps", "collective": "gloo"}})",
       R"({"distributed": {"gradient_sync": "hybrid", "collective": "gloo"}})",
       "distributed.collective"},
      {R"({"distributed": {"gradient_sync": "hybrid", "bucket_mb": 4}})",
       R"({"distributed": {"gradient_sync": "nccl", "bucket_mb": 4}})", "distributed.bucket_mb"},
      {R"({"distributed": {"gradient_sync": "nccl", "model_parallel": true, "bucket_mb": 4}})",
       R"({"distributed": {"gradient_sync": "nccl", "model_parallel": true, "hierarchical": true,
           "bucket_mb": 4}})",
       "distributed.bucket_mb"},
      {R"({"distributed": {"enable": true, "world_size": 2, "batch_splitting": "adaptive",
           "nodes": [{"name": "a", "workers": 1}, {"name": "b", "workers": 1, "weight": 3}]}})",
       R"({"distributed": {"enable": true, "world_size": 2, "batch_splitting": "weighted",
           "nodes": [{"name": "a", "workers": 1}, {"name": "b", "workers": 1, "weight": 3}]}})",
       "distributed.nodes[1].weight"},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.key);
    const std::string error = ErrorOf(c.inert);
    EXPECT_NE(error.find(std::string(c.key) + ": "), std::string::npos) << error;
    EXPECT_NE(error.find("has no effect"), std::string::npos) << error;
    EXPECT_NE(error.find("allowed: "), std::string::npos) << error;
    const Config active = ParseOk(c.active);
    // And what check-config prints for it loads again.
    EXPECT_TRUE(Config::Parse(active.ToJson().dump(), "printed").ok());
  }
}

// bf16 GEMMs are the CPU trainer's; under "auto" the device is decided on
// the worker, so the key needs "cpu" said outright.
TEST(ConfigKeysTest, Bf16MlpNeedsTheCpuTrainer) {
  EXPECT_NE(
      ErrorOf(R"({"training": {"mlp_precision": "bf16"}})").find("training.device is \"auto\""),
      std::string::npos)
      << "the default device is auto";
  for (const char* device : {"auto", "cuda"}) {
    const std::string error = ErrorOf(
        std::string(R"({"training": {"mlp_precision": "bf16", "device": ")") + device + R"("}})");
    EXPECT_NE(error.find("training.mlp_precision: "), std::string::npos) << error;
    EXPECT_NE(error.find(std::string("training.device is \"") + device), std::string::npos)
        << error;
    EXPECT_NE(error.find("allowed: "), std::string::npos) << error;
  }
  const Config bf16 = ParseOk(R"({"training": {"mlp_precision": "bf16", "device": "cpu"}})");
  EXPECT_EQ(bf16.training.mlp_precision, MlpPrecision::kBf16);
  const auto printed = Config::Parse(bf16.ToJson().dump(), "printed");
  ASSERT_TRUE(printed.ok()) << printed.status().ToString();
  EXPECT_EQ(printed->training.mlp_precision, MlpPrecision::kBf16);
  EXPECT_EQ(ParseOk("{}").training.mlp_precision, MlpPrecision::kFp32);
  EXPECT_NE(ErrorOf(R"({"training": {"mlp_precision": "fp16", "device": "cpu"}})")
                .find("training.mlp_precision"),
            std::string::npos);
}

}  // namespace
}  // namespace gridsync
