// The gridsync configuration: JSON with // comments, loaded, strictly
// validated and filled with defaults in one place.
//
// Every binary reads the same file. Validation rejects unknown keys, wrong
// types, out-of-range values and unsupported combinations with a message that
// names the key path, the bad value and what is allowed; binaries turn such a
// Status into exit code 2 (kConfigErrorExitCode) before anything starts.
// Keys whose feature arrives later are accepted here and refused, with
// "not supported yet", by the code that would use them (see
// Config::CheckRunnable).
//
// Thread safety: a Config is an immutable value after loading; share freely.
#pragma once

#include <chrono>
#include <cstdint>
#include <nlohmann/json.hpp>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "common/status.h"

namespace gridsync {

// The most steps a run (training.steps), a checkpoint cadence or a step
// flag (--resume-step, --start-step) may name.
inline constexpr int kMaxTrainingSteps = 10'000'000;

inline constexpr int kConfigErrorExitCode = 2;
// A process (shard or worker) refused to start a job afresh over
// checkpoints another run left (CheckFreshStart), or to start or roll back
// from checkpoint files of another run than the job's (common/
// checkpoint_run.h): StatusCode::kCheckpointsHeld. Or gridsync launch
// --resume found every complete step's files damaged. Nothing a restart
// mends, and distinct from exit 2 so that the units can refuse to restart
// on it alone (RestartPreventExitStatus) and gridsync launch does not
// restart it.
inline constexpr int kCheckpointsHeldExitCode = 3;
// A worker lost its coordinator during a job it can rejoin (checkpoints on,
// ps or hybrid), or reached none before its first step (any mode: it joined
// nothing). Restarted, it rejoins or starts once the coordinator serves; the
// worker unit restarts on it alone (RestartForceExitStatus), as on a crash.
inline constexpr int kCoordinatorLostExitCode = 4;
// A shard or worker started after the job's training began found no
// complete checkpoint to rejoin from (the coordinator refused it with
// kFailedPrecondition): the job lost its part for good, and restarting the
// process at once would be refused the same way. gridsync launch stops the
// job on it instead of spending --max-restarts.
inline constexpr int kCannotRejoinExitCode = 5;
// A shard stopped (SIGTERM, SIGINT), or a worker holding checkpoint state
// finished, after checkpoint writes failed since it started (a full disk, a
// folder it may no longer write): the job trained,
// but its checkpoints may be incomplete, which a run that asked for them
// must not end quietly on (gridsync launch then exits 1 after the summary;
// under systemd the stopped unit shows failed).
inline constexpr int kCheckpointsNotWrittenExitCode = 6;

// What a run writes in task.output at its end (rank 0, or a standalone run).
inline constexpr const char* kReconstructionFile = "reconstruction.png";

// The image every demo and benchmark fits unless task.image says otherwise:
// a public-domain photo shipped by Debian's python-matplotlib-data (512x600).
inline constexpr const char* kDefaultImagePath =
    "/usr/share/matplotlib/mpl-data/sample_data/grace_hopper.jpg";

enum class GradientSyncMode { kNccl, kPs, kHybrid };
enum class BatchSplitting { kEven, kWeighted, kAdaptive };
enum class ModelParallelDim { kRow, kColumn, kBoth };
enum class TaskType { kImage, kSdf, kNerf };
enum class Consistency { kBsp, kSsp, kAsync };
// Where Adam runs under ps/hybrid: on the shards (pushes carry gradients)
// or on each worker (pushes carry parameter updates, which the shards
// average per row). auto: on the workers whenever a codec is on: Adam on
// the shards normalises each late burst error feedback delivers down to one
// step, and compressing the update instead loses less for every codec.
enum class OptimizerPlacement { kAuto, kShard, kWorker };
enum class CollectiveKind { kAuto, kNccl, kGloo };
// Where the model trains: auto (CUDA when this build has it and a device is
// present, else the CPU), cpu, or cuda (kernels/cuda/device_trainer.h).
enum class TrainingDevice { kAuto, kCpu, kCuda };
// The format the CPU trainer's MLP multiplies in: fp32, or bf16 operands
// (weights, activations and their gradients rounded to bfloat16) with fp32
// sums, native on AVX-512 BF16 and AMX (kernels/cpu/gemm.h).
enum class MlpPrecision { kFp32, kBf16 };

std::string_view ToString(GradientSyncMode v);
std::string_view ToString(BatchSplitting v);
std::string_view ToString(ModelParallelDim v);
std::string_view ToString(TaskType v);
std::string_view ToString(Consistency v);
std::string_view ToString(OptimizerPlacement v);
std::string_view ToString(CollectiveKind v);
std::string_view ToString(TrainingDevice v);
std::string_view ToString(MlpPrecision v);

struct EncodingConfig {
  std::string otype = "HashGrid";  // only HashGrid
  int n_levels = 16;               // 1..32
  int n_features_per_level = 2;    // 1, 2, 4 or 8
  int log2_hashmap_size = 19;      // 4..30
  int base_resolution = 16;        // 1..1<<20
  double per_level_scale = 1.5;    // 1.0..16.0 (finite)

