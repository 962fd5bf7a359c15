// Store: a small key-value store with blocking waits, the rendezvous seam
// (after Gloo's rendezvous::Store). HashStore is the in-memory twin for tests
// (threads in one process); CoordinatorStore (coordinator_client.h) is the
// real one, backed by the coordinator's KV store, so no shared filesystem is
// assumed.
//
// Thread safety: implementations are safe for concurrent use.
#pragma once

#include <chrono>
#include <condition_variable>
#include <map>
#include <mutex>
#include <string>
#include <vector>

#include "common/status.h"

namespace gridsync {

class Store {
 public:
  virtual ~Store() = default;
  virtual Status Set(const std::string& key, const std::string& value) = 0;
  // Waits up to `timeout` for every key; the timeout error names the keys
  // still missing.
  virtual Result<std::vector<std::string>> Get(const std::vector<std::string>& keys,
                                               std::chrono::milliseconds timeout) = 0;
};

class HashStore : public Store {
 public:
  Status Set(const std::string& key, const std::string& value) override;
  Result<std::vector<std::string>> Get(const std::vector<std::string>& keys,
                                       std::chrono::milliseconds timeout) override;

 private:
  std::mutex mu_;
  std::condition_variable changed_;
  std::map<std::string, std::string> values_;  // guarded by mu_
};

}  // namespace gridsync
