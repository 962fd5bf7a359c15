// Client of gridsync-coordinator (the control plane): registration, the
// cluster map, barriers and the key-value store, over TCP with
// length-prefixed Cap'n Proto (common/wire/gridsync.capnp).
//
// Every call has a timeout; a timeout error names who or what is missing
// ("barrier 'init' timed out after 30 s: 3 of 4 arrived; missing: worker-2").
// Errors the coordinator returns (for example table sizes that disagree at
// registration) come back as the Status it sent.
//
// Thread safety: safe for concurrent use; calls are serialised internally
// (one request in flight per connection).
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "common/cluster_map.h"
#include "common/status.h"
#include "common/store.h"
#include "common/wire/curve.h"

namespace gridsync {

class CoordinatorClient {
 public:
  // Connects to host:port, retrying until `timeout` (the coordinator may
  // still be starting); the error names the address.
  // With auth.on (security.curve), the connection then proves the role key
  // (authHello, auth) before anything else; `role` is the one it proves.
  static Result<std::unique_ptr<CoordinatorClient>> Connect(const std::string& host, uint16_t port,
                                                            std::chrono::milliseconds timeout,
                                                            const wire::ControlAuth& auth = {},
                                                            Role role = Role::kObserver);
  ~CoordinatorClient();

  struct Registration {
    uint32_t rank = 0;
    ClusterMap map;
  };
  Result<Registration> Register(const RegisterInfo& info, std::chrono::milliseconds timeout);
  // The same, for a process restarted in its old rank (info.rejoin_step >
  // 0): while the coordinator still holds the rank (or, asking for any
  // rank, every rank) for the process that died, its connection not yet seen
  // closed, asks again until `timeout`.
  Result<Registration> RegisterAgain(const RegisterInfo& info, std::chrono::milliseconds timeout);

  // With wait_complete, waits until every expected shard and worker has
  // registered; the timeout error lists the missing ranks by role.
  Result<ClusterMap> GetMap(bool wait_complete, std::chrono::milliseconds timeout);
  // The cluster's job and its epoch (the map's), without waiting for
  // members: what a shard asks when a message of a newer job or epoch
  // arrives, and what a waiting worker checks it still follows. With the
  // workers it lists: a shard holding a pull for a missing push asks
  // whether the missing worker is still a member.
  Result<JobState> CurrentJob();

  // Blocks until `count` members arrived at barrier `name`. `member` names
  // the caller in the coordinator's "missing" list.
  Status Barrier(const std::string& name, uint32_t count, const std::string& member,
                 std::chrono::milliseconds timeout);

  Status Set(const std::string& key, const std::string& value);
  Result<std::vector<std::string>> Get(const std::vector<std::string>& keys,
                                       std::chrono::milliseconds timeout);

  Status Heartbeat();

  // How long a call that waits on nothing (getMap without wait_complete,
  // set, heartbeat) may take for its reply: 10 s unless set. A monitor
  // sets its --timeout, so a peer that accepts and never answers is named
  // within it.
  void SetReplyTimeout(std::chrono::milliseconds timeout);

 private:
  Status Authenticate(const wire::ControlAuth& auth, Role role);
  class Impl;
  explicit CoordinatorClient(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

// Tells the coordinator why this shard or worker (`role`, `rank`) cannot
// join the job, before it exits on a refusal no restart mends (`why`), so
// that the others' wait for the cluster names it (kCannotJoinPrefix). Best
// effort: a failure is logged, never returned, since the process is
// exiting on `why` anyway.
void ReportCannotJoin(CoordinatorClient& client, Role role, uint32_t rank, const Status& why);

// A Store backed by the coordinator's KV store (for Gloo/NCCL rendezvous).
class CoordinatorStore : public Store {
 public:
  explicit CoordinatorStore(CoordinatorClient* client, std::string prefix = "")
      : client_(client), prefix_(std::move(prefix)) {}
  Status Set(const std::string& key, const std::string& value) override;
  Result<std::vector<std::string>> Get(const std::vector<std::string>& keys,
                                       std::chrono::milliseconds timeout) override;

 private:
  CoordinatorClient* client_;
  std::string prefix_;
};

}  // namespace gridsync
