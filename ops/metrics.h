// A Prometheus endpoint (GET /metrics: prometheus-cpp's data model and text
// format, served by ops/metrics_http.h) whose values are read at scrape
// time through callbacks: the serving and training paths keep their own
// counters and pay nothing per metric, and a scrape always sees the
// current figures.
//
// Every process of a cluster can run one (metrics.port in the config, or
// --metrics-port): the coordinator at the port, shard s at port + 1 + s,
// worker r at port + 1 + ps.shards + r. Each process also publishes its
// address in the coordinator's store under "metrics/<role>/<rank>", where
// `gridsync monitor` finds it.
//
// Thread safety: Add* before or after Start, from one thread; callbacks run
// on the server's thread and must be thread-safe.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "common/status.h"
#include "ops/latency_histogram.h"

namespace gridsync {

using MetricLabels = std::map<std::string, std::string>;

// One sample of a metric: its labels (besides the endpoint's own) and value.
struct MetricSample {
  MetricLabels labels;
  double value = 0;
};

class MetricsEndpoint {
 public:
  // Listens on host:port (port 0: any free one). `labels` go on every
  // metric (e.g. role and rank). Fails, naming the address, when it cannot
  // listen.
  static Result<std::unique_ptr<MetricsEndpoint>> Start(const std::string& host, uint16_t port,
                                                        MetricLabels labels);
  ~MetricsEndpoint();

  uint16_t port() const;
  std::string address() const;  // host:port

  // Monotonic totals (names end in _total) and current values.
  void AddCounter(std::string name, std::string help, std::function<double()> read);
  void AddGauge(std::string name, std::string help, std::function<double()> read);
  // Several labelled samples of one metric (e.g. refusals by reason).
  void AddCounters(std::string name, std::string help,
                   std::function<std::vector<MetricSample>()> read);
  void AddGauges(std::string name, std::string help,
                 std::function<std::vector<MetricSample>()> read);
  void AddHistogram(std::string name, std::string help,
                    std::function<LatencyHistogram::Snapshot()> read);

 private:
  struct Impl;
  explicit MetricsEndpoint(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

// The port a process of the cluster serves metrics on, from metrics.port
// (0: none). role: "coordinator", "shard" or "worker"; rank: the shard
// index or worker rank.
uint16_t MetricsPortOf(int base_port, const std::string& role, int rank, int shards);

}  // namespace gridsync
