// One parameter-server shard: a ZeroMQ ROUTER socket serving pushes of
// gradient rows, pulls of parameter rows, initial values and stats for the
// rows the Partition gives it, with Adam applied on the shard.
//
// Consistency (ps.consistency):
//   bsp   - pushes for step s are held until every worker's push for s has
//           arrived, then summed in worker-rank order and applied; a pull
//           with min_version v is answered once v steps are applied.
//   ssp   - the same aggregation, but pushes up to `staleness` steps ahead of
//           the applied version are accepted, and workers pull with
//           min_version = step - staleness, so none reads parameters more
//           than `staleness` steps old.
//   async - every push is applied on arrival; pulls never wait.
//
// With ps.optimizer on the workers, pushes carry parameter updates, and a
// row moves by the mean of the updates the step's pushes gave it (see
// server/shard_store.h); a push carrying the other kind is refused.
//
// Compressed push values (any codec of kernels/cpu/codec.h, described in
// each block) are decoded here and then summed like plain values.
//
// Every received message passes wire::Decode, an ownership check and the
// codec's Decode before anything changes; a bad one gets an Error reply and a log line, and the
// shard keeps serving. A pull that waits longer than the timeout gets an
// Error naming the workers whose pushes are missing (twice the timeout when
// the coordinator listed them since: NoteCoordinatorState).
//
// Thread safety: Start/Stop/endpoint/stats from one controlling thread;
// SetControl and NoteCoordinatorState from any thread; the shard runs an
// I/O thread plus a pool for applying and gathering.
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>

#include "common/cluster_map.h"
#include "common/sharding.h"
#include "common/status.h"
#include "common/store.h"
#include "common/wire/connection_cap.h"
#include "common/wire/curve.h"
#include "common/wire/message.h"
#include "kernels/adam_math.h"
#include "ops/latency_histogram.h"
#include "ops/timeline.h"
#include "spec/run_spec.h"

