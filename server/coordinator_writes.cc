// The coordinator engine (coordinator_engine.h): writing and closing
// connections. Queuing (and sealing) replies and writing them in order,
// refusing a connection with an error reply and lingering until the peer
// has read it, and closing one: the member it registered leaves the cluster
// map, and with the last worker the job ends or, with a complete
// checkpoint, waits for restarted workers. Reading and dispatching are in
// coordinator_connections.cc.
//
// Thread safety: see coordinator_engine.h (the io thread only).
#include <algorithm>
#include <chrono>
#include <string>
#include <utility>
#include <vector>

#include "common/cluster_map.h"
#include "server/coordinator_engine.h"

namespace gridsync {
namespace coordinator_engine {

bool CoordinatorImpl::StrangersOutboxRoom(const ConnPtr& conn, uint64_t bytes) {
  // Replies queued to strangers that do not read them, at most their share
  // of max_pending_bytes in all: a stranger's kvGet of 64 MiB of values,
  // twice, and no read held 128 MiB a connection, 512 connections at most
  // (a review). The stranger holding the most goes first; a stranger that
  // reads its replies holds none when its next one comes.
  for (;;) {
    uint64_t all = bytes;
    ConnPtr most = conn;
    uint64_t most_bytes = conn->outbox_bytes + bytes;
    for (const ConnPtr& c : connections_) {
      if (c->closed || !Stranger(*c)) continue;
      all += c->outbox_bytes;
      if (c != conn && c->outbox_bytes > most_bytes) {
        most = c;
        most_bytes = c->outbox_bytes;
      }
    }
    if (all <= StrangerPendingShare()) return true;
    const std::string why = fmt::format(
        "replies queued to connections that did not register and do not read them would hold "
        "{} bytes; allowed: at most {} (this one held {}): read the replies",
        all, StrangerPendingShare(), most_bytes);
    if (refusal_log_.Allow())
      spdlog::warn("coordinator: connection {} ({}) closed: {}", most->id, most->peer, why);
    Close(most, why);
    if (most == conn) return false;
  }
}

void CoordinatorImpl::Send(const ConnPtr& conn, std::vector<uint8_t> frame) {
  Persist();
  if (conn->closed) return;
  if (conn->session) frame = conn->session->Seal(frame);
  if (Stranger(*conn) && !StrangersOutboxRoom(conn, frame.size())) return;
  conn->outbox_bytes += frame.size();
  conn->outbox.push_back(std::move(frame));
  if (!conn->writing) WriteNext(conn);
}

void CoordinatorImpl::WriteNext(const ConnPtr& conn) {
  if (conn->closed) return;
  if (conn->outbox.empty()) {
    conn->writing = false;
    if (conn->closing) Linger(conn);
    return;
  }
  conn->writing = true;
  asio::async_write(conn->socket, asio::buffer(conn->outbox.front()),
                    [this, conn](ErrorCode ec, size_t) {
                      Guard(conn, "write", [&] {
                        if (conn->closed) return;
                        const bool was_full = conn->outbox_bytes > options_.max_outbox_bytes;
                        conn->outbox_bytes -= conn->outbox.front().size();
                        conn->outbox.pop_front();
                        if (ec) {
                          Close(conn, "write failed: " + ec.message());
                          return;
                        }
                        WriteNext(conn);
                        // Reading paused while the peer did not take its replies.
                        if (was_full && conn->outbox_bytes <= options_.max_outbox_bytes)
                          ReadHeader(conn);
                      });
                    });
}

void CoordinatorImpl::Fail(const ConnPtr& conn, uint64_t request_id, const Status& status) {
  if (refusal_log_.Allow()) {
    spdlog::warn("coordinator: connection {} ({}): {} ({}); replying with the error and closing it",
                 conn->id, conn->peer, status.message(), StatusCodeName(status.code()));
  }
  Cleanup(conn, "sent a message that was refused: " + status.message());
  ReleasePending(*conn);  // its unfinished message is dropped
  Send(conn, wire::EncodeErrorReply(request_id, status));
  conn->closing = true;
  if (!conn->writing) Linger(conn);
}

// Closing a socket whose receive buffer still holds bytes makes the kernel
// send a reset, and a reset can discard the error reply before the peer
// reads it. So: half-close (the peer reads the reply, then EOF), discard
// what the peer still sends, and close at its EOF, after 500 ms, or after
// 1 MiB, whichever comes first.
void CoordinatorImpl::Linger(const ConnPtr& conn) {
  if (conn->closed || conn->linger_timer) return;
  ErrorCode ignored;
  // A read still pending (the next request's header, at a stop) is
  // cancelled: DiscardInput is the one read from here on (Asio allows one
  // at a time); its handler sees the connection closing and returns. No
  // write is pending here (the outbox is written).
  if (conn->reading) conn->socket.cancel(ignored);
  conn->socket.shutdown(tcp::socket::shutdown_send, ignored);
  conn->linger_timer = std::make_unique<asio::steady_timer>(io_);
  conn->linger_timer->expires_after(std::chrono::milliseconds(500));
  conn->linger_timer->async_wait([this, conn](ErrorCode) {
    Guard(conn, "linger", [&] { Close(conn, conn->linger_reason); });
  });
  conn->discard.resize(4096);
  DiscardInput(conn);
}

void CoordinatorImpl::DiscardInput(const ConnPtr& conn) {
  if (conn->closed) return;
  conn->socket.async_read_some(asio::buffer(conn->discard), [this, conn](ErrorCode ec, size_t n) {
    Guard(conn, "linger", [&] {
      if (conn->closed) return;
      conn->discarded += n;
      if (ec || conn->discarded > (size_t{1} << 20)) {
        Close(conn, conn->linger_reason);
        return;
      }
      DiscardInput(conn);
    });
  });
}

void CoordinatorImpl::Cleanup(const ConnPtr& conn, const std::string& reason) {
  if (conn->cleaned) return;
  conn->cleaned = true;
  ClearQueue(conn);
  if (auto w = conn->waiter) {
    conn->waiter.reset();
    w->done = true;
    w->timer.cancel();
    Detach(w);
    if (w->kind == Waiter::Kind::kBarrier && !shutting_down_) {
      spdlog::info("barrier '{}': {} left while waiting ({})", w->barrier, w->member, reason);
    }
  }
  if (conn->member) {
    const MemberInfo member = *conn->member;
    conn->member.reset();
    auto& members = member.role == Role::kShard ? map_.shards : map_.workers;
    members.erase(std::remove_if(members.begin(), members.end(),
                                 [&](const MemberInfo& m) { return m.rank == member.rank; }),
                  members.end());
    ++map_.generation;
    if (!shutting_down_) {
      spdlog::log(
          job_done_ ? spdlog::level::info : spdlog::level::warn,
          "{} {} left{} (node '{}', pid {}, {}): {}; cluster map generation {}: {}/{} shards, "
          "{}/{} workers",
          RoleName(member.role), member.rank, job_done_ ? " after the job ended" : "", member.node,
          member.pid, conn->peer, reason, map_.generation, map_.shards.size(), map_.expected_shards,
          map_.workers.size(), map_.expected_workers);
    }
    const bool resumable = !job_done_ && JobHasCompleteStep();
    if (map_.workers.empty() && training_started_ && resumable && !shutting_down_) {
      // Every worker died before the end, but the job has a complete
      // checkpoint: it stays open, and workers restarted with the same
      // config rejoin it.
      spdlog::warn(
          "job {}: every worker left before the job finished; it has a complete checkpoint, so "
          "it stays open and {} (a fresh job needs a fresh coordinator)",
          map_.job,
          map_.expected_shards == 0
              ? "the whole job restarts from it (nccl workers do not rejoin: gridsync launch "
                "--resume, or this coordinator with --fresh and --start-step on every worker)"
              : "restarted workers rejoin it");
    } else if (map_.workers.empty() && training_started_) {
      // The job's last worker left: the next workers start a new job, which
      // long-running shards (systemd units that stay up) serve afresh.
      spdlog::info("job {} {}; the next workers start job {}", map_.job,
                   job_done_ ? "ended" : "ended without finishing", map_.job + 1);
      AdvanceJob();
    }
    if (map_.workers.empty()) {
      // The next job's first worker defines its settings.
      job_settings_.clear();
      job_settings_owner_.reset();
      // Rendezvous state (Gloo's addresses, NCCL's ids, the backend vote)
      // belongs to the workers that wrote it: the next ones, reusing the
      // group names, must not find it (a second nccl-mode job on this
      // coordinator waited for the first job's Gloo peers). So do the
      // adaptive split's rounds ("rates/<step>/<rank>", the last two kept
      // by DropOldRateRounds): the next job's workers, reaching the same
      // step, read the old job's rates without waiting, and with another
      // world size some of them fresh ones, so their splits disagreed.
      for (const std::string& prefix :
           {std::string(kCollectiveStorePrefix), std::string("rates/")}) {
        auto it = kv_.lower_bound(prefix);
        while (it != kv_.end() && it->first.rfind(prefix, 0) == 0) it = KvErase(it);
      }
    }
    if (map_.shards.empty() && map_.workers.empty() && tables_owner_) {
      // The job is gone; the next one may bring other tables.
      tables_owner_.reset();
      map_.tables.clear();
      ResetSharedSettings();
      if (!shutting_down_)
        spdlog::info("no shards or workers left; the cluster's tables are forgotten");
    }
    Persist();
  }
}

void CoordinatorImpl::Close(const ConnPtr& conn, const std::string& reason) {
  if (conn->closed) return;
  Cleanup(conn, reason);
  conn->closed = true;
  conn->outbox.clear();
  conn->outbox_bytes = 0;
  ReleasePending(*conn);
  if (conn->linger_timer) conn->linger_timer->cancel();
  if (conn->read_timer) conn->read_timer->cancel();
  ErrorCode ignored;
  conn->socket.shutdown(tcp::socket::shutdown_both, ignored);
  conn->socket.close(ignored);
  connections_.erase(conn);
  spdlog::debug("coordinator: connection {} ({}) closed: {}", conn->id, conn->peer, reason);
  if (shutting_down_ && connections_.empty()) stop_timer_.cancel();  // nothing left to wait for
}

}  // namespace coordinator_engine
}  // namespace gridsync
