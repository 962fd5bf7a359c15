#include "worker/ps_client.h"

#include <algorithm>
#include <chrono>
#include <cstring>
#include <map>

#include "common/check.h"
#include "common/counter_rng.h"
#include "worker/worker_adam.h"

namespace gridsync {
namespace {

using Clock = std::chrono::steady_clock;

double Seconds(Clock::time_point since) {
  return std::chrono::duration<double>(Clock::now() - since).count();
}

// Adds the seconds of its life to *total: a stage timer for every exit.
class ScopedSeconds {
 public:
  explicit ScopedSeconds(double* total) : total_(total) {}
  ~ScopedSeconds() { *total_ += Seconds(start_); }
  ScopedSeconds(const ScopedSeconds&) = delete;
  ScopedSeconds& operator=(const ScopedSeconds&) = delete;

 private:
  double* total_;
  Clock::time_point start_ = Clock::now();
};

}  // namespace

PsClient::PsClient(const Partition& partition, uint32_t worker_rank, uint32_t num_workers,
                   std::chrono::milliseconds timeout, wire::Limits limits)
    : partition_(partition),
      worker_rank_(worker_rank),
      num_workers_(num_workers),
      timeout_(timeout),
      limits_(limits) {
  for (uint32_t t = 0; t < partition.n_tables(); ++t) {
    shapes_.push_back({partition.table(t).rows, partition.table(t).width});
  }
}

PsClient::~PsClient() = default;

Result<std::unique_ptr<PsClient>> PsClient::Connect(
    const ClusterMap& map, const Partition& partition, uint32_t worker_rank, uint32_t num_workers,
    std::chrono::milliseconds timeout, wire::Limits limits, const wire::CurveSettings& curve) {
  if (map.shards.size() != partition.shards()) {
    return Status::InvalidArgument("the cluster map lists " + std::to_string(map.shards.size()) +
                                   " shards, the partition expects " +
                                   std::to_string(partition.shards()));
  }
  std::unique_ptr<PsClient> client(
      new PsClient(partition, worker_rank, num_workers, timeout, limits));
  client->job_ = map.job;
  client->epoch_ = map.epoch;
  for (const auto& shard : map.shards) {
    try {
      zmq::socket_t socket(client->context_, zmq::socket_type::dealer);
      socket.set(zmq::sockopt::linger, 0);
      socket.set(zmq::sockopt::maxmsgsize, static_cast<int64_t>(limits.max_frame_bytes));
      socket.set(zmq::sockopt::sndhwm, 0);
      socket.set(zmq::sockopt::rcvhwm, 0);
      GRIDSYNC_RETURN_IF_ERROR(wire::ApplyCurveClient(socket, curve));
      socket.connect(shard.endpoint);
      client->sockets_.push_back(std::move(socket));
      client->endpoints_.push_back(shard.endpoint);
    } catch (const zmq::error_t& e) {
      return Status::IOError("cannot connect to shard " + std::to_string(shard.rank) + " at " +
                             shard.endpoint + ": " + e.what());
    }
  }
  client->pull_blocks_.resize(client->sockets_.size());
  client->stashed_.resize(client->sockets_.size());
  return client;
}

namespace {

// One pass over each table deals its rows to their owners: in every column
// group, rows go to the shard Partition::Owner names; a dense table becomes a
// dense block where a shard's rows are contiguous.
std::vector<std::vector<wire::OutBlock>> SplitAll(const Partition& partition,
                                                  const std::vector<TableRowsRef>& tables,
                                                  bool with_values) {
  const uint32_t shards = partition.shards();
  std::vector<std::vector<wire::OutBlock>> out(shards);
  for (const auto& ref : tables) {
    const uint32_t t = ref.table;
    const uint32_t width = partition.table(t).width;
    const uint32_t groups = partition.ColumnGroups(t);
    const uint32_t cw = partition.ColWidth(t);
    const size_t n = ref.dense ? partition.table(t).rows : ref.row_count;
    auto row_at = [&](size_t i) { return ref.dense ? static_cast<uint32_t>(i) : ref.rows[i]; };
    std::vector<int> index(shards, -1);
    for (uint32_t g = 0; g < groups; ++g) {
      const uint32_t col = partition.ColBegin(t, g);
      // Rows are ascending and ownership changes only at block boundaries,
      // so each run of rows inside one block moves in bulk.
      for (size_t i = 0; i < n;) {
        const uint32_t row = row_at(i);
        const uint32_t shard = partition.Owner(t, row, g);
        const uint64_t limit = (uint64_t{row} / kRowBlock + 1) * kRowBlock;
        size_t j;
        if (ref.dense) {
          j = std::min<uint64_t>(n, limit);
        } else {
          j = static_cast<size_t>(std::lower_bound(ref.rows + i, ref.rows + n, limit) - ref.rows);
        }
        if (index[shard] < 0) {
          index[shard] = static_cast<int>(out[shard].size());
          wire::OutBlock block;
          block.table = t;
          block.col_begin = col;
          block.width = cw;
          out[shard].push_back(std::move(block));
        }
        wire::OutBlock& block = out[shard][static_cast<size_t>(index[shard])];
        if (ref.dense) {
          for (size_t k = i; k < j; ++k) block.rows.push_back(static_cast<uint32_t>(k));
        } else {
          block.rows.insert(block.rows.end(), ref.rows + i, ref.rows + j);
        }
        if (with_values && ref.values != nullptr) {
          if (cw == width) {
            block.values.insert(block.values.end(), ref.values + i * width, ref.values + j * width);
          } else {
            for (size_t k = i; k < j; ++k) {
              const float* v = ref.values + k * width + col;
              block.values.insert(block.values.end(), v, v + cw);
            }
          }
        }
        i = j;
      }
    }
    for (uint32_t s = 0; s < shards; ++s) {
      if (index[s] < 0) continue;
      wire::OutBlock& block = out[s][static_cast<size_t>(index[s])];
      block.row_count = static_cast<uint32_t>(block.rows.size());
      if (ref.dense && block.rows.back() - block.rows.front() + 1 == block.rows.size()) {
        block.dense = true;
        block.row_begin = block.rows.front();
        block.rows.clear();
      }
    }
  }
  return out;
}

}  // namespace

Status PsClient::AwaitReplies(
    uint64_t request_id, wire::Kind expected,
    const std::function<Status(uint32_t, const wire::Message&)>& on_reply) {
  std::vector<bool> done(sockets_.size(), false);
  size_t remaining = sockets_.size();
  // Handles one reply; returns true when it answered `request_id`.
  auto handle = [&](uint32_t s, const std::vector<zmq::message_t>& frames,
                    bool* answered) -> Status {
    *answered = false;
    const ScopedSeconds timed(&counters_.decode_seconds);
    auto message = wire::Decode(frames, shapes_, limits_);
    if (!message.ok()) return message.status().WithContext("reply from shard " + std::to_string(s));
    // Request ids start at 1: an Error for request 0 answers a message the
    // shard could not read at all, so it is ours and nothing else will come.
    if (message->kind == wire::Kind::kError && message->request_id == 0) {
      return message->error.WithContext("shard " + std::to_string(s) +
                                        " could not read a message of worker " +
                                        std::to_string(worker_rank_));
    }
    if (message->request_id != request_id) return Status::OK();
    if (message->kind == wire::Kind::kError) {
      return message->error.WithContext("shard " + std::to_string(s) + " refused request " +
                                        std::to_string(request_id));
    }
    if (message->kind != expected) {
      return Status::Corruption("shard " + std::to_string(s) + " answered " +
                                wire::KindName(message->kind) + ", expected " +
                                wire::KindName(expected));
    }
    counters_.bytes_pulled += expected == wire::Kind::kPullReply ? message->bytes : 0;
    GRIDSYNC_RETURN_IF_ERROR(on_reply(s, *message));
    *answered = true;
    return Status::OK();
  };
  // Pull replies that arrived while waiting for something else.
  for (uint32_t s = 0; s < sockets_.size(); ++s) {
    if (request_id != pull_request_ || !stashed_[s].has_value()) continue;
    bool answered = false;
    const Status status = handle(s, *stashed_[s], &answered);
    stashed_[s].reset();
    GRIDSYNC_RETURN_IF_ERROR(status);
    if (answered) {
      done[s] = true;
      --remaining;
    }
  }
  const auto deadline = Clock::now() + timeout_;
  constexpr auto kCheckEvery = std::chrono::milliseconds(1000);
  auto next_check = Clock::now() + kCheckEvery;
  while (remaining > 0) {
    if (wait_check_ && Clock::now() >= next_check) {
      GRIDSYNC_RETURN_IF_ERROR(wait_check_());
      next_check = Clock::now() + kCheckEvery;
    }
    std::vector<zmq::pollitem_t> items;
    std::vector<uint32_t> which;
    for (uint32_t s = 0; s < sockets_.size(); ++s) {
      if (done[s]) continue;
      items.push_back({sockets_[s].handle(), 0, ZMQ_POLLIN, 0});
      which.push_back(s);
    }
    const auto left =
        std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now());
    if (left.count() <= 0) {
      std::string missing;
      for (uint32_t s : which)
        missing += (missing.empty() ? "" : ", ") + std::to_string(s) + " (" + endpoints_[s] + ")";
      return Status::Timeout("no " + std::string(wire::KindName(expected)) + " from shards [" +
                             missing + "] within " +
                             std::to_string(timeout_.count() / 1000.0).substr(0, 5) +
                             " s (worker " + std::to_string(worker_rank_) + ")");
    }
    try {
      zmq::poll(items.data(), items.size(), wait_check_ ? std::min(left, kCheckEvery) : left);
    } catch (const zmq::error_t& e) {
      return Status::IOError(std::string("poll failed: ") + e.what());
    }
    for (size_t k = 0; k < items.size(); ++k) {
      if (!(items[k].revents & ZMQ_POLLIN)) continue;
      const uint32_t s = which[k];
      auto frames = wire::ReceiveMultipart(sockets_[s], 0, limits_);
      if (!frames.ok()) return frames.status().WithContext("shard " + std::to_string(s));
      if (request_id != pull_request_ && pull_request_ != 0 &&
          RequestIdOf(*frames) == pull_request_) {
        // The reply to the outstanding pull, early: keep it for ReceivePull.
        stashed_[s] = std::move(*frames);
        continue;
      }
      bool answered = false;
      GRIDSYNC_RETURN_IF_ERROR(handle(s, *frames, &answered));
      if (!answered) continue;  // a late reply to an abandoned request
      done[s] = true;
      --remaining;
    }
  }
  return Status::OK();
}

