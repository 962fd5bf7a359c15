// The steps launchers exchange (resume_steps.h).
//
// Thread safety: see resume_steps.h.
#include "tools/resume_steps.h"

#include <spdlog/fmt/fmt.h>

#include <algorithm>
#include <initializer_list>
#include <nlohmann/json.hpp>
#include <set>

namespace gridsync::launch_detail {
namespace {

// A value as the refusal quotes it: at most 200 characters.
// Bytes that are not printable ASCII as \xNN: the value reaches a
// terminal and a journal, where control bytes must not act.
std::string Quoted(std::string_view value) {
  constexpr size_t kMax = 200;
  std::string out = "'";
  for (const char c : value.substr(0, kMax)) {
    const auto byte = static_cast<unsigned char>(c);
    if (byte >= 0x20 && byte < 0x7f) {
      out += c;
    } else {
      out += fmt::format("\\x{:02x}", byte);
    }
  }
  out += value.size() > kMax ? "'..." : "'";
  return out;
}

// A launcher's value as a JSON object of exactly `keys`, or the refusal
// `refuse` makes of why not.
template <typename Refuse>
Result<nlohmann::json> ParseObject(std::string_view value, std::initializer_list<const char*> keys,
                                   const Refuse& refuse) {
  nlohmann::json j = nlohmann::json::parse(value, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded() || !j.is_object()) return refuse("not a JSON object");
  bool exact = j.size() == keys.size();
  std::string names;
  for (const char* key : keys) {
    exact = exact && j.contains(key);
    names += (names.empty() ? "" : ", ") + std::string(key);
  }
  if (!exact) return refuse("not exactly the keys " + names);
  return j;
}

}  // namespace

std::string EncodeNodeSteps(const NodeSteps& steps) {
  nlohmann::json j;
  j["parts"] = steps.has_parts;
  j["steps"] = steps.intact;
  j["damaged"] = steps.damaged;
  return j.dump();
}

Result<NodeSteps> DecodeNodeSteps(std::string_view value, const std::string& node) {
  const auto refuse = [&](const std::string& why) {
    return Status::Corruption(fmt::format(
        "the launcher of node {} published {} as the steps it can resume from: {}; allowed: "
        "{{\"parts\": true or false, \"steps\": [up to {} distinct steps above 0], "
        "\"damaged\": true or false}}, as gridsync launch --resume --node writes it",
        node, Quoted(value), why, kMaxResumeSteps));
  };
  GRIDSYNC_ASSIGN_OR_RETURN(const nlohmann::json j,
                            ParseObject(value, {"parts", "steps", "damaged"}, refuse));
  const auto& parts = j["parts"];
  const auto& steps = j["steps"];
  const auto& damaged = j["damaged"];
  if (!parts.is_boolean()) return refuse("parts is not true or false");
  if (!damaged.is_boolean()) return refuse("damaged is not true or false");
  if (!steps.is_array()) return refuse("steps is not a list");
  if (steps.size() > kMaxResumeSteps) return refuse("more steps than allowed");
  NodeSteps out;
  out.has_parts = parts.get<bool>();
  out.damaged = damaged.get<bool>();
  std::set<uint64_t> seen;
  for (const auto& s : steps) {
    if (!s.is_number_unsigned() || s.get<uint64_t>() == 0)
      return refuse("a step is not a whole number above 0");
    if (!seen.insert(s.get<uint64_t>()).second) return refuse("a step is listed twice");
    out.intact.push_back(s.get<uint64_t>());
  }
  if (!out.has_parts && (!out.intact.empty() || out.damaged))
    return refuse("steps or damage listed for a node of no parts");
  return out;
}

std::string EncodeVerdict(const ResumeVerdict& verdict) {
  nlohmann::json j;
  j["step"] = verdict.step;
  j["refused"] = verdict.refused;
  return j.dump();
}

Result<ResumeVerdict> DecodeVerdict(std::string_view value, const std::string& node) {
  const auto refuse = [&](const std::string& why) {
    return Status::Corruption(fmt::format(
        "the launcher of node {} published {} as its verdict on the step to resume from: {}; "
        "allowed: {{\"step\": a whole number, \"refused\": an exit code 0..255}}, as gridsync "
        "launch --resume --node writes it",
        node, Quoted(value), why));
  };
  GRIDSYNC_ASSIGN_OR_RETURN(const nlohmann::json j,
                            ParseObject(value, {"step", "refused"}, refuse));
  const auto& step = j["step"];
  const auto& refused = j["refused"];
  if (!step.is_number_unsigned()) return refuse("step is not a whole number");
  if (!refused.is_number_unsigned() || refused.get<uint64_t>() > 255)
    return refuse("refused is not an exit code 0..255");
  return ResumeVerdict{step.get<uint64_t>(), static_cast<int>(refused.get<uint64_t>())};
}

uint64_t NewestCommonStep(const std::vector<NodeSteps>& nodes) {
  std::vector<const NodeSteps*> with_parts;
  for (const auto& n : nodes)
    if (n.has_parts) with_parts.push_back(&n);
  if (with_parts.empty()) return 0;
  uint64_t best = 0;
  for (uint64_t step : with_parts.front()->intact) {
    const bool everywhere = std::all_of(with_parts.begin(), with_parts.end(), [&](const auto* n) {
      return std::find(n->intact.begin(), n->intact.end(), step) != n->intact.end();
    });
    if (everywhere) best = std::max(best, step);
  }
  return best;
}

std::string DescribeSteps(const NodeSteps& steps) {
  if (!steps.has_parts) return "any step (no part checkpoints there)";
  if (steps.intact.empty()) return "no intact complete step";
  std::string out;
  for (size_t k = 0; k < steps.intact.size(); ++k)
    out += (k == 0 ? "" : ", ") + std::to_string(steps.intact[k]);
  return out;
}

std::string DescribeNodeSteps(const std::vector<std::string>& names,
                              const std::vector<NodeSteps>& nodes) {
  std::string out;
  for (size_t i = 0; i < nodes.size() && i < names.size(); ++i)
    out += (out.empty() ? "" : "; ") + names[i] + ": " + DescribeSteps(nodes[i]);
  return out;
}

}  // namespace gridsync::launch_detail
