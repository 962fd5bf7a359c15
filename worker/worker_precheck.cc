// A worker's checks before it trains (worker_precheck.h).
#include "worker/worker_precheck.h"

#include <spdlog/fmt/fmt.h>

#include <algorithm>

#include "common/host_memory.h"
#include "kernels/cuda/cuda_kernels.h"
#include "spec/shard_memory.h"
#include "worker/batch_split.h"

namespace gridsync {
namespace {

constexpr double kGiB = 1073741824.0;

}  // namespace

uint64_t EstimateModelBytes(const RunSpec& spec) {
  // Per parameter: master, Adam's m and v, the gradient, an fp16 copy.
  return spec.model.n_params * 4 * 6;
}

uint64_t EstimateWorkerBytes(const RunSpec& spec, uint64_t samples) {
  const Config& config = spec.config;
  const auto& e = config.encoding;
  const uint64_t levels = static_cast<uint64_t>(e.n_levels);
  const uint64_t features = static_cast<uint64_t>(e.n_features_per_level);
  // Per sample: positions and targets; per level the 4 corners' index and
  // weight; features and their gradient; the MLP's activations and their
  // gradients (tiled, so a bound rather than the exact figure).
  const uint64_t per_sample = 4 * (5 + levels * 4 * 2 + levels * features * 2 +
                                   static_cast<uint64_t>(config.network.n_neurons) * 2 + 64);
  return per_sample * samples + EstimateModelBytes(spec);
}

uint64_t LargestMicroBatch(const Config& config, bool distributed) {
  uint64_t samples = static_cast<uint64_t>(config.training.batch_size);
  if (distributed && config.distributed.batch_splitting != BatchSplitting::kAdaptive) {
    const BatchSplit split(config.distributed, config.training.batch_size);
    samples = *std::max_element(split.counts().begin(), split.counts().end());
  }
  const auto accumulation =
      static_cast<uint64_t>(std::max(config.training.gradient_accumulation, 1));
  return (samples + accumulation - 1) / accumulation;
}

Status CheckWorkerMemory(const RunSpec& spec, const ImageTask& image, bool distributed,
                         bool writes_png) {
  const uint64_t available = AvailableToThisProcessBytes();
  if (available == 0) return Status::OK();  // unknown: nothing to hold it against
  const Config& config = spec.config;
  // The image (held) counts too, and on the process that writes the
  // reconstruction at the end its bytes and the PNG encoder's (about as
  // many again).
  const uint64_t image_bytes =
      image.memory_bytes() + (writes_png ? image.pixel_count() * 3 * 2 : 0);
  const uint64_t model = EstimateModelBytes(spec);
  const auto& e = config.encoding;
  // The model alone: no batch or image makes it fit, so name what does.
  if (model > available) {
    const auto [needs, has] = NeedAndAvailable(model, available);
    return Status::InvalidArgument(fmt::format(
        "the model needs about {} before any sample ({} parameters: encoding.n_levels {} "
        "x n_features_per_level {} with log2_hashmap_size {}, and the MLP; each held as master, "
        "gradient, Adam's m and v and a working copy) but {} are available; allowed: "
        "fewer encoding.n_levels, a smaller encoding.log2_hashmap_size, n_features_per_level or "
        "base_resolution",
        needs, spec.model.n_params, e.n_levels, e.n_features_per_level, e.log2_hashmap_size, has));
  }
  const uint64_t samples = LargestMicroBatch(config, distributed);
  const uint64_t need = EstimateWorkerBytes(spec, samples) + image_bytes;
  if (need <= available) return Status::OK();
  const auto [needs, has] = NeedAndAvailable(need, available);
  return Status::InvalidArgument(fmt::format(
      "training.batch_size {} needs about {} in this worker ({} samples per micro-batch, "
      "{:.1f} GiB of it the model and its Adam state, {:.1f} GiB task.image's {}x{} pixels) but "
      "{} are available; allowed: a smaller batch_size or image, more "
      "gradient_accumulation or more workers",
      config.training.batch_size, needs, samples, static_cast<double>(model) / kGiB,
      static_cast<double>(image_bytes) / kGiB, image.width(), image.height(), has));
}

Status CheckMachineMemory(const RunSpec& spec, const ImageTask& image, int workers, int shards,
                          bool writes_png) {
  const uint64_t available = AvailableMemoryBytes();
  if (available == 0 || workers + shards <= 1) return Status::OK();
  // A worker decodes its image before it makes its model, and the workers
  // start together: each at the larger of its decoding's peak (a 16-bit PNG
  // takes 18 bytes a pixel, not the 3 kept) and its training.
  const uint64_t worker = std::max(
      EstimateWorkerBytes(spec, LargestMicroBatch(spec.config, true)) + image.memory_bytes(),
      image.decode_peak_bytes());
  // A shard as its store allocates (spec/shard_memory.h), the largest: the
  // parameters' share and gradients, Adam's state or push counts, and a
  // replica per worker under delta pulls.
  const uint64_t shard = shards > 0 ? LargestShardMemoryBytes(spec) : 0;
  const uint64_t need = worker * static_cast<uint64_t>(workers) +
                        shard * static_cast<uint64_t>(shards) +
                        (writes_png ? image.pixel_count() * 3 * 2 : 0);
  if (need <= available) return Status::OK();
  const auto [needs, has] = NeedAndAvailable(need, available);
  return Status::InvalidArgument(fmt::format(
      "the {} workers and {} shards this machine runs need about {} together ({:.2f} GiB "
      "a worker: the model, its Adam state and a micro-batch of {} samples, or decoding "
      "task.image where that takes more; {:.2f} GiB a shard) but {} are available; "
      "allowed: fewer workers on this machine (distributed.nodes over several machines), a smaller "
      "model, "
      "training.batch_size or image",
      workers, shards, needs, static_cast<double>(worker) / kGiB,
      LargestMicroBatch(spec.config, true), static_cast<double>(shard) / kGiB, has));
}

Status CheckTrainingDevice(const Config& config, bool standalone) {
  const DistributedConfig& d = config.distributed;
  // NCCL's collectives need a GPU too (a probe's workers failed at NCCL's
  // init, after check-config said OK).
  const bool nccl_collective = !standalone && d.enable && d.collective == CollectiveKind::kNccl &&
                               d.gradient_sync != GradientSyncMode::kPs;
  if (config.training.device != TrainingDevice::kCuda && !nccl_collective) return Status::OK();
  std::string reason;
  if (cuda::Available(&reason)) return Status::OK();
  if (config.training.device != TrainingDevice::kCuda) {
    return Status::InvalidArgument(
        "distributed.collective: \"nccl\", but CUDA is unavailable here (" + reason + ")" +
        "; allowed here: \"auto\" (NCCL where the model is on a GPU, else Gloo) or \"gloo\"");
  }
  return Status::InvalidArgument(
      "training.device: \"cuda\", but CUDA is unavailable here (" + reason + ")" +
      "; allowed here: \"auto\" (the GPU where there is one, else the CPU) or \"cpu\"");
}

}  // namespace gridsync
