#include "ops/metrics_http.h"

#include <spdlog/spdlog.h>

#include <array>
#include <atomic>
#include <boost/asio/io_context.hpp>
#include <boost/asio/ip/tcp.hpp>
#include <boost/asio/post.hpp>
#include <boost/asio/steady_timer.hpp>
#include <boost/beast/core.hpp>
#include <boost/beast/http.hpp>
#include <list>
#include <string_view>
#include <thread>
#include <utility>

namespace gridsync {

namespace asio = boost::asio;
namespace beast = boost::beast;
namespace http = beast::http;
using tcp = asio::ip::tcp;

namespace {

// What one request may take of the read buffer: its 8 KiB of header and
// whatever else the same reads brought. The parser's header and body
// limits do not bound the buffer: a chunk header without its end of line
// ("1;" then endless bytes) grew it to 570 MB in the 2 s deadline (a
// hostile probe).
constexpr size_t kMaxRequestBufferBytes = 16 * 1024;

// One connection: a request read under the deadline, one reply, close.
struct Session {
  explicit Session(tcp::socket s)
      : socket(std::move(s)), timer(socket.get_executor()), buffer(kMaxRequestBufferBytes) {}
  tcp::socket socket;
  asio::steady_timer timer;
  beast::flat_buffer buffer;  // at most kMaxRequestBufferBytes
  http::request_parser<http::empty_body> parser;
  http::response<http::string_body> reply;
  std::array<char, 4096> drain;                      // what a refused client still sends
  std::list<std::shared_ptr<Session>>::iterator at;  // in Impl::open_
  bool closed = false;
};

// The parser's own verdicts on the bytes, not a connection that closed
// or was cut off before a whole request came.
bool IsMalformed(const beast::error_code& ec) {
  return ec.category() == http::make_error_code(http::error::bad_target).category() &&
         ec != http::error::end_of_stream && ec != http::error::partial_message;
}

}  // namespace

class MetricsHttpServer::Impl {
 public:
  Impl(std::function<std::string()> render, MetricsHttpLimits limits)
      : render_(std::move(render)), limits_(limits), acceptor_(io_), retry_(io_) {}

  Status Listen(const std::string& host, uint16_t port) {
    beast::error_code ec;
    tcp::resolver resolver(io_);
    const auto found = resolver.resolve(host, std::to_string(port), ec);
    if (ec || found.empty()) return Status::IOError("cannot resolve '" + host + "'");
    const tcp::endpoint endpoint = found.begin()->endpoint();
    acceptor_.open(endpoint.protocol(), ec);
    if (!ec) acceptor_.set_option(asio::socket_base::reuse_address(true), ec);
    if (!ec) acceptor_.bind(endpoint, ec);
    if (!ec) acceptor_.listen(asio::socket_base::max_listen_connections, ec);
    if (ec) return Status::IOError(ec.message());
    port_ = acceptor_.local_endpoint(ec).port();
    Accept();
    thread_ = std::thread([this] { io_.run(); });
    return Status::OK();
  }

  void Stop() {
    asio::post(io_, [this] {
      beast::error_code ignored;
      acceptor_.close(ignored);
      retry_.cancel();
      while (!open_.empty()) Close(open_.front());
      io_.stop();
    });
    if (thread_.joinable()) thread_.join();
  }

  uint16_t port() const { return port_; }
  uint64_t evicted() const { return evicted_.load(std::memory_order_relaxed); }

 private:
  void Accept() {
    acceptor_.async_accept([this](beast::error_code ec, tcp::socket socket) {
      if (ec == asio::error::operation_aborted) return;
      if (!ec) return Serve(std::move(socket)), Accept();
      // Errors such as EMFILE: try again in 100 ms rather than spin.
      retry_.expires_after(std::chrono::milliseconds(100));
      retry_.async_wait([this](beast::error_code timer_ec) {
        if (!timer_ec) Accept();
      });
    });
  }

  void Serve(tcp::socket socket) {
    if (open_.size() >= limits_.max_connections) {
      evicted_.fetch_add(1, std::memory_order_relaxed);
      Close(open_.front());
    }
    auto session = std::make_shared<Session>(std::move(socket));
    session->at = open_.insert(open_.end(), session);
    session->parser.header_limit(8 * 1024);
    session->parser.body_limit(0);
    session->timer.expires_after(limits_.request_timeout);
    session->timer.async_wait([this, session](beast::error_code ec) {
      if (!ec) Close(session);  // no whole request in time
    });
    http::async_read(
        session->socket, session->buffer, session->parser,
        [this, session](beast::error_code ec, size_t) {
          if (session->closed) return;
          if (ec == http::error::header_limit) {
            return Refuse(session, http::status::request_header_fields_too_large,
                          "the request's header is over 8 KiB; allowed: GET "
                          "/metrics with at most 8 KiB of header\n");
          }
          if (ec == http::error::body_limit || ec == http::error::buffer_overflow) {
            return Refuse(session, http::status::payload_too_large,
                          "a request body is not allowed; allowed: GET or HEAD "
                          "/metrics without a body\n");
          }
          if (IsMalformed(ec)) {
            return Refuse(session, http::status::bad_request,
                          "malformed HTTP request (" + ec.message() + "); allowed: GET /metrics\n");
          }
          if (ec) return Close(session);  // gone, or cut off mid-request
          Reply(session);
        });
  }

