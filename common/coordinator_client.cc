// CoordinatorClient: one TCP connection, synchronous calls with deadlines.
//
// Each call runs its socket operations as Asio async operations on a private
// io_context with run_until(deadline); an operation still pending at the
// deadline is cancelled by closing the socket. After a timeout or an I/O
// error the stream position is unknown (a reply may be half read), so the
// connection is closed and every later call fails with the reason: the
// caller reconnects. Note that the coordinator drops a member's registration
// when its connection closes.
//
// A call that waits on the coordinator (getMap with waitComplete, barrier,
// kvGet) gives the server its own timeout and waits that long plus
// kWaitMargin, so the server's descriptive timeout error (who or what is
// missing) normally arrives first.
//
// The bytes (frames, roles, members, maps, tables, error replies) are
// common/wire/coord_codec.h's, the same code the coordinator encodes and
// decodes with; the Fill and Parse lambdas below only pick the union member.
#include "common/coordinator_client.h"

#include <capnp/message.h>
#include <capnp/serialize.h>
#include <kj/exception.h>
#include <spdlog/fmt/fmt.h>
#include <spdlog/spdlog.h>

#include <algorithm>
#include <array>
#include <boost/asio.hpp>
#include <limits>
#include <optional>
#include <thread>
#include <utility>

#include "common/tcp_backoff.h"
#include "common/wire/coord_codec.h"

namespace gridsync {
namespace {

namespace asio = boost::asio;
using tcp = asio::ip::tcp;
using ErrorCode = boost::system::error_code;
using Clock = std::chrono::steady_clock;
namespace schema = wire::schema;
using wire::AsData;
using wire::AsText;

constexpr auto kWaitMargin = std::chrono::seconds(2);
// Calls that do not wait on anything still get a deadline.
constexpr auto kIoTimeout = std::chrono::seconds(10);
constexpr auto kRetryInterval = std::chrono::milliseconds(100);
// A reply is at most a map or kvGet values; this only bounds allocation.
constexpr uint32_t kMaxReplyBytes = 256u << 20;

double SecondsOf(std::chrono::milliseconds ms) { return static_cast<double>(ms.count()) / 1000.0; }

uint32_t ToTimeoutMs(std::chrono::milliseconds timeout) {
  if (timeout.count() <= 0) return 0;
  return static_cast<uint32_t>(
      std::min<int64_t>(timeout.count(), std::numeric_limits<uint32_t>::max()));
}

}  // namespace

class CoordinatorClient::Impl {
 public:
  Impl(std::string host, uint16_t port)
      : host_(std::move(host)),
        port_(port),
        address_(fmt::format("{}:{}", host_, port_)),
        socket_(io_) {}
  ~Impl() {
    ErrorCode ignored;
    socket_.close(ignored);
  }

  // One connection attempt, bounded by `deadline`.
  ErrorCode TryConnect(Clock::time_point deadline) {
    ErrorCode ec;
    tcp::resolver resolver(io_);
    auto endpoints = resolver.resolve(host_, std::to_string(port_), ec);
    if (ec) return ec;
    ErrorCode ignored;
    socket_.close(ignored);
    ec = Run(
        [&](auto handler) {
          asio::async_connect(
              socket_, endpoints,
              [handler](const ErrorCode& e, const tcp::endpoint&) mutable { handler(e); });
        },
        deadline);
    if (ec) return ec;
    socket_.set_option(tcp::no_delay(true), ignored);
    // Requests sent during an outage reach the coordinator within a second
    // of its end, not on TCP's doubled timer (common/tcp_backoff.h).
    if (const std::string why = CapRetransmitBackoff(socket_.native_handle()); !why.empty()) {
      spdlog::debug("coordinator client: {}", why);
    }
    return ec;
  }

  const std::string& address() const { return address_; }

  // After a proof: every later frame is sealed (wire::ControlSession).
  void StartSession(wire::ControlSession session) {
    std::lock_guard<std::mutex> lock(mu_);
    session_ = std::move(session);
  }

  void SetReplyTimeout(std::chrono::milliseconds timeout) {
    std::lock_guard<std::mutex> lock(mu_);
    reply_timeout_ = std::max(timeout, std::chrono::milliseconds(1));
  }