void PsClient::FollowEpoch(uint32_t epoch) {
  epoch_ = epoch;
  pull_request_ = 0;
  pull_evaluation_ = false;
  for (auto& stashed : stashed_) stashed.reset();
  for (auto& blocks : pull_blocks_) blocks.clear();
}

void PsClient::SetCompression(const CodecOptions& codec, bool error_feedback, size_t min_bytes,
                              uint64_t seed) {
  codec_ = codec;
  use_feedback_ = error_feedback && codec.codec != Codec::kNone;
  min_bytes_ = min_bytes;
  codec_seed_ = seed;
}

void PsClient::SetWorkerOptimizer(const AdamHyper& hyper) {
  worker_adam_ = std::make_unique<WorkerAdam>(partition_, hyper);
}

namespace {
// Pulled rows this far ahead have their destination prefetched.
constexpr size_t kPullPrefetch = 16;

// Residuals are kept per column slice of a table.
// One error-feedback key per (table, column slice): both halves whole, so
// no two slices share residuals however wide a table is.
uint64_t FeedbackKey(uint32_t table, uint32_t col_begin) {
  return (uint64_t{table} << 32) | col_begin;
}
}  // namespace

void PsClient::AddPendingUpdates(const std::vector<TablePullRef>& tables) const {
  if (worker_adam_ == nullptr || !use_feedback_) return;
  // Each table writes only its own destination.
  auto add = [&](size_t i) {
    const TablePullRef& ref = tables[i];
    const uint32_t width = partition_.table(ref.table).width;
    const size_t n = ref.dense ? partition_.table(ref.table).rows : ref.row_count;
    for (uint32_t g = 0; g < partition_.ColumnGroups(ref.table); ++g) {
      const uint32_t col = partition_.ColBegin(ref.table, g);
      feedback_.AddResidualInPlace(FeedbackKey(ref.table, col), ref.dense ? nullptr : ref.rows, n,
                                   ref.dest, width, col);
    }
  };
  ParallelForOn(pool_, tables.size(), add);
}

