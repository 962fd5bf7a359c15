// ScrapeMetrics (ops/metrics_scrape.h) against real sockets on 127.0.0.1:
// a good endpoint is read, and one that accepts and then never answers, or
// answers a byte at a time forever, costs the scrape its timeout and no
// more (a hostile probe held `gridsync monitor --once` 40 s, past SIGTERM:
// beast's deadline did not apply to the blocking calls it used).
#include "ops/metrics_scrape.h"

#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cmath>
#include <string>
#include <thread>
#include <vector>

#include "ops/metrics.h"
#include "tests/loopback_listener.h"

namespace gridsync {
namespace {

using Clock = std::chrono::steady_clock;
using namespace std::chrono_literals;

// A listener on 127.0.0.1 whose one thread serves each connection with
// `serve(fd)` until stopped.
class FakeEndpoint {
 public:
  template <typename Serve>
  explicit FakeEndpoint(Serve serve) {
    fd_ = testing::ListenOnLoopback(&port_, 8);
    thread_ = std::thread([this, serve] {
      for (;;) {
        const int conn = ::accept(fd_, nullptr, nullptr);
        if (conn < 0) return;  // the listener was shut down
        serve(conn, stop_);
        ::close(conn);
      }
    });
  }
  ~FakeEndpoint() {
    stop_ = true;
    ::shutdown(fd_, SHUT_RDWR);
    thread_.join();
    ::close(fd_);
  }
  std::string address() const { return "127.0.0.1:" + std::to_string(port_); }

