// PsClient (ps_client.h): the sockets, waiting for replies, pulls.
//
// Thread safety: see ps_client.h.
#include "worker/ps_client.h"

#include <spdlog/spdlog.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <limits>
#include <map>
#include <type_traits>

#include "common/check.h"
#include "common/counter_rng.h"
#include "common/prefetch.h"
#include "common/row_width.h"
#include "common/tcp_backoff.h"
#include "worker/ps_client_internal.h"
#include "worker/worker_adam.h"

namespace gridsync {

using ps_internal::Clock;
using ps_internal::FeedbackKey;
using ps_internal::ScopedSeconds;
using ps_internal::Seconds;
using ps_internal::SplitAll;

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
    std::chrono::milliseconds timeout, wire::Limits limits, const wire::CurveSettings& curve,
    std::shared_ptr<zmq::context_t> context) {
  if (map.shards.size() != partition.shards()) {
    return Status::InvalidArgument("the cluster map lists " + std::to_string(map.shards.size()) +
                                   " shards, the partition expects " +
                                   std::to_string(partition.shards()));
  }
  std::unique_ptr<PsClient> client(
      new PsClient(partition, worker_rank, num_workers, timeout, limits));
  client->job_ = map.job;
  client->epoch_ = map.epoch;
  client->context_ = context ? std::move(context) : std::make_shared<zmq::context_t>(1);
  for (const auto& shard : map.shards) {
    try {
      zmq::socket_t socket(*client->context_, zmq::socket_type::dealer);
      socket.set(zmq::sockopt::linger, 0);
      socket.set(zmq::sockopt::maxmsgsize, static_cast<int64_t>(limits.max_frame_bytes));
      socket.set(zmq::sockopt::sndhwm, 0);
      socket.set(zmq::sockopt::rcvhwm, 0);
      socket.set(zmq::sockopt::ipv6, 1);  // a shard on an IPv6 address (see the shard's bind)
      // A DEALER with no connection up blocks its sends; after a shard
      // refused this worker's key (ZAP) none may ever come, and a hostile
      // probe's worker waited forever in zmq_msg_send. Sends wait as long
      // as replies do (SendToShard).
      socket.set(zmq::sockopt::sndtimeo, static_cast<int>(std::min<int64_t>(
                                             timeout.count(), std::numeric_limits<int>::max())));
      GRIDSYNC_RETURN_IF_ERROR(wire::ApplyCurveClient(socket, curve));
      // Without a watch (a context out of sockets: each takes two) the
      // client works as well; only its timeouts explain less.
      auto watch = wire::HandshakeWatch::Attach(*client->context_, socket);
      if (!watch.ok()) {
        spdlog::debug("shard {}: {}", shard.rank, watch.status().ToString());
        watch = std::unique_ptr<wire::HandshakeWatch>();
      }
      socket.connect(shard.endpoint);
      client->handshakes_.push_back(std::move(*watch));
      client->sockets_.push_back(std::move(socket));
      client->endpoints_.push_back(shard.endpoint);
    } catch (const zmq::error_t& e) {
      return Status::IOError("cannot connect to shard " + std::to_string(shard.rank) + " at " +
                             shard.endpoint + ": " + e.what());
    }
  }
  client->curve_ = curve.on;
  client->handshake_failure_logged_.assign(client->sockets_.size(), false);
  client->pull_blocks_.resize(client->sockets_.size());
  client->stashed_.resize(client->sockets_.size());
  client->stashed_bytes_.resize(client->sockets_.size());
  client->pull_cursor_.resize(client->sockets_.size());
  client->pull_pending_.resize(client->sockets_.size());
  client->pull_pending_at_.resize(client->sockets_.size());
  return client;
}

Status PsClient::SendToShard(uint32_t s, std::vector<zmq::message_t>& frames, const char* what) {
  const auto start = Clock::now();
  Status sent = wire::SendMultipart(sockets_[s], frames);
  if (sent.ok()) return sent;
  if (Seconds(start) * 1000.0 < 0.9 * static_cast<double>(timeout_.count()))
    return sent.WithContext(std::string(what) + " to shard " + std::to_string(s));
  // The send timed out: no connection to the shard was up all along.
  const std::string why = DescribeSilentShard(s);
  return Status::Timeout("cannot hand a " + std::string(what) + " to shard " + std::to_string(s) +
                         " (" + endpoints_[s] + ") within " +
                         std::to_string(timeout_.count() / 1000.0).substr(0, 5) + " s (worker " +
                         std::to_string(worker_rank_) + "): no connection to it is up" +
                         (why.empty() ? "" : "; " + why));
}