const float* PsClient::PendingUpdate(uint32_t table, uint32_t col_begin, uint32_t row) const {
  return feedback_.Residual(FeedbackKey(table, col_begin), row);
}

Status PsClient::SetDevicePushSource(DevicePushSource* source,
                                     const std::vector<uint32_t>& tables) {
  if (source != nullptr && worker_adam_ != nullptr) {
    return Status::InvalidArgument(
        "push values on the model's device: Adam runs on this worker (ps.optimizer worker) and "
        "needs them here; allowed: ps.optimizer shard");
  }
  if (device_source_ != nullptr) GRIDSYNC_RETURN_IF_ERROR(SyncFeedback());
  device_source_ = source;
  device_tables_.assign(partition_.n_tables(), false);
  if (source == nullptr) return Status::OK();
  for (uint32_t t : tables) {
    if (t >= partition_.n_tables())
      return Status::InvalidArgument("device push table " + std::to_string(t) + " of " +
                                     std::to_string(partition_.n_tables()));
    device_tables_[t] = true;
  }
  return LoadDeviceResiduals();
}

Status PsClient::LoadDeviceResiduals() {
  cpu::ErrorFeedback owned;
  for (uint64_t key : feedback_.Keys())
    if (DeviceOwned(key)) owned.CopyTableFrom(feedback_, key);
  return device_source_->LoadResiduals(owned).WithContext("loading the residuals onto the device");
}