 private:
  int fd_ = -1;
  uint16_t port_ = 0;
  std::atomic<bool> stop_{false};
  std::thread thread_;
};

void ReadRequest(int fd) {
  char buffer[4096];
  (void)::recv(fd, buffer, sizeof(buffer), 0);
}

TEST(MetricsScrapeTest, ReadsAGoodEndpoint) {
  FakeEndpoint endpoint([](int fd, const std::atomic<bool>&) {
    ReadRequest(fd);
    const std::string body = "# TYPE up gauge\nup{role=\"worker\"} 1\nsteps 42\n";
    const std::string reply =
        "HTTP/1.1 200 OK\r\nContent-Length: " + std::to_string(body.size()) + "\r\n\r\n" + body;
    (void)::send(fd, reply.data(), reply.size(), MSG_NOSIGNAL);
  });
  auto scraped = ScrapeMetrics(endpoint.address(), 2000ms);
  ASSERT_TRUE(scraped.ok()) << scraped.status().ToString();
  EXPECT_EQ(MetricValue(*scraped, "steps"), 42);
  EXPECT_EQ(MetricValue(*scraped, "up", {{"role", "worker"}}), 1);
}

TEST(MetricsScrapeTest, AnEndpointThatNeverAnswersCostsTheTimeout) {
  FakeEndpoint endpoint([](int fd, const std::atomic<bool>& stop) {
    ReadRequest(fd);
    while (!stop) std::this_thread::sleep_for(10ms);  // holds the connection, says nothing
  });
  const auto start = Clock::now();
  auto scraped = ScrapeMetrics(endpoint.address(), 300ms);
  const auto took = Clock::now() - start;
  ASSERT_FALSE(scraped.ok());
  EXPECT_EQ(scraped.status().code(), StatusCode::kTimeout) << scraped.status().ToString();
  EXPECT_NE(scraped.status().message().find("reading the reply"), std::string::npos)
      << scraped.status().message();
  EXPECT_LT(took, 2s);
}

TEST(MetricsScrapeTest, AReplyTrickledForeverCostsTheTimeout) {
  FakeEndpoint endpoint([](int fd, const std::atomic<bool>& stop) {
    ReadRequest(fd);
    const std::string head = "HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n";
    (void)::send(fd, head.data(), head.size(), MSG_NOSIGNAL);
    while (!stop) {
      if (::send(fd, "1\r\nx\r\n", 6, MSG_NOSIGNAL) < 0) return;
      std::this_thread::sleep_for(20ms);
    }
  });
  const auto start = Clock::now();
  auto scraped = ScrapeMetrics(endpoint.address(), 300ms);
  ASSERT_FALSE(scraped.ok());
  EXPECT_EQ(scraped.status().code(), StatusCode::kTimeout) << scraped.status().ToString();
  EXPECT_LT(Clock::now() - start, 2s);
}

// An endpoint that answers every request with `reply` and then, when
// `endless` is set, sends `endless` until the client goes.
FakeEndpoint Answering(std::string reply, std::string endless = "") {
  return FakeEndpoint([reply, endless](int fd, const std::atomic<bool>& stop) {
    ReadRequest(fd);
    if (::send(fd, reply.data(), reply.size(), MSG_NOSIGNAL) < 0) return;
    while (!endless.empty() && !stop) {
      if (::send(fd, endless.data(), endless.size(), MSG_NOSIGNAL) < 0) return;
    }
  });
}

// A hostile probe: a chunk header without its end of line grew the
// monitor's read buffer to 2 GB, and a 63 MB body held 1 GB of samples.
TEST(MetricsScrapeTest, HostileRepliesAreRefusedWithinBoundsAndSayWhatIsAllowed) {
  const std::string chunked = "HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n1;";
  {
    auto endpoint = Answering(chunked, std::string(65536, 'e'));
    const auto start = Clock::now();
    auto scraped = ScrapeMetrics(endpoint.address(), 5000ms);
    ASSERT_FALSE(scraped.ok());
    EXPECT_NE(scraped.status().message().find("allowed: a gridsync /metrics reply"),
              std::string::npos)
        << scraped.status().ToString();
    EXPECT_LT(Clock::now() - start, 4s) << "refused at the bound, not at the timeout";
  }
  {
    const std::string body(kMaxScrapedBodyBytes + 1, '\n');
    auto endpoint = Answering("HTTP/1.1 200 OK\r\nContent-Length: " + std::to_string(body.size()) +
                              "\r\n\r\n" + body);
    auto scraped = ScrapeMetrics(endpoint.address(), 5000ms);
    ASSERT_FALSE(scraped.ok());
    EXPECT_NE(scraped.status().message().find("the reply is larger than 4 MiB"), std::string::npos)
        << scraped.status().ToString();
  }
  {
    auto endpoint = Answering("HTTP/1.1 500 Oops\r\nContent-Length: 0\r\n\r\n");
    auto scraped = ScrapeMetrics(endpoint.address(), 2000ms);
    ASSERT_FALSE(scraped.ok());
    EXPECT_NE(scraped.status().message().find("HTTP 500; allowed: 200 OK to GET /metrics"),
              std::string::npos)
        << scraped.status().ToString();
  }
  for (const std::string address :
       {"127.0.0.1:94986", "127.0.0.1:0", "127.0.0.1:+80", "127.0.0.1:080", ":80", "127.0.0.1"}) {
    auto scraped = ScrapeMetrics(address, 200ms);
    ASSERT_FALSE(scraped.ok()) << address;
    EXPECT_NE(scraped.status().message().find("allowed: host:port, the port 1..65535"),
              std::string::npos)
        << scraped.status().ToString();
  }
}

// A monitor told to stop does not wait out an endpoint's timeout.
TEST(MetricsScrapeTest, AStoppedScrapeEndsWithinASlice) {
  FakeEndpoint endpoint([](int fd, const std::atomic<bool>& stop) {
    ReadRequest(fd);
    while (!stop) std::this_thread::sleep_for(10ms);
  });
  const auto start = Clock::now();
  auto scraped =
      ScrapeMetrics(endpoint.address(), 10000ms, [&] { return Clock::now() - start > 200ms; });
  ASSERT_FALSE(scraped.ok());
  EXPECT_EQ(scraped.status().code(), StatusCode::kUnavailable) << scraped.status().ToString();
  EXPECT_LT(Clock::now() - start, 2s);
}

TEST(MetricsScrapeTest, TheTextFormatIsReadAsPrometheusWritesIt) {
  auto good = ParseMetricsText(
      "# HELP x a figure\n"
      "bytes{direction=\"i\\n\"} 9\n"
      "bytes{direction=\"in\"} 1\n"
      "tabbed\t5\n"
      "nan NaN\n"
      "inf{a=\"b\\\\\",c=\"\\\"q\"} -Inf 1700000000000\r\n"
      "exp 1.5e+3\n");
  ASSERT_TRUE(good.ok()) << good.status().ToString();
  EXPECT_EQ(MetricValue(*good, "bytes", {{"direction", "in"}}), 1);
  EXPECT_EQ(MetricValue(*good, "bytes", {{"direction", "i\n"}}), 9);
  EXPECT_EQ(MetricValue(*good, "tabbed"), 5);
  EXPECT_TRUE(std::isnan(MetricValue(*good, "nan")));
  EXPECT_EQ(MetricValue(*good, "inf", {{"a", "b\\"}, {"c", "\"q"}}), -HUGE_VAL);
  EXPECT_EQ(MetricValue(*good, "exp"), 1500);
  for (const std::string bad : {"x 0x10\n", "x 1.5junk\n", "x\n", "x{a=\"1\"}\n", "v 5\nv 5\n",
                                "v{a=\"1\",a=\"2\"} 1\n", "{a=\"1\"} 1\n"}) {
    EXPECT_FALSE(ParseMetricsText(bad).ok()) << bad;
  }
  std::string many;
  for (size_t i = 0; i <= kMaxScrapedSamples; ++i) many += "m{i=\"" + std::to_string(i) + "\"} 1\n";
  auto refused = ParseMetricsText(many);
  ASSERT_FALSE(refused.ok());
  EXPECT_NE(refused.status().message().find("more than 100000 samples"), std::string::npos)
      << refused.status().ToString();
}

// ---- The endpoint side (ops/metrics.h, ops/metrics_http.h) ----

// A TCP connection to 127.0.0.1:port; -1 when it failed.
int Connect(uint16_t port) {
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  addr.sin_port = htons(port);
  if (::connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0) {
    ::close(fd);
    return -1;
  }
  return fd;
}

// Sends `request` on a new connection and returns what comes back until
// the server closes it (at most 2 s).
std::string Exchange(uint16_t port, const std::string& request) {
  const int fd = Connect(port);
  if (fd < 0) return "";
  (void)::send(fd, request.data(), request.size(), MSG_NOSIGNAL);
  std::string reply;
  const auto deadline = Clock::now() + 2s;
  char buffer[4096];
  while (Clock::now() < deadline) {
    pollfd p{fd, POLLIN, 0};
    if (::poll(&p, 1, 100) <= 0) continue;
    const ssize_t n = ::recv(fd, buffer, sizeof(buffer), 0);
    if (n <= 0) break;
    reply.append(buffer, static_cast<size_t>(n));
  }
  ::close(fd);
  return reply;
}

std::unique_ptr<MetricsEndpoint> StartEndpoint() {
  auto endpoint = MetricsEndpoint::Start("127.0.0.1", 0, {{"role", "test"}});
  EXPECT_TRUE(endpoint.ok()) << endpoint.status().ToString();
  if (!endpoint.ok()) return nullptr;
  (*endpoint)->AddGauge("gridsync_test_value", "A figure", [] { return 7.0; });
  return std::move(endpoint).value();
}

// A hostile probe: 200 connections that sent nothing held every thread of
// civetweb's pool (8, each until its 500 ms request timeout), and no scrape
// got through while they came.
TEST(MetricsEndpointTest, ConnectionsThatSendNothingDoNotBlockAScrape) {
  auto endpoint = StartEndpoint();
  ASSERT_NE(endpoint, nullptr);
  std::vector<int> idle;
  for (int i = 0; i < 400; ++i) {  // past the 256 the server keeps open
    const int fd = Connect(endpoint->port());
    ASSERT_GE(fd, 0);
    idle.push_back(fd);
  }
  for (int round = 0; round < 5; ++round) {
    const auto start = Clock::now();
    auto scraped = ScrapeMetrics(endpoint->address(), 2000ms);
    ASSERT_TRUE(scraped.ok()) << scraped.status().ToString();
    EXPECT_EQ(MetricValue(*scraped, "gridsync_test_value", {{"role", "test"}}), 7);
    EXPECT_LT(Clock::now() - start, 1s);
  }
  for (int fd : idle) ::close(fd);
}

// What our own endpoints write is what the monitor reads: prometheus-cpp
// writes NaN as "Nan" (a worker's NaN loss failed its whole scrape once the
// parser took only "NaN": a review), and a sample's label named as one of
// the endpoint's is kept beside it as exported_<name>.
TEST(MetricsEndpointTest, OurOwnFiguresScrapeBackNaNAndClashingLabelsIncluded) {
  auto endpoint = StartEndpoint();
  ASSERT_NE(endpoint, nullptr);
  endpoint->AddGauge("gridsync_test_nan", "NaN", [] { return std::nan(""); });
  endpoint->AddGauge("gridsync_test_inf", "Inf", [] { return -HUGE_VAL; });
  endpoint->AddGauges("gridsync_test_members", "Members by role", [] {
    return std::vector<MetricSample>{{{{"role", "shard"}}, 2}};
  });
  auto scraped = ScrapeMetrics(endpoint->address(), 2000ms);
  ASSERT_TRUE(scraped.ok()) << scraped.status().ToString();
  EXPECT_TRUE(std::isnan(MetricValue(*scraped, "gridsync_test_nan")));
  EXPECT_EQ(MetricValue(*scraped, "gridsync_test_inf"), -HUGE_VAL);
  EXPECT_EQ(MetricValue(*scraped, "gridsync_test_members",
                        {{"role", "test"}, {"exported_role", "shard"}}),
            2);
}

TEST(MetricsEndpointTest, OnlyGetOfMetricsIsServedAndRequestsAreBounded) {
  auto endpoint = StartEndpoint();
  ASSERT_NE(endpoint, nullptr);
  const uint16_t port = endpoint->port();
  const std::string ok = Exchange(port, "GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n");
  EXPECT_EQ(ok.rfind("HTTP/1.1 200", 0), 0u) << ok;
  EXPECT_NE(ok.find("gridsync_test_value{role=\"test\"} 7"), std::string::npos) << ok;
  const std::string query = Exchange(port, "GET /metrics?job=x HTTP/1.1\r\nHost: x\r\n\r\n");
  EXPECT_EQ(query.rfind("HTTP/1.1 200", 0), 0u) << "Prometheus' params add a query: " << query;
  const std::string other = Exchange(port, "GET /admin HTTP/1.1\r\nHost: x\r\n\r\n");
  EXPECT_EQ(other.rfind("HTTP/1.1 404", 0), 0u) << other;
  const std::string post = Exchange(port, "POST /metrics HTTP/1.1\r\nHost: x\r\n\r\n");
  EXPECT_EQ(post.rfind("HTTP/1.1 405", 0), 0u) << post;
  // A header past 8 KiB, a body, and garbage: refused with a status line
  // and what is allowed, the whole reply read although the client's
  // request was not.
  const std::string large =
      Exchange(port, "GET /metrics HTTP/1.1\r\nX: " + std::string(100000, 'a') + "\r\n\r\n");
  EXPECT_EQ(large.rfind("HTTP/1.1 431", 0), 0u) << large;
  EXPECT_NE(large.find("allowed: GET /metrics with at most 8 KiB"), std::string::npos) << large;
  const std::string body =
      Exchange(port, "GET /metrics HTTP/1.1\r\nContent-Length: 5\r\n\r\nhello");
  EXPECT_EQ(body.rfind("HTTP/1.1 413", 0), 0u) << body;
  // A chunk header that never ends (its buffer grew to 570 MB within the
  // deadline: a hostile probe) meets the read buffer's bound.
  const std::string chunked =
      Exchange(port, "GET /metrics HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n1;" +
                         std::string(4 << 20, 'e'));
  EXPECT_EQ(chunked.rfind("HTTP/1.1 413", 0), 0u) << chunked.substr(0, 200);
  const std::string garbage = Exchange(port, "garbage\r\n\r\n");
  EXPECT_EQ(garbage.rfind("HTTP/1.1 400", 0), 0u) << garbage;
  EXPECT_NE(garbage.find("allowed: GET /metrics"), std::string::npos) << garbage;
  // Still serving.
  auto scraped = ScrapeMetrics(endpoint->address(), 2000ms);
  ASSERT_TRUE(scraped.ok()) << scraped.status().ToString();
}

}  // namespace
}  // namespace gridsync
