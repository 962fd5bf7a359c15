#include "common/cluster_map.h"

#include <map>

namespace gridsync {

const char* RoleName(Role role) {
  switch (role) {
    case Role::kShard:
      return "shard";
    case Role::kWorker:
      return "worker";
    case Role::kObserver:
      return "observer";
  }
  return "unknown-role";
}

std::string RankList(const std::vector<uint32_t>& ranks) {
  std::string out = "[";
  for (size_t i = 0; i < ranks.size(); ++i) {
    if (i > 0) out += ", ";
    out += std::to_string(ranks[i]);
  }
  return out + "]";
}

std::string CannotJoinKey(Role role, uint32_t rank) {
  return std::string(kCannotJoinPrefix) + RoleName(role) + "/" + std::to_string(rank);
}

std::optional<std::string> SettingsMismatch(const std::vector<Setting>& mine,
                                            const std::vector<Setting>& reference) {
  std::map<std::string, std::pair<const std::string*, const std::string*>> by_key;
  for (const Setting& s : mine) by_key[s.key].first = &s.value;
  for (const Setting& s : reference) by_key[s.key].second = &s.value;
  std::string out;
  for (const auto& [key, values] : by_key) {
    const auto [here, there] = values;
    if (here != nullptr && there != nullptr && *here == *there) continue;
    out += (out.empty() ? "" : "; ") + key + ": " + (here ? *here : std::string("(not sent)")) +
           " here, " + (there ? *there : std::string("(not sent)")) + " there";
  }
  if (out.empty()) return std::nullopt;
  return out;
}

}  // namespace gridsync
