// The worker's side of the parameter server: one ZeroMQ DEALER socket per
// shard; pushes of gradient rows (touched rows only; dense tables whole),
// initial values, and pulls of parameter rows, each split by the Partition
// into one message per shard.
//
// With compression the client encodes push values and keeps error feedback;
// with ps.optimizer = worker it also runs Adam (worker/worker_adam.h) and
// pushes updates instead of gradients (see SetWorkerOptimizer).
//
// A pull is two calls, SendPull and ReceivePull, so the caller can compute
// while the shards answer. Every wait has the configured timeout; the error
// names the shards that did not answer. A shard's Error reply comes back as
// a Status naming the shard.
//
// Thread safety: not thread-safe; one client per worker thread.
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>
#include <zmq.hpp>

#include "common/cluster_map.h"
#include "common/sharding.h"
#include "common/status.h"
#include "common/thread_pool.h"
#include "common/uninit_vector.h"
#include "common/wire/curve.h"
#include "common/wire/handshake_watch.h"
#include "common/wire/message.h"
#include "kernels/adam_math.h"
#include "kernels/cpu/adam.h"
#include "kernels/cpu/codec.h"
#include "kernels/cpu/error_feedback.h"

namespace gridsync {

class WorkerAdam;

// Rows of one table to send: row ids ascending (ignored when dense: every
// row) and their values packed in the same order, full table width per row
// (values[i * width ...] belongs to the i-th row listed).
// on_device: the values are held by the client's DevicePushSource (values
// null; push only).
// give_rows, give_values (optional, push only): the vectors that hold rows
// and values (data() == rows / values), which the client may take instead
// of copying them: when all of the table goes to one shard whole (one
// shard, or one owner of every listed row, and no column split), they
// become the message's frames, which ZeroMQ frees once sent. A vector
// taken is left empty; one not taken is left as it was. Either way the
// caller refills it before its next use.
struct TableRowsRef {
  uint32_t table = 0;
  bool dense = false;
  const uint32_t* rows = nullptr;
  size_t row_count = 0;  // sparse only
  const float* values = nullptr;
  bool on_device = false;
  std::vector<uint32_t>* give_rows = nullptr;
  UninitVector<float>* give_values = nullptr;
};

// Push values that stay on the model's device until they are encoded
// (DeviceStagedSync: ps with a codec): for a table a push marks on_device,
// the client asks the source for each block's values or, for a block it
// compresses, for its payload. The source then keeps the error-feedback
// residuals (as cpu::ErrorFeedback would, under the same keys: (table <<
// 32) | first column) and, with Adam on the worker, that table's Adam state
// (WorkerAdam's rule); the client's own copies are made current by
// SyncFeedback and AppendState. Fetch and Encode are called from the
// client's pool at once (distinct keys); they must be thread-safe.
class DevicePushSource {
 public:
  virtual ~DevicePushSource() = default;
  // The block's values (n x width: rows of `table`, columns [col_begin,
  // col_begin + width)) into `values`.
  virtual Status Fetch(uint32_t table, uint32_t col_begin, uint32_t width, const uint32_t* rows,
                       size_t n, float* values) = 0;
  // The same values, encoded as cpu::Encode would into payload
  // (EncodedSize(options, n x width) bytes); with `feedback`, residuals
  // added first and kept afterwards; with `mask_momentum`, Adam's m masked
  // where the payload delivered (WorkerAdam::MaskMomentum).
  virtual Status Encode(uint32_t table, uint32_t col_begin, uint32_t width, const uint32_t* rows,
                        size_t n, const CodecOptions& options, uint64_t seed, bool feedback,
                        bool mask_momentum, uint8_t* payload) = 0;
  // Adam on the worker: the gradient rows (ascending, full width) become
  // updates where they are, WorkerAdam's rule; *kept = the rows that
  // stepped (the others are left out of the push).
  virtual Status ToUpdates(uint32_t table, const uint32_t* rows, size_t n,
                           std::vector<uint32_t>* kept) = 0;
  // The table's Adam state copied into *state (sized for the table); and
  // replaced by `state`'s (null: zeros, a table that never stepped).
  virtual Status CopyAdamState(uint32_t table, cpu::AdamTable* state) = 0;
  virtual Status LoadAdamState(uint32_t table, const cpu::AdamTable* state) = 0;
  // The residuals held, copied into *into; and replaced by `from`'s.
  virtual Status CopyResidualsTo(cpu::ErrorFeedback* into) = 0;
  virtual Status LoadResiduals(const cpu::ErrorFeedback& from) = 0;
};

// Rows of one table to fetch, written into `dest` (the full table, row-major,
// width = table width).
struct TablePullRef {
  uint32_t table = 0;
  bool dense = false;
  const uint32_t* rows = nullptr;
  size_t row_count = 0;
  float* dest = nullptr;
};

struct PsCounters {
  uint64_t bytes_pushed = 0;
  uint64_t bytes_pulled = 0;       // request and reply bytes
  double push_seconds = 0;         // sending pushes and waiting for acks
  double pull_wait_seconds = 0;    // time blocked in ReceivePull
  uint64_t values_compressed = 0;  // gradient values sent through a codec
  // Where the client's time went: building requests (worker Adam, splitting
  // by shard, codecs, wire encoding) and handing them to ZeroMQ; decoding
  // replies and copying pulled values to their destinations.
  double encode_seconds = 0;
  double decode_seconds = 0;
  // Parts of encode_seconds (for benchmarks): worker Adam (here or on the
  // model's device), and the codecs with their error feedback.
  double adam_seconds = 0;
  double codec_seconds = 0;
};

class PsClient {
 public:
  // `context`: a ZeroMQ context to share with other clients of this process
  // (it must outlive none of them: each holds a reference); null, the
  // client makes its own, with one I/O thread.
  static Result<std::unique_ptr<PsClient>> Connect(
      const ClusterMap& map, const Partition& partition, uint32_t worker_rank, uint32_t num_workers,
      std::chrono::milliseconds timeout, wire::Limits limits = {},
      const wire::CurveSettings& curve = {}, std::shared_ptr<zmq::context_t> context = {});
  ~PsClient();

