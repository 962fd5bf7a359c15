// RunSpec: everything a run derives from its Config, resolved once.
//
// Config (common/config.h) holds what the user wrote, validated. Every value
// computed from it (the model's grid and MLP shape and PS tables, Adam's
// hyper-parameters, the codec, where Adam runs, bucket and timeout
// durations, the partition's axis) is computed here and nowhere else. Each
// entry point (the worker's and shard's mains, the in-process cluster, the
// training entry points in worker/sync/train.h, benchmarks and tests)
// resolves one RunSpec and passes it, or the part a component needs, down.
// A component never re-derives a value from the Config.
//
// Thread safety: a RunSpec is an immutable value once resolved.
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <vector>

#include "common/cluster_map.h"
#include "common/codec_format.h"
#include "common/config.h"
#include "common/status.h"
#include "kernels/adam_math.h"
#include "kernels/cpu/mlp.h"
#include "kernels/hash_grid_layout.h"

namespace gridsync {

// The image task's model: a 2D grid and an MLP from its features to RGB.
struct ModelSpec {
  HashGridSpec grid;
  cpu::MlpShape mlp;
  // The model as the PS sees it (kernels/model_tables.h).
  std::vector<TableInfo> tables;
  uint64_t n_params = 0;  // grid and MLP together
  AdamHyper adam;
  bool mixed_precision = false;
  cpu::MatmulFormat mlp_format = cpu::MatmulFormat::kFp32;  // training.mlp_precision
  uint64_t seed = 0;
  // training.dynamic_resolution: the step at which every level is on
  // (training.dynamic_resolution_steps, or half the run when unset); 0 off.
  uint64_t dynamic_resolution_steps = 0;
};

// What the data and control planes, and the collectives, use.
struct SyncSpec {
  std::chrono::milliseconds timeout{0};  // every wait (distributed.timeout_s)
  // How often the training loop looks for dead peers between steps: a
  // quarter of the timeout, within 100 ms .. 1 s.
  std::chrono::milliseconds peer_check_every{0};
  size_t bucket_bytes = 0;      // all-reduce buckets (distributed.bucket_mb)
  int hierarchical_slices = 0;  // DistributedConfig::HierarchicalSlices()
  // The PS partition's axis: rows, or mp_dim under model_parallel.
  ModelParallelDim partition_dim = ModelParallelDim::kRow;
  bool optimizer_on_workers = false;  // ps.optimizer resolved
  // A distributed worker exchanges pushes and pulls of up to many MiB with
  // PS shards (gradient_sync ps or hybrid), so its heap is tuned for them
  // (common/message_heap.h).
  bool ps_messages = false;
  // The workers hold training state of their own (Adam's state, or error
  // feedback's residuals, delta pulls' replicas; under nccl the whole model), which their
  // checkpoints must carry.
  bool worker_state = false;
  // The collective's backend: distributed.collective; auto stays "auto"
  // (NCCL where it can run, worker/collective/factory.h) in nccl mode when
  // the model may train on a GPU, and is gloo otherwise (NCCL would copy
  // every host bucket to a GPU and back).
  std::string collective = "gloo";
};

// compression resolved.
struct CompressionSpec {
  CodecOptions codec;  // codec kNone: off
  bool error_feedback = false;
  size_t min_bytes = 0;
  bool delta_pulls = false;  // compression.pull with a codec
  // gradient_sync nccl: the all-reduce's element format (fp16 or bf16
  // halves the bytes).
  enum class AllReduceFormat { kFp32, kFp16, kBf16 } all_reduce = AllReduceFormat::kFp32;
};

struct RunSpec {
  Config config;  // what the user wrote, for the values used as written
  ModelSpec model;
  SyncSpec sync;
  CompressionSpec compression;

  // Fails with InvalidArgument naming the key when a derived value is out
  // of what the kernels support (for example a grid the layout refuses).
  static Result<RunSpec> Resolve(const Config& config);
};

// The codec `compression` describes (also for benchmarks that sweep codecs).
Result<CodecOptions> CodecFromConfig(const CompressionConfig& compression);

}  // namespace gridsync