Status PsClient::SyncFeedback() {
  if (device_source_ == nullptr) return Status::OK();
  cpu::ErrorFeedback held;
  GRIDSYNC_RETURN_IF_ERROR(device_source_->CopyResidualsTo(&held).WithContext(
      "copying the residuals from the model's device"));
  for (uint64_t key : feedback_.Keys())
    if (DeviceOwned(key)) feedback_.Erase(key);
  for (uint64_t key : held.Keys()) {
    if (!DeviceOwned(key))
      return Status::Internal("the device holds residuals of table " + std::to_string(key >> 32) +
                              ", which it does not push");
    feedback_.CopyTableFrom(held, key);
  }
  return Status::OK();
}

Result<bool> PsClient::FlushResiduals(uint64_t step, uint64_t min_version) {
  if (!use_feedback_) return false;
  GRIDSYNC_RETURN_IF_ERROR(SyncFeedback());
  // Under bsp a shard refuses a push for a step it has not reached.
  GRIDSYNC_RETURN_IF_ERROR(SendPull(min_version, {}));
  GRIDSYNC_RETURN_IF_ERROR(
      ReceivePull().status().WithContext("waiting to flush the error-feedback residuals"));
  struct Rows {
    std::vector<uint32_t> rows;
    std::vector<float> values;
  };
  std::vector<Rows> held(partition_.n_tables());
  std::vector<TableRowsRef> refs;
  for (uint32_t t = 0; t < partition_.n_tables(); ++t) {
    const uint32_t width = partition_.table(t).width;
    const uint32_t cw = partition_.ColWidth(t);
    Rows& h = held[t];
    for (uint32_t g = 0; g < partition_.ColumnGroups(t); ++g) {
      const auto rows = feedback_.Rows(FeedbackKey(t, partition_.ColBegin(t, g)));
      h.rows.insert(h.rows.end(), rows.begin(), rows.end());
    }
    std::sort(h.rows.begin(), h.rows.end());
    h.rows.erase(std::unique(h.rows.begin(), h.rows.end()), h.rows.end());
    if (h.rows.empty()) continue;
    h.values.assign(h.rows.size() * width, 0.0f);
    for (uint32_t g = 0; g < partition_.ColumnGroups(t); ++g) {
      const uint32_t col = partition_.ColBegin(t, g);
      for (size_t i = 0; i < h.rows.size(); ++i) {
        const float* r = feedback_.Residual(FeedbackKey(t, col), h.rows[i]);
        if (r != nullptr) std::memcpy(h.values.data() + i * width + col, r, cw * sizeof(float));
      }
    }
    refs.push_back({t, false, h.rows.data(), h.rows.size(), h.values.data()});
  }
  feedback_.Clear();
  if (device_source_ != nullptr) GRIDSYNC_RETURN_IF_ERROR(LoadDeviceResiduals());
  // What was computed already: no optimizer, no codec.
  const auto start = Clock::now();
  const Status status =
      SendAndAwaitAcks(wire::Kind::kPush, step, SplitAll(partition_, refs, /*with_values=*/true));
  counters_.push_seconds += Seconds(start);
  GRIDSYNC_RETURN_IF_ERROR(status.WithContext("flushing the error-feedback residuals"));
  return true;
}

