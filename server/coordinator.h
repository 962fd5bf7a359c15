// gridsync-coordinator's engine: the control plane on Boost.Asio.
//
// It accepts registrations (role, node, local rank, endpoint, tables),
// assigns ranks, and publishes a generation-numbered cluster map. The first
// registrant's tables define the cluster's tables; a later registrant whose
// tables disagree is refused, with the table name and both sizes. It also
// serves barriers and a small key-value store. Every wait has a timeout and
// its error names the members or keys still missing. A member whose
// connection closes is removed from the map (the generation changes) and
// logged by role and rank.
//
// Bad input (oversized length prefix, bytes that do not decode, unknown
// request) gets an Error reply where possible and the connection is closed;
// the coordinator keeps serving everyone else.
//
// Thread safety: Start/Stop/port from one thread; the server runs its own
// io_context thread.
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "common/cluster_map.h"
#include "common/status.h"
#include "common/wire/curve.h"

namespace gridsync {

struct CoordinatorOptions {
  std::string bind_host = "127.0.0.1";
  uint16_t port = 0;  // 0: pick a free port (tests)
  uint32_t expected_shards = 0;
  uint32_t expected_workers = 0;
  uint32_t max_message_bytes = 16 * 1024 * 1024;
  // Resource limits against hostile or broken clients (each refusal is an
  // error reply naming the limit, then a close):
  uint32_t max_connections = 512;  // beyond: refused at accept (descriptors stay free)
  // Bytes of partially received messages and of requests read while an
  // earlier one on their connection waits (a barrier, a kvGet), over all
  // connections: a body is stored as it arrives, never allocated from the
  // length prefix alone, and one connection's waiting requests may hold at
  // most a quarter of it (past either, that connection is refused).
  uint64_t max_pending_bytes = 256ull << 20;
  // A message must arrive whole within this once its first byte has; a new
  // connection must send its first request within it too.
  std::chrono::milliseconds read_timeout{30000};
  // A peer whose host died or became unreachable (power loss, a cut link:
  // no FIN, no RST) is noticed within about this long by TCP keepalive
  // probes (and TCP_USER_TIMEOUT for unacknowledged replies), and its
  // connection closed, so that its rank frees for a restarted process.
  // gridsync-coordinator sets it to distributed.timeout_s plus a member's
  // ping interval and 1 s (common/member_liveness.h). 0: off.
  std::chrono::seconds dead_peer_after{30};
  // Replies written but not yet taken by the peer: past this, the
  // connection's requests are no longer read until it drains.
  uint64_t max_outbox_bytes = 64ull << 20;
  // The key-value store (rendezvous ids, addresses, votes, checkpoint
  // lists: small values): past these a kvSet is refused, so that no client
  // can grow the coordinator without bound.
  uint64_t max_store_bytes = 256ull << 20;  // keys and values, all of them
  uint32_t max_store_keys = 1u << 16;
  // Of those, what connections that never registered (observers, tools)
  // may hold together (at most the bounds above): 1/16 of the defaults, so
  // that the registered members always have the rest (a probe that filled
  // the store from an unregistered connection had every later member's
  // kvSet refused).
  uint32_t max_unregistered_store_keys = 1u << 12;
  uint64_t max_unregistered_store_bytes = 16ull << 20;
  // A kvGet's values in one reply: a few small keys hold a rendezvous; a
  // request naming one large value a thousand times would otherwise make
  // the coordinator build a reply a thousand values long.
  uint64_t max_reply_bytes = 64ull << 20;
  // Barriers: a name (and a member's name) longer than this, or a new name
  // while this many barriers have members waiting, is refused. A barrier is
  // forgotten once nobody waits at it (its round completed, its members
  // timed out or left), so these bound what barriers hold at any time.
  uint32_t max_barrier_name_bytes = 1024;
  uint32_t max_barriers = 1024;
  // The file the coordinator keeps its job in across its own restarts
  // (server/coordinator_state.h): read at Start, rewritten whenever the job,
  // its epoch, the generation or the job's checkpoint registry changes, and
  // always before a reply that depends on the change goes out. Empty: a
  // restart forgets the job. gridsync-coordinator sets it to
  // <checkpoint.dir>/coordinator-state.json when checkpoints are on.
  std::string state_file;
  // Start at job 1 whatever state_file holds (and overwrite it).
  bool fresh_state = false;
  // security.curve: every connection must prove a role key (authHello, then
  // auth) before anything else, and may register only as that role.
  wire::ControlAuth auth;
  // The settings every shard and worker must share (spec/cluster_settings.h
  // SharedSettings) and the source to name in a refusal. gridsync-
  // coordinator sets them from its own config, so that a member whose
  // config differs is refused even when it is the first to register (the
  // rest would otherwise be refused, naming it). Empty: the first member
  // to register defines them, until no member is left.
  std::vector<Setting> shared_settings;
  std::string shared_settings_source;
};

// What the control plane holds and has done, for metrics and monitors.
struct CoordinatorStats {
  uint64_t generation = 0;
  uint64_t job = 0;
  uint64_t epoch = 0;  // the job's rollbacks (a shard or worker rejoined)
  uint32_t shards = 0, expected_shards = 0;
  uint32_t workers = 0, expected_workers = 0;
  uint64_t connections = 0;      // open now
  uint64_t barrier_waiting = 0;  // members waiting at a barrier now
  uint64_t barriers_passed = 0;  // completed barrier rounds
  uint64_t barrier_timeouts = 0;
  uint64_t barriers = 0;         // barrier names with members waiting now
  uint64_t pending_bytes = 0;    // partially received messages now
  uint64_t queued_requests = 0;  // read while an earlier request waits, now
  uint64_t queued_bytes = 0;     // their frames' bytes
  uint64_t kv_sets = 0, kv_gets = 0;
  uint64_t registrations = 0, registrations_refused = 0;
};

class Coordinator {
 public:
  static Result<std::unique_ptr<Coordinator>> Start(const CoordinatorOptions& options);
  virtual ~Coordinator() = default;
  virtual uint16_t port() const = 0;
  // Turns of a 250 ms timer on the serving io_context: it stops advancing
  // when the serving thread hangs (what feeds systemd's watchdog).
  virtual uint64_t heartbeats() const = 0;
  // Read on the serving thread (posted to it); fails after `timeout` if
  // that thread does not answer.
  virtual Result<CoordinatorStats> stats(std::chrono::milliseconds timeout) = 0;
  // Sets a key of the store from this process (e.g. its metrics address).
  virtual void StoreLocally(const std::string& key, const std::string& value) = 0;
  virtual void Stop() = 0;
};

}  // namespace gridsync
