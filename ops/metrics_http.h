// The HTTP side of a metrics endpoint (ops/metrics.h): GET /metrics on
// Boost.Beast, one asynchronous thread. It replaces prometheus-cpp's
// civetweb Exposer, which gives each connection a thread of a fixed pool
// until its request arrives: a hostile probe's 200 connections that sent
// nothing held all 8 threads, and no scrape got through while they came.
// Here a connection that sends nothing costs a socket and a timer: a
// request must arrive whole within `request_timeout`, at most
// `max_connections` are open, and past that the oldest one is closed for
// the new one (a scraper's connection is the newest, so a flood must open
// max_connections connections within its round trip to push it out).
// Requests are bounded (8 KiB of header, no body): past that they are
// answered 431 or 413, a malformed one 400, each naming what is allowed;
// anything but GET or HEAD of /metrics (a query ignored) is answered 404
// or 405; every reply closes its connection.
//
// Thread safety: Start and the destructor from one thread; `render` runs
// on the server's thread.
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>

#include "common/status.h"

namespace gridsync {

struct MetricsHttpLimits {
  uint32_t max_connections = 256;
  std::chrono::milliseconds request_timeout{2000};
};

class MetricsHttpServer {
 public:
  // Listens on host:port (port 0: any free one); `render` gives the body
  // of each scrape (Prometheus text format).
  static Result<std::unique_ptr<MetricsHttpServer>> Start(const std::string& host, uint16_t port,
                                                          std::function<std::string()> render,
                                                          MetricsHttpLimits limits = {});
  ~MetricsHttpServer();
  MetricsHttpServer(const MetricsHttpServer&) = delete;
  MetricsHttpServer& operator=(const MetricsHttpServer&) = delete;

  uint16_t port() const;
  // Connections closed to make room for newer ones, so far.
  uint64_t evicted() const;

 private:
  class Impl;
  explicit MetricsHttpServer(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace gridsync