bool PsClient::Compresses(const wire::OutBlock& block) const {
  const size_t n = size_t{block.row_count} * block.width;
  return n != 0 && n <= kMaxCodecValues && n * sizeof(float) >= min_bytes_;
}

Status PsClient::CompressAll(uint64_t step, const std::vector<bool>& on_device,
                             std::vector<std::vector<wire::OutBlock>>* split) {
  // Blocks that share an error-feedback key (one table's slice, cut by rows
  // across shards) run in order on one thread; distinct keys in parallel,
  // their tables made first. The bytes are the same as on one thread.
  const bool codec_on = codec_.codec != Codec::kNone;
  std::map<uint64_t, std::vector<std::pair<uint32_t, wire::OutBlock*>>> by_key;
  for (uint32_t s = 0; s < split->size(); ++s) {
    for (auto& block : (*split)[s]) {
      const bool device = on_device[block.table];
      if (!codec_on || !Compresses(block)) {
        if (!device) continue;
        // Sent as values: they come from the device.
        block.values.resize(size_t{block.row_count} * block.width);
        GRIDSYNC_RETURN_IF_ERROR(device_source_
                                     ->Fetch(block.table, block.col_begin, block.width,
                                             block.rows.data(), block.row_count,
                                             block.values.data())
                                     .WithContext("table " + std::to_string(block.table) +
                                                  ": copying the push from the model's device"));
        continue;
      }
      const uint64_t key = FeedbackKey(block.table, block.col_begin);
      if (use_feedback_ && !device) feedback_.Reserve(key, block.width);
      by_key[key].emplace_back(s, &block);
    }
  }
  std::vector<const std::vector<std::pair<uint32_t, wire::OutBlock*>>*> groups;
  for (const auto& [key, blocks] : by_key) groups.push_back(&blocks);
  std::vector<Status> status(groups.size());
  std::vector<uint64_t> values(groups.size(), 0);
  auto compress = [&](size_t g) {
    for (const auto& [shard, block] : *groups[g]) {
      values[g] += size_t{block->row_count} * block->width;
      status[g] = Compress(step, shard, on_device[block->table], block);
      if (!status[g].ok()) return;
    }
  };
  ParallelForOn(pool_, groups.size(), compress);
  for (size_t g = 0; g < groups.size(); ++g) {
    GRIDSYNC_RETURN_IF_ERROR(status[g]);
    counters_.values_compressed += values[g];
  }
  return Status::OK();
}