void PsClient::WatchHandshakes() {
  for (uint32_t s = 0; s < handshakes_.size(); ++s) {
    if (handshakes_[s] == nullptr) continue;
    const bool failed = handshakes_[s]->Poll();
    // Each new connection's retransmission timer capped, as the shards cap
    // theirs (common/tcp_backoff.h): a link that flapped left this
    // worker's pushes on TCP's backed-off timer (6.5 s) after the link was
    // back, and its wait for the acks ran out (a hostile probe). A
    // descriptor reused meanwhile is another TCP socket of this process,
    // which the cap leaves correct.
    for (const int fd : handshakes_[s]->TakeConnected()) {
      if (const std::string why = CapRetransmitBackoff(fd, RetransmitCapFor(timeout_));
          !why.empty())
        spdlog::debug("worker {}: a connection to shard {} keeps TCP's backoff: {}", worker_rank_,
                      s, why);
    }
    if (!failed || handshake_failure_logged_[s]) continue;
    const std::string why = DescribeSilentShard(s);
    if (why.empty()) continue;
    // Once per shard: the reconnects repeat the failure every 100 ms.
    handshake_failure_logged_[s] = true;
    spdlog::warn("worker {}: {}", worker_rank_, why);
  }
}

std::string PsClient::DescribeSilentShard(uint32_t s) {
  if (handshakes_[s] == nullptr) return "";
  handshakes_[s]->Poll();
  return handshakes_[s]->Explain("shard " + std::to_string(s) + " (" + endpoints_[s] + ")",
                                 curve_ ? "security.keys_dir's shard.pub" : "");
}

Status PsClient::AwaitReplies(uint64_t request_id, wire::Kind expected,
                              const ReplyHandler& on_reply) {
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
    bool more = false;
    GRIDSYNC_RETURN_IF_ERROR(on_reply(s, *message, &more));
    *answered = !more;
    return Status::OK();
  };
  // Pull replies that arrived while waiting for something else, in order.
  for (uint32_t s = 0; s < sockets_.size(); ++s) {
    if (request_id != pull_request_) continue;
    std::vector<std::vector<zmq::message_t>> stashed;
    stashed.swap(stashed_[s]);
    stashed_bytes_[s] = 0;
    for (const auto& frames : stashed) {
      bool answered = false;
      GRIDSYNC_RETURN_IF_ERROR(handle(s, frames, &answered));
      if (answered) {
        done[s] = true;
        --remaining;
        break;  // the parts after the last are no reply to anything
      }
    }
  }
  // A shard answers a pull it held for `timeout` with an error naming the
  // workers whose pushes are missing; waiting exactly as long, the worker
  // gave up first and blamed the shards (a hostile probe: worker 1 frozen,
  // worker 0 reported "no pullReply from shards [0, 1]"). The grace lets
  // the shard's answer arrive.
  const auto waited = timeout_ + std::clamp<std::chrono::milliseconds>(
                                     timeout_ / 4, std::chrono::milliseconds(1000),
                                     std::chrono::milliseconds(5000));
  auto deadline = Clock::now() + waited;
  bool waited_again = false;  // SetStallCheck's one more wait
  constexpr auto kCheckEvery = std::chrono::milliseconds(1000);
  auto next_check = Clock::now() + kCheckEvery;
  while (remaining > 0) {
    if (Clock::now() >= next_check) {
      WatchHandshakes();
      if (wait_check_) GRIDSYNC_RETURN_IF_ERROR(wait_check_());
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
    if (left.count() <= 0 && !waited_again && stall_check_ &&
        std::all_of(which.begin(), which.end(), [&](uint32_t s) { return stall_check_(s); })) {
      waited_again = true;
      deadline = Clock::now() + waited;
      spdlog::warn(
          "worker {}: no {} from {} shard(s) within {:.1f} s, but each is still a member of the "
          "job, as it was: waiting once more, up to {:.1f} s (a network that stalled resends on "
          "TCP's backed-off timer)",
          worker_rank_, wire::KindName(expected), which.size(), waited.count() / 1000.0,
          waited.count() / 1000.0);
      continue;
    }
    if (left.count() <= 0) {
      std::string missing, why;
      for (uint32_t s : which) {
        missing += (missing.empty() ? "" : ", ") + std::to_string(s) + " (" + endpoints_[s] + ")";
        const std::string explained = DescribeSilentShard(s);
        if (!explained.empty()) why += "; " + explained;
      }
      return Status::Timeout("no " + std::string(wire::KindName(expected)) + " from shards [" +
                             missing + "] within " +
                             std::to_string(waited.count() / 1000.0).substr(0, 5) + " s" +
                             (waited_again ? " twice (still members of the job)" : "") +
                             " (worker " + std::to_string(worker_rank_) + ")" + why);
    }
    try {
      zmq::poll(items.data(), items.size(), std::min(left, kCheckEvery));
    } catch (const zmq::error_t& e) {
      // A signal is no failure: wait again for what is left of the time
      // (pull_reply_fuzz found a pull refused this way by libFuzzer's timer).
      if (e.num() == EINTR) continue;
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
        uint64_t bytes = 0;
        for (const auto& f : *frames) bytes += f.size();
        stashed_bytes_[s] += bytes;
        uint64_t asked = 0;  // the values the pull asked this shard for
        for (const auto& b : pull_blocks_[s]) asked += uint64_t{b.row_count} * b.width * 4;
        if (stashed_bytes_[s] > kMaxStashFactor * asked + kStashSlackBytes) {
          return Status::Corruption(
              "shard " + std::to_string(s) + " sent " + std::to_string(stashed_bytes_[s]) +
              " bytes of replies to pull " + std::to_string(pull_request_) +
              " before it was read; " + "allowed: at most " +
              std::to_string(kMaxStashFactor * asked + kStashSlackBytes) + " (the pull asked for " +
              std::to_string(asked) + " bytes of values)");
        }
        stashed_[s].push_back(std::move(*frames));
        continue;
      }
      bool answered = false;
      GRIDSYNC_RETURN_IF_ERROR(handle(s, *frames, &answered));
      if (!answered) continue;  // a late reply to an abandoned request
      done[s] = true;
      --remaining;
    }
  }
  // At the end of every wait, not only a second into one: a reply came over
  // a connection whose event was queued before it, so a connection made (or
  // made again) is capped before the next wait (the first wait may begin
  // before its connection is made).
  WatchHandshakes();
  return Status::OK();
}

