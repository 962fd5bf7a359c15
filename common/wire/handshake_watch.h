// What a connecting socket's ZMTP handshakes did, for the error a client
// gives when a server never answers.
//
// Why: under CURVE a server that cannot read a client's HELLO (the client
// trusts another server key: a wrong shard.pub) or refuses its key (ZAP)
// closes the connection, and the client's socket quietly reconnects; the
// client only ever sees no reply. A hostile probe's worker with the wrong
// shard.pub reported just "no pushAck from shards [0]" after its timeout,
// while the cause was in the shard's log on another host. ZeroMQ's socket
// monitor (the stable v1 events) does report, on the client, each
// connection made, each handshake that succeeded, and each that failed or
// was cut off: that is enough to tell "nothing listens there" from "it
// listens but our handshake fails" from "it refused our key".
//
// The events queue on an inproc pair socket and are read only when the
// owner asks (Poll), so the data path pays nothing; a queue that filled
// while nobody asked drops the newest events, and the counts stay a
// faithful summary of the first ones (the ones that tell the story).
//
// Thread safety: not thread-safe; used by the thread that owns the watched
// socket. The context must outlive the watch.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>
#include <zmq.hpp>

#include "common/status.h"

namespace gridsync::wire {

class HandshakeWatch {
 public:
  // Monitors `socket` (not connected yet) of `context`.
  static Result<std::unique_ptr<HandshakeWatch>> Attach(zmq::context_t& context,
                                                        zmq::socket_t& socket);
  ~HandshakeWatch();
  HandshakeWatch(const HandshakeWatch&) = delete;
  HandshakeWatch& operator=(const HandshakeWatch&) = delete;

  // Reads the events queued since the last call, without waiting; returns
  // whether a handshake failure was among them.
  bool Poll();

  // The descriptors of the TCP connections made since the last call (read
  // by Poll), for options ZeroMQ does not set (common/tcp_backoff.h). An
  // event read late may name a descriptor already closed, or reused by
  // another socket of this process.
  std::vector<int> TakeConnected();

  // Why the server may not have answered, after a Poll: empty when a
  // handshake succeeded since the last failure (the cause lies elsewhere),
  // else a sentence that starts with a lower-case letter and names what to
  // check, for `server` (e.g. "shard 0") whose public key this process took
  // from `key_file` (empty: no CURVE).
  std::string Explain(const std::string& server, const std::string& key_file) const;

 private:
  HandshakeWatch(zmq::context_t& context, const std::string& endpoint);

  zmq::socket_t events_;
  uint64_t connections_ = 0;    // TCP connections made
  uint64_t handshakes_ = 0;     // handshakes that succeeded
  uint64_t failures_ = 0;       // handshakes that failed or were cut off
  bool failed_last_ = false;    // the newest handshake outcome was a failure
  std::vector<int> connected_;  // descriptors of connections made, not yet taken
  int last_protocol_error_ = 0;
  int last_auth_status_ = 0;  // ZAP status code: 300, 400 or 500
};

}  // namespace gridsync::wire