Status PsClient::Compress(uint64_t step, uint32_t shard, bool on_device, wire::OutBlock* block) {
  const size_t n = size_t{block->row_count} * block->width;
  const uint64_t key = FeedbackKey(block->table, block->col_begin);
  std::vector<uint32_t> dense_rows;
  const uint32_t* rows = block->rows.data();
  if (block->dense) {
    dense_rows.resize(block->row_count);
    for (uint32_t i = 0; i < block->row_count; ++i) dense_rows[i] = block->row_begin + i;
    rows = dense_rows.data();
  }
  block->codec = codec_;
  block->codec_seed = CounterRandom(codec_seed_, step, (uint64_t{block->table} << 32) | shard);
  block->payload.resize(EncodedSize(block->codec, n));
  if (on_device) {
    // The values, their residuals and the codec stay on the device; only
    // the payload comes back.
    return device_source_
        ->Encode(block->table, block->col_begin, block->width, rows, block->row_count, block->codec,
                 block->codec_seed, use_feedback_, block->payload.data())
        .WithContext("table " + std::to_string(block->table) +
                     ": encoding the push on the model's device (a Corruption means the values "
                     "are not finite: training diverged?)");
  }
  if (use_feedback_)
    feedback_.AddResidual(key, rows, block->row_count, block->width, block->values.data());
  std::vector<float> decoded(use_feedback_ ? n : 0);
  // Our own bytes: they decode unless the values were not finite (a
  // diverged run), which the shard would refuse as well.
  const auto diverged = [&](const Status& status) {
    return status.WithContext("table " + std::to_string(block->table) +
                              ": the values to push do not encode (training diverged?)");
  };
  if (block_encoder_) {
    // The model's device: a refusal of the decode is as above; anything else
    // is the device's own failure, named as such.
    GRIDSYNC_RETURN_IF_ERROR(
        block_encoder_(block->codec, block->values.data(), n, block->codec_seed,
                       block->payload.data(), use_feedback_ ? decoded.data() : nullptr)
            .WithContext("table " + std::to_string(block->table) +
                         ": encoding the push on the model's device (a Corruption means the "
                         "values are not finite: training diverged?)"));
  } else {
    cpu::Encode(block->codec, block->values.data(), n, block->codec_seed, block->payload.data());
    if (use_feedback_) {
      GRIDSYNC_RETURN_IF_ERROR(
          diverged(cpu::Decode(block->codec, block->payload.data(), block->payload.size(), n,
                               block->codec_seed, decoded.data())));
    }
  }
  if (use_feedback_) {
    feedback_.StoreResidual(key, rows, block->row_count, block->width, block->values.data(),
                            decoded.data());
    // DGC's momentum factor masking: a sparsifying codec delivers a value
    // after many steps; the momentum that built it up would otherwise keep
    // pushing the same way.
    if (worker_adam_ != nullptr &&
        (codec_.codec == Codec::kTopk || codec_.codec == Codec::kRandomk)) {
      worker_adam_->MaskMomentum(block->table, rows, block->row_count, block->col_begin,
                                 block->width, decoded.data());
    }
  }
  block->values.clear();
  return Status::OK();
}

Status PsClient::Push(wire::Kind kind, uint64_t step, const std::vector<TableRowsRef>& tables) {
  const auto start = Clock::now();
  const bool updates = kind == wire::Kind::kPush && worker_adam_ != nullptr;
  std::vector<bool> on_device(partition_.n_tables(), false);
  bool any_on_device = false;
  for (const auto& ref : tables) {
    if (!ref.on_device) continue;
    if (device_source_ == nullptr || !device_tables_[ref.table] || kind != wire::Kind::kPush ||
        updates || ref.dense) {
      return Status::InvalidArgument(
          "table " + std::to_string(ref.table) +
          ": a push of values on the model's device needs a DevicePushSource, a gradient push, "
          "Adam on the shards and sparse rows");
    }
    on_device[ref.table] = any_on_device = true;
  }
  auto split = SplitAll(partition_, updates ? worker_adam_->ToUpdates(tables, pool_) : tables,
                        /*with_values=*/true);
  if (kind == wire::Kind::kPush && (codec_.codec != Codec::kNone || any_on_device))
    GRIDSYNC_RETURN_IF_ERROR(CompressAll(step, on_device, &split));
  counters_.encode_seconds += Seconds(start);
  const Status status = SendAndAwaitAcks(kind, step, std::move(split));
  counters_.push_seconds += Seconds(start);
  return status;
}

Status PsClient::PushSkipped(uint64_t step) {
  const auto start = Clock::now();
  const Status status = SendAndAwaitAcks(wire::Kind::kPush, step,
                                         std::vector<std::vector<wire::OutBlock>>(sockets_.size()),
                                         /*skip_step=*/true);
  counters_.push_seconds += Seconds(start);
  return status;
}