void PsClient::FollowEpoch(uint32_t epoch) {
  epoch_ = epoch;
  pull_request_ = 0;
  pull_evaluation_ = false;
  for (auto& stashed : stashed_) stashed.clear();
  std::fill(stashed_bytes_.begin(), stashed_bytes_.end(), 0);
  for (auto& blocks : pull_blocks_) blocks.clear();
  for (auto& at : pull_pending_at_) at.clear();
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

Status PsClient::PushSkipped(uint64_t step) {
  const auto start = Clock::now();
  const Status status = SendAndAwaitAcks(wire::Kind::kPush, step,
                                         std::vector<std::vector<wire::OutBlock>>(sockets_.size()),
                                         /*skip_step=*/true);
  counters_.push_seconds += Seconds(start);
  return status;
}

Status PsClient::SendAndAwaitAcks(wire::Kind kind, uint64_t step,
                                  std::vector<std::vector<wire::OutBlock>> split, bool skip_step,
                                  const std::function<void()>& after_send) {
  const uint64_t request_id = next_request_++;
  Status sent = Status::OK();
  for (uint32_t s = 0; s < sockets_.size() && sent.ok(); ++s) {
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
    sent = SendToShard(s, frames, "push");
  }
  if (after_send) after_send();
  GRIDSYNC_RETURN_IF_ERROR(sent);
  uint64_t version = UINT64_MAX;
  GRIDSYNC_RETURN_IF_ERROR(AwaitReplies(request_id, wire::Kind::kPushAck,
                                        [&](uint32_t, const wire::Message& ack, bool*) {
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
    // The request is written from the kept blocks (their rows go as
    // deltaVarint, so no row is copied for it).
    pull_blocks_[s] = std::move(split[s]);
    pull_cursor_[s] = {};
    pull_pending_at_[s].clear();  // GatherPendingUpdates fills it for this pull
    stashed_[s].clear();
    stashed_bytes_[s] = 0;
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
    auto frames = wire::EncodeCopy(header, pull_blocks_[s]);
    for (const auto& f : frames) counters_.bytes_pulled += f.size();
    GRIDSYNC_RETURN_IF_ERROR(SendToShard(s, frames, "pull"));
  }
  return Status::OK();
}

uint64_t PsClient::RequestIdOf(const std::vector<zmq::message_t>& frames) const {
  return wire::PeekRequestId(frames, limits_);
}

namespace {
// Pulled rows this far ahead have their destination prefetched.
constexpr size_t kPullPrefetch = 16;

// Rows [first, first + count) of a pulled block into the table `dest` (rows
// x width; the block holds columns col_begin.. of each row). With a replica
// (delta pulls) the values are a delta against it when `encoded`, else the
// whole values, and the replica's row is what lands in the table. With
// `pending` (count x the block's width, PsClient::GatherPendingUpdates) each
// row lands plus its pending update; the replica keeps what the shards sent.
void CopyPulledRows(const wire::OutBlock& want, uint32_t first, uint32_t count,
                    uint32_t table_width, const float* values, bool encoded, float* replica,
                    const float* pending, float* dest) {
  WithRowWidth(want.width, [&](auto constant) {
    const uint32_t cols = RowWidth(constant, want.width);
    if (!want.dense && replica == nullptr) {
      // The common case (sparse rows, whole values) as its own loop: the
      // general one's per-row tests cost more than the copy of a row.
      const uint32_t* rows = want.rows.data() + first;
      const size_t n = count;
      auto copy = [&](auto with_pending) {
        for (size_t r = 0; r < n; ++r) {
          if (r + kPullPrefetch < n) {
            PrefetchRow(dest + size_t{rows[r + kPullPrefetch]} * table_width + want.col_begin);
          }
          const float* src = values + r * cols;
          float* out = dest + size_t{rows[r]} * table_width + want.col_begin;
          if constexpr (with_pending) {
            const float* add = pending + r * cols;
            for (uint32_t c = 0; c < cols; ++c) out[c] = src[c] + add[c];
          } else {
            for (uint32_t c = 0; c < cols; ++c) out[c] = src[c];
          }
        }
      };
      if (pending != nullptr) {
        copy(std::true_type{});
      } else {
        copy(std::false_type{});
      }
      return;
    }
    for (size_t r = 0; r < count; ++r) {
      const size_t k = first + r;  // the row's index in the block
      // Sparse rows land scattered over the table: start loading the
      // destination (and replica) rows a few ahead.
      if (!want.dense && r + kPullPrefetch < count) {
        const size_t ahead = size_t{want.rows[k + kPullPrefetch]} * table_width + want.col_begin;
        PrefetchRow(dest + ahead);
        if (replica != nullptr) PrefetchRow(replica + ahead);
      }
      const uint32_t row = want.dense ? want.row_begin + static_cast<uint32_t>(k) : want.rows[k];
      const size_t at = size_t{row} * table_width + want.col_begin;
      const float* src = values + r * cols;
      if (replica != nullptr) {
        float* rep = replica + at;
        if (encoded) {
          for (uint32_t c = 0; c < cols; ++c) rep[c] += src[c];
        } else {
          for (uint32_t c = 0; c < cols; ++c) rep[c] = src[c];
        }
        src = rep;
      }
      // Rows are a few floats: a loop, not a call to memcpy per row.
      float* out = dest + at;
      if (pending != nullptr) {
        const float* add = pending + r * cols;
        for (uint32_t c = 0; c < cols; ++c) out[c] = src[c] + add[c];
      } else {
        for (uint32_t c = 0; c < cols; ++c) out[c] = src[c];
      }
    }
  });
}

}  // namespace

Status PsClient::TakePullPart(uint32_t s, const wire::Message& m, bool* more) {
  const auto& asked = pull_blocks_[s];
  PartCursor& at = pull_cursor_[s];
  // Named only when something is refused: no string built per part.
  const auto shard = [s] { return "shard " + std::to_string(s); };
  if (m.part_row != at.flat) {
    return Status::Corruption(shard() + " sent a part of its pull reply from row " +
                              std::to_string(m.part_row) + "; allowed: row " +
                              std::to_string(at.flat) + ", where the parts before it end");
  }
  for (size_t i = 0; i < m.blocks.size(); ++i) {
    const auto& got = m.blocks[i];
    if (at.block == asked.size()) {
      return Status::Corruption(shard() + " answered more blocks than the " +
                                std::to_string(asked.size()) + " requested");
    }
    const auto& want = asked[at.block];
    const uint32_t left = want.row_count - at.row;
    // A part continues the request's blocks in order: each of its blocks
    // holds rows of the next requested block, none past its end, and only
    // a requested block of no rows is answered by a block of none.
    if (got.table != want.table || got.width != want.width || got.col_begin != want.col_begin ||
        got.row_count > left || (got.row_count == 0 && left != 0)) {
      return Status::Corruption(
          shard() + " answered block " + std::to_string(at.block) + " (rows " +
          std::to_string(at.row) + ".." + std::to_string(want.row_count) + " of table " +
          std::to_string(want.table) + ", " + std::to_string(want.width) + " columns from " +
          std::to_string(want.col_begin) + ") with " + std::to_string(got.row_count) +
          " rows of table " + std::to_string(got.table) + ", " + std::to_string(got.width) +
          " columns from " + std::to_string(got.col_begin) +
          "; allowed: the requested block's next 1.." + std::to_string(left) + " rows");
    }
    float* dest = pull_dest_[want.table];
    const uint32_t width = partition_.table(want.table).width;
    const float* values = got.values.data();
    // An evaluation's whole values go to a copy of the model and leave
    // the replica (what training holds) alone, as the shards do.
    float* replica = delta_pulls_ && !pull_evaluation_ ? replica_[want.table].data() : nullptr;
    std::vector<float> decoded;
    if (got.compressed()) {
      if (replica == nullptr) {
        return Status::Corruption(shard() +
                                  " sent an encoded pull reply, but this worker does not "
                                  "use delta pulls (compression.pull must match)");
      }
      decoded.resize(size_t{got.row_count} * got.width);
      GRIDSYNC_RETURN_IF_ERROR(cpu::Decode(got.codec, got.payload.data(), got.payload.size(),
                                           decoded.size(), got.codec_seed, decoded.data())
                                   .WithContext("pull reply from " + shard()));
      // A codec's scale fields can encode any float: bound the deltas
      // as the plain values are bounded at decode.
      GRIDSYNC_RETURN_IF_ERROR(wire::CheckValueBounds(decoded, limits_, "pull reply delta")
                                   .WithContext("pull reply from " + shard()));
      values = decoded.data();
    }
    const float* pending = nullptr;
    if (!pull_pending_at_[s].empty() && pull_pending_at_[s][at.block].at != kNoPending) {
      const PendingBlock& p = pull_pending_at_[s][at.block];
      float* gathered = pull_pending_[s].data() + p.at + size_t{at.row} * want.width;
      const uint64_t key = FeedbackKey(want.table, want.col_begin);
      if (p.version == feedback_.VersionOf(key)) {
        if (p.gathered) pending = gathered;
      } else if (feedback_.GatherResiduals(key, want.dense ? nullptr : want.rows.data() + at.row,
                                           want.row_begin + at.row, got.row_count, want.width,
                                           gathered)) {
        // Residuals stored since GatherPendingUpdates: these rows get what
        // the table holds now (the next push reads the table: the versions
        // differ).
        pending = gathered;
      }
    }
    CopyPulledRows(want, at.row, got.row_count, width, values, got.compressed(), replica, pending,
                   dest);
    at.row += got.row_count;
    at.flat += got.row_count;
    if (at.row == want.row_count) {
      ++at.block;
      at.row = 0;
    }
  }
  const bool all = at.block == asked.size();
  if (m.more_parts == all) {
    return Status::Corruption(
        shard() + (all ? " announced more parts of its pull reply after its last requested row"
                       : " ended its pull reply at row " + std::to_string(at.flat) + " of block " +
                             std::to_string(at.block) + " of " + std::to_string(asked.size()) +
                             "; allowed: every requested row"));
  }
  *more = m.more_parts;
  return Status::OK();
}

Result<uint64_t> PsClient::ReceivePull() {
  const auto start = Clock::now();
  uint64_t version = UINT64_MAX;
  const uint64_t request = pull_request_;
  Status status = AwaitReplies(request, wire::Kind::kPullReply,
                               [&](uint32_t s, const wire::Message& m, bool* more) {
                                 GRIDSYNC_RETURN_IF_ERROR(TakePullPart(s, m, more));
                                 version = std::min(version, m.step);
                                 return Status::OK();
                               });
  counters_.pull_wait_seconds += Seconds(start);
  pull_request_ = 0;
  if (!status.ok()) return status;
  return version;
}

}  // namespace gridsync