  // Sends the request `fill` builds and returns `parse` of the reply, or the
  // coordinator's error. `wait` is how long the server may hold the reply.
  template <typename T, typename Fill, typename Parse>
  Result<T> Call(const char* what, std::chrono::milliseconds wait, Fill&& fill, Parse&& parse) {
    std::lock_guard<std::mutex> lock(mu_);
    if (!broken_.ok()) {
      return Status::IOError(
          fmt::format("{}: the connection to the coordinator at {} is closed ({}); reconnect", what,
                      address_, broken_.message()));
    }
    const uint64_t id = next_request_id_++;
    const auto budget = std::chrono::duration_cast<std::chrono::milliseconds>(
        wait.count() > 0 ? wait + kWaitMargin : reply_timeout_);
    const auto deadline = Clock::now() + budget;

    std::vector<uint8_t> frame;
    try {
      capnp::MallocMessageBuilder message;
      auto request = message.initRoot<schema::CoordRequest>();
      request.setRequestId(id);
      fill(request);
      frame = wire::EncodeFrame(message);
      if (session_) frame = session_->Seal(frame);
    } catch (const kj::Exception& e) {
      return Status::InvalidArgument(
          fmt::format("{}: cannot build the request: {}", what, e.getDescription().cStr()));
    }

    auto io_failure = [&](const char* step, const ErrorCode& ec) -> Status {
      Status status;
      if (ec == asio::error::timed_out) {
        // The budget of a held request is its wait plus a margin: both are
        // named, so that 5.0 s is not read against a timeout_s of 3.
        const std::string of = wait.count() > 0
                                   ? fmt::format(
                                         " (the wait of {:.1f} s it asked for, plus {:.1f} s "
                                         "for the coordinator's own answer)",
                                         SecondsOf(wait), SecondsOf(kWaitMargin))
                                   : std::string(" (the reply timeout)");
        status = Status::Timeout(fmt::format(
            "{}: no reply from the coordinator at {} within {:.1f} s{} (request {}, {} timed out)",
            what, address_, SecondsOf(budget), of, id, step));
      } else if (ec == asio::error::eof || ec == asio::error::connection_reset) {
        // It read "receive ... failed: Connection reset by peer": the peer
        // hung up, whatever listens there (a probe of the wrong port).
        status = Status::IOError(fmt::format(
            "{}: the coordinator at {} closed the connection ({}: {}): it stopped or refused "
            "this member (its log says which), or this is not a gridsync coordinator's port",
            what, address_, step, ec.message()));
      } else {
        status = Status::IOError(fmt::format("{}: {} to the coordinator at {} failed: {}", what,
                                             step, address_, ec.message()));
      }
      MarkBroken(status);
      return status;
    };

    ErrorCode ec = Run(
        [&](auto handler) {
          asio::async_write(socket_, asio::buffer(frame),
                            [handler](const ErrorCode& e, size_t) mutable { handler(e); });
        },
        deadline);
    if (ec) return io_failure("send", ec);

    std::array<uint8_t, wire::kFramePrefixBytes> header{};
    ec = Run(
        [&](auto handler) {
          asio::async_read(socket_, asio::buffer(header),
                           [handler](const ErrorCode& e, size_t) mutable { handler(e); });
        },
        deadline);
    if (ec) return io_failure("receive", ec);
    const uint32_t length = wire::DecodeFramePrefix(header);
    if (wire::CheckFrameLength(length, wire::FrameLimit(kMaxReplyBytes, session_.has_value())) !=
        wire::FrameLengthCheck::kOk) {
      // Printable bytes where a length belongs: another protocol answered
      // (an HTTP server says "HTTP").
      const bool text = std::all_of(header.begin(), header.end(),
                                    [](uint8_t c) { return c >= 0x20 && c < 0x7f; });
      // ZMTP's greeting opens with 0xff and padding: a ZeroMQ socket (a PS
      // shard's data port) answered, not the coordinator's control port.
      const bool zmtp = header[0] == 0xff && header[1] == 0 && header[2] == 0 && header[3] == 0;
      const std::string shown(header.begin(), header.end());
      Status status = Status::Corruption(fmt::format(
          "{}: the coordinator at {} sent a reply of {} bytes{}; allowed: a multiple of 8 from 8 "
          "to {}",
          what, address_, length,
          text ? " (its first bytes read \"" + shown +
                     "\": another protocol answered; is this a gridsync coordinator's port?)"
          : zmtp ? std::string(" (its first bytes are a ZeroMQ greeting: a ZeroMQ socket, such as "
                               "a PS shard's data port, answered; distributed.master_port names "
                               "the coordinator's control port)")
                 : std::string(),
          kMaxReplyBytes));
      MarkBroken(status);
      return status;
    }
    // The body grows as its bytes arrive (1 MiB at a time): a peer that
    // announces the largest reply and then trickles must not cost that
    // much memory up front, on every connection it answers.
    // Words as uint64_t: capnp::word is not copyable under clang, so a
    // vector of it cannot grow.
    constexpr size_t kReadChunk = size_t{1} << 20;
    std::vector<uint64_t> body;
    for (size_t read = 0; read < length && !ec;) {
      const size_t chunk = std::min<size_t>(kReadChunk, length - read);
      body.resize((read + chunk) / 8);
      ec = Run(
          [&](auto handler) {
            asio::async_read(socket_,
                             asio::buffer(reinterpret_cast<uint8_t*>(body.data()) + read, chunk),
                             [handler](const ErrorCode& e, size_t) mutable { handler(e); });
          },
          deadline);
      read += chunk;
    }
    if (ec) return io_failure("receive", ec);
    kj::ArrayPtr<const capnp::word> words(reinterpret_cast<const capnp::word*>(body.data()),
                                          body.size());
    std::vector<capnp::word> opened_body;  // a sealed reply's plain text
    if (session_) {
      auto opened = wire::OpenSealedBody(*session_, body.data(), length);
      if (!opened.ok()) {
        Status status = Status::Corruption(
            fmt::format("{}: a reply from the coordinator at {} did not open: {}", what, address_,
                        opened.status().message()));
        MarkBroken(status);
        return status;
      }
      opened_body = std::move(opened).value();
      words = kj::ArrayPtr<const capnp::word>(opened_body.data(), opened_body.size());
    }

    try {
      capnp::FlatArrayMessageReader reader(words, wire::FrameReaderOptions(words.size()));
      auto reply = reader.getRoot<schema::CoordReply>();
      // Request 0 is the coordinator refusing the connection itself (a
      // frame it could not take: its length, a budget, a deadline) before
      // it knew which request it held: its own words say why, and the
      // connection is closed behind it.
      if (reply.getRequestId() == 0 && reply.isError() && id != 0) {
        const Status refused = wire::StatusFromWire(reply.getError());
        Status status(refused.code(), fmt::format("{}: the coordinator at {} refused this "
                                                  "connection: {}",
                                                  what, address_, refused.message()));
        MarkBroken(status);
        return status;
      }
      if (reply.getRequestId() != id) {
        Status status = Status::Corruption(fmt::format(
            "{}: the coordinator at {} answered request {} while request {} was in flight", what,
            address_, reply.getRequestId(), id));
        MarkBroken(status);
        return status;
      }
      if (reply.isError()) return wire::StatusFromWire(reply.getError());
      return parse(reply);
    } catch (const kj::Exception& e) {
      Status status = Status::Corruption(
          fmt::format("{}: the reply from the coordinator at {} does not decode: {}", what,
                      address_, e.getDescription().cStr()));
      MarkBroken(status);
      return status;
    }
  }