Status PsClient::SendAndAwaitAcks(wire::Kind kind, uint64_t step,
                                  std::vector<std::vector<wire::OutBlock>> split, bool skip_step) {
  const uint64_t request_id = next_request_++;
  for (uint32_t s = 0; s < sockets_.size(); ++s) {
    wire::OutHeader header;
    header.kind = kind;
    header.step = step;
    header.worker_rank = worker_rank_;
    header.request_id = request_id;
    header.shard = s;
    header.num_workers = num_workers_;
    header.job = job_;
    header.epoch = epoch_;
    header.skip_step = skip_step;
    if (kind == wire::Kind::kPush && worker_adam_ != nullptr) {
      header.push_values = wire::PushValues::kUpdates;
    }
    const auto encode_start = Clock::now();
    auto frames = wire::Encode(header, std::move(split[s]));
    counters_.encode_seconds += Seconds(encode_start);
    for (const auto& f : frames) counters_.bytes_pushed += f.size();
    GRIDSYNC_RETURN_IF_ERROR(
        wire::SendMultipart(sockets_[s], frames).WithContext("push to shard " + std::to_string(s)));
  }
  uint64_t version = UINT64_MAX;
  GRIDSYNC_RETURN_IF_ERROR(
      AwaitReplies(request_id, wire::Kind::kPushAck, [&](uint32_t, const wire::Message& ack) {
        version = std::min(version, ack.step);
        return Status::OK();
      }));
  last_ack_version_ = version == UINT64_MAX ? 0 : version;
  return Status::OK();
}

Status PsClient::SendPull(uint64_t min_version, const std::vector<TablePullRef>& tables, bool whole,
                          uint64_t for_step, bool evaluation) {
  const ScopedSeconds timed(&counters_.encode_seconds);
  pull_evaluation_ = evaluation;
  std::vector<TableRowsRef> refs;
  pull_dest_.assign(partition_.n_tables(), nullptr);
  if (delta_pulls_ && replica_.empty()) replica_.resize(partition_.n_tables());
  for (const auto& t : tables) {
    refs.push_back({t.table, t.dense, t.rows, t.row_count, nullptr});
    pull_dest_[t.table] = t.dest;
    if (delta_pulls_ && replica_[t.table].empty()) {
      const auto& info = partition_.table(t.table);
      replica_[t.table].assign(t.dest, t.dest + info.rows * info.width);
    }
  }
  auto split = SplitAll(partition_, refs, /*with_values=*/false);
  pull_request_ = next_request_++;
  for (uint32_t s = 0; s < sockets_.size(); ++s) {
    // Keep what was asked: the reply carries values only, in request order.
    pull_blocks_[s].clear();
    for (const auto& b : split[s]) {
      wire::OutBlock copy;
      copy.table = b.table;
      copy.dense = b.dense;
      copy.row_begin = b.row_begin;
      copy.col_begin = b.col_begin;
      copy.width = b.width;
      copy.row_count = b.row_count;
      copy.rows = b.rows;
      pull_blocks_[s].push_back(std::move(copy));
    }
    wire::OutHeader header;
    header.kind = wire::Kind::kPull;
    header.worker_rank = worker_rank_;
    header.request_id = pull_request_;
    header.shard = s;
    header.min_version = min_version;
    header.step = for_step;
    header.num_workers = num_workers_;
    header.job = job_;
    header.epoch = epoch_;
    header.whole_values = whole;
    header.evaluation = evaluation;
    auto frames = wire::Encode(header, std::move(split[s]));
    for (const auto& f : frames) counters_.bytes_pulled += f.size();
    GRIDSYNC_RETURN_IF_ERROR(wire::SendMultipart(sockets_[s], frames)
                                 .WithContext("pull from shard " + std::to_string(s)));
  }
  return Status::OK();
}

uint64_t PsClient::RequestIdOf(const std::vector<zmq::message_t>& frames) const {
  return wire::PeekRequestId(frames, limits_);
}