namespace gridsync {

struct ShardOptions {
  uint32_t shard = 0;
  std::string endpoint = "tcp://127.0.0.1:0";  // port 0: any free port
  uint32_t workers = 1;                        // pushes expected per step
  Consistency consistency = Consistency::kBsp;
  uint32_t staleness = 0;
  int threads = 2;
  AdamHyper hyper;
  bool apply_updates = false;  // pushes carry updates (ps.optimizer resolves to worker)
  std::chrono::milliseconds timeout{30000};
  // Pull replies handed to ZeroMQ but not yet written to their peer's
  // socket (wire::UnsentBytes): a peer that does not read its replies would
  // otherwise make the shard hold them without bound. A pull is refused,
  // by name, when its peer already has replies pending and this one would
  // take them past the first bound, or all peers' past the second. A worker
  // reads each reply before its next pull, so its own pending bytes are 0
  // whenever it asks, and it is never refused.
  uint64_t max_unsent_bytes_per_peer = uint64_t{1} << 30;
  uint64_t max_unsent_bytes = uint64_t{4} << 30;
  // Pulls held for the next version (bsp, ssp), with the row ids they
  // ask for: at most this many bytes together (a worker holds one, while
  // the others' pushes of the step come in).
  uint64_t max_waiting_pull_bytes = uint64_t{1} << 30;
  // A pull reply of more values than this goes in parts of about this
  // many bytes (gridsync.capnp's partRow): the shard gathers the next part
  // while ZeroMQ sends this one and the worker copies it into its model,
  // instead of each waiting for the whole reply. 0: always whole. Replies
  // with encoded blocks (compression.pull) always go whole.
  uint64_t reply_part_bytes = uint64_t{256} << 10;
  wire::Limits limits;
  // compression.pull: delta pulls (ShardStore::EnableReplicas). Reply
  // blocks of at least pull_min_bytes carry params - the worker's replica,
  // encoded; smaller ones carry the parameters whole.
  CodecOptions pull_codec;
  size_t pull_min_bytes = 4096;
  // security: CURVE server with a ZAP handler admitting the listed keys.
  wire::CurveSettings curve;
  // Connections beyond these are shut down as they arrive
  // (ShardConnectionLimits: room for the cluster's workers several times
  // over, all of them behind one address), and so are those that send more
  // than they complete as messages; the unread-byte bounds left at 0 are
  // derived from the partition (twice the largest message a worker sends
  // the shard, plus 64 MiB, per connection; 2 workers + 2 such messages,
  // plus 256 MiB, in all).
  wire::ConnectionLimits connections;
  // checkpoint.every_steps / dir: write the partition every this many
  // applied steps (0: never); resume_step > 0: start from that checkpoint.
  // --timeline: every applied step as a span on this Chrome trace.
  std::shared_ptr<TimelineWriter> timeline;
  uint64_t checkpoint_every = 0;
  std::string checkpoint_dir;
  // Under CURVE: authenticates the partition's checkpoint files
  // (common/checkpoint_mac_key.h), written and read.
  std::optional<CheckpointMacKey> checkpoint_key;
  // The parts a checkpoint step of the job needs (CheckpointParts): the
  // newest step they all hold is never pruned.
  std::vector<std::string> checkpoint_parts;
  uint64_t resume_step = 0;
  // A shard restarted during training, rejoining the job from its
  // checkpoint of resume_step: it holds every message until Joined.
  bool rejoining = false;
  // A shard of a cluster (gridsync-ps): it holds every message until
  // Joined too, so that nothing sent before its registration (when it has
  // no coordinator to ask) can set its job.
  bool join_first = false;
};

// What a shard asks of its cluster's coordinator (set before or while
// serving): the job and epoch the cluster runs, and where the checkpoint
// steps it holds are published (common/checkpoint_registry.h).
struct ShardControl {
  std::function<Result<JobState>()> job_state;
  Store* checkpoint_registry = nullptr;  // outlives the shard
};

// The options of shard `shard` of the run `spec` describes (endpoint left
// at its default: callers choose where to listen).
Result<ShardOptions> ShardOptionsFor(const RunSpec& spec, uint32_t shard);

// The connection caps of a shard serving `workers`: the defaults
// (wire::ConnectionLimits), raised to 4 connections a worker (plus 64) in
// all and 2 a worker (plus 16) from one address, so that every worker,
// observer and restarted process of the cluster fits whatever its hosts.
wire::ConnectionLimits ShardConnectionLimits(uint32_t workers);

// What the shard's store allocates for `partition` under `options`
// (spec/shard_memory.h, with a replica per worker for delta pulls, as the
// shard makes them): gridsync-bench load reads the shard's memory by it.
uint64_t ShardStoreBytes(const Partition& partition, const ShardOptions& options);
// The workers whose replicas the store keeps: all of them with delta pulls
// (pull_codec set), else none.
uint32_t ReplicaWorkers(const ShardOptions& options);

// What the shard's serving loop is doing, for metrics (besides
// wire::ShardStats, which the stats request carries).
struct ServingStats {
  uint64_t waiting_pulls = 0;  // pulls held for a version not yet applied
  uint64_t job = 0;            // the job served (0: none yet)
  uint32_t epoch = 0;          // its epoch (rollbacks to a checkpoint)
  // Pulls answered in more than one part (ShardOptions::reply_part_bytes),
  // and the messages of those replies.
  uint64_t pulls_in_parts = 0;
  uint64_t reply_parts = 0;
  std::map<std::string, uint64_t> refusals;  // error replies by reason (status code, "unreadable")
  // Checkpoints written and failed (a failed write is logged and training
  // goes on: these make a full disk visible to an operator's alert), and
  // the newest step written (0: none).
  uint64_t checkpoints_written = 0;
  uint64_t checkpoint_failures = 0;
  uint64_t checkpoint_step = 0;
  // A rollback whose own files failed their checks (Corruption): the step
  // (0: none). The shard refuses every request from then on; its process
  // sets the files aside and exits for its supervisor to restart it into a
  // rejoin from an older step.
  uint64_t damaged_rollback_step = 0;
  // The step of a rollback refused because its files are another run's
  // (0: none): nothing a restart mends, so the process exits
  // kCheckpointsHeldExitCode rather than refuse requests until the workers
  // time out.
  uint64_t foreign_rollback_step = 0;
  // Pull replies queued and not yet written to their peers' sockets, and
  // the connections shut down for holding replies they did not read while
  // a peer that reads its own asked (server/reply_backlog.h).
  uint64_t unsent_bytes = 0;
  uint64_t peers_shed = 0;
  // Where the serving loop's time went, cumulative seconds per stage: wire
  // and codec decoding with validation; applying pushes; gathering pulled
  // rows; encoding replies; handing them to ZeroMQ.
  struct Stages {
    double decode = 0, apply = 0, gather = 0, encode = 0, send = 0;
  } stages;
};

class PsShard {
 public:
  static Result<std::unique_ptr<PsShard>> Start(const Partition& partition,
                                                const ShardOptions& options);
  virtual ~PsShard() = default;
  // The bound endpoint (with the real port when 0 was asked for).
  virtual std::string endpoint() const = 0;
  virtual wire::ShardStats stats() const = 0;
  // Connections refused: by the ZAP handler (security.curve) and beyond
  // ShardOptions::connections.
  virtual uint64_t refused_connections() const = 0;
  // TCP connections open now (as the connection cap counts them).
  virtual uint32_t open_connections() const = 0;
  // The most bytes one connection sent that the shard has not read as
  // whole messages, at the last look (every 10 ms; wire::ConnectionCap).
  virtual uint64_t largest_unread_bytes() const = 0;
  // Turns of the serving loop so far (it turns at least every 50 ms while
  // healthy, idle or not): what feeds systemd's watchdog.
  virtual uint64_t heartbeats() const = 0;
  // Where the shard learns which job and epoch the cluster runs (the
  // coordinator's map, through the shard's registration): it starts afresh
  // for a newer job, or reloads a checkpoint for a newer epoch of its job,
  // only once this confirms it (server/job_gate.h). Without one, the first
  // job seen is served and no other. May be called while serving.
  virtual void SetControl(ShardControl control) = 0;
  // The shard registered for `job` at `epoch`: one started from a
  // checkpoint (resume_step) publishes it, and a rejoining one
  // (ShardOptions::rejoining) serves from now; one that starts afresh
  // makes the job's checkpoint run (shard 0: common/checkpoint_run.h).
  // Before serving messages.
  virtual void Joined(uint64_t job, uint32_t epoch) = 0;
  // The coordinator's job state as this shard's process last read it (its
  // periodic ping; gridsync-ps). A pull held for a push from a worker the
  // coordinator listed since the pull arrived is held once more at its
  // timeout: a worker behind a stalled network, not one that left (a
  // departed worker leaves the map, and its peers' pulls end at the first
  // timeout). Never asked from the serving loop, whose turns a coordinator
  // behind the same stalled network would stop. From any thread.
  // `asked`: when the state was asked for (a state asked before a pull
  // arrived says nothing of the wait).
  virtual void NoteCoordinatorState(const JobState& state,
                                    std::chrono::steady_clock::time_point asked) = 0;
  // Before registering for `job`: a shard started from a checkpoint
  // checks the run its files name against the other shards' (a resume) or
  // the job's (a rejoin). InvalidArgument: another run's files, which no
  // restart mends (gridsync-ps exits kCheckpointsHeldExitCode).
  virtual Status CheckStartRun(Store& registry, uint64_t job) = 0;
  virtual ServingStats serving_stats() const = 0;
  // Seconds per applied step (every push of it summed and stepped).
  virtual const LatencyHistogram& apply_latency() const = 0;
  virtual void Stop() = 0;
};

}  // namespace gridsync
