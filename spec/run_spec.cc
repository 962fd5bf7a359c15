#include "spec/run_spec.h"

#include <algorithm>

#include "common/sharding.h"
#include "kernels/model_tables.h"

namespace gridsync {
namespace {

// The image task: 2D positions in, RGB out.
constexpr uint32_t kImageDims = 2;
constexpr int kImageOutputs = 3;

Result<ModelSpec> ResolveModel(const Config& config) {
  ModelSpec m;
  const auto& e = config.encoding;
  m.grid.dims = kImageDims;
  m.grid.n_levels = static_cast<uint32_t>(e.n_levels);
  m.grid.features = static_cast<uint32_t>(e.n_features_per_level);
  m.grid.log2_hashmap_size = static_cast<uint32_t>(e.log2_hashmap_size);
  m.grid.base_resolution = static_cast<uint32_t>(e.base_resolution);
  m.grid.per_level_scale = static_cast<float>(e.per_level_scale);
  GRIDSYNC_ASSIGN_OR_RETURN(const HashGridLayout layout, HashGridLayout::Make(m.grid));
  m.mlp.input_width = static_cast<int>(layout.output_width());
  m.mlp.hidden_width = config.network.n_neurons;
  m.mlp.hidden_layers = config.network.n_hidden_layers;
  m.mlp.output_width = kImageOutputs;
  m.tables = ModelTables(layout, m.mlp);
  for (const auto& t : m.tables) m.n_params += t.rows * t.width;
  m.adam.learning_rate = static_cast<float>(config.training.learning_rate);
  m.mixed_precision = config.training.mixed_precision;
  m.mlp_format = config.training.mlp_precision == MlpPrecision::kBf16 ? cpu::MatmulFormat::kBf16
                                                                      : cpu::MatmulFormat::kFp32;
  m.seed = config.training.seed;
  const auto& t = config.training;
  if (t.dynamic_resolution) {
    m.dynamic_resolution_steps = t.dynamic_resolution_steps > 0
                                     ? static_cast<uint64_t>(t.dynamic_resolution_steps)
                                     : std::max<uint64_t>(1, t.steps / 2);
  }
  return m;
}

// Under ps or hybrid, refuses a ps.shards that leaves a shard owning no
// value of the model: the model's tables are dealt out in blocks of
// kRowBlock rows (common/sharding.h), so a small model (a few levels of few
// rows) over many shards leaves processes that serve every step and hold
// nothing, a key that silently does nothing for them (a hostile probe).
Status CheckEveryShardOwnsValues(const Config& config, const ModelSpec& model,
                                 ModelParallelDim dim) {
  const auto& d = config.distributed;
  // Without distributed.enable no shard runs (ps.* is noted as no effect).
  if (!d.enable || d.gradient_sync == GradientSyncMode::kNccl || config.ps.shards <= 1)
    return Status::OK();
  auto owners_of = [&](uint32_t shards) -> uint32_t {  // shards that own a value
    auto partition = Partition::Make(model.tables, shards, dim);
    if (!partition.ok()) return shards;  // refused where the partition is made
    uint32_t owners = 0;
    for (uint32_t s = 0; s < shards; ++s) owners += partition->OwnedValues(s) > 0 ? 1 : 0;
    return owners;
  };
  const auto shards = static_cast<uint32_t>(config.ps.shards);
  const uint32_t owners = owners_of(shards);
  if (owners == shards) return Status::OK();
  uint32_t most = shards - 1;  // the most shards that all own a value
  while (most > 1 && owners_of(most) != most) --most;
  uint64_t blocks = 0;
  for (const auto& t : model.tables) blocks += (t.rows + kRowBlock - 1) / kRowBlock;
  return Status::InvalidArgument(
      "ps.shards " + std::to_string(shards) + ": " + std::to_string(shards - owners) +
      " of the shards would own no value of the model, which has " +
      std::to_string(model.tables.size()) + " tables in " + std::to_string(blocks) +
      " blocks of up to " + std::to_string(kRowBlock) +
      " rows, the unit dealt to shards (common/sharding.h); allowed: ps.shards at most " +
      std::to_string(most) +
      " for this model, or a larger model (encoding.n_levels, log2_hashmap_size, "
      "network.n_hidden_layers)");
}

}  // namespace

Result<CodecOptions> CodecFromConfig(const CompressionConfig& compression) {
  GRIDSYNC_ASSIGN_OR_RETURN(const Codec codec, ParseCodec(compression.codec));
  CodecOptions options;
  options.codec = codec;
  options.ratio = compression.ratio;
  options.bits = compression.bits;
  options.block = static_cast<uint32_t>(compression.block);
  GRIDSYNC_RETURN_IF_ERROR(ValidateCodecOptions(options));
  return options;
}

Result<RunSpec> RunSpec::Resolve(const Config& config) {
  RunSpec spec;
  spec.config = config;
  auto model = ResolveModel(config);
  if (!model.ok()) return model.status().WithContext(config.source + ": the model");
  spec.model = std::move(model).value();

  const auto& d = config.distributed;
  SyncSpec& s = spec.sync;
  s.timeout = d.timeout();
  s.peer_check_every = std::chrono::milliseconds(
      std::clamp<int64_t>(static_cast<int64_t>(d.timeout_s * 250), 100, 1000));
  s.bucket_bytes = std::max<size_t>(sizeof(float), static_cast<size_t>(d.bucket_mb * 1024 * 1024));
  s.hierarchical_slices = d.HierarchicalSlices();
  s.partition_dim = d.model_parallel ? d.mp_dim : ModelParallelDim::kRow;
  s.optimizer_on_workers = config.OptimizerOnWorkers();
  s.ps_messages = d.enable && d.gradient_sync != GradientSyncMode::kNccl;
  if (auto owned = CheckEveryShardOwnsValues(config, spec.model, s.partition_dim); !owned.ok())
    return owned.WithContext(config.source);

  CompressionSpec& c = spec.compression;
  auto codec = CodecFromConfig(config.compression);
  if (!codec.ok()) return codec.status().WithContext(config.source + ": compression");
  c.codec = *codec;
  c.error_feedback = config.compression.error_feedback;
  c.min_bytes = static_cast<size_t>(config.compression.min_bytes);
  c.delta_pulls = config.compression.pull && c.codec.codec != Codec::kNone;
  // Under nccl every worker holds the whole model and its Adam state; with
  // delta pulls a worker holds its replica of the parameters.
  s.worker_state = s.optimizer_on_workers || (c.codec.codec != Codec::kNone && c.error_feedback) ||
                   c.delta_pulls || d.gradient_sync == GradientSyncMode::kNccl;
  // auto: NCCL when the model may train on a GPU and NCCL can run here
  // (the workers agree: worker/sync/train.cc), in nccl mode and in hybrid,
  // whose node sum then runs on device buffers; Gloo while it trains on the
  // CPU (and for ps, which has no collective).
  const bool device_sum =
      d.gradient_sync == GradientSyncMode::kNccl || d.gradient_sync == GradientSyncMode::kHybrid;
  switch (config.distributed.collective) {
    case CollectiveKind::kNccl:
      s.collective = "nccl";
      break;
    case CollectiveKind::kGloo:
      s.collective = "gloo";
      break;
    case CollectiveKind::kAuto:
      s.collective = config.training.device != TrainingDevice::kCpu && device_sum ? "auto" : "gloo";
      break;
  }
  if (d.gradient_sync == GradientSyncMode::kNccl) {
    if (c.codec.codec == Codec::kFp16) c.all_reduce = CompressionSpec::AllReduceFormat::kFp16;
    if (c.codec.codec == Codec::kBf16) c.all_reduce = CompressionSpec::AllReduceFormat::kBf16;
  }
  return spec;
}

}  // namespace gridsync