  // kind push (gradients of `step`) or init (initial values); waits for every
  // shard's acknowledgement. Every shard gets a message, empty or not: in BSP
  // it counts pushes per worker.
  // while_acks, if given, runs once the push is sent, while the shards
  // decode and apply it: work that needs neither the acks nor the
  // parameters (the next step's batch) then costs no wall time of its own.
  Status Push(wire::Kind kind, uint64_t step, const std::vector<TableRowsRef>& tables,
              const std::function<void()>& while_acks = nullptr);

  // Mixed precision: this worker's gradients of `step` overflowed. Every
  // shard gets an empty push flagged skipStep and applies no push of the
  // step (bsp, ssp), so the step is skipped on all workers alike.
  Status PushSkipped(uint64_t step);

  // whole: ask for the parameters themselves even with delta pulls (the
  // final pull, whose values must be exact).
  // for_step: the step whose gradient these rows will compute; under ssp
  // and async the shards send them looked ahead to the version that
  // gradient will meet (ShardStore::GatherAhead). 0: as they are.
  // evaluation (with whole): a mid-run evaluation's pull; the shards leave
  // their copy of this worker's replica (delta pulls) as it was.
  Status SendPull(uint64_t min_version, const std::vector<TablePullRef>& tables, bool whole = false,
                  uint64_t for_step = 0, bool evaluation = false);
  // Returns the lowest parameter version among the shards' replies. A
  // shard may answer in parts (ShardOptions::reply_part_bytes); each is
  // copied into the destinations as it arrives, and a part that does not
  // continue the one before is refused naming the shard and rows. The
  // destinations are written only here, never while a push waits; after
  // an error they may be partly written (parts and blocks are copied as
  // they arrive), so the caller must not train on them.
  Result<uint64_t> ReceivePull();

  // The job rolled back to a checkpoint (a restarted shard rejoined): from
  // now every message carries `epoch`, and whatever was outstanding is
  // forgotten (late replies to it are ignored). Error-feedback residuals and
  // Adam's state are the caller's to restore (RestoreState).
  void FollowEpoch(uint32_t epoch);
  uint32_t epoch() const { return epoch_; }

  // Called about once a second while a reply is awaited: an error ends the
  // wait with it (the job rolled back; nothing will answer what was asked).
  void SetWaitCheck(std::function<Status()> check) { wait_check_ = std::move(check); }
  // Asked when a wait runs out, for each shard that has not answered:
  // whether it is still a member of the job, as it was (the coordinator
  // still lists it, the epoch unchanged). When every silent shard is, the
  // wait goes on once more, as long again: a network that came back after a
  // stall resends what it lost only when TCP's backed-off timer fires, up
  // to twice the outage later, and the job died with every process alive
  // (a hostile probe: a 7 s outage against timeout_s 10). Bounded: one
  // more wait, then the timeout names the shards.
  void SetStallCheck(std::function<bool(uint32_t shard)> check) { stall_check_ = std::move(check); }

