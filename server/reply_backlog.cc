// ReplyBacklog (reply_backlog.h).
//
// Thread safety: see reply_backlog.h.
#include "server/reply_backlog.h"

#include <spdlog/spdlog.h>
#include <sys/socket.h>

#include <algorithm>
#include <vector>

#include "common/wire/connection_cap.h"

namespace gridsync {

ReplyBacklog::Peer& ReplyBacklog::PeerOf(const zmq::message_t& identity) {
  // Peers come and go (each connection has an identity of its own): drop
  // those nobody holds a counter of and nothing is queued for, once the
  // map has doubled since the last pass (not a scan on every pull).
  if (peers_.size() >= prune_at_) {
    std::erase_if(peers_, [](const auto& entry) {
      const Peer& p = entry.second;
      return p.unsent.use_count() == 1 && p.unsent->bytes.load() == 0 && p.small.use_count() == 1 &&
             p.small->bytes.load() == 0;
    });
    prune_at_ = std::max<size_t>(1024, 2 * peers_.size());
  }
  Peer& peer = peers_[std::string(identity.data<char>(), identity.size())];
  if (peer.unsent == nullptr) {
    peer.unsent = std::make_shared<wire::UnsentBytes>();
    peer.unsent->total = total_;
    peer.small = std::make_shared<wire::UnsentBytes>();
    peer.small->total = small_total_;
  }
  return peer;
}

size_t ReplyBacklog::PeersHolding() const {
  size_t holding = 0;
  for (const auto& [identity, peer] : peers_)
    holding += peer.unsent->bytes.load(std::memory_order_relaxed) > 0 ? 1 : 0;
  return holding;
}

bool ReplyBacklog::ShedFor(const Peer& asking, uint64_t bytes) {
  // What the connections already shut down still hold is on its way out.
  uint64_t leaving = 0;
  std::vector<Peer*> holders;
  for (auto& [identity, peer] : peers_) {
    const uint64_t held = peer.unsent->bytes.load(std::memory_order_relaxed);
    if (held == 0 || &peer == &asking) continue;
    if (peer.shed) {
      leaving += held;
    } else if (peer.fd >= 0) {
      holders.push_back(&peer);
    }
  }
  const auto fits_once_gone = [&] {
    const uint64_t all = total();
    return (all > leaving ? all - leaving : 0) + bytes <= max_all_;
  };
  std::sort(holders.begin(), holders.end(),
            [](const Peer* a, const Peer* b) { return a->since < b->since; });
  const auto now = Clock::now();
  for (Peer* peer : holders) {
    // Every peer that has held replies unread for kStaleHold goes at once
    // (no reader holds one that long: a worker reads its reply as it
    // comes); then the oldest of the others until the reply fits. One at a
    // time, 256 reconnecting peers refilled the room faster than it freed.
    if (now - peer->since < kStaleHold && fits_once_gone()) break;
    const uint64_t held = peer->unsent->bytes.load(std::memory_order_relaxed);
    peer->shed = true;
    leaving += held;
    shed_.fetch_add(1, std::memory_order_relaxed);
    if (shed_log_.Allow()) {
      spdlog::warn(
          "{}: shut down the connection of {}: it holds {} bytes of replies it has not read for "
          "{} ms, and with {} bytes queued in all a peer that reads its replies asked for {}; "
          "allowed: at most {} bytes queued in all (read the replies before asking for more)",
          who_, wire::PeerOfConnection(peer->fd), held,
          std::chrono::duration_cast<std::chrono::milliseconds>(now - peer->since).count(), total(),
          bytes, max_all_);
    }
    // ZeroMQ owns the descriptor: shut down, its engine reads EOF, closes
    // it and drops the replies queued for it (their counters go to 0).
    ::shutdown(peer->fd, SHUT_RDWR);
  }
  return fits_once_gone();
}

Status ReplyBacklog::RoomNeverFreed(uint64_t bytes) const {
  return Status::IOError(fmt::format(
      "pull of {} bytes refused: {} bytes of replies to other peers are not yet written to their "
      "sockets, and those of the connections shut down for not reading theirs were not dropped "
      "within {} ms; allowed: at most {} in all",
      bytes, total(), kShedWait.count(), max_all_));
}

std::shared_ptr<wire::UnsentBytes> ReplyBacklog::AdmitSmall(const zmq::message_t& identity,
                                                            uint64_t bytes) {
  Peer& peer = PeerOf(identity);
  const uint64_t mine = peer.small->bytes.load(std::memory_order_relaxed);
  if (mine + bytes > kSmallReplySlack || small_total() + bytes > kSmallRepliesAll) return nullptr;
  return peer.small;
}

Result<ReplyBacklog::Admission> ReplyBacklog::Admit(const zmq::message_t& identity, int fd,
                                                    uint64_t bytes) {
  Peer& peer = PeerOf(identity);
  const uint64_t mine = peer.unsent->bytes.load(std::memory_order_relaxed);
  const uint64_t all = total();
  const bool over_all = all + bytes > max_all_;
  // Under bsp one version serves every worker's pull at once: up to one
  // reply a worker past the bound for all is theirs.
  const bool crowded = mine == 0 && over_all && PeersHolding() >= workers_;
  const bool shedding = crowded && peer.replies > 0;  // it read replies before
  if ((mine > 0 && (mine + bytes > max_per_peer_ || over_all)) || (crowded && !shedding) ||
      (shedding && !ShedFor(peer, bytes))) {
    return Status::IOError(fmt::format(
        "pull of {} bytes refused: {} bytes of replies to this peer and {} to all peers are not "
        "yet written to their sockets; allowed: at most {} per peer and {} in all (read the "
        "replies before asking for more)",
        bytes, mine, all, max_per_peer_, max_all_));
  }
  // Queued only once the room is there, never on the promise of it: a
  // flood of fresh connections outran the drops.
  if (shedding && total() + bytes > max_all_) return Admission{nullptr, /*wait=*/true};
  if (mine == 0) {
    peer.since = Clock::now();
    peer.shed = false;  // a new connection under the same identity
  }
  if (fd >= 0) peer.fd = fd;
  ++peer.replies;
  return Admission{peer.unsent, false};
}

}  // namespace gridsync
