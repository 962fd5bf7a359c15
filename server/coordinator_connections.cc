// The coordinator engine (coordinator_engine.h): connections. Accepting,
// reading frames with their deadlines, authenticating, and dispatching
// decoded requests in order. Writing, refusing and closing are in
// coordinator_writes.cc.
//
// Thread safety: see coordinator_engine.h (the io thread only).
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sys/socket.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

#include "common/tcp_backoff.h"
#include "server/coordinator_engine.h"

namespace gridsync {
namespace coordinator_engine {
namespace {

void DetectDeadPeer(tcp::socket& socket, std::chrono::seconds after) {
  if (after.count() <= 0) return;
  // Probes start after half the time without traffic, then every eighth,
  // and four unanswered ones close the connection: about `after` in all.
  // The kernel answers probes even for a stopped process, so only a dead
  // host or a cut network trips this, never a slow member.
  const int total = static_cast<int>(std::min<int64_t>(after.count(), 24 * 3600));
  const int idle = std::max(1, total / 2);
  const int interval = std::max(1, total / 8);
  const int count = 4;
  const unsigned user_timeout_ms = static_cast<unsigned>(total) * 1000u;
  const int fd = socket.native_handle();
  const int on = 1;
  bool ok = setsockopt(fd, SOL_SOCKET, SO_KEEPALIVE, &on, sizeof(on)) == 0;
  ok = ok && setsockopt(fd, IPPROTO_TCP, TCP_KEEPIDLE, &idle, sizeof(idle)) == 0;
  ok = ok && setsockopt(fd, IPPROTO_TCP, TCP_KEEPINTVL, &interval, sizeof(interval)) == 0;
  ok = ok && setsockopt(fd, IPPROTO_TCP, TCP_KEEPCNT, &count, sizeof(count)) == 0;
  ok = ok && setsockopt(fd, IPPROTO_TCP, TCP_USER_TIMEOUT, &user_timeout_ms,
                        sizeof(user_timeout_ms)) == 0;
  if (!ok) spdlog::warn("coordinator: TCP keepalive not set: {}", std::strerror(errno));
}

}  // namespace

// ---- Accepting and reading ----

void CoordinatorImpl::Accept() {
  acceptor_.async_accept([this](ErrorCode ec, tcp::socket socket) {
    Guard(nullptr, "accept", [&] {
      if (shutting_down_ || ec == asio::error::operation_aborted) return;
      if (ec) {
        // For example EMFILE: back off instead of spinning.
        spdlog::warn("coordinator: accept failed: {}; retrying in 100 ms", ec.message());
        accept_retry_.expires_after(std::chrono::milliseconds(100));
        accept_retry_.async_wait([this](ErrorCode timer_ec) {
          Guard(nullptr, "accept retry", [&] {
            if (!timer_ec && !shutting_down_) Accept();
          });
        });
        return;
      }
      auto conn = std::make_shared<Connection>(std::move(socket), ++next_connection_id_);
      ErrorCode opt_ec;
      conn->socket.set_option(tcp::no_delay(true), opt_ec);
      DetectDeadPeer(conn->socket, options_.dead_peer_after);
      // Replies queued during an outage go out within a second of its end
      // (common/tcp_backoff.h), so an outage shorter than dead_peer_after
      // does not end the member's connection.
      if (const std::string why = CapRetransmitBackoff(conn->socket.native_handle());
          !why.empty()) {
        spdlog::debug("coordinator: {}", why);
      }
      auto remote = conn->socket.remote_endpoint(opt_ec);
      conn->peer = opt_ec ? std::string("unknown peer")
                          : fmt::format("{}:{}", remote.address().to_string(), remote.port());
      connections_.insert(conn);
      conn->read_timer = std::make_unique<asio::steady_timer>(io_);
      if (!MakeRoomFor(conn)) {
        Accept();
        return;
      }
      spdlog::debug("coordinator: connection {} from {}", conn->id, conn->peer);
      ArmReadDeadline(conn, "its first request");
      if (options_.auth.on) ArmAuthDeadline(conn);
      ReadHeader(conn);
      Accept();
    });
  });
}

bool CoordinatorImpl::MakeRoomFor(const ConnPtr& fresh) {
  // Refused and evicted connections linger for their error reply (Linger)
  // and no longer count.
  size_t open = 0;
  // The oldest of the strangers that never spoke; the idlest of those with
  // nothing waiting; the newest of those waiting for an answer.
  ConnPtr silent, idlest, waiting;
  size_t silent_count = 0, waiting_count = 0;
  for (const ConnPtr& c : connections_) {
    if (c->closed || c->closing) continue;
    ++open;
    if (c == fresh || !Stranger(*c)) continue;
    if (!c->heard) {
      ++silent_count;
      if (!silent || c->last_heard < silent->last_heard) silent = c;
    } else if (!c->waiter && c->queued.empty()) {
      if (!idlest || c->last_heard < idlest->last_heard) idlest = c;
    } else {
      ++waiting_count;
      if (!waiting || c->id > waiting->id) waiting = c;
    }
  }
  if (open <= options_.max_connections) return true;
  // The more numerous kind of stranger is the flood: silent ones while they
  // are at least as many as the waiting ones (a launcher waiting at its
  // barrier outlives a flood of silent connections), else the idle, then
  // the waiting ones. A shard or worker is silent for the milliseconds
  // between its connect and its register: with 512 strangers waiting on
  // keys, each newcomer of a starting cluster closed the one before it
  // (a hostile probe), and strangers waiting with a timeout of days had
  // locked every member out before that.
  if (silent && silent_count >= waiting_count) {
    idlest = silent;
  } else if (!idlest && waiting) {
    Fail(waiting, 0,
         Status::IOError(fmt::format(
             "closed to make room for a new connection: {} open, at most {} (max_connections), "
             "{} of them strangers waiting for an answer, and this one has neither registered "
             "nor proved a key and connected last of those; allowed: register (or prove a key: "
             "security.mode curve) before waiting",
             open, options_.max_connections, waiting_count)));
    return true;
  }
  if (idlest) {
    const auto idle_ms = std::chrono::duration_cast<std::chrono::milliseconds>(
                             std::chrono::steady_clock::now() - idlest->last_heard)
                             .count();
    Fail(idlest, 0,
         Status::IOError(fmt::format(
             "closed to make room for a new connection: {} open, at most {} (max_connections), "
             "and this one has neither registered nor proved a key and {} {} ms ago, longer "
             "than any other such connection; allowed: register (or prove a key) promptly after "
             "connecting",
             open, options_.max_connections,
             idlest->heard ? "was heard from last" : "sent no whole message since it connected",
             idle_ms)));
    return true;
  }
  Fail(fresh, 0,
       Status::InvalidArgument(fmt::format(
           "too many connections: {} open, all of them registered members or proven keys; "
           "allowed: at most {} (max_connections)",
           open - 1, options_.max_connections)));
  return false;
}

void CoordinatorImpl::ReadHeader(const ConnPtr& conn) {
  if (conn->closed || conn->closing || conn->reading || shutting_down_) return;
  if (conn->queued.size() >= kMaxQueuedRequests) return;       // resumed by Drain()
  if (conn->outbox_bytes > options_.max_outbox_bytes) return;  // resumed by WriteNext()
  conn->reading = true;
  asio::async_read(conn->socket, asio::buffer(conn->header), [this, conn](ErrorCode ec, size_t) {
    Guard(conn, "read", [&] {
      conn->reading = false;
      // Lingering (a refusal, or the coordinator stopping): Linger's own
      // read discards what the peer still sends.
      if (conn->closed || conn->closing) return;
      if (ec) {
        Close(conn, ec == asio::error::eof ? std::string("connection closed by the peer")
                                           : "read failed: " + ec.message());
        return;
      }
      const uint32_t length = wire::DecodeFramePrefix(conn->header);
      switch (wire::CheckFrameLength(
          length, wire::FrameLimit(options_.max_message_bytes, conn->session.has_value()))) {
        case wire::FrameLengthCheck::kOk:
          break;
        case wire::FrameLengthCheck::kEmpty:
          Fail(conn, 0,
               Status::InvalidArgument(fmt::format(
                   "empty message (length prefix 0); allowed: a flat Cap'n Proto CoordRequest of 8 "
                   "to {} bytes",
                   options_.max_message_bytes)));
          return;
        case wire::FrameLengthCheck::kTooLong:
          Fail(conn, 0,
               Status::InvalidArgument(fmt::format(
                   "message length {} bytes exceeds the limit of {} bytes (max_message_bytes); "
                   "allowed: 8 to {} bytes, a multiple of 8",
                   length, options_.max_message_bytes, options_.max_message_bytes)));
          return;
        case wire::FrameLengthCheck::kNotWords:
          Fail(conn, 0,
               Status::Corruption(fmt::format(
                   "message length {} bytes is not a multiple of 8; allowed: a flat Cap'n Proto "
                   "message, which is whole 8-byte words",
                   length)));
          return;
      }
      conn->stranger_message = Stranger(*conn);
      if (conn->stranger_message && length > kStrangerMessageBytes) {
        Fail(conn, 0,
             Status::InvalidArgument(fmt::format(
                 "message length {} bytes from a connection that has not registered; allowed: "
                 "at most {} bytes until it registers as a shard or worker (or proves its key)",
                 length, kStrangerMessageBytes)));
        return;
      }
      conn->body_length = length;
      conn->body_received = 0;
      conn->body.clear();
      ArmReadDeadline(conn, "the rest of a message");
      ReadBody(conn);
    });
  });
}

bool CoordinatorImpl::MakeStrangerRoom(const ConnPtr& conn, uint64_t want) {
  // The whole budget too: strangers closed for the share alone, and the
  // reader then refused by the budget for all, would have been closed for
  // nothing.
  const auto past_share = [&] { return stranger_pending_bytes_ + want > StrangerPendingShare(); };
  while (past_share() || pending_bytes_ + queued_bytes_ + want > options_.max_pending_bytes) {
    ConnPtr largest;
    for (const ConnPtr& c : connections_) {
      if (c == conn || c->closed || c->closing || !c->stranger_message || c->pending == 0) continue;
      // The oldest connection among equal holders.
      if (!largest || c->pending > largest->pending ||
          (c->pending == largest->pending && c->id < largest->id))
        largest = c;
    }
    if (!largest || largest->pending <= conn->pending + want) {
      // Only the budget for all is past: its own check refuses the reader.
      if (!past_share()) return true;
      Fail(conn, 0,
           Status::InvalidArgument(fmt::format(
               "connections that have not registered hold {} bytes of unfinished messages, and "
               "this one would hold the most ({} bytes); allowed: at most {} in all (half of "
               "max_pending_bytes, the rest kept for the members); send whole messages",
               stranger_pending_bytes_, conn->pending + want, StrangerPendingShare())));
      return false;
    }
    Fail(largest, 0,
         Status::IOError(fmt::format(
             "closed to make room for another connection's message: connections that have not "
             "registered hold {} bytes of unfinished messages, at most {} in all (half of "
             "max_pending_bytes), and this one held the most, {} bytes of a message of {}; "
             "allowed: whole messages, sent promptly, of at most {} bytes until it registers",
             stranger_pending_bytes_, StrangerPendingShare(), largest->pending,
             largest->body_length, kStrangerMessageBytes)));
  }
  return true;
}

void CoordinatorImpl::ReadBody(const ConnPtr& conn) {
  // The body grows as bytes arrive (at most 64 KiB a read), so a length
  // prefix alone reserves nothing; all partial bodies share one budget with
  // the requests queued behind waiting ones (OnRequest).
  constexpr size_t kChunk = 64 * 1024;
  const size_t want = std::min(kChunk, conn->body_length - conn->body_received);
  if (conn->stranger_message && !MakeStrangerRoom(conn, want)) return;
  if (pending_bytes_ + queued_bytes_ + want > options_.max_pending_bytes) {
    Fail(conn, 0,
         Status::InvalidArgument(fmt::format(
             "the coordinator holds {} bytes of unfinished messages and {} bytes of queued "
             "requests; allowed: at most {} over all connections (max_pending_bytes); send whole "
             "messages",
             pending_bytes_, queued_bytes_, options_.max_pending_bytes)));
    return;
  }
  pending_bytes_ += want;
  if (conn->stranger_message) stranger_pending_bytes_ += want;
  conn->pending += want;
  conn->body.resize((conn->body_received + want) / 8 + 1);
  conn->reading = true;
  auto* at = reinterpret_cast<uint8_t*>(conn->body.data()) + conn->body_received;
  asio::async_read(conn->socket, asio::buffer(at, want), [this, conn, want](ErrorCode ec, size_t) {
    Guard(conn, "read", [&] {
      conn->reading = false;
      // Lingering (refused meanwhile, or the coordinator stopping): Linger cancelled
      // this read and discards what the peer still sends.
      if (conn->closed || conn->closing) return;
      if (ec) {
        Close(conn, ec == asio::error::eof
                        ? std::string("connection closed by the peer in the middle of a message")
                        : "read failed: " + ec.message());
        return;
      }
      conn->body_received += want;
      if (conn->body_received < conn->body_length) {
        ReadBody(conn);
        return;
      }
      conn->read_timer->cancel();
      ReleasePending(*conn);  // the message is whole: no longer pending
      conn->body.resize(conn->body_length / 8);
      kj::ArrayPtr<const capnp::word> words(reinterpret_cast<const capnp::word*>(conn->body.data()),
                                            conn->body.size());
      std::vector<capnp::word> opened_words;  // a sealed frame's plain text
      if (conn->session) {
        auto opened = wire::OpenSealedBody(*conn->session, conn->body.data(), conn->body_length);
        if (!opened.ok()) {
          spdlog::warn("coordinator: connection {} ({}): {}", conn->id, conn->peer,
                       opened.status().message());
          Close(conn, "a sealed frame did not open");
          return;
        }
        opened_words = std::move(opened).value();
        words = kj::ArrayPtr<const capnp::word>(opened_words.data(), opened_words.size());
      }
      uint64_t request_id = 0;
      auto request = wire::DecodeRequest(words, &request_id);
      // Shrink big buffers back; keep small ones for the next request.
      if (conn->body.capacity() > 4096) std::vector<uint64_t>().swap(conn->body);
      if (!request.ok()) {
        Fail(conn, request_id, request.status());
        return;
      }
      conn->last_heard = std::chrono::steady_clock::now();
      conn->heard = true;
      OnRequest(conn, std::move(request).value(), conn->body_length);
      ReadHeader(conn);
    });
  });
}

void CoordinatorImpl::ArmReadDeadline(const ConnPtr& conn, const char* what) {
  conn->read_timer->expires_after(options_.read_timeout);
  std::weak_ptr<Connection> weak = conn;
  conn->read_timer->async_wait([this, weak, what](ErrorCode ec) {
    Guard(nullptr, "read deadline", [&] {
      auto c = weak.lock();
      if (ec || !c || c->closed || c->closing) return;
      Fail(c, 0,
           Status::Timeout(fmt::format(
               "{} did not arrive within {} ms (read_timeout); allowed: whole messages, sent "
               "promptly",
               what, options_.read_timeout.count())));
    });
  });
}

void CoordinatorImpl::ArmAuthDeadline(const ConnPtr& conn) {
  conn->auth_timer = std::make_unique<asio::steady_timer>(io_);
  conn->auth_timer->expires_after(options_.read_timeout);
  std::weak_ptr<Connection> weak = conn;
  conn->auth_timer->async_wait([this, weak](ErrorCode ec) {
    Guard(nullptr, "auth deadline", [&] {
      auto c = weak.lock();
      if (ec || !c || c->closed || c->closing || c->authenticated) return;
      // Fail logs it, within the refusal budget (a stranger's loop
      // must not write a line a connection).
      Fail(c, 0,
           Status::Timeout(fmt::format(
               "no key proof within {} ms of connecting (read_timeout); allowed: authHello, then "
               "auth with a role key, promptly",
               options_.read_timeout.count())));
    });
  });
}

void CoordinatorImpl::OnRequest(const ConnPtr& conn, Request request, uint64_t bytes) {
  if (!conn->waiter && conn->queued.empty()) {
    Dispatch(conn, std::move(request));
    return;
  }
  // A stranger may not queue at all: gridsync's clients send one request at
  // a time, and four keyless connections, each waiting at a barrier of its
  // own with a quarter of the budget queued behind it, had every member's
  // next message refused (a review of the strangers' share).
  if (Stranger(*conn)) {
    Fail(conn, request.id,
         Status::InvalidArgument(fmt::format(
             "request {} arrived while an earlier request on this connection waits, and the "
             "connection has neither registered nor proved a key; allowed: one request at a time "
             "until it registers as a shard or worker (or proves its key)",
             request.id)));
    return;
  }
  // Queued behind a waiting request (a barrier may wait many minutes): its
  // bytes stay in the pending budget until it is handled. Once whole they
  // used to leave it, and two connections each holding a barrier queued 64
  // kvSets of 15 MB: 1.9 GB. Past the budget the connection is refused (it
  // pipelines, which CoordinatorClient never does); others keep theirs.
  const uint64_t held = pending_bytes_ + queued_bytes_;
  if (conn->queued_bytes + bytes > QueuedShare() || held + bytes > options_.max_pending_bytes) {
    Fail(conn, request.id,
         Status::InvalidArgument(fmt::format(
             "request {} ({} bytes) arrived while an earlier request on this connection waits, "
             "with {} bytes of requests already queued behind it; the coordinator holds {} bytes "
             "of queued requests and unfinished messages; allowed: at most {} bytes queued per "
             "connection (a quarter of max_pending_bytes) and {} in all (max_pending_bytes); send "
             "the next request once the waiting one is answered",
             request.id, bytes, conn->queued_bytes, held, QueuedShare(),
             options_.max_pending_bytes)));
    return;
  }
  conn->queued_bytes += bytes;
  queued_bytes_ += bytes;
  conn->queued.push_back(QueuedRequest{std::move(request), bytes});
}

void CoordinatorImpl::Drain(const ConnPtr& conn) {
  while (!conn->closed && !conn->closing && !conn->waiter && !conn->queued.empty()) {
    QueuedRequest next = std::move(conn->queued.front());
    conn->queued.pop_front();
    conn->queued_bytes -= next.bytes;
    queued_bytes_ -= next.bytes;
    Dispatch(conn, std::move(next.request));
  }
  ReadHeader(conn);  // resumes reading if the queue had filled up
}

void CoordinatorImpl::ClearQueue(const ConnPtr& conn) {
  queued_bytes_ -= conn->queued_bytes;
  conn->queued_bytes = 0;
  conn->queued.clear();
}

bool CoordinatorImpl::Authenticate(const ConnPtr& conn, Request& request) {
  if (conn->authenticated) {
    if (auto* reg = std::get_if<RegisterInfo>(&request.body);
        reg != nullptr && reg->role != *conn->authenticated) {
      spdlog::warn("coordinator: connection {} ({}) authenticated as {} tried to register as {}",
                   conn->id, conn->peer, RoleName(*conn->authenticated), RoleName(reg->role));
      Send(conn,
           wire::EncodeErrorReply(
               request.id, Status::InvalidArgument(fmt::format(
                               "this connection proved the {} key; allowed: register "
                               "as {} only",
                               RoleName(*conn->authenticated), RoleName(*conn->authenticated)))));
      return false;
    }
    return true;  // a second authHello/auth is refused by Dispatch
  }
  if (std::holds_alternative<AuthHelloRequest>(request.body)) {
    conn->challenge = wire::RandomBytes(32);
    Send(conn, wire::EncodeChallengeReply(request.id, conn->challenge));
    return false;
  }
  if (auto* auth = std::get_if<AuthRequest>(&request.body)) {
    const std::string role = RoleName(auth->role);
    const std::string challenge = conn->challenge;
    Status proof =
        conn->challenge.empty()
            ? Status::InvalidArgument("auth before authHello; allowed: authHello, then auth")
            : wire::OpenChallenge(options_.auth, role, conn->challenge, auth->nonce, auth->box);
    conn->challenge.clear();  // one proof per challenge
    if (!proof.ok()) {
      // One line, within the refusal budget (Fail): four looping wrong-key
      // monitors wrote a warning a connection, 500 in 11 s (a hostile probe).
      Fail(conn, request.id,
           Status(proof.code(), "failed to authenticate as " + role + ": " + proof.message()));
      return false;
    }
    auto session = wire::ControlSession::Derive(options_.auth, options_.auth.role_public.at(role),
                                                challenge, /*coordinator_side=*/true);
    if (!session.ok()) {
      Fail(conn, request.id, session.status());
      return false;
    }
    conn->authenticated = auth->role;
    spdlog::debug("coordinator: connection {} ({}) authenticated as {}", conn->id, conn->peer,
                  role);
    Send(conn, wire::EncodeOkReply(request.id));  // the last frame in the clear
    conn->session = std::move(session).value();
    return false;
  }
  Fail(conn, request.id,  // logged there, within the refusal budget
       Status::InvalidArgument("unauthenticated connection: this coordinator runs security.mode "
                               "curve (a client with security.mode off sends no key); allowed "
                               "first: authHello, then auth with a role key (security.keys_dir)"));
  return false;
}

void CoordinatorImpl::Dispatch(const ConnPtr& conn, Request request) {
  const uint64_t id = request.id;
  if (options_.auth.on && !Authenticate(conn, request)) return;
  std::visit(
      [&](auto& body) {
        using T = std::decay_t<decltype(body)>;
        if constexpr (std::is_same_v<T, RegisterInfo>) {
          HandleRegister(conn, id, std::move(body));
        } else if constexpr (std::is_same_v<T, GetMapRequest>) {
          HandleGetMap(conn, id, body);
        } else if constexpr (std::is_same_v<T, BarrierRequest>) {
          HandleBarrier(conn, id, std::move(body));
        } else if constexpr (std::is_same_v<T, KvSetRequest>) {
          HandleKvSet(conn, id, std::move(body));
        } else if constexpr (std::is_same_v<T, KvGetRequest>) {
          HandleKvGet(conn, id, std::move(body));
        } else if constexpr (std::is_same_v<T, HeartbeatRequest>) {
          Send(conn, wire::EncodeOkReply(id));
        } else {
          // authHello/auth without security, or auth once authenticated.
          Fail(conn, id,
               Status::InvalidArgument(options_.auth.on
                                           ? "this connection is already authenticated"
                                           : "authentication is off on this coordinator "
                                             "(its config's security.mode resolves to off); "
                                             "allowed: any other request, or the same "
                                             "security.mode on every process"));
        }
      },
      request.body);
}

}  // namespace coordinator_engine
}  // namespace gridsync