  const PsCounters& counters() const { return counters_; }
  // The lowest parameter version the shards reported in their acks of the
  // last push (under async: the pushes applied, this one included).
  uint64_t last_ack_version() const { return last_ack_version_; }
  // Starts the counters over (after the one-off initial push).
  void ResetCounters() { counters_ = PsCounters{}; }
  // Puts back counters saved before traffic that is not training's (the
  // whole pulls of a mid-run evaluation).
  void RestoreCounters(const PsCounters& saved) { counters_ = saved; }

  // Compresses the values of pushes (not init) whose block holds at least
  // `min_bytes` of floats. With error feedback, what a lossy codec did not
  // deliver is kept per touched row (per table and column slice) and added
  // to that row's next gradient. `seed` keys the codecs' randomness (mixed
  // with step, table and shard per block).
  void SetCompression(const CodecOptions& codec, bool error_feedback, size_t min_bytes,
                      uint64_t seed);
  // compression.pull: the shards answer pulls with encoded deltas against a
  // replica of the parameters this client keeps (server/shard_store.h's
  // delta pulls); the replica starts from the tables' contents at the first
  // pull of each table, which must be the initial values every worker shares.
  void SetDeltaPulls(bool on) { delta_pulls_ = on; }
  // The residuals; with a DevicePushSource, as of the last SyncFeedback.
  const cpu::ErrorFeedback& error_feedback() const { return feedback_; }
  // Pushes' values on the model's device (see DevicePushSource; not
  // owned, null: none) for the tables `tables` lists; their residuals (and
  // worker Adam's state) are the source's, the other tables' stay here.
  // What this client holds for those tables now is loaded into it.
  Status SetDevicePushSource(DevicePushSource* source, const std::vector<uint32_t>& tables = {});
  // With a DevicePushSource: error_feedback() = the source's residuals.
  Status SyncFeedback();

  // After the last step: pushes, as step `step` and uncompressed, everything
  // error feedback still holds (every row with a residual, full width), so
  // the final parameters lack nothing this worker computed; then forgets the
  // residuals. Under bsp/ssp every worker must flush (the shards count it as
  // a step), and the push waits, as a step would, until the shards reached
  // `min_version` (MinVersionFor in worker/sync/ps_session.h). Returns whether anything
  // could have been held (a lossy codec with error feedback); when false
  // nothing is sent.
  Result<bool> FlushResiduals(uint64_t step, uint64_t min_version);

  // Checkpoints (worker/worker_checkpoint.h): this worker's training state,
  // the error-feedback residuals and, with Adam on the worker, its state.
  // RestoreState replaces both; Corruption when `data` is not such a state
  // or holds Adam's state where this client has none (or the reverse);
  // InvalidArgument when a row's Adam step count exceeds `step`, the
  // checkpoint's (a row steps at most once a step).
  // (Both keep a DevicePushSource's residuals in step: see SyncFeedback.)
  Status AppendState(std::string* out);
  Status RestoreState(std::string_view data, uint64_t step);
  // This worker's pending update (error-feedback residual) of a row of the
  // column slice starting at col_begin, or null (with a DevicePushSource, as
  // of the last SyncFeedback).
  const float* PendingUpdate(uint32_t table, uint32_t col_begin, uint32_t row) const;