 private:
  // Starts one async operation through `start(handler)` and runs the
  // io_context until it completes or `deadline` passes (then the socket is
  // closed, which cancels it, and timed_out is returned).
  template <typename Start>
  ErrorCode Run(Start&& start, Clock::time_point deadline) {
    std::optional<ErrorCode> result;
    start([&result](const ErrorCode& ec) { result = ec; });
    io_.restart();
    while (!result) {
      if (io_.run_one_until(deadline) == 0) break;
    }
    if (!result) {
      ErrorCode ignored;
      socket_.close(ignored);
      io_.restart();
      io_.run();  // lets the cancelled operation finish
      return asio::error::timed_out;
    }
    return *result;
  }

  void MarkBroken(const Status& status) {
    broken_ = status;
    ErrorCode ignored;
    socket_.close(ignored);
  }

  std::string host_;
  uint16_t port_;
  std::string address_;
  std::mutex mu_;  // one call at a time; guards everything below
  std::chrono::milliseconds reply_timeout_ = kIoTimeout;
  asio::io_context io_;
  tcp::socket socket_;
  uint64_t next_request_id_ = 1;
  Status broken_;                                // not OK once the connection is unusable
  std::optional<wire::ControlSession> session_;  // security: frames sealed after the proof
};

CoordinatorClient::CoordinatorClient(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
CoordinatorClient::~CoordinatorClient() = default;

Result<std::unique_ptr<CoordinatorClient>> CoordinatorClient::Connect(
    const std::string& host, uint16_t port, std::chrono::milliseconds timeout,
    const wire::ControlAuth& auth, Role role) {
  auto impl = std::make_unique<Impl>(host, port);
  const auto start = Clock::now();
  const auto deadline = start + timeout;
  int attempts = 0;
  for (;;) {
    ++attempts;
    ErrorCode ec = impl->TryConnect(deadline);
    if (!ec) break;
    const auto now = Clock::now();
    if (now + kRetryInterval >= deadline) {
      // Unavailable: a worker that never reached its coordinator joined
      // nothing, so its unit may restart it into a later start (exit 4).
      return Status::Unavailable(fmt::format(
          "cannot connect to the coordinator at {} within {:g} s ({} attempt{}): {}",
          impl->address(), SecondsOf(timeout), attempts, attempts == 1 ? "" : "s",
          ec == asio::error::timed_out ? std::string("connect timed out") : ec.message()));
    }
    std::this_thread::sleep_for(kRetryInterval);
  }
  std::unique_ptr<CoordinatorClient> client(new CoordinatorClient(std::move(impl)));
  if (auth.on) GRIDSYNC_RETURN_IF_ERROR(client->Authenticate(auth, role));
  return client;
}

Status CoordinatorClient::Authenticate(const wire::ControlAuth& auth, Role role) {
  GRIDSYNC_ASSIGN_OR_RETURN(
      std::string challenge,
      impl_->Call<std::string>(
          "authHello", std::chrono::milliseconds(0),
          [](schema::CoordRequest::Builder request) { request.setAuthHello(); },
          [](schema::CoordReply::Reader reply) -> Result<std::string> {
            if (!reply.isChallenge()) {
              return Status::Corruption("authHello: the coordinator's reply is not a challenge");
            }
            return wire::StringOf(reply.getChallenge());
          }));
  std::string nonce, box;
  GRIDSYNC_RETURN_IF_ERROR(wire::BoxChallenge(auth, challenge, &nonce, &box));
  auto done = impl_->Call<bool>(
      "auth", std::chrono::milliseconds(0),
      [&](schema::CoordRequest::Builder request) {
        auto a = request.initAuth();
        a.setRole(wire::RoleToWire(role));
        a.setNonce(AsData(nonce));
        a.setBox(AsData(box));
      },
      [](schema::CoordReply::Reader reply) -> Result<bool> {
        if (!reply.isOk()) return Status::Corruption("auth: the coordinator's reply is not ok");
        return true;
      });
  if (!done.ok()) {
    return done.status().WithContext(std::string("proving the ") + RoleName(role) +
                                     " key to the coordinator");
  }
  // From here on every frame is sealed; only the real coordinator holds the
  // key to the first reply.
  GRIDSYNC_ASSIGN_OR_RETURN(wire::ControlSession session,
                            wire::ControlSession::Derive(auth, auth.coordinator_public, challenge,
                                                         /*coordinator_side=*/false));
  impl_->StartSession(std::move(session));
  return Status::OK();
}

Result<CoordinatorClient::Registration> CoordinatorClient::RegisterAgain(
    const RegisterInfo& info, std::chrono::milliseconds timeout) {
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  for (;;) {
    auto registered = Register(info, timeout);
    if (registered.ok() || registered.status().code() != StatusCode::kInvalidArgument ||
        registered.status().message().find("taken") == std::string::npos ||
        std::chrono::steady_clock::now() >= deadline) {
      return registered;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
}

Result<CoordinatorClient::Registration> CoordinatorClient::Register(
    const RegisterInfo& info, std::chrono::milliseconds timeout) {
  return impl_->Call<Registration>(
      "register", timeout,
      [&](schema::CoordRequest::Builder request) {
        wire::RegisterToWire(info, request.initRegister());
      },
      [](schema::CoordReply::Reader reply) -> Result<Registration> {
        if (!reply.isRegistered()) {
          return Status::Corruption("register: the coordinator's reply is not 'registered'");
        }
        Registration registration;
        registration.rank = reply.getRegistered().getRank();
        GRIDSYNC_ASSIGN_OR_RETURN(registration.map,
                                  wire::MapFromWire(reply.getRegistered().getMap()));
        return registration;
      });
}

void CoordinatorClient::SetReplyTimeout(std::chrono::milliseconds timeout) {
  impl_->SetReplyTimeout(timeout);
}

Result<ClusterMap> CoordinatorClient::GetMap(bool wait_complete,
                                             std::chrono::milliseconds timeout) {
  return impl_->Call<ClusterMap>(
      "getMap", wait_complete ? timeout : std::chrono::milliseconds(0),
      [&](schema::CoordRequest::Builder request) {
        auto get = request.initGetMap();
        get.setWaitComplete(wait_complete);
        get.setTimeoutMs(ToTimeoutMs(timeout));
      },
      [](schema::CoordReply::Reader reply) -> Result<ClusterMap> {
        if (!reply.isMap())
          return Status::Corruption("getMap: the coordinator's reply is not a map");
        return wire::MapFromWire(reply.getMap());
      });
}

Result<JobState> CoordinatorClient::CurrentJob() {
  GRIDSYNC_ASSIGN_OR_RETURN(const ClusterMap map, GetMap(false, std::chrono::milliseconds(0)));
  JobState state{map.job, map.epoch, map.resume_step, {}};
  for (const MemberInfo& m : map.workers) state.workers.push_back(m.rank);
  std::sort(state.workers.begin(), state.workers.end());
  return state;
}

Status CoordinatorClient::Barrier(const std::string& name, uint32_t count,
                                  const std::string& member, std::chrono::milliseconds timeout) {
  auto result = impl_->Call<bool>(
      "barrier", timeout,
      [&](schema::CoordRequest::Builder request) {
        auto barrier = request.initBarrier();
        barrier.setName(AsText(name));
        barrier.setCount(count);
        barrier.setTimeoutMs(ToTimeoutMs(timeout));
        barrier.setMember(AsText(member));
      },
      [](schema::CoordReply::Reader reply) -> Result<bool> {
        if (!reply.isOk()) return Status::Corruption("barrier: the coordinator's reply is not ok");
        return true;
      });
  return result.ok() ? Status::OK() : result.status();
}

Status CoordinatorClient::Set(const std::string& key, const std::string& value) {
  auto result = impl_->Call<bool>(
      "kvSet", std::chrono::milliseconds(0),
      [&](schema::CoordRequest::Builder request) {
        auto set = request.initKvSet();
        set.setKey(AsText(key));
        set.setValue(AsData(value));
      },
      [](schema::CoordReply::Reader reply) -> Result<bool> {
        if (!reply.isOk()) return Status::Corruption("kvSet: the coordinator's reply is not ok");
        return true;
      });
  return result.ok() ? Status::OK() : result.status();
}

void ReportCannotJoin(CoordinatorClient& client, Role role, uint32_t rank, const Status& why) {
  // The coordinator bounds what a process that never registered may store;
  // the reason's head is what the others need.
  constexpr size_t kMaxReasonBytes = 1024;
  std::string reason = why.ToString();
  if (reason.size() > kMaxReasonBytes) reason.resize(kMaxReasonBytes);
  const Status told = client.Set(CannotJoinKey(role, rank), reason);
  if (!told.ok()) {
    spdlog::warn("{} {}: could not tell the coordinator why it cannot join: {}", RoleName(role),
                 rank, told.ToString());
  }
}

Result<std::vector<std::string>> CoordinatorClient::Get(const std::vector<std::string>& keys,
                                                        std::chrono::milliseconds timeout) {
  return impl_->Call<std::vector<std::string>>(
      "kvGet", timeout,
      [&](schema::CoordRequest::Builder request) {
        auto get = request.initKvGet();
        auto list = get.initKeys(static_cast<unsigned>(keys.size()));
        for (size_t i = 0; i < keys.size(); ++i)
          list.set(static_cast<unsigned>(i), AsText(keys[i]));
        get.setTimeoutMs(ToTimeoutMs(timeout));
      },
      [&](schema::CoordReply::Reader reply) -> Result<std::vector<std::string>> {
        if (!reply.isValues())
          return Status::Corruption("kvGet: the coordinator's reply is not values");
        auto values = reply.getValues();
        if (values.size() != keys.size()) {
          return Status::Corruption(
              fmt::format("kvGet: asked for {} keys, the coordinator sent {} values", keys.size(),
                          values.size()));
        }
        return wire::ValuesFromWire(values);
      });
}

Status CoordinatorClient::Heartbeat() {
  auto result = impl_->Call<bool>(
      "heartbeat", std::chrono::milliseconds(0),
      [](schema::CoordRequest::Builder request) { request.setHeartbeat(); },
      [](schema::CoordReply::Reader reply) -> Result<bool> {
        if (!reply.isOk())
          return Status::Corruption("heartbeat: the coordinator's reply is not ok");
        return true;
      });
  return result.ok() ? Status::OK() : result.status();
}

Status CoordinatorStore::Set(const std::string& key, const std::string& value) {
  return client_->Set(prefix_ + key, value);
}

Result<std::vector<std::string>> CoordinatorStore::Get(const std::vector<std::string>& keys,
                                                       std::chrono::milliseconds timeout) {
  std::vector<std::string> prefixed;
  prefixed.reserve(keys.size());
  for (const auto& key : keys) prefixed.push_back(prefix_ + key);
  return client_->Get(prefixed, timeout);
}

}  // namespace gridsync