  // Field by field: what a round trip through ToJson must preserve.
  bool operator==(const EncodingConfig&) const = default;
};

struct NetworkConfig {
  int n_neurons = 64;       // 1..1024
  int n_hidden_layers = 2;  // 0..16

  // Field by field: what a round trip through ToJson must preserve.
  bool operator==(const NetworkConfig&) const = default;
};

// A node: a machine (or, in tests, a group of processes) whose workers share
// fast links. Worker ranks are dealt to nodes in order: the first node's
// workers are ranks 0..workers-1, and so on.
struct NodeConfig {
  std::string name;     // non-empty, unique
  int workers = 1;      // 1..4096
  double weight = 1.0;  // (0, 1e6]: share of the global batch under batch_splitting weighted
  // The address this node's processes bind and advertise (Gloo, shards).
  // Empty: unset (every node unset means one machine; see ClusterLayout).
  std::string host;
  int shards = -1;  // 0..256 PS shards on this node; -1: unset (placed by ClusterLayout)

  // Field by field: what a round trip through ToJson must preserve.
  bool operator==(const NodeConfig&) const = default;
};

// Where every process of the cluster lives, resolved once from the config
// (common/cluster_layout.cc has the rules) and validated with it, so
// check-config refuses exactly what the binaries would.
struct ShardPlacement {
  int node = 0;      // index into ClusterLayout::nodes
  std::string host;  // the address the shard binds and advertises
  int port = 0;
  std::string Endpoint() const;  // "tcp://host:port"

  // Field by field: what a round trip through ToJson must preserve.
  bool operator==(const ShardPlacement&) const = default;
};

struct ClusterLayout {
  // More than one machine: every advertised address must be reachable from
  // the others (no loopback, no 0.0.0.0).
  bool multi_host = false;
  std::vector<NodeConfig> nodes;       // distributed.nodes (or one node), host filled in
  std::vector<ShardPlacement> shards;  // one per PS shard; empty under gradient_sync nccl
  int coordinator_node = 0;            // the node whose host is master_addr; -1: none of them

  // Index of the node called `name`, or -1.
  int NodeIndex(std::string_view name) const;
  // Worker ranks of node n: [first, first + nodes[n].workers).
  int FirstRank(int n) const;

  // Field by field: what a round trip through ToJson must preserve.
  bool operator==(const ClusterLayout&) const = default;
};

struct DistributedConfig {
  bool enable = false;
  int world_size = 1;                     // 1..65536
  std::string master_addr = "127.0.0.1";  // non-empty host name or address
  int master_port = 29500;                // 1..65535
  GradientSyncMode gradient_sync = GradientSyncMode::kNccl;
  BatchSplitting batch_splitting = BatchSplitting::kEven;
  bool model_parallel = false;
  ModelParallelDim mp_dim = ModelParallelDim::kRow;  // only meaningful with model_parallel
  bool hierarchical = false;
  double timeout_s = 30.0;  // [1, 3600]: every wait (rendezvous, barrier, pull) gives up after this
  // auto: NCCL where the model lives on the GPU, else Gloo (RunSpec resolves it)
  CollectiveKind collective = CollectiveKind::kAuto;
  double bucket_mb = 25.0;     // (0, 4096]: all-reduce bucket size in MiB
  int adaptive_interval = 20;  // 1..100000: steps between re-splits under batch_splitting adaptive
  std::vector<NodeConfig> nodes;  // empty: one node holding every worker