  // ps.optimizer = worker: Adam runs here (worker/worker_adam.h) and pushes
  // carry its updates rather than gradients; compression and error feedback
  // then apply to the updates.
  void SetWorkerOptimizer(const AdamHyper& hyper);
  // Worker-side Adam, the codecs with their error feedback, and the pending
  // updates of pulls run in parallel on `pool` (not owned; it outlives this
  // client); null: on the calling thread. Results are the same either way.
  void SetThreadPool(ThreadPool* pool) { pool_ = pool; }
  // Where a push block's codec runs: as cpu::Encode(options, values, n,
  // seed, payload) and, when `decoded` is not null, cpu::Decode of the
  // payload into it, byte for byte (the model's GPU: DeviceTrainer::
  // EncodeBlock). Called from the pool's threads at once; it must be
  // thread-safe. Null (the default): the CPU's codecs.
  using BlockEncoder =
      std::function<Status(const CodecOptions& options, const float* values, size_t n,
                           uint64_t seed, uint8_t* payload, float* decoded)>;
  void SetBlockEncoder(BlockEncoder encoder) { block_encoder_ = std::move(encoder); }
  bool optimizer_on_worker() const { return worker_adam_ != nullptr; }
  // With the optimizer here and error feedback on: the updates this worker
  // computed but its codec has not delivered yet (the residuals) are added
  // to the rows of the outstanding pull as ReceivePull copies them in, so
  // its next gradient sees its own pending updates rather than parameters
  // they have yet to reach; without them Adam keeps pushing a delayed
  // coordinate the same way and the late burst overshoots. Call it right
  // after SendPull: the residuals, as they are now, are read while the
  // shards answer (not in a pass over the scattered rows after the reply),
  // the copy adds them in order, and the next push reuses them
  // (AddResidualOf). Rows of a table whose residuals changed before
  // ReceivePull (a push between) are read again as they land. A pull
  // without this call (an evaluation's, the final one) gets the shards'
  // values as they are.
  // Tables a DevicePushSource owns are left out: their owner adds their
  // residuals where the rows are read (DeviceTrainer::
  // AddResidualsToGridRows).
  void GatherPendingUpdates();
  bool adds_pending_updates() const { return worker_adam_ != nullptr && use_feedback_; }

 private:
  PsClient(const Partition& partition, uint32_t worker_rank, uint32_t num_workers,
           std::chrono::milliseconds timeout, wire::Limits limits);
  // Waits for the reply to request `request_id` from every shard; calls
  // on_reply(shard, message, &more) for each message of it. A reply in
  // parts (pull replies) sets *more until its last part.
  using ReplyHandler = std::function<Status(uint32_t, const wire::Message&, bool* more)>;
  Status AwaitReplies(uint64_t request_id, wire::Kind expected, const ReplyHandler& on_reply);
  // One part of the reply to the outstanding pull from shard s, checked to
  // continue the parts before it, into the pull's destinations.
  Status TakePullPart(uint32_t s, const wire::Message& m, bool* more);

  const Partition& partition_;
  uint32_t worker_rank_;
  uint64_t job_ = 0;    // the cluster map's job, on every message
  uint32_t epoch_ = 0;  // ... and its epoch
  std::function<Status()> wait_check_;
  std::function<bool(uint32_t)> stall_check_;
  uint32_t num_workers_;
  std::chrono::milliseconds timeout_;
  wire::Limits limits_;
  std::vector<wire::TableShape> shapes_;  // what replies are decoded against
  // Null until Connect: the caller's context when it shares one among the
  // clients of a process (one I/O thread for all of them, as a process that
  // simulates many workers wants), else the client's own. Declared before
  // the sockets, so they close before it goes.
  std::shared_ptr<zmq::context_t> context_;
  std::vector<zmq::socket_t> sockets_;  // by shard
  std::vector<std::string> endpoints_;
  // By shard: what each socket's handshakes did, for the error when a
  // shard never answers (a wrong shard.pub shows only as silence); null
  // where the context had no sockets left for one.
  std::vector<std::unique_ptr<wire::HandshakeWatch>> handshakes_;
  bool curve_ = false;
  // Explains a silent shard: "shard s (endpoint)" and what its handshakes
  // tell; logs a handshake failure the first time one is seen.
  std::string DescribeSilentShard(uint32_t s);
  void WatchHandshakes();
  // Sends frames to shard s; a send that waited the timeout (no connection
  // up) is a Timeout naming the shard and what its handshakes tell.
  Status SendToShard(uint32_t s, std::vector<zmq::message_t>& frames, const char* what);
  std::vector<bool> handshake_failure_logged_;
  uint64_t next_request_ = 1;
  uint64_t last_ack_version_ = 0;
  PsCounters counters_;
  CodecOptions codec_;
  bool use_feedback_ = false;
  size_t min_bytes_ = 0;
  uint64_t codec_seed_ = 0;
  BlockEncoder block_encoder_;  // null: the CPU's codecs
  cpu::ErrorFeedback feedback_;
  std::unique_ptr<WorkerAdam> worker_adam_;
  ThreadPool* pool_ = nullptr;
  struct Settle;  // below
  // Whether a block is compressed (large enough, not too large).
  bool Compresses(const wire::OutBlock& block) const;
  // Compresses every block of a push (split by shard), in parallel on pool_;
  // blocks of the tables `on_device` marks are encoded by device_source_, or
  // fetched from it when they are not compressed.
  Status CompressAll(uint64_t step, const std::vector<bool>& on_device,
                     std::vector<std::vector<wire::OutBlock>>* split);
  Status Compress(uint64_t step, uint32_t shard, bool on_device, wire::OutBlock* block,
                  std::vector<Settle>* settle);
  DevicePushSource* device_source_ = nullptr;
  std::vector<bool> device_tables_;  // by table: whose residuals are the source's
  bool DeviceOwned(uint64_t key) const {
    const uint64_t table = key >> 32;
    return table < device_tables_.size() && device_tables_[table];
  }
  // The source's residuals (and worker Adam's state) = this client's of
  // the tables it owns; and this client's Adam state of those tables = the
  // source's.
  Status LoadDeviceState();
  Status SyncAdamState();
  std::vector<std::vector<uint32_t>> device_kept_;  // by table: a push's rows that stepped