Result<uint64_t> PsClient::ReceivePull() {
  const auto start = Clock::now();
  uint64_t version = UINT64_MAX;
  const uint64_t request = pull_request_;
  Status status =
      AwaitReplies(request, wire::Kind::kPullReply, [&](uint32_t s, const wire::Message& m) {
        const auto& asked = pull_blocks_[s];
        if (m.blocks.size() != asked.size()) {
          return Status::Corruption("shard " + std::to_string(s) + " answered " +
                                    std::to_string(m.blocks.size()) + " blocks for " +
                                    std::to_string(asked.size()) + " requested");
        }
        for (size_t i = 0; i < asked.size(); ++i) {
          const auto& want = asked[i];
          const auto& got = m.blocks[i];
          if (got.table != want.table || got.row_count != want.row_count ||
              got.width != want.width || got.col_begin != want.col_begin) {
            return Status::Corruption("shard " + std::to_string(s) + " answered block " +
                                      std::to_string(i) + " with a different shape than requested");
          }
          float* dest = pull_dest_[want.table];
          const uint32_t width = partition_.table(want.table).width;
          const float* values = got.values.data();
          // An evaluation's whole values go to a copy of the model and leave
          // the replica (what training holds) alone, as the shards do.
          float* replica =
              delta_pulls_ && !pull_evaluation_ ? replica_[want.table].data() : nullptr;
          std::vector<float> decoded;
          if (got.compressed()) {
            if (replica == nullptr) {
              return Status::Corruption("shard " + std::to_string(s) +
                                        " sent an encoded pull reply, but this worker does not "
                                        "use delta pulls (compression.pull must match)");
            }
            decoded.resize(size_t{got.row_count} * got.width);
            GRIDSYNC_RETURN_IF_ERROR(
                cpu::Decode(got.codec, got.payload.data(), got.payload.size(), decoded.size(),
                            got.codec_seed, decoded.data())
                    .WithContext("pull reply from shard " + std::to_string(s)));
            values = decoded.data();
          }
          for (size_t r = 0; r < want.row_count; ++r) {
            // Sparse rows land scattered over the table: start loading the
            // destination (and replica) rows a few ahead.
            if (!want.dense && r + kPullPrefetch < want.row_count) {
              const size_t ahead = size_t{want.rows[r + kPullPrefetch]} * width + want.col_begin;
              __builtin_prefetch(dest + ahead, 1);
              if (replica != nullptr) __builtin_prefetch(replica + ahead, 1);
            }
            const uint32_t row =
                want.dense ? want.row_begin + static_cast<uint32_t>(r) : want.rows[r];
            const size_t at = size_t{row} * width + want.col_begin;
            const float* src = values + r * want.width;
            if (replica != nullptr) {
              // Encoded: a delta against the replica; whole: the values.
              float* rep = replica + at;
              if (got.compressed()) {
                for (uint32_t c = 0; c < want.width; ++c) rep[c] += src[c];
              } else {
                for (uint32_t c = 0; c < want.width; ++c) rep[c] = src[c];
              }
              src = rep;
            }
            // Rows are a few floats: a loop, not a call to memcpy per row.
            float* out = dest + at;
            for (uint32_t c = 0; c < want.width; ++c) out[c] = src[c];
          }
        }
        version = std::min(version, m.step);
        return Status::OK();
      });
  counters_.pull_wait_seconds += Seconds(start);
  pull_request_ = 0;
  if (!status.ok()) return status;
  return version;
}

Status PsClient::AppendState(std::string* out) {
  GRIDSYNC_RETURN_IF_ERROR(SyncFeedback());
  out->push_back(worker_adam_ ? '\1' : '\0');
  feedback_.AppendState(out);
  if (worker_adam_) worker_adam_->AppendState(out);
  return Status::OK();
}

Status PsClient::RestoreState(std::string_view data) {
  if (data.empty() || (data.front() != '\0' && data.front() != '\1'))
    return Status::Corruption("not a worker state (no optimizer flag)");
  const bool adam = data.front() == '\1';
  if (adam != (worker_adam_ != nullptr)) {
    return Status::InvalidArgument(std::string("the state was saved with Adam on the ") +
                                   (adam ? "worker" : "shards") + ", this run has it on the " +
                                   (worker_adam_ ? "worker" : "shards") +
                                   "; allowed: the same ps.optimizer and compression.codec");
  }
  data.remove_prefix(1);
  GRIDSYNC_RETURN_IF_ERROR(feedback_.RestoreState(&data));
  if (worker_adam_) GRIDSYNC_RETURN_IF_ERROR(worker_adam_->RestoreState(&data));
  if (!data.empty())
    return Status::Corruption(std::to_string(data.size()) + " bytes beyond the worker's state");
  if (device_source_ != nullptr) return LoadDeviceResiduals();
  return Status::OK();
}

}  // namespace gridsync
