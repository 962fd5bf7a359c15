// A shard's pull replies not yet written to their peers' sockets, per peer,
// and the bounds on them (ShardOptions::max_unsent_bytes_per_peer and
// max_unsent_bytes). ZeroMQ queues a reply until the peer reads it, and its
// high-water mark is off, so a peer that asks and never reads would grow the
// shard without these.
//
// A peer holding replies that asks again is refused past its own bound or
// the bound for all. A peer holding none that was sent replies before has
// read them (a worker waits with one pull at a time): past the bound for
// all, once more peers than the run has workers hold replies, the
// connections of the peers holding replies longest are shut down (their
// queued replies go with them) until its reply fits. Before, it was
// refused: a hostile probe's eight connections that never read held the
// whole 4 GiB, and every worker's next pull was refused, which ended the
// run. A peer that never reads holds since its first reply; a worker only
// since the reply it is reading, so the peers that never read go first. A
// peer never sent a reply has shown nothing and is refused there, as
// before (a second probe's 256 connections, reconnecting as each was shut
// down, asked anew as fresh peers and crowded the workers out).
//
// Thread safety: the shard's serving thread only. The counters it hands
// out are decremented by ZeroMQ's I/O threads (atomics) once a reply's
// frames are written or dropped.
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <zmq.hpp>

#include "common/logging.h"
#include "common/status.h"
#include "common/wire/message.h"

namespace gridsync {

class ReplyBacklog {
 public:
  ReplyBacklog(uint64_t max_per_peer, uint64_t max_all, uint32_t workers, std::string who)
      : max_per_peer_(max_per_peer), max_all_(max_all), workers_(workers), who_(std::move(who)) {}

  // What Admit decided for a reply: queue it with `unsent` (the counter its
  // frames carry, wire::Encode's `unsent`), or `wait`: connections just shut
  // down hold the room it needs, which ZeroMQ frees as the serving thread
  // goes on receiving (a closed connection's pipe ends there), so the
  // caller asks again shortly, for at most kShedWait, then refuses.
  struct Admission {
    std::shared_ptr<wire::UnsentBytes> unsent;
    bool wait = false;
  };
  static constexpr std::chrono::milliseconds kShedWait{1000};
  // Replies held unread this long mark a peer that does not read: when
  // room is needed, all such peers are shut down at once.
  static constexpr std::chrono::milliseconds kStaleHold{2000};

  // Whether a reply of `bytes` to `identity`, whose request came on
  // connection `fd` (ZMQ_SRCFD; -1: unknown), may be queued; IOError naming
  // the bounds when not. May shut down other peers' connections (see
  // above).
  Result<Admission> Admit(const zmq::message_t& identity, int fd, uint64_t bytes);
  // The refusal of a reply that waited kShedWait in vain.
  Status RoomNeverFreed(uint64_t bytes) const;

  // The counter for a small reply of `bytes` to `identity` (an error, a
  // push's ack, stats: wire::Counted), or null when the peer holds
  // kSmallReplySlack of them unread, or all peers kSmallRepliesAll: it
  // does not read, and the reply is dropped. Uncounted, a peer that
  // streamed junk and never read had ~300 B of refusal queued per 8 B it
  // sent (a review). Counted apart from pull replies, so that they neither
  // refuse a worker's pull nor need its peers shed (a worker reads each
  // reply before it asks again).
  static constexpr uint64_t kSmallReplySlack = uint64_t{256} << 10;
  static constexpr uint64_t kSmallRepliesAll = uint64_t{256} << 20;
  std::shared_ptr<wire::UnsentBytes> AdmitSmall(const zmq::message_t& identity, uint64_t bytes);
  uint64_t small_total() const { return small_total_->bytes.load(std::memory_order_relaxed); }

  uint64_t total() const { return total_->bytes.load(std::memory_order_relaxed); }
  // Connections shut down for holding replies they did not read. (total()
  // and shed() may be read from any thread.)
  uint64_t shed() const { return shed_.load(std::memory_order_relaxed); }

 private:
  using Clock = std::chrono::steady_clock;
  struct Peer {
    std::shared_ptr<wire::UnsentBytes> unsent;
    std::shared_ptr<wire::UnsentBytes> small;  // AdmitSmall's replies
    int fd = -1;                               // the connection its last pull came on
    Clock::time_point since;                   // holding replies since (its first one still queued)
    bool shed = false;                         // its connection was shut down
    uint64_t replies = 0;                      // replies admitted to it
  };

  Peer& PeerOf(const zmq::message_t& identity);
  size_t PeersHolding() const;
  // Shuts down the connections of the peers (but `asking`) holding replies
  // longest until `bytes` more fit within max_all_ once theirs are
  // dropped; false when even all of them would not make the room.
  bool ShedFor(const Peer& asking, uint64_t bytes);

  const uint64_t max_per_peer_;
  const uint64_t max_all_;
  const uint32_t workers_;
  const std::string who_;
  std::shared_ptr<wire::UnsentBytes> total_ = std::make_shared<wire::UnsentBytes>();
  std::shared_ptr<wire::UnsentBytes> small_total_ = std::make_shared<wire::UnsentBytes>();
  std::map<std::string, Peer> peers_;
  size_t prune_at_ = 1024;  // PeerOf prunes the map past this size
  std::atomic<uint64_t> shed_{0};
  LogBudget shed_log_{"connections shut down for replies they did not read"};
};

}  // namespace gridsync
