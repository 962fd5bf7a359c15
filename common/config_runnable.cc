// What a loaded config can run (config.h: Config::CheckRunnable and the
// placement of Adam it resolves): combinations of keys each valid on its
// own that gridsync cannot run, refused alike by the binaries and
// check-config, each naming what is allowed.
//
// Thread safety: const member functions of an immutable config.
#include <algorithm>
#include <string>
#include <string_view>
#include <vector>

#include "common/cluster_layout.h"
#include "common/codec_format.h"
#include "common/config.h"
#include "common/config_reader.h"
#include "common/file_bytes.h"

namespace gridsync {

using config_reader::Join;

bool CompressionConfig::OnlyRounds() const {
  const Result<Codec> parsed = ParseCodec(codec);
  return parsed.ok() && gridsync::OnlyRounds(*parsed);
}

bool CompressionConfig::KeepsGradientRange() const {
  const Result<Codec> parsed = ParseCodec(codec);
  return parsed.ok() && gridsync::KeepsGradientRange(*parsed);
}

namespace {

// Why Adam runs where it does: the one resolution of ps.optimizer, which
// OptimizerOnWorkers and DescribeOptimizerPlacement both read.
enum class PlacementReason { kAsSet, kNoCodec, kErrorFeedback, kKeepsRange, kHoldsBack };

PlacementReason ResolvePlacement(const Config& c) {
  if (c.ps.optimizer != OptimizerPlacement::kAuto) return PlacementReason::kAsSet;
  // Error feedback delivers what it held back in bursts, which Adam on the
  // shards would normalise to one step each. fp16, bf16 and int8 without it
  // (their default) deliver every gradient at once and at its magnitude
  // (KeepsGradientRange), so the shards' Adam runs the uncompressed run's
  // arithmetic on rounded gradients. Measured (gridsync launch
  // configs/local.json, ps, 300 steps, batch 16384; none 36.07 dB): Adam on
  // the shards fp16 36.06, bf16 36.07, int8 35.94; on the workers 35.86,
  // 35.87, 35.86. fp16 as plain halves (before protocol version 3), which
  // flushed values under 6e-8, lost 0.43 dB on the shards: 35.64.
  if (c.compression.codec == "none") return PlacementReason::kNoCodec;
  if (c.compression.error_feedback) return PlacementReason::kErrorFeedback;
  if (c.compression.KeepsGradientRange()) return PlacementReason::kKeepsRange;
  return PlacementReason::kHoldsBack;
}

}  // namespace

bool Config::OptimizerOnWorkers() const {
  switch (ResolvePlacement(*this)) {
    case PlacementReason::kAsSet:
      return ps.optimizer == OptimizerPlacement::kWorker;
    case PlacementReason::kNoCodec:
    case PlacementReason::kKeepsRange:
      return false;
    case PlacementReason::kErrorFeedback:
    case PlacementReason::kHoldsBack:
      return true;
  }
  return true;  // unreachable: every reason is listed
}

std::string Config::DescribeOptimizerPlacement() const {
  const char* where = OptimizerOnWorkers() ? "Adam on the workers, which push updates"
                                           : "Adam on the shards, which receive gradients";
  std::string why;
  switch (ResolvePlacement(*this)) {
    case PlacementReason::kAsSet:
      why = "as set";
      break;
    case PlacementReason::kNoCodec:
      why = "no codec";
      break;
    case PlacementReason::kErrorFeedback:
      why =
          "compression.error_feedback is on: what it holds back arrives later, as a parameter "
          "change rather than a gradient the shards' Adam would normalise again";
      break;
    case PlacementReason::kKeepsRange:
      why = "codec \"" + compression.codec +
            "\" only rounds and keeps a gradient's range, and error feedback is off";
      break;
    case PlacementReason::kHoldsBack:
      why = "codec \"" + compression.codec + "\" holds values back or drops them";
      break;
  }
  return "ps.optimizer \"" + std::string(ToString(ps.optimizer)) + "\": " + where + " (" + why +
         ")";
}

std::vector<std::string> Config::NotesFor(bool standalone) const {
  std::vector<std::string> lines = notes.lines;
  if (!standalone) lines.insert(lines.end(), notes.host_lines.begin(), notes.host_lines.end());
  if (standalone && distributed.enable) {
    std::string line =
        "--standalone: one process trains, so distributed.*, ps.*, compression.* and "
        "security.* have no effect in this run";
    if (compression.codec != "none" || compression.pull) {
      line += " (compression.codec \"" + compression.codec + "\"" +
              (compression.pull ? ", compression.pull true" : "") + ": nothing is compressed)";
    }
    line += "; used without --standalone, by the cluster the file describes";
    lines.push_back(std::move(line));
  }
  return lines;
}

Status Config::CheckClusterProcess(std::string_view role, bool create_folders) const {
  if (!distributed.enable) {
    return Status::InvalidArgument(
        "distributed.enable is false: one process trains alone and no " + std::string(role) +
        " runs; allowed: distributed.enable true for a cluster (gridsync-worker --standalone "
        "trains in one process)");
  }
  if (checkpoint.every_steps > 0) {
    if (Status writable = CheckWritableFolder(checkpoint.dir, create_folders); !writable.ok())
      return Status(writable.code(), "checkpoint.dir: " + writable.message());
  }
  return Status::OK();
}

Status Config::CheckRunnable(bool standalone) const {
  std::vector<std::string> lines;
  // Values no run can use (InvalidArgument), every one at once; the
  // caller names the file.
  std::vector<std::string> invalid;
  if (!standalone && distributed.enable) {
    const GradientSyncMode sync = distributed.gradient_sync;
    if (sync == GradientSyncMode::kNccl && compression.codec != "none") {
      const bool half = compression.codec == "fp16" || compression.codec == "bf16";
      if (!half) {
        lines.push_back("compression.codec=" + compression.codec +
                        ": not supported with distributed.gradient_sync=nccl (an all-reduce "
                        "sums values, which this codec's encoding cannot); allowed: none, fp16, "
                        "bf16, or gradient_sync ps or hybrid, whose pushes the codec compresses");
      } else if (distributed.hierarchical || distributed.model_parallel) {
        lines.push_back(
            "compression.codec=" + compression.codec +
            ": not supported yet with distributed.gradient_sync=nccl and " +
            (distributed.hierarchical ? "distributed.hierarchical" : "distributed.model_parallel") +
            " (their reduce-scatter and all-gather sum fp32); allowed now: the flat, "
            "replicated all-reduce, or codec none");
      }
      if (compression.pull) {
        lines.push_back(
            "compression.pull=true: not supported with distributed.gradient_sync=nccl (an "
            "all-reduce has no pulls); allowed: false, or gradient_sync ps or hybrid");
      }
      if (compression.codec == "fp16" && compression.block_given) {
        lines.push_back(
            "compression.block=" + std::to_string(compression.block) +
            ": has no effect with compression.codec=fp16 under distributed.gradient_sync=nccl "
            "(the 16-bit all-reduce scales each bucket by one power of two; block sizes the "
            "scales of ps and hybrid pushes); allowed: remove it, or gradient_sync ps or hybrid");
      }
    }
    if (sync == GradientSyncMode::kPs) {
      const int split = distributed.world_size * training.gradient_accumulation;
      if (distributed.batch_splitting == BatchSplitting::kEven &&
          training.batch_size % split != 0) {
        invalid.push_back("training.batch_size: " + std::to_string(training.batch_size) +
                          " does not split evenly over distributed.world_size " +
                          std::to_string(distributed.world_size) +
                          " x training.gradient_accumulation " +
                          std::to_string(training.gradient_accumulation) +
                          "; allowed: a multiple of " + std::to_string(split));
      }
    }
    if (training.batch_size < distributed.world_size * training.gradient_accumulation) {
      invalid.push_back(
          "training.batch_size: " + std::to_string(training.batch_size) +
          " is smaller than distributed.world_size x training.gradient_accumulation; allowed: at "
          "least one sample per micro-batch of every worker");
    }
  }
  // A single process sends no gradient and pulls nothing, so a codec
  // would do nothing there: refused, as a key that silently does nothing
  // is. (--standalone runs a distributed config alone on purpose: its
  // compression section stays for the cluster.)
  if (!distributed.enable) {
    if (compression.codec != "none") {
      invalid.push_back("compression.codec: \"" + compression.codec +
                        "\" has no effect with distributed.enable false (a single process "
                        "compresses nothing); allowed: \"none\", or distributed.enable true");
    }
    if (compression.pull) {
      invalid.push_back(
          "compression.pull: true has no effect with distributed.enable false (a single "
          "process pulls nothing); allowed: false, or distributed.enable true");
    }
  }
  if (checkpoint.every_steps > 0) {
    const std::string every = "checkpoint.every_steps=" + std::to_string(checkpoint.every_steps);
    const bool distributed_run = distributed.enable && !standalone;
    const bool ps_bsp = distributed_run &&
                        (distributed.gradient_sync == GradientSyncMode::kPs ||
                         distributed.gradient_sync == GradientSyncMode::kHybrid) &&
                        ps.consistency == Consistency::kBsp;
    const bool nccl = distributed_run && distributed.gradient_sync == GradientSyncMode::kNccl;
    const bool half = compression.codec == "fp16" || compression.codec == "bf16";
    if (nccl) {
      // Each worker checkpoints its model and Adam state from the host
      // (worker/worker_checkpoint.h).
      if (training.device != TrainingDevice::kCpu) {
        lines.push_back(every + " under distributed.gradient_sync=nccl with training.device=" +
                        std::string(ToString(training.device)) +
                        ": not supported yet (a model trained on a GPU keeps its state there, "
                        "which is not checkpointed; auto may pick one); allowed now: "
                        "training.device=cpu, or 0");
      } else if (half && compression.error_feedback) {
        lines.push_back(every + " with compression.codec=" + compression.codec +
                        " and compression.error_feedback=true under "
                        "distributed.gradient_sync=nccl: not supported yet (the 16-bit "
                        "all-reduce's residuals are not checkpointed); allowed now: "
                        "compression.error_feedback=false, compression.codec=none, or 0");
      }
    } else if (!ps_bsp) {
      lines.push_back(every +
                      ": not supported yet in this setting; allowed now: gradient_sync ps or "
                      "hybrid with consistency bsp (under ssp and async each shard applies "
                      "pushes as they come, so no version is one state of every shard), or nccl "
                      "with training.device=cpu, or 0 (a standalone run keeps no checkpoints)");
    }
  }
  if (task.type != TaskType::kImage) {
    lines.push_back("task.type=" + std::string(ToString(task.type)) +
                    ": not supported yet; allowed now: image");
  }
  if (!invalid.empty()) return Status::InvalidArgument(Join(invalid, "\n"));
  if (lines.empty()) return Status::OK();
  return Status::Unsupported(Join(lines, "\n"));
}

}  // namespace gridsync
