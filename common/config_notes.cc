// Config::notes: the keys a config sets that change nothing in its run
// (see config_notes.h).
#include "common/config_notes.h"

#include <fmt/format.h>

#include <algorithm>
#include <cstdint>
#include <string>
#include <vector>

#include "common/config_reader.h"
#include "common/sharding.h"

namespace gridsync {

using Json = nlohmann::json;
using config_reader::KeyText;
using config_reader::Quote;

// Keys set in the text, to other values than their defaults, that the run's
// mode does not use (Config::notes). Their defaults are left out, so the
// resolved config check-config prints (every key of a section) loads again
// without notes.
std::vector<std::string> InertSectionNotes(const Json& root, const DistributedConfig& d) {
  static const Json defaults = Config{}.ToJson();
  std::vector<std::string> lines;
  const auto keys_of = [&root](std::string_view section, std::string_view except) {
    std::string keys;
    const auto it = root.find(section);
    if (it == root.end() || !it->is_object()) return keys;
    const Json& defaults_of = defaults[std::string(section)];
    for (const auto& [key, value] : it->items()) {
      if (key == except) continue;
      const auto default_value = defaults_of.find(key);
      if (default_value != defaults_of.end() && *default_value == value) continue;
      keys += (keys.empty() ? "" : ", ") + std::string(section) + "." + KeyText(key);
    }
    return keys;
  };
  // "Still checked": they are validated as in the modes that use them, so
  // the --set that switches modes finds the file runnable.
  if (!d.enable) {
    if (std::string keys = keys_of("distributed", "enable"); !keys.empty()) {
      lines.push_back(keys +
                      ": no effect with distributed.enable false (one process trains; still "
                      "checked); used with distributed.enable true");
    }
    if (std::string keys = keys_of("ps", ""); !keys.empty()) {
      lines.push_back(keys +
                      ": no effect with distributed.enable false (no shards run; still "
                      "checked); used with distributed.enable true and gradient_sync \"ps\" "
                      "or \"hybrid\"");
    }
  } else if (d.gradient_sync == GradientSyncMode::kNccl) {
    if (std::string keys = keys_of("ps", ""); !keys.empty()) {
      lines.push_back(keys +
                      ": no effect with distributed.gradient_sync \"nccl\" (no shards run; "
                      "still checked); used with gradient_sync \"ps\" or \"hybrid\"");
    }
  }
  return lines;
}

// Keys whose value the resolved cluster makes a no-op (Config::notes): read,
// but they change nothing in this run. Only where nothing else (a refusal,
// a checkpoint's manifest, the device path) depends on them either.
std::vector<std::string> InertValueNotes(const Config& c) {
  std::vector<std::string> lines;
  const DistributedConfig& d = c.distributed;
  if (!d.enable && c.security.mode == SecurityMode::kCurve) {
    lines.push_back(
        "security.mode \"curve\": no effect with distributed.enable false (one process trains "
        "and opens no connection, so no key is loaded); used with distributed.enable true");
  }
  if (c.checkpoint.every_steps > c.training.steps) {
    lines.push_back("checkpoint.every_steps " + std::to_string(c.checkpoint.every_steps) +
                    " is more than training.steps " + std::to_string(c.training.steps) +
                    ": this run writes no checkpoint; used with every_steps up to the steps");
  }
  // The derived default (task.output/checkpoints) is left out: the
  // resolved config check-config prints names it, and loads without notes.
  if (c.checkpoint.every_steps == 0 && c.checkpoint.dir != c.task.output + "/checkpoints") {
    lines.push_back("checkpoint.dir " + Quote(c.checkpoint.dir) +
                    ": this run writes no checkpoint (checkpoint.every_steps 0; the folder is read "
                    "only by `gridsync launch --resume`); used with every_steps > 0");
  }
  if (c.training.dynamic_resolution && c.training.dynamic_resolution_steps > c.training.steps) {
    lines.push_back("training.dynamic_resolution_steps " +
                    std::to_string(c.training.dynamic_resolution_steps) +
                    " is more than training.steps " + std::to_string(c.training.steps) +
                    ": the finest hash-grid levels never turn on in this run; used with "
                    "dynamic_resolution_steps up to the steps (0: steps / 2)");
  }
  // active(0) = max(1, ceil(L / 4)) levels: with one level that is all of
  // them from the first step (a probe found no word about it).
  if (c.training.dynamic_resolution && c.encoding.n_levels == 1) {
    lines.push_back(
        "training.dynamic_resolution true with encoding.n_levels 1: the one level is on from the "
        "first step, so nothing turns on later; used with n_levels 2 or more");
  }
  if (c.compression.codec != "none") {
    // A push carries a table once a shard (PsClient::CompressAll), so no
    // block holds more than the model's largest table: a grid level of at
    // most 2^log2_hashmap_size rows, or an MLP weight matrix
    // (kernels/model_tables.h). A min_bytes above it compressed nothing, bit
    // for bit the run without a codec (a hostile probe: 8 MiB, under a
    // note that fired only past the whole model's 67 MB).
    const EncodingConfig& e = c.encoding;
    const NetworkConfig& n = c.network;
    const uint64_t width = static_cast<uint64_t>(n.n_neurons);
    const uint64_t inputs = static_cast<uint64_t>(e.n_levels) * e.n_features_per_level;
    const uint64_t level_bytes =
        4 * (uint64_t{1} << e.log2_hashmap_size) * static_cast<uint64_t>(e.n_features_per_level);
    const uint64_t matrix_bytes =
        4 * (n.n_hidden_layers == 0 ? inputs * 3 : std::max({inputs, width, uint64_t{3}}) * width);
    // Under nccl the 16-bit all-reduce takes the whole grid as one tensor
    // (worker/sync/allreduce_sync.cc): the whole model bounds it there.
    const uint64_t model_bytes =
        static_cast<uint64_t>(e.n_levels) * level_bytes +
        4 * (n.n_hidden_layers == 0
                 ? inputs * 3
                 : inputs * width + (n.n_hidden_layers - 1) * width * width + width * 3);
    const uint64_t largest = d.gradient_sync == GradientSyncMode::kNccl
                                 ? model_bytes
                                 : std::max(level_bytes, matrix_bytes);
    if (static_cast<uint64_t>(c.compression.min_bytes) > largest) {
      lines.push_back(
          "compression.min_bytes " + std::to_string(c.compression.min_bytes) +
          (d.gradient_sync == GradientSyncMode::kNccl
               ? " is more than the whole model (at most " + std::to_string(largest) +
                     " bytes): nothing is ever compressed"
               : " is more than the model's largest table (at most " + std::to_string(largest) +
                     " bytes), and a push's blocks are tables or their parts: nothing is ever "
                     "compressed") +
          "; used with min_bytes below the blocks a push carries (default 4096)");
    }
    if (c.compression.codec == "int8" && c.compression.block == 1) {
      lines.push_back(
          "compression.block 1: int8 sends a 4-byte scale with every value, 5 bytes a value "
          "against 4 uncompressed, so its pushes grow; used with blocks of 2 values or more "
          "(default 256)");
    }
    if (c.compression.codec == "fp16" && c.compression.block == 1 &&
        d.gradient_sync != GradientSyncMode::kNccl) {
      lines.push_back(
          "compression.block 1: fp16 sends a 2-byte exponent with every value, 4 bytes a value "
          "as uncompressed, so its pushes do not shrink; used with blocks of 2 values or more "
          "(default 256)");
    }
  }
  if (d.enable && d.world_size == 1) {
    std::string keys;
    // (Under hybrid the note below says it.)
    if (d.hierarchical && d.gradient_sync != GradientSyncMode::kHybrid)
      keys = "distributed.hierarchical true";
    if (d.batch_splitting != BatchSplitting::kEven) {
      keys += (keys.empty() ? "" : ", ") + std::string("distributed.batch_splitting ") +
              Quote(ToString(d.batch_splitting));
    }
    // One worker is never ahead of another: each of its steps waits for
    // its own previous one, as under bsp (the same bits, measured).
    // (With checkpoints on, async and ssp are refused, which says it.)
    if (d.gradient_sync != GradientSyncMode::kNccl && c.ps.consistency != Consistency::kBsp &&
        c.checkpoint.every_steps == 0) {
      keys += (keys.empty() ? "" : ", ") + std::string("ps.consistency ") +
              Quote(ToString(c.ps.consistency));
    }
    // A group of one: Gloo's collectives return at once and the buckets
    // carry nothing. ("nccl" is left out: it is refused where NCCL cannot
    // run; and model_parallel, which shards Adam's state and names the
    // checkpoints' layout even for one worker.)
    if (d.gradient_sync != GradientSyncMode::kPs && d.collective == CollectiveKind::kGloo)
      keys += (keys.empty() ? "" : ", ") + std::string("distributed.collective \"gloo\"");
    if (d.gradient_sync == GradientSyncMode::kNccl && d.bucket_mb != DistributedConfig{}.bucket_mb)
      keys += (keys.empty() ? "" : ", ") + fmt::format("distributed.bucket_mb {:g}", d.bucket_mb);
    if (!keys.empty()) {
      lines.push_back(keys +
                      ": no effect with distributed.world_size 1 (one worker takes the whole "
                      "batch and reduces with nobody); used with several workers");
    }
  }
  if (d.enable && d.world_size > 1 && d.batch_splitting == BatchSplitting::kWeighted &&
      !d.nodes.empty()) {
    // A worker's share is its node's weight over the node's workers
    // (worker/batch_split.cc): the same for all of them is the even split.
    // (Without nodes the workers' speeds on a probe batch split it:
    // worker/sync/train_loop.cc.)
    const std::vector<NodeConfig> nodes = d.ResolvedNodes();
    bool uneven = false;
    for (const NodeConfig& node : nodes) {
      uneven = uneven || node.weight / node.workers != nodes[0].weight / nodes[0].workers;
    }
    if (!uneven) {
      lines.push_back(
          "distributed.batch_splitting \"weighted\": every worker's share (its node's weight "
          "over the node's workers) is the same, so the batch is split evenly, as \"even\" "
          "does; used with distributed.nodes whose weights per worker differ");
    }
  }
  // Rebalanced after every adaptive_interval steps, each new split from
  // the step after next (SplitSchedule, worker/sync/gradient_sync.h): none
  // takes effect when the interval reaches the steps less one.
  if (d.enable && d.world_size > 1 && d.batch_splitting == BatchSplitting::kAdaptive &&
      d.adaptive_interval >= c.training.steps - 1) {
    lines.push_back("distributed.adaptive_interval " + std::to_string(d.adaptive_interval) +
                    " with training.steps " + std::to_string(c.training.steps) +
                    ": a new split takes effect from the step after next, so none does in this "
                    "run and \"adaptive\" splits the batch as \"even\" does; used with an "
                    "interval of at most training.steps - 2");
  }
  // hybrid's collective reduces inside a node: with one worker on every
  // node it has nobody to reduce with (under ps the key is refused).
  if (d.enable && d.world_size > 1 && d.gradient_sync == GradientSyncMode::kHybrid &&
      d.collective == CollectiveKind::kGloo) {
    const std::vector<NodeConfig> nodes = d.ResolvedNodes();
    if (!nodes.empty() && std::all_of(nodes.begin(), nodes.end(),
                                      [](const NodeConfig& node) { return node.workers == 1; })) {
      lines.push_back(
          "distributed.collective \"gloo\": every node of distributed.nodes has one worker, so "
          "under gradient_sync \"hybrid\" no collective runs (each worker pushes to the shards "
          "alone); used with nodes of several workers");
    }
  }
  // hybrid reduces inside each node before the PS whatever the key says.
  if (d.enable && d.hierarchical && d.gradient_sync == GradientSyncMode::kHybrid) {
    lines.push_back(
        "distributed.hierarchical: true changes nothing under gradient_sync \"hybrid\", which "
        "always reduces inside each node first (a collective there, the PS across nodes); used "
        "with gradient_sync \"nccl\" (its hierarchical all-reduce)");
  }
  // CURVE covers the coordinator's connections and the shards' data plane.
  // Under nccl the gradients go worker to worker through the collective:
  // Gloo's messages are sealed then (worker/collective/collective_seal.h),
  // NCCL's cannot be, and neither authenticates nor encrypts (a hostile
  // probe before the seal: mode curve, 30 MB a step in the clear). Under
  // hybrid the collective stays inside a node (one machine).
  if (c.security.curve && d.enable && d.world_size > 1 &&
      d.gradient_sync == GradientSyncMode::kNccl && d.collective != CollectiveKind::kGloo) {
    lines.push_back(
        "security.mode: CURVE seals the workers' all-reduce under gradient_sync \"nccl\" only "
        "when it runs on Gloo; NCCL (distributed.collective \"nccl\", or \"auto\" on machines "
        "with a GPU a worker) neither authenticates nor encrypts it; used with "
        "distributed.collective \"gloo\", or across machines with gradient_sync \"ps\" or "
        "\"hybrid\", whose gradients cross machines through the shards under CURVE (or run NCCL "
        "on a network you trust)");
  }
  if (!c.security.curve && !c.security.keys_dir.empty()) {
    lines.push_back(
        "security.keys_dir: no effect: the cluster runs on one machine, so security.mode "
        "\"auto\" leaves the data plane unencrypted and loads no key; used when "
        "distributed.nodes span machines, or with security.mode \"curve\"");
  }
  // Under ps and hybrid model_parallel only picks the PS partition's axis
  // (RunSpec's partition_dim), and "row" is the axis without it.
  if (d.enable && d.model_parallel && d.gradient_sync != GradientSyncMode::kNccl &&
      d.mp_dim == ModelParallelDim::kRow) {
    lines.push_back(
        "distributed.model_parallel: with mp_dim \"row\" the PS tables are split by rows, as "
        "without it; mp_dim \"column\" or \"both\" split them otherwise");
  }
  // "column" and "both" split a table by columns only where its column
  // groups divide its width (common/sharding.h); where no table's do, the
  // split is by rows, as "row" makes it. The parts are the PS shards, or
  // under nccl the workers, each of which holds a slice of every table
  // (worker/sync/sharded_update.h: the same Partition).
  if (d.enable && d.model_parallel && d.mp_dim != ModelParallelDim::kRow) {
    const bool workers = d.gradient_sync == GradientSyncMode::kNccl;
    // The model's tables (kernels/model_tables.h): a grid level's features
    // a row, a hidden layer's neurons, the 3 outputs.
    std::vector<uint32_t> widths = {static_cast<uint32_t>(c.encoding.n_features_per_level), 3};
    if (c.network.n_hidden_layers > 0) widths.push_back(static_cast<uint32_t>(c.network.n_neurons));
    const auto parts =
        static_cast<uint32_t>(workers ? d.world_size : static_cast<int64_t>(c.ps.shards));
    const std::string key = workers ? "distributed.world_size" : "ps.shards";
    if (std::all_of(widths.begin(), widths.end(), [&](uint32_t w) {
          return Partition::ColumnGroupsFor(w, parts, d.mp_dim) == 1;
        })) {
      std::string listed;
      for (uint32_t w : widths) listed += (listed.empty() ? "" : ", ") + std::to_string(w);
      lines.push_back("distributed.model_parallel: with mp_dim " + Quote(ToString(d.mp_dim)) +
                      " and " + key + " " + std::to_string(parts) + " no table's width (" + listed +
                      " floats) splits into the " + (workers ? "workers'" : "shards'") +
                      " column groups, so the " + (workers ? "workers' slices" : "PS tables") +
                      " are split by rows, as mp_dim \"row\" does; used with " + key +
                      " sharing a factor with a table's width (\"both\") or dividing it "
                      "(\"column\")");
    }
  }
  return lines;
}

std::vector<std::string> QualityNotes(const Config& c) {
  std::vector<std::string> lines;
  const DistributedConfig& d = c.distributed;
  const std::string& codec = c.compression.codec;
  // Measured: gridsync-bench compress --train --steps 300 --workers 2
  // --shards 1 --set ps.optimizer=shard, the demo's model (note 53; the
  // H200's device path gave the same within 0.3 dB).
  if (d.enable && d.gradient_sync != GradientSyncMode::kNccl &&
      c.ps.optimizer == OptimizerPlacement::kShard &&
      (codec == "onebit" || codec == "topk" || codec == "randomk")) {
    lines.push_back(
        "ps.optimizer \"shard\" with compression.codec " + Quote(codec) +
        ": Adam on the shards takes the decoded pushes, whose error it scales up coordinate by "
        "coordinate; measured 300 steps below the uncompressed run by 17 dB (onebit), 11 dB "
        "(randomk) and 9 dB (topk) (gridsync-bench compress --train --set ps.optimizer=shard); "
        "ps.optimizer \"auto\" or \"worker\" runs Adam on the workers before the codec (onebit "
        "-0.3 dB)");
  }
  return lines;
}

}  // namespace gridsync
