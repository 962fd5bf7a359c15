// The parameter-server shard's engine (ps_shard_engine.h): pulls, answered
// at once or held until the shard reaches the version they ask for, within
// the timeout (or twice it, while the missing pushers are still members of
// the job: ExpireWaitingPulls); their replies gathered in parts, and parked
// while a peer's unsent replies are over their bound.
//
// Thread safety: the I/O thread only.
#include <spdlog/fmt/fmt.h>

#include "server/ps_shard_engine.h"

namespace gridsync {
namespace ps_shard_engine {
namespace {

// Pulls one connection may have waiting for a later version: a worker
// waits with one at a time; a few more allow for a client that gave up on
// one and asked again before it expired.
constexpr size_t kMaxWaitingPullsPerPeer = 4;

}  // namespace

void PsShardImpl::HandlePull(std::unique_ptr<Request> request) {
  const wire::Message& m = request->message;
  if (store_->replicas_enabled() &&
      (m.worker_rank >= options_.workers || m.num_workers != options_.workers)) {
    ReplyError(*request,
               Status::InvalidArgument(
                   "pull from worker " + std::to_string(m.worker_rank) + " of " +
                   std::to_string(m.num_workers) + "; allowed: workers 0.." +
                   std::to_string(options_.workers - 1) + " of " +
                   std::to_string(options_.workers) + " (delta pulls keep a replica per worker)"));
    return;
  }
  {
    std::lock_guard<std::mutex> lock(stats_mu_);
    ++stats_.pulls;
  }
  const uint64_t min_version = request->message.min_version;
  if (options_.consistency == Consistency::kAsync || min_version <= applied_) {
    if (!ReplyPull(*request)) ParkForRoom(std::move(request));
    return;
  }
  // No worker asks beyond the next version: under bsp a worker pulls for
  // step s + 1 once its push of step s is in, and that version is the
  // next; under ssp it asks s + 1 - staleness after a push of step s that
  // was at most applied + staleness. A pull for a later one would only be
  // held, with its rows, until the timeout.
  if (min_version > applied_ + 1) {
    ReplyError(*request,
               Status::InvalidArgument("pull for version " + std::to_string(min_version) +
                                       " while shard " + std::to_string(options_.shard) +
                                       " is at version " + std::to_string(applied_) +
                                       "; allowed: at most " + std::to_string(applied_ + 1) +
                                       " (the next; no worker reads further ahead)"));
    return;
  }
  // A worker waits with one pull at a time; a peer flooding pulls would
  // otherwise grow this list, and the rows it holds, until the timeouts.
  const size_t max_waiting = MaxWaitingPulls();
  const auto [its_own, held] = LoadOf(waiting_, *request);
  // One peer may not take the room of all: a peer that sent 4096 pulls for
  // the next version had every worker's next pull refused, and the run
  // ended (a review).
  if (its_own >= kMaxWaitingPullsPerPeer) {
    ReplyError(*request,
               Status::IOError("shard " + std::to_string(options_.shard) + " holds " +
                               std::to_string(its_own) +
                               " pulls of this connection waiting for later versions already; "
                               "allowed: at most " +
                               std::to_string(kMaxWaitingPullsPerPeer) +
                               " a connection (a worker waits with one)"));
    return;
  }
  if (waiting_.size() >= max_waiting || held > options_.max_waiting_pull_bytes) {
    ReplyError(*request,
               Status::IOError("shard " + std::to_string(options_.shard) + " holds " +
                               std::to_string(waiting_.size()) +
                               " pulls waiting for later versions already, and with this one " +
                               std::to_string(held) + " bytes of them; allowed: at most " +
                               std::to_string(max_waiting) + " pulls and " +
                               std::to_string(options_.max_waiting_pull_bytes) +
                               " bytes (a worker waits with one)"));
    return;
  }
  waiting_.push_back({std::move(request), Clock::now() + options_.timeout});
}

uint64_t PsShardImpl::HeldBytes(const Request& request) {
  // Its frames, and the row ids decoded from them (an upper bound: raw ids
  // are read in place).
  uint64_t bytes = 0;
  for (const auto& frame : request.frames) bytes += frame.size();
  for (const auto& block : request.message.blocks) bytes += block.rows.size() * sizeof(uint32_t);
  return bytes;
}

bool PsShardImpl::ReplyPull(Request& request) {
  // Pulls are also answered while another request is handled (a push that
  // completes a version serves the pulls waiting for it): a failure here
  // is this pull's own error reply, never its trigger's, and the caller
  // still drops it from the waiting list.
  try {
    return ReplyPullUnguarded(request);
  } catch (const std::bad_alloc&) {
    ReplyError(request, Status::Internal("pull refused: out of memory building its reply (it "
                                         "asked for more than this shard can allocate)"));
    return true;
  }
}

uint64_t PsShardImpl::ReplyBytes(const wire::Message& pull) {
  uint64_t bytes = 0;
  for (const auto& block : pull.blocks) bytes += uint64_t{block.row_count} * block.width * 4;
  return bytes;
}

PsShardImpl::Load PsShardImpl::LoadOf(const std::vector<Waiting>& list,
                                      const Request& request) const {
  // Summed here rather than kept: pulls wait rarely and briefly, and the
  // count bound comes first, so a flood costs a scan of at most
  // MaxWaitingPulls.
  Load load{0, HeldBytes(request)};
  if (list.size() >= MaxWaitingPulls()) return load;
  for (const Waiting& w : list) {
    load.its_own += w.request->identity == request.identity;
    load.held += HeldBytes(*w.request);
  }
  return load;
}

size_t PsShardImpl::MaxWaitingPulls() const {
  return std::max<size_t>(4096, size_t{4} * options_.workers);
}

void PsShardImpl::ParkForRoom(std::unique_ptr<Request> request) {
  // Bounded as the pulls waiting for a version are: while peers are being
  // shut down for room, a reader streaming pulls had each parked for
  // kShedWait, its rows held, without bound (a review). A worker parks one.
  const auto [its_own, held] = LoadOf(awaiting_room_, *request);
  if (its_own >= kMaxWaitingPullsPerPeer || awaiting_room_.size() >= MaxWaitingPulls() ||
      (!awaiting_room_.empty() && held > options_.max_waiting_pull_bytes)) {
    ReplyError(
        *request,
        Status::IOError("shard " + std::to_string(options_.shard) + " holds " +
                        std::to_string(awaiting_room_.size()) + " pulls (" +
                        std::to_string(its_own) + " of this connection, " + std::to_string(held) +
                        " bytes with this one) waiting for room among replies peers have not read; "
                        "allowed: at most " +
                        std::to_string(kMaxWaitingPullsPerPeer) + " a connection, " +
                        std::to_string(MaxWaitingPulls()) + " and " +
                        std::to_string(options_.max_waiting_pull_bytes) +
                        " bytes in all (retry once the replies are read)"));
    return;
  }
  awaiting_room_.push_back({std::move(request), Clock::now() + ReplyBacklog::kShedWait});
}

void PsShardImpl::RetryPullsAwaitingRoom() {
  if (awaiting_room_.empty()) return;
  // Taken out first: a pull that still does not fit is parked again (with
  // its first deadline), and the list is not walked while it changes.
  std::vector<Waiting> parked = std::move(awaiting_room_);
  awaiting_room_.clear();
  const auto now = Clock::now();
  for (Waiting& w : parked) {
    if (ReplyPull(*w.request)) continue;
    if (now >= w.deadline) {
      ReplyError(*w.request, backlog_.RoomNeverFreed(ReplyBytes(w.request->message)));
      continue;
    }
    awaiting_room_.push_back(std::move(w));
  }
}

bool PsShardImpl::ReplyPullUnguarded(Request& request) {
  constexpr size_t kChunkRows = 16384;
  const wire::Message& m = request.message;
  const uint64_t reply_bytes = ReplyBytes(m);
  // Bounded per peer and in all (server/reply_backlog.h).
  auto admitted = backlog_.Admit(request.identity, request.fd, reply_bytes);
  if (!admitted.ok()) {
    ReplyError(request, admitted.status());
    return true;
  }
  if (admitted->wait) return false;
  std::shared_ptr<wire::UnsentBytes> unsent = std::move(admitted->unsent);
  const bool deltas = store_->replicas_enabled();
  // Delta pulls: which blocks go encoded (as params - replica) and which
  // whole; decided per block, the same way on every call.
  std::vector<char> encoded(m.blocks.size(), 0);
  bool any_encoded = false;
  for (size_t i = 0; i < m.blocks.size() && deltas && !m.whole_values; ++i) {
    encoded[i] = uint64_t{m.blocks[i].row_count} * m.blocks[i].width * sizeof(float) >=
                 options_.pull_min_bytes;
    any_encoded = any_encoded || encoded[i];
  }
  // Stale reads look ahead (server/stale_reads.h).
  const float ahead = stale_reads_.OnPull(m, clock_);
  const uint64_t part_bytes =
      any_encoded || options_.reply_part_bytes == 0 ? UINT64_MAX : options_.reply_part_bytes;
  // Every part is gathered here, before any other request is served, so
  // the parts together are one version of the rows, as a whole reply is.
  uint64_t flat = 0;  // rows of the request before the part's first
  size_t block = 0;   // the request's block the part starts in ...
  uint32_t row = 0;   // ... and its row there
  uint64_t parts = 0;
  do {
    const auto part_start = Clock::now();
    struct Slice {
      size_t block;
      uint32_t begin, end;
    };
    std::vector<Slice> slices;
    uint64_t bytes = 0;
    const uint64_t part_first = flat;
    // Whole blocks while they fit, then the rows of the next that do (at
    // least one row a part); blocks of no rows ride along where they are.
    while (block < m.blocks.size() && (bytes < part_bytes || slices.empty())) {
      const wire::Block& in = m.blocks[block];
      if (in.row_count == 0) {
        slices.push_back({block, 0, 0});
        ++block;
        continue;
      }
      const uint64_t row_bytes = uint64_t{in.width} * sizeof(float);
      const uint64_t room = bytes < part_bytes ? part_bytes - bytes : 0;
      const uint32_t left = in.row_count - row;  // >= 1
      const uint32_t fit = static_cast<uint32_t>(
          std::clamp<uint64_t>(row_bytes == 0 ? left : room / row_bytes, 1, left));
      const uint32_t end = row + fit;
      slices.push_back({block, row, end});
      bytes += uint64_t{end - row} * row_bytes;
      flat += end - row;
      row = end;
      if (row < in.row_count) break;  // the block was cut: the part is full
      ++block;
      row = 0;
    }
    // Blocks of no rows right after the part's end ride along too: the
    // last part then ends exactly at the request's end.
    while (block < m.blocks.size() && m.blocks[block].row_count == 0) {
      slices.push_back({block, 0, 0});
      ++block;
    }
    std::vector<wire::OutBlock> blocks(slices.size());
    struct Piece {
      size_t slice, begin, end;  // rows of the slice's request block
    };
    std::vector<Piece> pieces;
    for (size_t k = 0; k < slices.size(); ++k) {
      const Slice& sl = slices[k];
      const wire::Block& in = m.blocks[sl.block];
      wire::OutBlock& out = blocks[k];
      out.table = in.table;
      out.dense = in.dense;
      out.row_begin = in.row_begin + sl.begin;
      out.col_begin = in.col_begin;
      out.width = in.width;
      out.row_count = sl.end - sl.begin;
      out.values.resize(size_t{out.row_count} * in.width);
      for (size_t b = sl.begin; b < sl.end; b += kChunkRows) {
        pieces.push_back({k, b, std::min<size_t>(sl.end, b + kChunkRows)});
      }
    }
    pool_.ParallelFor(pieces.size(), [&](size_t k) {
      const Piece& p = pieces[k];
      const Slice& sl = slices[p.slice];
      const wire::Block& in = m.blocks[sl.block];
      float* out = blocks[p.slice].values.data() + (p.begin - sl.begin) * in.width;
      if (encoded[sl.block]) {
        store_->GatherDelta(in, m.worker_rank, p.begin, p.end, out);
      } else if (ahead > 0) {
        store_->GatherAhead(in, p.begin, p.end, ahead, out);
        if (deltas) store_->AdvanceReplica(in, m.worker_rank, p.begin, p.end, out, /*whole=*/true);
      } else {
        store_->Gather(in, p.begin, p.end, out);
        // An evaluation's values go to a copy of the model, not the
        // worker's replica.
        if (deltas && !m.evaluation)
          store_->AdvanceReplica(in, m.worker_rank, p.begin, p.end, out, /*whole=*/true);
      }
    });
    if (any_encoded) {
      // One part (see part_bytes): slice i is the request's block i, whole.
      pool_.ParallelFor(blocks.size(), [&](size_t i) {
        if (!encoded[i]) return;
        wire::OutBlock& out = blocks[i];
        out.codec = options_.pull_codec;
        out.codec_seed = m.request_id * 0x9E3779B97F4A7C15ull + i;
        out.payload.resize(EncodedSize(out.codec, out.values.size()));
        cpu::Encode(out.codec, out.values.data(), out.values.size(), out.codec_seed,
                    out.payload.data());
        // What the worker will add to its replica, added here too.
        const Status decoded = cpu::Decode(out.codec, out.payload.data(), out.payload.size(),
                                           out.values.size(), out.codec_seed, out.values.data());
        GRIDSYNC_CHECK(decoded.ok());  // our own encoding
        store_->AdvanceReplica(m.blocks[i], m.worker_rank, 0, out.row_count, out.values.data(),
                               /*whole=*/false);
        out.values.clear();
      });
    }
    wire::OutHeader header;
    header.kind = wire::Kind::kPullReply;
    header.step = applied_;
    header.request_id = m.request_id;
    header.shard = options_.shard;
    header.part_row = part_first;
    header.more_parts = block < m.blocks.size();
    AddStage(kGather, part_start);
    const auto encode_start = Clock::now();
    auto frames = wire::Encode(header, std::move(blocks), unsent);
    AddStage(kEncode, encode_start);
    Send(request.identity, std::move(frames));
    ++parts;
  } while (block < m.blocks.size());
  if (parts > 1) {
    pulls_in_parts_.fetch_add(1, std::memory_order_relaxed);
    reply_parts_.fetch_add(parts, std::memory_order_relaxed);
  }
  return true;
}

void PsShardImpl::ServeWaitingPulls() {
  for (auto it = waiting_.begin(); it != waiting_.end();) {
    if (it->request->message.min_version <= applied_) {
      if (!ReplyPull(*it->request)) ParkForRoom(std::move(it->request));
      it = waiting_.erase(it);
    } else {
      ++it;
    }
  }
}

std::vector<uint32_t> PsShardImpl::MissingPushers() const {
  std::vector<uint32_t> missing;
  const auto slot = pending_.find(applied_);
  for (uint32_t w = 0; w < options_.workers; ++w) {
    const bool in = options_.consistency == Consistency::kBsp
                        ? slot != pending_.end() && slot->second.count(w) != 0
                        : clock_[w] > applied_;
    if (!in) missing.push_back(w);
  }
  return missing;
}

bool PsShardImpl::StillMembers(const std::vector<uint32_t>& missing, Clock::time_point since) {
  std::lock_guard<std::mutex> lock(coordinator_state_mu_);
  if (!coordinator_state_ || coordinator_state_at_ < since) return false;
  const JobState& state = *coordinator_state_;
  if (state.job != job_gate_.job() || state.epoch != job_gate_.epoch()) return false;
  return std::all_of(missing.begin(), missing.end(), [&](uint32_t w) {
    return std::binary_search(state.workers.begin(), state.workers.end(), w);
  });
}

std::string PsShardImpl::CoordinatorSilence(Clock::time_point since) {
  std::lock_guard<std::mutex> lock(coordinator_state_mu_);
  // Never answered: a shard outside a cluster (tests), or one just started.
  if (!coordinator_state_ || coordinator_state_at_ >= since) return "";
  const double seconds = std::chrono::duration<double>(Clock::now() - since).count();
  return fmt::format(
      "; the coordinator answered none of this shard's calls made in the last {:.1f} s, so the "
      "missing workers may be waiting on the coordinator too",
      seconds);
}

void PsShardImpl::ExpireWaitingPulls() {
  if (waiting_.empty()) return;
  const auto now = Clock::now();
  std::optional<std::vector<uint32_t>> missing_once;  // the same for every pull of this pass
  for (auto it = waiting_.begin(); it != waiting_.end();) {
    if (now < it->deadline) {
      ++it;
      continue;
    }
    if (!missing_once) missing_once = MissingPushers();
    const std::vector<uint32_t>& missing = *missing_once;
    // A worker behind a stalled network is silent for as long as TCP's
    // backed-off resends take, which can outlast timeout_s after a shorter
    // outage; its peers' pulls are held once more while the coordinator
    // listed it since the pull arrived (as the workers wait once more for a
    // listed shard, PsClient::SetStallCheck). A worker that left is dropped
    // from the map, and its peers hear of it at the first timeout.
    if (!it->waited_again && !missing.empty() &&
        StillMembers(missing, it->deadline - options_.timeout)) {
      if (held_again_logged_ != applied_) {  // one line a step, not one a waiting worker
        held_again_logged_ = applied_;
        spdlog::warn(
            "shard {}: pulls for version {} waited {:.1f} s for the pushes of step {} from "
            "workers {}, which the coordinator still lists in the job: holding them once more",
            options_.shard, it->request->message.min_version, options_.timeout.count() / 1000.0,
            applied_.load(), RankList(missing));
      }
      it->waited_again = true;
      it->deadline = now + options_.timeout;
      ++it;
      continue;
    }
    ReplyError(
        *it->request,
        Status::Timeout(
            "pull for version " + std::to_string(it->request->message.min_version) + " waited " +
            std::to_string(options_.timeout.count() / 1000.0).substr(0, 5) + " s" +
            (it->waited_again ? " twice (the missing workers were members of the job at the first "
                                "timeout)"
                              : "") +
            "; shard " + std::to_string(options_.shard) + " is at version " +
            std::to_string(applied_) + ", missing pushes for step " + std::to_string(applied_) +
            " from workers " + RankList(missing) +
            // A frozen coordinator read as missing pushes alone, naming
            // the workers that waited on it (a hostile probe).
            CoordinatorSilence(it->deadline - options_.timeout)));
    it = waiting_.erase(it);
  }
}

}  // namespace ps_shard_engine
}  // namespace gridsync