  void Reply(const std::shared_ptr<Session>& session) {
    const auto& request = session->parser.get();
    auto& reply = session->reply;
    reply.version(request.version());
    reply.keep_alive(false);
    reply.set(http::field::server, "gridsync");
    const bool head = request.method() == http::verb::head;
    // The path without a query: Prometheus adds one for a scrape config's
    // `params`, which a single endpoint has no use for.
    const std::string_view target(request.target().data(), request.target().size());
    if (target.substr(0, target.find('?')) != "/metrics") {
      reply.result(http::status::not_found);
      reply.set(http::field::content_type, "text/plain");
      reply.body() = "not found; allowed: GET /metrics\n";
    } else if (request.method() != http::verb::get && !head) {
      reply.result(http::status::method_not_allowed);
      reply.set(http::field::allow, "GET, HEAD");
      reply.body() = "allowed: GET or HEAD\n";
    } else {
      reply.result(http::status::ok);
      reply.set(http::field::content_type, "text/plain; version=0.0.4");
      try {
        reply.body() = render_();
      } catch (const std::exception& e) {
        reply.result(http::status::internal_server_error);
        reply.body() = std::string("metrics could not be read: ") + e.what() + "\n";
      }
    }
    reply.prepare_payload();
    if (head) reply.body().clear();  // the length stays the GET's
    http::async_write(session->socket, reply,
                      [this, session](beast::error_code, size_t) { Close(session); });
  }

  // A request that cannot be served gets its status line and a body that
  // says what is allowed (a scraper misconfigured by hand sees why). The
  // connection then lingers: our side is shut for sending and what the
  // client still sends is read and dropped until it closes or the request
  // deadline passes, because closing with unread bytes resets the
  // connection and the client may lose the reply.
  void Refuse(const std::shared_ptr<Session>& session, http::status status, std::string why) {
    auto& reply = session->reply;
    reply.version(11);
    reply.keep_alive(false);
    reply.result(status);
    reply.set(http::field::server, "gridsync");
    reply.set(http::field::content_type, "text/plain");
    reply.body() = std::move(why);
    reply.prepare_payload();
    http::async_write(session->socket, reply, [this, session](beast::error_code ec, size_t) {
      if (session->closed) return;
      if (ec) return Close(session);
      beast::error_code ignored;
      session->socket.shutdown(tcp::socket::shutdown_send, ignored);
      Drain(session);
    });
  }

  void Drain(const std::shared_ptr<Session>& session) {
    session->socket.async_read_some(
        asio::buffer(session->drain), [this, session](beast::error_code ec, size_t) {
          if (session->closed) return;
          if (ec) return Close(session);  // the client closed, or the deadline did
          Drain(session);
        });
  }

  // By value: erasing the session from open_ may drop a caller's reference.
  void Close(std::shared_ptr<Session> session) {
    if (session->closed) return;
    session->closed = true;
    beast::error_code ignored;
    session->timer.cancel();
    session->socket.shutdown(tcp::socket::shutdown_both, ignored);
    session->socket.close(ignored);
    open_.erase(session->at);
  }

  std::function<std::string()> render_;
  const MetricsHttpLimits limits_;
  asio::io_context io_;
  tcp::acceptor acceptor_;
  asio::steady_timer retry_;  // after a failed accept
  uint16_t port_ = 0;
  std::list<std::shared_ptr<Session>> open_;  // the server thread's, oldest first
  std::atomic<uint64_t> evicted_{0};
  std::thread thread_;
};

Result<std::unique_ptr<MetricsHttpServer>> MetricsHttpServer::Start(
    const std::string& host, uint16_t port, std::function<std::string()> render,
    MetricsHttpLimits limits) {
  auto impl = std::make_unique<Impl>(std::move(render), limits);
  GRIDSYNC_RETURN_IF_ERROR(impl->Listen(host, port));
  return std::unique_ptr<MetricsHttpServer>(new MetricsHttpServer(std::move(impl)));
}

MetricsHttpServer::MetricsHttpServer(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
MetricsHttpServer::~MetricsHttpServer() { impl_->Stop(); }
uint16_t MetricsHttpServer::port() const { return impl_->port(); }
uint64_t MetricsHttpServer::evicted() const { return impl_->evicted(); }

}  // namespace gridsync
