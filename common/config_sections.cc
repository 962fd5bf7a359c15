// The section readers of Config::Parse (config_sections.h).
//
// Thread safety: see config_sections.h.
#include "common/config_sections.h"

#include <spdlog/fmt/fmt.h>

#include <algorithm>
#include <limits>
#include <span>
#include <string>
#include <string_view>
#include <unordered_set>

namespace gridsync::config_sections {
namespace {

// Paths the binaries open or create: longer ones fail in the kernel
// (ENAMETOOLONG) only once a run reaches them, and would be echoed whole.
constexpr size_t kMaxPathBytes = 4095;
// distributed.world_size; also bounds distributed.nodes, one worker each.
constexpr int kMaxWorldSize = 65536;

using Json = nlohmann::json;

// Parsing goes through the enumerator lists and ToString, so the accepted spellings and the
// printed ones cannot drift apart.
constexpr GradientSyncMode kGradientSyncs[] = {GradientSyncMode::kNccl, GradientSyncMode::kPs,
                                               GradientSyncMode::kHybrid};
constexpr BatchSplitting kBatchSplittings[] = {BatchSplitting::kEven, BatchSplitting::kWeighted,
                                               BatchSplitting::kAdaptive};
constexpr ModelParallelDim kModelParallelDims[] = {
    ModelParallelDim::kRow, ModelParallelDim::kColumn, ModelParallelDim::kBoth};
constexpr TaskType kTaskTypes[] = {TaskType::kImage, TaskType::kSdf, TaskType::kNerf};
constexpr std::string_view kCodecNames[] = {"none", "fp16",   "bf16", "int8",
                                            "qsgd", "onebit", "topk", "randomk"};
constexpr TrainingDevice kTrainingDevices[] = {TrainingDevice::kAuto, TrainingDevice::kCpu,
                                               TrainingDevice::kCuda};
constexpr MlpPrecision kMlpPrecisions[] = {MlpPrecision::kFp32, MlpPrecision::kBf16};
constexpr CollectiveKind kCollectiveKinds[] = {CollectiveKind::kAuto, CollectiveKind::kNccl,
                                               CollectiveKind::kGloo};
constexpr Consistency kConsistencies[] = {Consistency::kBsp, Consistency::kSsp,
                                          Consistency::kAsync};
constexpr OptimizerPlacement kOptimizerPlacements[] = {
    OptimizerPlacement::kAuto, OptimizerPlacement::kShard, OptimizerPlacement::kWorker};
constexpr SecurityMode kSecurityModes[] = {SecurityMode::kAuto, SecurityMode::kCurve,
                                           SecurityMode::kOff};
constexpr std::string_view kEncodingTypes[] = {"HashGrid"};
constexpr int kFeaturesPerLevel[] = {1, 2, 4, 8};

}  // namespace

using config_reader::Got;
using config_reader::Problems;
using config_reader::Quote;
using config_reader::SectionReader;
using config_reader::StringRule;

namespace {

// master_addr and ps.host (a node's host says where it binds as well). 253
// is the longest DNS name; an IP address is far shorter.
constexpr StringRule kHostRule{
    .allowed =
        "an IP address or a host name (letters, digits, '-' and '_' between dots), "
        "without a port, at most 253 characters",
    .max_length = 253,
    .forbid_spaces = true,
    .host = true};

void ReadEncoding(SectionReader& top, Problems& problems, Config& config) {
  EncodingConfig& e = config.encoding;
  SectionReader r(&problems, "encoding", top.Object("encoding"));
  r.StringChoice("otype", &e.otype, kEncodingTypes);
  r.Int("n_levels", &e.n_levels, 1, 32);
  r.IntChoice("n_features_per_level", &e.n_features_per_level, kFeaturesPerLevel);
  r.Int("log2_hashmap_size", &e.log2_hashmap_size, 4, 30);
  r.Int("base_resolution", &e.base_resolution, 1, 1 << 20);
  r.Double("per_level_scale", &e.per_level_scale, 1.0, /*lo_open=*/false, 16.0);
  r.ReportUnknownKeys();
}

void ReadNetwork(SectionReader& top, Problems& problems, Config& config) {
  NetworkConfig& n = config.network;
  SectionReader r(&problems, "network", top.Object("network"));
  r.Int("n_neurons", &n.n_neurons, 1, 1024);
  const bool layers_ok = r.Int("n_hidden_layers", &n.n_hidden_layers, 0, 16);
  r.ReportUnknownKeys();
  // Without a hidden layer the MLP is one linear map: no width to set.
  if (layers_ok && n.n_hidden_layers == 0 && r.Has("n_neurons")) {
    problems.Add("network.n_neurons",
                 std::to_string(n.n_neurons) +
                     " has no effect with network.n_hidden_layers 0 (no hidden layer)",
                 "network.n_neurons only with hidden layers");
  }
}

void ReadDistributed(SectionReader& top, Problems& problems, Config& config) {
  DistributedConfig& d = config.distributed;
  SectionReader r(&problems, "distributed", top.Object("distributed"));
  const bool enable_ok = r.Bool("enable", &d.enable);
  const bool world_size_ok = r.Int("world_size", &d.world_size, 1, kMaxWorldSize);
  r.String("master_addr", &d.master_addr, kHostRule);
  r.Int("master_port", &d.master_port, 1, 65535);
  const bool sync_ok = r.EnumValue("gradient_sync", &d.gradient_sync,
                                   std::span<const GradientSyncMode>(kGradientSyncs));
  const bool splitting_ok = r.EnumValue("batch_splitting", &d.batch_splitting,
                                        std::span<const BatchSplitting>(kBatchSplittings));
  const bool model_parallel_ok = r.Bool("model_parallel", &d.model_parallel);
  const bool mp_dim_ok =
      r.EnumValue("mp_dim", &d.mp_dim, std::span<const ModelParallelDim>(kModelParallelDims));
  const bool hierarchical_ok = r.Bool("hierarchical", &d.hierarchical);
  // At least a second: every wait includes a peer's start (a process
  // launched beside the coordinator connects before it listens, a worker
  // loads its image before the first barrier), so 0.001-0.2 passed here
  // and no job could ever start ("cannot connect ... within 0.1 s").
  r.Double("timeout_s", &d.timeout_s, 1.0, /*lo_open=*/false, 3600.0);
  r.EnumValue("collective", &d.collective, std::span<const CollectiveKind>(kCollectiveKinds));
  // At least 1 KiB: smaller buckets only multiply the all-reduces (1e-30
  // made 4-byte buckets, 7.6M all-reduces a step, and no step ended).
  r.Double("bucket_mb", &d.bucket_mb, 0.001, /*lo_open=*/false, 4096.0);
  r.Int("adaptive_interval", &d.adaptive_interval, 1, 100000);
  const char* kNodesAllowed =
      "an array of objects {\"name\": string, \"workers\": integer, \"weight\": number, "
      "\"host\": address, \"shards\": integer}";
  bool nodes_ok = true;
  std::string weight_given;  // the first node that sets a weight
  std::unordered_set<std::string> node_names;
  const Json* nodes = r.Array("nodes", kNodesAllowed);
  // Each node has a worker, so no more nodes than the largest world size;
  // checked first, since every node is read and compared below.
  if (nodes != nullptr && nodes->size() > static_cast<size_t>(kMaxWorldSize)) {
    problems.Add(
        "distributed.nodes", std::to_string(nodes->size()) + " nodes",
        "at most " + std::to_string(kMaxWorldSize) + " nodes (each has at least one worker)");
    nodes_ok = false;
    nodes = nullptr;
  }
  if (nodes != nullptr) {
    for (size_t i = 0; i < nodes->size(); ++i) {
      const std::string path = "distributed.nodes[" + std::to_string(i) + "]";
      const Json& item = (*nodes)[i];
      if (!item.is_object()) {
        problems.Add(path, "wrong type: expected an object, got " + Got(item), kNodesAllowed);
        nodes_ok = false;
        continue;
      }
      NodeConfig node;
      SectionReader nr(&problems, path, &item);
      nodes_ok &=
          nr.String("name", &node.name,
                    {.allowed = "a non-empty node name without spaces, at most 253 characters",
                     .max_length = 253,
                     .forbid_spaces = true});
      nodes_ok &= nr.Int("workers", &node.workers, 1, 4096);
      nodes_ok &= nr.Double("weight", &node.weight, 0.0, /*lo_open=*/true, 1e6);
      if (nr.Has("weight") && weight_given.empty()) weight_given = path + ".weight";
      nodes_ok &= nr.String("host", &node.host,
                            {.allowed = "the address this node's processes bind and advertise: "
                                        "an IP address or a host name (letters, digits, '-' "
                                        "and '_' between dots), without a port, at most 253 "
                                        "characters",
                             .max_length = 253,
                             .forbid_spaces = true,
                             .host = true});
      nodes_ok &= nr.Int("shards", &node.shards, 0, 256);  // absent: placed by ClusterLayout
      if (!nr.Has("name")) {
        problems.Add(path + ".name", "missing", "every node needs a name");
        nodes_ok = false;
      }
      nr.ReportUnknownKeys();
      if (!node.name.empty() && !node_names.insert(node.name).second) {
        problems.Add(path + ".name", "duplicate node name " + Quote(node.name), "unique names");
        nodes_ok = false;
      }
      d.nodes.push_back(node);
    }
    if (nodes->empty()) {
      problems.Add("distributed.nodes", "empty array", "at least one node, or leave the key out");
      nodes_ok = false;
    }
  }
  r.ReportUnknownKeys();
  if (nodes_ok && world_size_ok && !d.nodes.empty()) {
    int total = 0;
    for (const auto& node : d.nodes) total += node.workers;
    if (total != d.world_size) {
      problems.Add("distributed.nodes",
                   "workers add up to " + std::to_string(total) +
                       ", but distributed.world_size is " + std::to_string(d.world_size),
                   "node worker counts that sum to distributed.world_size");
    }
  }

  // A key that silently does nothing misleads whoever reads the config later, so settings
  // that only matter together with another one are refused when that one is off.
  if (enable_ok && world_size_ok && !d.enable && d.world_size > 1) {
    problems.Add("distributed.world_size",
                 std::to_string(d.world_size) + " needs distributed.enable true",
                 "1 while distributed.enable is false");
  }
  if (splitting_ok && !weight_given.empty() && d.batch_splitting != BatchSplitting::kWeighted) {
    problems.Add(weight_given,
                 "has no effect with batch_splitting " + Quote(ToString(d.batch_splitting)) +
                     " (only \"weighted\" splits the batch by node weight)",
                 "node weights only with distributed.batch_splitting \"weighted\"; remove them "
                 "or split by weight");
  }
  if (splitting_ok && r.Has("adaptive_interval") &&
      d.batch_splitting != BatchSplitting::kAdaptive) {
    problems.Add("distributed.adaptive_interval",
                 std::to_string(d.adaptive_interval) + " has no effect with batch_splitting " +
                     Quote(ToString(d.batch_splitting)),
                 "distributed.adaptive_interval only with batch_splitting \"adaptive\"");
  }
  // The collective runs the all-reduce (nccl) or the reduce inside a node
  // (hybrid); only the all-reduce is cut into buckets.
  if (sync_ok && r.Has("collective") && d.gradient_sync == GradientSyncMode::kPs) {
    problems.Add("distributed.collective",
                 Quote(ToString(d.collective)) +
                     " has no effect with gradient_sync \"ps\" (no collective runs)",
                 "distributed.collective only with gradient_sync \"nccl\" or \"hybrid\"");
  }
  if (sync_ok && r.Has("bucket_mb") && d.gradient_sync != GradientSyncMode::kNccl) {
    problems.Add("distributed.bucket_mb",
                 fmt::format("{:g} has no effect with gradient_sync {} (no bucketed all-reduce)",
                             d.bucket_mb, Quote(ToString(d.gradient_sync))),
                 "distributed.bucket_mb only with gradient_sync \"nccl\"");
  }
  // Model parallelism without the hierarchical stage sums the gradient with
  // one reduce-scatter (worker/sync/sharded_update.h), never in buckets.
  if (sync_ok && model_parallel_ok && hierarchical_ok && r.Has("bucket_mb") &&
      d.gradient_sync == GradientSyncMode::kNccl && d.model_parallel && !d.hierarchical) {
    problems.Add("distributed.bucket_mb",
                 fmt::format("{:g} has no effect with distributed.model_parallel true and "
                             "hierarchical false (the gradient is summed by one reduce-scatter, "
                             "not a bucketed all-reduce)",
                             d.bucket_mb),
                 "distributed.bucket_mb with gradient_sync \"nccl\" when model_parallel is false "
                 "or hierarchical is true; remove it");
  }
  if (model_parallel_ok && mp_dim_ok && r.Has("mp_dim") && !d.model_parallel) {
    problems.Add(
        "distributed.mp_dim",
        Quote(ToString(d.mp_dim)) + " has no effect unless distributed.model_parallel is true",
        "distributed.mp_dim only with distributed.model_parallel: true; remove it or "
        "enable model parallelism");
  }
  // Hierarchical means reduce inside each node first, then across nodes:
  // nccl's hierarchical all-reduce, and what hybrid always does (a
  // collective inside the node, the PS across nodes). Plain ps has no
  // intra-node stage, so the key would do nothing there.
  if (hierarchical_ok && sync_ok && d.hierarchical && d.gradient_sync == GradientSyncMode::kPs) {
    problems.Add("distributed.hierarchical",
                 "true needs a node-level stage, which gradient_sync \"ps\" does not have",
                 "distributed.hierarchical: true with gradient_sync \"nccl\" (its "
                 "hierarchical all-reduce); with \"ps\" set it to false, or use \"hybrid\", "
                 "which reduces inside each node first without the key");
  }
}

void ReadTraining(SectionReader& top, Problems& problems, Config& config) {
  TrainingConfig& t = config.training;
  SectionReader r(&problems, "training", top.Object("training"));
  const bool batch_ok = r.Int("batch_size", &t.batch_size, 1, 1 << 24);
  r.Double("learning_rate", &t.learning_rate, 0.0, /*lo_open=*/true, 10.0);
  r.Bool("mixed_precision", &t.mixed_precision);
  const bool accumulation_ok = r.Int("gradient_accumulation", &t.gradient_accumulation, 1, 1024);
  const bool dynamic_ok = r.Bool("dynamic_resolution", &t.dynamic_resolution);
  const bool dynamic_steps_ok =
      r.Int("dynamic_resolution_steps", &t.dynamic_resolution_steps, 0, kMaxTrainingSteps);
  r.Int("steps", &t.steps, 1, kMaxTrainingSteps);
  r.Uint64("seed", &t.seed);
  r.Int("threads", &t.threads, 1, 256);
  r.Int("log_every", &t.log_every, 0, std::numeric_limits<int>::max());
  const bool device_ok =
      r.EnumValue("device", &t.device, std::span<const TrainingDevice>(kTrainingDevices));
  const bool precision_ok =
      r.EnumValue("mlp_precision", &t.mlp_precision, std::span<const MlpPrecision>(kMlpPrecisions));
  r.ReportUnknownKeys();

  // The GPU trainer multiplies in fp32 (cuBLAS, pedantic math); under
  // "auto" the device is only known on the worker, and check-config must
  // refuse what the worker would.
  if (device_ok && precision_ok && t.mlp_precision == MlpPrecision::kBf16 &&
      t.device != TrainingDevice::kCpu) {
    problems.Add("training.mlp_precision",
                 "\"bf16\" is the CPU trainer's (AVX-512 BF16 or AMX; rounded operands "
                 "elsewhere), and training.device is \"" +
                     std::string(ToString(t.device)) + "\"",
                 "\"bf16\" with training.device \"cpu\"; otherwise \"fp32\"");
  }

  // Every micro-batch must hold the same whole number of samples (>= 1), or accumulated
  // gradients would weight samples unevenly; divisibility implies both.
  if (batch_ok && accumulation_ok && t.batch_size % t.gradient_accumulation != 0) {
    const int limit = std::min(t.batch_size, 1024);
    int below = t.gradient_accumulation < limit ? t.gradient_accumulation : limit;
    while (t.batch_size % below != 0) --below;
    int above = t.gradient_accumulation + 1;
    while (above <= limit && t.batch_size % above != 0) ++above;
    std::string nearest = std::to_string(below);
    if (above <= limit) nearest += " or " + std::to_string(above);
    problems.Add("training.gradient_accumulation",
                 std::to_string(t.gradient_accumulation) + " does not divide training.batch_size " +
                     std::to_string(t.batch_size) +
                     " (each micro-batch is batch_size / gradient_accumulation samples, a whole "
                     "number >= 1)",
                 "a divisor of training.batch_size in 1..1024, nearest: " + nearest);
  }
  if (dynamic_ok && dynamic_steps_ok && !t.dynamic_resolution && t.dynamic_resolution_steps > 0) {
    problems.Add("training.dynamic_resolution_steps",
                 std::to_string(t.dynamic_resolution_steps) +
                     " has no effect unless training.dynamic_resolution is true",
                 "0 while training.dynamic_resolution is false");
  }
}

void ReadTask(SectionReader& top, Problems& problems, Config& config) {
  TaskConfig& k = config.task;
  SectionReader r(&problems, "task", top.Object("task"));
  r.EnumValue("type", &k.type, std::span<const TaskType>(kTaskTypes));
  r.String(
      "image", &k.image,
      {.allowed = "a non-empty path to a JPEG (8-bit, baseline, extended or progressive), PNG, BMP "
                  "(uncompressed), TGA, GIF or binary PNM (P5, P6) image, at most 4095 "
                  "bytes (PATH_MAX)",
       .max_length = kMaxPathBytes});
  r.String("output", &k.output,
           {.allowed = "a non-empty folder path of at most 4095 bytes (PATH_MAX)",
            .max_length = kMaxPathBytes});
  r.ReportUnknownKeys();
}

void ReadPs(SectionReader& top, Problems& problems, Config& config) {
  PsConfig& p = config.ps;
  SectionReader r(&problems, "ps", top.Object("ps"));
  r.Int("shards", &p.shards, 1, 256);
  const bool consistency_ok =
      r.EnumValue("consistency", &p.consistency, std::span<const Consistency>(kConsistencies));
  const bool staleness_ok = r.Int("staleness", &p.staleness, 0, 1000);
  r.Int("threads", &p.threads, 1, 64);
  r.String("host", &p.host, kHostRule);
  p.host_given = r.Has("host");
  r.Int("base_port", &p.base_port, 0, 65535);
  r.EnumValue("optimizer", &p.optimizer, std::span<const OptimizerPlacement>(kOptimizerPlacements));
  r.ReportUnknownKeys();
  if (consistency_ok && staleness_ok && r.Has("staleness") && p.consistency != Consistency::kSsp) {
    problems.Add("ps.staleness",
                 std::to_string(p.staleness) + " has no effect unless ps.consistency is \"ssp\"",
                 "ps.staleness only with ps.consistency \"ssp\"");
  }
}

void ReadCompression(SectionReader& top, Problems& problems, Config& config) {
  CompressionConfig& c = config.compression;
  SectionReader r(&problems, "compression", top.Object("compression"));
  // A combination is checked only when both its keys are valid: with a
  // misspelt codec, "has no effect with codec none" would blame the
  // options for a value the user never wrote.
  const bool codec_ok = r.StringChoice("codec", &c.codec, kCodecNames);
  r.Double("ratio", &c.ratio, 0.0, /*lo_open=*/true, 1.0);
  r.Int("bits", &c.bits, 1, 8);
  r.Int("block", &c.block, 1, 65536);
  c.block_given = r.Has("block");
  // Unset, error feedback follows the codec and what it carries:
  // - off for qsgd and randomk, which are unbiased by rescaling, so their
  //   residual is (1 - n/k) times what they kept and feeding it back
  //   diverges (measured: gridsync-bench compress --train);
  // - off for fp16, bf16 and int8, which deliver every value, rounded:
  //   what error feedback holds back of the rounding comes later in bursts,
  //   and it costs time (with it Adam runs on the workers). Measured side
  //   by side: under ps (compress --train, 2000 steps, 2 workers, means of
  //   3 seeds whose spread is up to 1 dB; none 37.31 dB) fp16 37.21 without
  //   it and 37.19 with, bf16 37.60 and 37.22, int8 37.06 and 37.31, train
  //   time 1.13 and 1.20 times none's for fp16; under nccl
  //   (configs/local.json, 500 steps, one seed) fp16 37.46 against 36.61,
  //   bf16 37.06 against 36.41;
  // - on for onebit and topk, which hold most of a step back.
  // (Read in either case, so the key is known to the unknown-key report.)
  c.error_feedback = c.codec != "qsgd" && c.codec != "randomk" && !c.OnlyRounds();
  r.Bool("error_feedback", &c.error_feedback);
  r.Int("min_bytes", &c.min_bytes, 0, 1 << 30);
  const bool pull_ok = r.Bool("pull", &c.pull);
  r.ReportUnknownKeys();
  if (!codec_ok) return;
  // Each codec option is read by the codecs named here and nothing else.
  struct CodecKey {
    const char* key;
    bool applies;
    const char* codecs;
  };
  const bool none = c.codec == "none";
  const CodecKey codec_keys[] = {
      {"ratio", c.codec == "topk" || c.codec == "randomk", "codec \"topk\" or \"randomk\""},
      {"bits", c.codec == "qsgd", "codec \"qsgd\""},
      {"block", c.codec == "int8" || c.codec == "fp16", "codec \"int8\" or \"fp16\""},
      {"error_feedback", !none, "a codec other than \"none\""},
      {"min_bytes", !none, "a codec other than \"none\""},
  };
  for (const CodecKey& k : codec_keys) {
    if (!r.Has(k.key) || k.applies) continue;
    problems.Add(std::string("compression.") + k.key,
                 "has no effect with compression.codec " + Quote(c.codec),
                 std::string("compression.") + k.key + " only with " + k.codecs +
                     "; remove it or pick such a codec");
  }
  // Their residual is (1 - n/k) times what they kept: fed back, it grows
  // step by step (a hostile probe: randomk's loss reached 1e14, qsgd's 5.7
  // against 0.014, under a warning that blamed the learning rate).
  if (c.error_feedback && (c.codec == "qsgd" || c.codec == "randomk")) {
    problems.Add("compression.error_feedback",
                 "true with compression.codec " + Quote(c.codec) +
                     " diverges: the codec is unbiased by rescaling what it keeps, so its "
                     "residual is no error to feed back",
                 "false with qsgd and randomk (their default), or a codec that feeds back its "
                 "error (fp16, bf16, int8, onebit, topk)");
  }
  if (pull_ok && c.pull && c.codec == "none") {
    problems.Add("compression.pull",
                 "true has no effect with compression.codec \"none\" (pulls then carry the "
                 "parameters themselves)",
                 "false, or a codec (fp16, bf16, int8, qsgd, onebit, topk, randomk)");
  }
}

void ReadCheckpoint(SectionReader& top, Problems& problems, Config& config) {
  CheckpointConfig& k = config.checkpoint;
  SectionReader r(&problems, "checkpoint", top.Object("checkpoint"));
  r.Int("every_steps", &k.every_steps, 0, kMaxTrainingSteps);
  r.String("dir", &k.dir,
           {.allowed = "a folder for the shards' checkpoints, at most 4095 bytes (PATH_MAX)",
            .max_length = kMaxPathBytes});
  r.ReportUnknownKeys();
  if (!r.Has("dir")) k.dir = config.task.output + "/checkpoints";
}

void ReadMetrics(SectionReader& top, Problems& problems, Config& config) {
  SectionReader r(&problems, "metrics", top.Object("metrics"));
  r.Int("port", &config.metrics.port, 0, 65535);
  r.ReportUnknownKeys();
  // The metrics ports (coordinator, shards, workers) must not run past
  // 65535.
  const int m = config.metrics.port;
  const int shards =
      config.distributed.gradient_sync == GradientSyncMode::kNccl ? 0 : config.ps.shards;
  const int last = m + shards + config.distributed.world_size;
  if (m > 0 && last > 65535) {
    problems.Add(
        "metrics.port",
        std::to_string(m) + " puts the last worker's metrics at port " + std::to_string(last),
        65535 - shards - config.distributed.world_size >= 1
            ? "1.." + std::to_string(65535 - shards - config.distributed.world_size) +
                  " (1 + ps.shards + world_size ports from it), or 0 (off)"
            : "0 (off): 1 + ps.shards + world_size = " +
                  std::to_string(1 + shards + config.distributed.world_size) +
                  " ports do not fit below 65536");
  }
  // Overlaps with the cluster's own ports: CheckPorts, once the shards
  // are placed.
}

void ReadSecurity(SectionReader& top, Problems& problems, Config& config) {
  SecurityConfig& sec = config.security;
  SectionReader r(&problems, "security", top.Object("security"));
  const bool mode_ok =
      r.EnumValue("mode", &sec.mode, std::span<const SecurityMode>(kSecurityModes));
  const bool dir_ok =
      r.String("keys_dir", &sec.keys_dir,
               {.allowed = "a folder with the keys `gridsync keygen` wrote, at most 4095 bytes",
                .max_length = kMaxPathBytes});
  r.ReportUnknownKeys();
  // Under "off" no key is ever loaded: a keys_dir there reads as if the
  // data plane were secured, which it is not.
  if (mode_ok && dir_ok && sec.mode == SecurityMode::kOff && r.Has("keys_dir")) {
    problems.Add("security.keys_dir",
                 Quote(sec.keys_dir) +
                     " has no effect with security.mode \"off\" (no key is "
                     "loaded and the data plane is neither authenticated nor "
                     "encrypted)",
                 "security.keys_dir only with security.mode \"curve\" or \"auto\"; remove it "
                 "or turn CURVE on");
  }
}

}  // namespace

void ReadSections(SectionReader* top, Problems* problems, Config* config) {
  ReadEncoding(*top, *problems, *config);
  ReadNetwork(*top, *problems, *config);
  ReadDistributed(*top, *problems, *config);
  ReadTraining(*top, *problems, *config);
  ReadTask(*top, *problems, *config);
  ReadPs(*top, *problems, *config);
  ReadCompression(*top, *problems, *config);
  ReadCheckpoint(*top, *problems, *config);
  ReadMetrics(*top, *problems, *config);
  ReadSecurity(*top, *problems, *config);
}

}  // namespace gridsync::config_sections
