// Config::ToJson (config.h): every key, resolved defaults included, so that
// a round trip through Parse gives the same Config.
//
// Thread safety: a const member function of an immutable config.
#include <algorithm>
#include <string>
#include <string_view>
#include <vector>

#include "common/cluster_layout.h"
#include "common/config.h"

namespace gridsync {

using Json = nlohmann::json;

nlohmann::json Config::ToJson() const {
  // nlohmann::json stores objects in a std::map, so a dump lists sections and keys
  // alphabetically whatever the insertion order; they are written here in the documented order
  // (encoding, network, distributed, training, task) for the reader of this code only.
  Json j;
  auto& e = j["encoding"];
  e["otype"] = encoding.otype;
  e["n_levels"] = encoding.n_levels;
  e["n_features_per_level"] = encoding.n_features_per_level;
  e["log2_hashmap_size"] = encoding.log2_hashmap_size;
  e["base_resolution"] = encoding.base_resolution;
  e["per_level_scale"] = encoding.per_level_scale;

  auto& n = j["network"];
  // Parse refuses a width without hidden layers.
  if (network.n_hidden_layers > 0) n["n_neurons"] = network.n_neurons;
  n["n_hidden_layers"] = network.n_hidden_layers;

  auto& d = j["distributed"];
  d["enable"] = distributed.enable;
  d["world_size"] = distributed.world_size;
  d["master_addr"] = distributed.master_addr;
  d["master_port"] = distributed.master_port;
  d["gradient_sync"] = ToString(distributed.gradient_sync);
  d["batch_splitting"] = ToString(distributed.batch_splitting);
  d["model_parallel"] = distributed.model_parallel;
  // Parse refuses mp_dim without model parallelism, so printing it then would make the
  // resolved config fail to load again.
  if (distributed.model_parallel) d["mp_dim"] = ToString(distributed.mp_dim);
  d["hierarchical"] = distributed.hierarchical;
  d["timeout_s"] = distributed.timeout_s;
  // Keys that only some modes read are written only there: Parse refuses
  // them elsewhere (a key never silently does nothing).
  const GradientSyncMode sync = distributed.gradient_sync;
  if (sync != GradientSyncMode::kPs) d["collective"] = ToString(distributed.collective);
  // As Config::Parse takes it back: not where the gradient is summed by one
  // reduce-scatter (model_parallel without hierarchical).
  if (sync == GradientSyncMode::kNccl && (!distributed.model_parallel || distributed.hierarchical))
    d["bucket_mb"] = distributed.bucket_mb;
  const BatchSplitting split = distributed.batch_splitting;
  if (split == BatchSplitting::kAdaptive) d["adaptive_interval"] = distributed.adaptive_interval;
  if (!distributed.nodes.empty()) {
    Json nodes = Json::array();
    for (const auto& node : distributed.nodes) {
      Json item = {{"name", node.name}, {"workers", node.workers}};
      if (split == BatchSplitting::kWeighted) item["weight"] = node.weight;
      if (!node.host.empty()) item["host"] = node.host;
      if (node.shards >= 0) item["shards"] = node.shards;
      nodes.push_back(std::move(item));
    }
    d["nodes"] = nodes;
  }

  auto& t = j["training"];
  t["batch_size"] = training.batch_size;
  t["learning_rate"] = training.learning_rate;
  t["mixed_precision"] = training.mixed_precision;
  t["gradient_accumulation"] = training.gradient_accumulation;
  t["dynamic_resolution"] = training.dynamic_resolution;
  t["dynamic_resolution_steps"] = training.dynamic_resolution_steps;
  t["steps"] = training.steps;
  t["seed"] = training.seed;
  t["threads"] = training.threads;
  t["log_every"] = training.log_every;
  t["device"] = ToString(training.device);
  t["mlp_precision"] = ToString(training.mlp_precision);

  auto& k = j["task"];
  k["type"] = ToString(task.type);
  k["image"] = task.image;
  k["output"] = task.output;

  auto& p = j["ps"];
  p["shards"] = ps.shards;
  p["consistency"] = ToString(ps.consistency);
  // Parse refuses staleness outside ssp (see mp_dim above).
  if (ps.consistency == Consistency::kSsp) p["staleness"] = ps.staleness;
  p["threads"] = ps.threads;
  // Written only when given: in a multi-host cluster it is an error.
  if (ps.host_given) p["host"] = ps.host;
  p["base_port"] = ps.base_port;
  p["optimizer"] = ToString(ps.optimizer);

  auto& c = j["compression"];
  c["codec"] = compression.codec;
  const std::string& codec = compression.codec;
  if (codec == "topk" || codec == "randomk") c["ratio"] = compression.ratio;
  if (codec == "qsgd") c["bits"] = compression.bits;
  // fp16's block applies to pushes (ps, hybrid): under nccl it is written
  // only when given, as it is then an error.
  if (codec == "int8" ||
      (codec == "fp16" &&
       (distributed.gradient_sync != GradientSyncMode::kNccl || compression.block_given)))
    c["block"] = compression.block;
  if (codec != "none") {
    c["error_feedback"] = compression.error_feedback;
    c["min_bytes"] = compression.min_bytes;
  }
  c["pull"] = compression.pull;

  auto& ck = j["checkpoint"];
  ck["every_steps"] = checkpoint.every_steps;
  ck["dir"] = checkpoint.dir;

  j["metrics"]["port"] = metrics.port;

  auto& sec = j["security"];
  sec["mode"] = ToString(security.mode);
  if (!security.keys_dir.empty()) sec["keys_dir"] = security.keys_dir;
  return j;
}

}  // namespace gridsync