  // The nodes with the default filled in, and where a worker rank lives.
  std::vector<NodeConfig> ResolvedNodes() const;
  int NodeOf(int rank) const;
  // timeout_s as the duration every wait uses.
  std::chrono::milliseconds timeout() const {
    return std::chrono::milliseconds(static_cast<int64_t>(timeout_s * 1000));
  }
  // Hierarchical all-reduce: the slices each node's buffer is cut into (the
  // smallest node's worker count; local ranks at or above it own none).
  int HierarchicalSlices() const;
  int LocalRankOf(int rank) const;

  // Field by field: what a round trip through ToJson must preserve.
  bool operator==(const DistributedConfig&) const = default;
};

struct PsConfig {
  int shards = 1;  // 1..256 PS shard processes
  Consistency consistency = Consistency::kBsp;
  int staleness = 2;               // 0..1000; ssp only: max steps ahead of the slowest
  int threads = 2;                 // 1..64 threads per shard
  std::string host = "127.0.0.1";  // where shards listen on one machine
  bool host_given = false;         // ps.host appeared in the config
  int base_port = 0;               // 0: master_port + 1 + shard; else base_port + shard
  OptimizerPlacement optimizer = OptimizerPlacement::kAuto;

  // Field by field: what a round trip through ToJson must preserve.
  bool operator==(const PsConfig&) const = default;
};

struct TrainingConfig {
  int batch_size = 16384;       // 1..1<<24; samples per optimizer step (global)
  double learning_rate = 1e-2;  // (0, 10], finite
  bool mixed_precision = false;
  int gradient_accumulation = 1;  // 1..1024, must divide batch_size
  bool dynamic_resolution = false;
  int dynamic_resolution_steps = 0;  // 0 = steps/2; step by which every level is on
  int steps = 1000;                  // 1..kMaxTrainingSteps
  uint64_t seed = 1337;
  int threads = 1;      // 1..256
  int log_every = 100;  // 0 = never; >= 0
  TrainingDevice device = TrainingDevice::kAuto;
  MlpPrecision mlp_precision = MlpPrecision::kFp32;  // bf16 needs device "cpu"

  // Field by field: what a round trip through ToJson must preserve.
  bool operator==(const TrainingConfig&) const = default;
};

struct TaskConfig {
  TaskType type = TaskType::kImage;
  std::string image = kDefaultImagePath;  // path to a JPEG/PNG/BMP/TGA/GIF/PNM
  std::string output = "out";             // folder for the reconstruction and reports

  // Field by field: what a round trip through ToJson must preserve.
  bool operator==(const TaskConfig&) const = default;
};

// Gradient compression on the PS path (ps pushes; in hybrid, across nodes
// only). Codec names and wire formats: kernels/cpu/codec.h.
struct CompressionConfig {
  std::string codec = "none";  // none, fp16, bf16, int8, qsgd, onebit, topk, randomk
  double ratio = 0.01;         // (0, 1]: topk/randomk fraction of values kept
  int bits = 4;                // 1..8: qsgd level bits
  int block = 256;             // 1..65536: int8 and fp16 values per scale
  bool block_given = false;    // compression.block appeared in the config
  // Keep the compression residual of touched rows and add it back. Unset:
  // true for onebit and topk; false for the unbiased qsgd and randomk and
  // for the codecs that only round (OnlyRounds).
  bool error_feedback = true;
  int min_bytes = 4096;  // 0..2^30: smaller blocks travel uncompressed
  bool pull = false;     // also compress pull replies (no error feedback)

  // The codec's properties (common/codec_format.h); false for a name that
  // is no codec (refused at load).
  bool OnlyRounds() const;
  bool KeepsGradientRange() const;

  // Field by field: what a round trip through ToJson must preserve.
  bool operator==(const CompressionConfig&) const = default;
};

// Authentication and encryption of the data plane (ZeroMQ CURVE with a ZAP
// handler on every shard; common/wire/curve.h). auto: on whenever the
// cluster spans machines (ClusterLayout::multi_host), off on one machine.
enum class SecurityMode { kAuto, kCurve, kOff };
std::string_view ToString(SecurityMode v);

struct SecurityConfig {
  SecurityMode mode = SecurityMode::kAuto;
  std::string keys_dir;  // <role>.key and <role>.pub files (gridsync keygen DIR)
  bool curve = false;    // resolved: CURVE on

