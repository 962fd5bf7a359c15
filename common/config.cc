// Loading and strict validation of the gridsync config (see config.h).
//
// Validation never stops at the first problem: an operator fixing a config by hand should see
// every mistake in one run, so each reader records its problem and the load fails at the end.
// Checks that relate two keys run only when both keys were valid on their own, so that one typo
// does not cascade into misleading follow-up messages.

#include "common/config.h"

#include <sys/stat.h>

#include <algorithm>
#include <cerrno>
#include <cstdint>
#include <string>
#include <string_view>
#include <system_error>
#include <utility>
#include <vector>

#include "common/cluster_layout.h"
#include "common/config_notes.h"
#include "common/config_reader.h"
#include "common/config_sections.h"
#include "common/file_bytes.h"

namespace gridsync {

std::string_view ToString(GradientSyncMode v) {
  switch (v) {
    case GradientSyncMode::kNccl:
      return "nccl";
    case GradientSyncMode::kPs:
      return "ps";
    case GradientSyncMode::kHybrid:
      return "hybrid";
  }
  return "?";
}

std::string_view ToString(BatchSplitting v) {
  switch (v) {
    case BatchSplitting::kEven:
      return "even";
    case BatchSplitting::kWeighted:
      return "weighted";
    case BatchSplitting::kAdaptive:
      return "adaptive";
  }
  return "?";
}

std::string_view ToString(ModelParallelDim v) {
  switch (v) {
    case ModelParallelDim::kRow:
      return "row";
    case ModelParallelDim::kColumn:
      return "column";
    case ModelParallelDim::kBoth:
      return "both";
  }
  return "?";
}

std::string_view ToString(TrainingDevice v) {
  switch (v) {
    case TrainingDevice::kAuto:
      return "auto";
    case TrainingDevice::kCpu:
      return "cpu";
    case TrainingDevice::kCuda:
      return "cuda";
  }
  return "?";
}

std::string_view ToString(MlpPrecision v) { return v == MlpPrecision::kBf16 ? "bf16" : "fp32"; }

std::string_view ToString(CollectiveKind v) {
  switch (v) {
    case CollectiveKind::kAuto:
      return "auto";
    case CollectiveKind::kNccl:
      return "nccl";
    case CollectiveKind::kGloo:
      return "gloo";
  }
  return "?";
}

std::vector<NodeConfig> DistributedConfig::ResolvedNodes() const {
  if (!nodes.empty()) return nodes;
  NodeConfig only;
  only.name = "node0";
  only.workers = world_size;
  return {only};
}

int DistributedConfig::NodeOf(int rank) const {
  const auto resolved = ResolvedNodes();
  int first = 0;
  for (size_t n = 0; n < resolved.size(); ++n) {
    if (rank < first + resolved[n].workers) return static_cast<int>(n);
    first += resolved[n].workers;
  }
  return static_cast<int>(resolved.size()) - 1;
}

int DistributedConfig::HierarchicalSlices() const {
  const auto resolved = ResolvedNodes();
  int slices = resolved.front().workers;
  for (const auto& node : resolved) slices = std::min(slices, node.workers);
  return slices;
}

int DistributedConfig::LocalRankOf(int rank) const {
  const auto resolved = ResolvedNodes();
  int first = 0;
  for (const auto& node : resolved) {
    if (rank < first + node.workers) return rank - first;
    first += node.workers;
  }
  return 0;
}

std::string_view ToString(Consistency v) {
  switch (v) {
    case Consistency::kBsp:
      return "bsp";
    case Consistency::kSsp:
      return "ssp";
    case Consistency::kAsync:
      return "async";
  }
  return "?";
}

std::string_view ToString(OptimizerPlacement v) {
  switch (v) {
    case OptimizerPlacement::kAuto:
      return "auto";
    case OptimizerPlacement::kShard:
      return "shard";
    case OptimizerPlacement::kWorker:
      return "worker";
  }
  return "?";
}

std::string_view ToString(SecurityMode v) {
  switch (v) {
    case SecurityMode::kAuto:
      return "auto";
    case SecurityMode::kCurve:
      return "curve";
    case SecurityMode::kOff:
      return "off";
  }
  return "?";
}

std::string_view ToString(TaskType v) {
  switch (v) {
    case TaskType::kImage:
      return "image";
    case TaskType::kSdf:
      return "sdf";
    case TaskType::kNerf:
      return "nerf";
  }
  return "?";
}

using Json = nlohmann::json;

using config_reader::ApplyOverride;
using config_reader::Got;
using config_reader::ParseJson;
using config_reader::Problems;
using config_reader::SectionReader;

Result<Config> Config::Parse(std::string_view text, std::string_view source,
                             const std::vector<std::string>& overrides) {
  Problems problems(source);
  Json root;
  if (!ParseJson(text, source, &problems, &root)) return problems.ToStatus();
  if (!root.is_object()) {
    problems.Add("(top level)", "wrong type: expected an object, got " + Got(root),
                 "an object {\"encoding\": {...}, \"training\": {...}, ...}");
    return problems.ToStatus();
  }
  for (const auto& override_text : overrides) ApplyOverride(override_text, &root, &problems);

  Config config;
  config.source = std::string(source);

  SectionReader top(&problems, "", &root);
  config_sections::ReadSections(&top, &problems, &config);
  top.ReportUnknownKeys();

  if (!problems.empty()) return problems.ToStatus();
  std::vector<ConfigProblem> layout_problems;
  config.layout = ResolveLayout(config, &layout_problems);
  if (layout_problems.empty()) CheckPorts(config, &layout_problems);
  for (const auto& p : layout_problems) problems.Add(p.key, p.problem, p.allowed);
  SecurityConfig& sec = config.security;
  sec.curve = sec.mode == SecurityMode::kCurve ||
              (sec.mode == SecurityMode::kAuto && config.layout.multi_host);
  // One process alone (distributed.enable false) opens no connection and
  // loads no key: curve has no effect there (a note says so), so no folder
  // is demanded for it.
  if (sec.curve && sec.keys_dir.empty() && config.distributed.enable) {
    problems.Add("security.keys_dir",
                 sec.mode == SecurityMode::kCurve
                     ? "missing while security.mode is \"curve\""
                     : "missing: the cluster spans several machines, so its data plane is "
                       "authenticated and encrypted (security.mode \"auto\")",
                 "the folder `gridsync keygen DIR` wrote (role keys), or security.mode \"off\" "
                 "on a trusted network");
  }
  if (!problems.empty()) return problems.ToStatus();
  config.notes.lines = InertSectionNotes(root, config.distributed);
  for (std::string& line : InertValueNotes(config)) config.notes.lines.push_back(std::move(line));
  for (std::string& line : QualityNotes(config)) config.notes.lines.push_back(std::move(line));
  config.notes.host_lines = EphemeralPortNotes(config);
  return config;
}

Result<Config> Config::LoadFile(const std::string& path,
                                const std::vector<std::string>& overrides) {
  // Looked at without opening it (opening a FIFO for reading blocks until a
  // writer comes, and a config path must never hang a unit at startup),
  // then read only as a regular file of bounded size: /dev/zero or a FIFO
  // would otherwise grow the text until the process aborts, or wait
  // forever, saying nothing.
  if (path.empty()) {
    return Status::InvalidArgument(
        "the config path is empty; allowed: a JSON config file (--config FILE)");
  }
  struct stat info {};
  if (::stat(path.c_str(), &info) != 0) {
    return Status::IOError("cannot open config " + path + ": " +
                           std::generic_category().message(errno));
  }
  if (!S_ISREG(info.st_mode)) {
    return Status::IOError("cannot read config " + path + ": it is " + FileKindName(info.st_mode) +
                           "; allowed: a regular JSON file");
  }
  if (static_cast<uint64_t>(info.st_size) > kMaxConfigBytes) {
    return Status::InvalidArgument("config " + path + ": " + std::to_string(info.st_size) +
                                   " bytes; allowed: at most " + std::to_string(kMaxConfigBytes) +
                                   " (a config is a few KiB of JSON)");
  }
  // Exactly the size taken: a file that grows meanwhile is refused, never
  // read on without bound.
  GRIDSYNC_ASSIGN_OR_RETURN(const std::string text, ReadFileOfSize(path, info.st_size));
  return Parse(text, path, overrides);
}

}  // namespace gridsync