  // Sends each shard its blocks (kind push or init) and waits for every ack;
  // after_send, if given, runs once the sends are done (or one failed),
  // before the wait.
  Status SendAndAwaitAcks(wire::Kind kind, uint64_t step,
                          std::vector<std::vector<wire::OutBlock>> split, bool skip_step = false,
                          const std::function<void()>& after_send = nullptr);

  uint64_t RequestIdOf(const std::vector<zmq::message_t>& frames) const;

  // The outstanding pull (0: none), and the parts of its replies that
  // arrived early, while a push waited for its acks: in order, at most
  // kMaxStashFactor x the pull's values + kStashSlackBytes a shard (a
  // shard that sends more is refused, not buffered).
  static constexpr uint64_t kMaxStashFactor = 2;
  static constexpr uint64_t kStashSlackBytes = uint64_t{1} << 20;
  uint64_t pull_request_ = 0;
  bool pull_evaluation_ = false;  // the outstanding pull is an evaluation's
  std::vector<std::vector<std::vector<zmq::message_t>>> stashed_;  // by shard, in arrival order
  std::vector<uint64_t> stashed_bytes_;                            // by shard
  std::vector<std::vector<wire::OutBlock>> pull_blocks_;           // by shard, as requested
  // Where the next part of shard s's pull reply must start: the request's
  // block and row within it, and the row counted over all its blocks.
  struct PartCursor {
    size_t block = 0;
    uint32_t row = 0;
    uint64_t flat = 0;
  };
  std::vector<PartCursor> pull_cursor_;  // by shard
  std::vector<float*> pull_dest_;        // by table
  // The last pull's pending updates (GatherPendingUpdates): by shard, a
  // buffer holding each block's values in request order, and by shard and
  // block where they start in it (kNoPending: a table the device owns), the
  // version of the residuals they were read from and whether the table held
  // any (no entries at all: no pending updates for this pull). The next
  // push reads the residuals of the same rows: it takes them from here
  // while the versions still match (AddResidualOf).
  static constexpr size_t kNoPending = SIZE_MAX;
  struct PendingBlock {
    size_t at = kNoPending;
    cpu::ErrorFeedback::Version version;
    bool gathered = false;  // false: the table held no residual then
  };
  std::vector<std::vector<float>> pull_pending_;
  std::vector<std::vector<PendingBlock>> pull_pending_at_;
  // values (n rows x width) += the residuals of `key`'s rows: from the last
  // pull's pending updates of shard `shard` where they are current and hold
  // the row, else from feedback_. Both give the same bits.
  void AddResidualOf(uint32_t shard, uint64_t key, const uint32_t* rows, size_t n, uint32_t width,
                     float* values) const;
  // What Compress leaves for after the push is sent (it runs while the
  // shards decode): storing a block's residuals (corrected - decoded) and
  // masking Adam's momentum. By group of CompressAll, in block order.
  struct Settle {
    uint64_t key = 0;
    uint32_t table = 0, col_begin = 0, width = 0;
    std::vector<uint32_t> rows;
    UninitVector<float> corrected;
    UninitVector<float> decoded;
    bool mask = false;
  };
  std::vector<std::vector<Settle>> settle_;
  void SettleGroup(std::vector<Settle>* items);  // stores them, in order, and clears them
  void SettleAll();                              // every group, in parallel on pool_
  // Worker states (AppendState): the flags byte's bits.
  static constexpr uint8_t kStateAdam = 1;
  static constexpr uint8_t kStateReplicas = 2;
  // RestoreState's part for delta pulls: replica_ from `data`, or an error
  // with replica_ as it was.
  Status RestoreReplicas(std::string_view* data);

  bool delta_pulls_ = false;
  std::vector<std::vector<float>> replica_;  // delta pulls: by table, what the shards sent
};

}  // namespace gridsync
