#include "common/store.h"

#include <spdlog/fmt/fmt.h>

namespace gridsync {
namespace {

std::string QuoteJoin(const std::vector<std::string>& keys) {
  std::string out;
  for (const auto& key : keys) {
    if (!out.empty()) out += ", ";
    out += "'" + key + "'";
  }
  return out;
}

}  // namespace

Status HashStore::Set(const std::string& key, const std::string& value) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    values_[key] = value;
  }
  changed_.notify_all();
  return Status::OK();
}

Result<std::vector<std::string>> HashStore::Get(const std::vector<std::string>& keys,
                                                std::chrono::milliseconds timeout) {
  std::unique_lock<std::mutex> lock(mu_);
  auto all_present = [&] {
    for (const auto& key : keys) {
      if (values_.find(key) == values_.end()) return false;
    }
    return true;
  };
  if (timeout.count() > 0) {
    changed_.wait_until(lock, std::chrono::steady_clock::now() + timeout, all_present);
  }
  std::vector<std::string> missing;
  std::vector<std::string> values;
  values.reserve(keys.size());
  for (const auto& key : keys) {
    auto it = values_.find(key);
    if (it == values_.end()) {
      missing.push_back(key);
    } else {
      values.push_back(it->second);
    }
  }
  if (missing.empty()) return values;
  if (timeout.count() <= 0) {
    return Status::NotFound(fmt::format("store: key{} {} not found (a get with timeout 0 does not wait)",
                                        missing.size() == 1 ? "" : "s", QuoteJoin(missing)));
  }
  return Status::Timeout(fmt::format("store: get timed out after {:.1f} s; missing keys: {}",
                                     static_cast<double>(timeout.count()) / 1000.0,
                                     QuoteJoin(missing)));
}

}  // namespace gridsync