  // Field by field: what a round trip through ToJson must preserve.
  bool operator==(const SecurityConfig&) const = default;
};

// Checkpoints of the PS shards (server/shard_checkpoint.h), for
// `gridsync launch --resume`.
struct CheckpointConfig {
  int every_steps = 0;  // 0: none; else every this many applied steps
  // Default: <task.output>/checkpoints (Parse fills it in when absent).
  std::string dir = "out/checkpoints";

  // Field by field: what a round trip through ToJson must preserve.
  bool operator==(const CheckpointConfig&) const = default;
};

// Prometheus metrics (ops/metrics.h): every process serves GET /metrics on
// its own address, the coordinator at `port`, shard s at port + 1 + s,
// worker r at port + 1 + ps.shards + r. 0: no metrics (each binary's
// --metrics-port still turns them on).
struct MetricsConfig {
  int port = 0;

  bool operator==(const MetricsConfig&) const = default;
};

struct Config {
  EncodingConfig encoding;
  NetworkConfig network;
  DistributedConfig distributed;
  TrainingConfig training;
  TaskConfig task;
  PsConfig ps;
  CompressionConfig compression;
  SecurityConfig security;
  CheckpointConfig checkpoint;
  MetricsConfig metrics;

  // Where the config came from, for messages ("configs/local.json").
  std::string source = "<defaults>";

  // Resolved from the sections above by Parse (also for the defaults).
  ClusterLayout layout;

  // What the text sets, to other values than the defaults, that has no
  // effect in this run: said (by check-config and every binary at its
  // start) rather than refused, because one file runs every mode by a --set
  // of distributed.gradient_sync or enable (the README's promise;
  // configs/local.json has a ps section); still checked as in the modes
  // that use it. Each line names the keys, why they have no effect, and
  // what would use them. About the text, not the settings: equality
  // ignores it.
  struct Notes {
    std::vector<std::string> lines;
    // About this host rather than the text (EphemeralPortNotes): the ports
    // a cluster listens on; dropped for --standalone, which opens none.
    std::vector<std::string> host_lines;
    bool operator==(const Notes&) const { return true; }
  };
  Notes notes;

  // Parses JSON text (with // and /* */ comments, UTF-8), applies `overrides`
  // ("training.steps=200", value parsed as JSON, else taken as a string),
  // validates and fills defaults. All problems are reported at once, one per
  // line, each as "<source>: <key.path>: <problem>; allowed: <what>".
  static Result<Config> Parse(std::string_view text, std::string_view source,
                              const std::vector<std::string>& overrides = {});
  // The largest config file LoadFile reads.
  static constexpr uint64_t kMaxConfigBytes = uint64_t{16} << 20;
  static Result<Config> LoadFile(const std::string& path,
                                 const std::vector<std::string>& overrides = {});

  // The resolved config, every key with its effective value.
  nlohmann::json ToJson() const;

  // Refuses settings that validate but whose feature is not implemented yet
  // (for example distributed training before the PS lands), with a
  // kUnsupported Status naming the key. `standalone` means the caller trains
  // in one process and ignores the distributed section.
  Status CheckRunnable(bool standalone) const;
  // What a process of a cluster (the coordinator, a PS shard, a cluster's
  // worker) refuses at its start beyond CheckRunnable, as check-config
  // does: distributed.enable false, where no `role` runs, and with
  // checkpoints on a checkpoint.dir it cannot create and write (refused
  // then rather than at every checkpoint while the job runs on; made
  // unless `create_folders` is false, as for --check-only).
  Status CheckClusterProcess(std::string_view role, bool create_folders = true) const;

  // notes.lines, and with `standalone` (gridsync-worker --standalone,
  // check-config --standalone) on a distributed config one more: its
  // cluster's sections stay in the file but do nothing in the one process
  // (a hostile probe: --standalone with compression.codec onebit trained
  // without a word, where distributed.enable false refuses the codec).
  std::vector<std::string> NotesFor(bool standalone) const;

  // ps.optimizer resolved: true when Adam runs on the workers (auto: with
  // any codec but those that only round and keep a gradient's range, fp16,
  // bf16 and int8, without error feedback).
  bool OptimizerOnWorkers() const;
  // Where Adam runs and why, for an operator (check-config prints it):
  // ps.optimizer "auto": Adam on the shards (codec "fp16" ...).
  std::string DescribeOptimizerPlacement() const;

  // Field by field: what a round trip through ToJson must preserve.
  bool operator==(const Config&) const = default;
};

}  // namespace gridsync
