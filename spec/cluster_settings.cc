#include "spec/cluster_settings.h"

#include <nlohmann/json.hpp>
#include <set>

namespace gridsync {
namespace {

using Json = nlohmann::json;

// Each key of section `name` of the resolved config (every key, defaults
// included, so two files that say the same thing differently agree),
// except `skip`, as "name.key" = its JSON text.
void AddSection(const Json& config, const std::string& name, const std::set<std::string>& only,
                const std::set<std::string>& skip, std::vector<Setting>* out) {
  const auto section = config.find(name);
  if (section == config.end() || !section->is_object()) return;
  for (const auto& [key, value] : section->items()) {
    if (skip.count(key) != 0 || (!only.empty() && only.count(key) == 0)) continue;
    out->push_back({name + "." + key, value.dump()});
  }
}

// The keys of "distributed" and "training" the shards act on too: shared,
// so the job's lists leave them out.
const std::set<std::string> kSharedDistributed = {"enable", "gradient_sync", "world_size",
                                                  "model_parallel", "mp_dim"};
const std::set<std::string> kSharedTraining = {"learning_rate"};

// Sets a and b together.
std::set<std::string> Union(std::set<std::string> a, const std::set<std::string>& b) {
  a.insert(b.begin(), b.end());
  return a;
}

}  // namespace

std::vector<Setting> SharedSettings(const RunSpec& spec) {
  const Config& c = spec.config;
  const Json config = c.ToJson();
  std::vector<Setting> out;
  // ps: all but where this shard listens and how many threads it has.
  AddSection(config, "ps", {}, {"base_port", "threads"}, &out);
  AddSection(config, "compression", {}, {}, &out);
  AddSection(config, "distributed", kSharedDistributed, {}, &out);
  AddSection(config, "training", kSharedTraining, {}, &out);
  AddSection(config, "checkpoint", {"every_steps"}, {}, &out);
  // Resolved: "auto" places Adam by the codec, and a shard and a worker
  // must place it alike.
  out.push_back({"ps.optimizer (resolved)", c.OptimizerOnWorkers() ? "\"worker\"" : "\"shard\""});
  return out;
}

std::vector<Setting> JobSettings(const RunSpec& spec, const std::string& image_digest) {
  const Json config = spec.config.ToJson();
  std::vector<Setting> out;
  // Per host: the device, threads, the log cadence, the coordinator's
  // address as this host reaches it, the timeouts.
  AddSection(config, "training", {}, Union(kSharedTraining, {"device", "threads", "log_every"}),
             &out);
  AddSection(config, "distributed", {},
             Union(kSharedDistributed, {"master_addr", "master_port", "timeout_s"}), &out);
  AddSection(config, "task", {"type"}, {}, &out);
  out.push_back({"task.image (its pixels)", image_digest});
  return out;
}

}  // namespace gridsync
