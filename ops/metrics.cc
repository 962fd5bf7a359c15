#include "ops/metrics.h"

#include <prometheus/collectable.h>
#include <prometheus/metric_family.h>
#include <prometheus/text_serializer.h>

#include <limits>
#include <memory>
#include <mutex>

#include "ops/metrics_http.h"

namespace gridsync {
namespace {

struct Entry {
  std::string name;
  std::string help;
  prometheus::MetricType type = prometheus::MetricType::Gauge;
  std::function<std::vector<MetricSample>()> read;
  std::function<LatencyHistogram::Snapshot()> histogram;
};

// The scrape-time reader behind /metrics.
class CallbackCollectable : public prometheus::Collectable {
 public:
  explicit CallbackCollectable(MetricLabels labels) : labels_(std::move(labels)) {}

  void Add(Entry entry) {
    std::lock_guard<std::mutex> lock(mu_);
    entries_.push_back(std::move(entry));
  }

  std::vector<prometheus::MetricFamily> Collect() const override {
    std::lock_guard<std::mutex> lock(mu_);
    std::vector<prometheus::MetricFamily> families;
    for (const Entry& e : entries_) {
      prometheus::MetricFamily family;
      family.name = e.name;
      family.help = e.help;
      family.type = e.type;
      if (e.histogram) {
        const LatencyHistogram::Snapshot s = e.histogram();
        prometheus::ClientMetric m;
        m.label = Labels({});
        uint64_t cumulative = 0;
        for (size_t b = 0; b < s.counts.size(); ++b) {
          cumulative += s.counts[b];
          const double bound = static_cast<int>(b) < LatencyHistogram::kBuckets
                                   ? LatencyHistogram::UpperBound(static_cast<int>(b))
                                   : std::numeric_limits<double>::infinity();
          m.histogram.bucket.push_back({cumulative, bound});
        }
        m.histogram.sample_count = cumulative;
        m.histogram.sample_sum = s.sum_seconds;
        family.metric.push_back(std::move(m));
      } else {
        for (const MetricSample& sample : e.read()) {
          prometheus::ClientMetric m;
          m.label = Labels(sample.labels);
          if (e.type == prometheus::MetricType::Counter) {
            m.counter.value = sample.value;
          } else {
            m.gauge.value = sample.value;
          }
          family.metric.push_back(std::move(m));
        }
      }
      families.push_back(std::move(family));
    }
    return families;
  }

 private:
  std::vector<prometheus::ClientMetric::Label> Labels(const MetricLabels& extra) const {
    MetricLabels all = labels_;
    for (const auto& [k, v] : extra) {
      // A sample's label named as one of the endpoint's keeps both, the
      // sample's as exported_<name>, as Prometheus renames a clash (it
      // replaced the endpoint's role: the coordinator's member counts read
      // as shard 0's).
      if (!all.emplace(k, v).second) all["exported_" + k] = v;
    }
    std::vector<prometheus::ClientMetric::Label> out;
    for (const auto& [k, v] : all) out.push_back({k, v});
    return out;
  }

  const MetricLabels labels_;
  mutable std::mutex mu_;
  std::vector<Entry> entries_;
};

std::function<std::vector<MetricSample>()> One(std::function<double()> read) {
  return [read = std::move(read)] { return std::vector<MetricSample>{{{}, read()}}; };
}

}  // namespace

struct MetricsEndpoint::Impl {
  std::string host;
  std::shared_ptr<CallbackCollectable> collectable;
  std::unique_ptr<MetricsHttpServer> server;  // last: stopped before the collectable goes
};

MetricsEndpoint::MetricsEndpoint(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
MetricsEndpoint::~MetricsEndpoint() = default;

Result<std::unique_ptr<MetricsEndpoint>> MetricsEndpoint::Start(const std::string& host,
                                                                uint16_t port,
                                                                MetricLabels labels) {
  auto impl = std::make_unique<Impl>();
  impl->host = host;
  impl->collectable = std::make_shared<CallbackCollectable>(std::move(labels));
  // Asynchronous (ops/metrics_http.h): civetweb's thread per connection let
  // 200 connections that sent nothing hold every thread, and no scrape got
  // through while they came.
  std::shared_ptr<CallbackCollectable> collectable = impl->collectable;
  auto server = MetricsHttpServer::Start(host, port, [collectable] {
    return prometheus::TextSerializer().Serialize(collectable->Collect());
  });
  if (!server.ok()) {
    const std::string bind = (host.find(':') != std::string::npos ? "[" + host + "]" : host) + ":" +
                             std::to_string(port);
    return Status::IOError("metrics: cannot listen on " + bind + ": " + server.status().message() +
                           "; allowed: a free port (metrics.port, --metrics-port)");
  }
  impl->server = std::move(server).value();
  return std::unique_ptr<MetricsEndpoint>(new MetricsEndpoint(std::move(impl)));
}

uint16_t MetricsEndpoint::port() const { return impl_->server->port(); }

std::string MetricsEndpoint::address() const { return impl_->host + ":" + std::to_string(port()); }

void MetricsEndpoint::AddCounter(std::string name, std::string help, std::function<double()> read) {
  AddCounters(std::move(name), std::move(help), One(std::move(read)));
}

void MetricsEndpoint::AddGauge(std::string name, std::string help, std::function<double()> read) {
  AddGauges(std::move(name), std::move(help), One(std::move(read)));
}

void MetricsEndpoint::AddCounters(std::string name, std::string help,
                                  std::function<std::vector<MetricSample>()> read) {
  impl_->collectable->Add(
      {std::move(name), std::move(help), prometheus::MetricType::Counter, std::move(read), {}});
}

void MetricsEndpoint::AddGauges(std::string name, std::string help,
                                std::function<std::vector<MetricSample>()> read) {
  impl_->collectable->Add(
      {std::move(name), std::move(help), prometheus::MetricType::Gauge, std::move(read), {}});
}

void MetricsEndpoint::AddHistogram(std::string name, std::string help,
                                   std::function<LatencyHistogram::Snapshot()> read) {
  impl_->collectable->Add(
      {std::move(name), std::move(help), prometheus::MetricType::Histogram, {}, std::move(read)});
}

uint16_t MetricsPortOf(int base_port, const std::string& role, int rank, int shards) {
  if (base_port <= 0) return 0;
  int port = base_port;
  if (role == "shard") port = base_port + 1 + rank;
  if (role == "worker") port = base_port + 1 + shards + rank;
  return static_cast<uint16_t>(port);
}

}  // namespace gridsync
