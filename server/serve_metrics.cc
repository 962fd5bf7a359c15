#include "server/serve_metrics.h"

#include <chrono>
#include <memory>
#include <mutex>
#include <optional>

namespace gridsync {

void ExposeShardMetrics(MetricsEndpoint& endpoint, const PsShard& shard) {
  const PsShard* s = &shard;
  auto stat = [s](uint64_t wire::ShardStats::*field) {
    return [s, field] { return static_cast<double>(s->stats().*field); };
  };
  endpoint.AddCounter("gridsync_shard_pushes_total", "Pushes applied or held for their step",
                      stat(&wire::ShardStats::pushes));
  endpoint.AddCounter("gridsync_shard_pulls_total", "Pulls answered",
                      stat(&wire::ShardStats::pulls));
  endpoint.AddCounter("gridsync_shard_errors_total", "Messages refused or dropped",
                      stat(&wire::ShardStats::errors));
  endpoint.AddCounters("gridsync_shard_bytes_total", "Bytes received and sent", [s] {
    const wire::ShardStats st = s->stats();
    return std::vector<MetricSample>{{{{"direction", "in"}}, static_cast<double>(st.bytes_in)},
                                     {{{"direction", "out"}}, static_cast<double>(st.bytes_out)}};
  });
  endpoint.AddGauge("gridsync_shard_rows_owned", "Rows of the model this shard owns",
                    stat(&wire::ShardStats::rows_owned));
  endpoint.AddGauge("gridsync_shard_version", "Steps applied (the parameters' version)",
                    stat(&wire::ShardStats::applied_steps));
  endpoint.AddGauge("gridsync_shard_waiting_pulls", "Pulls held for a version not yet applied",
                    [s] { return static_cast<double>(s->serving_stats().waiting_pulls); });
  endpoint.AddCounter("gridsync_shard_pulls_in_parts_total",
                      "Pulls answered in more than one part (replies of more than 256 KiB)",
                      [s] { return static_cast<double>(s->serving_stats().pulls_in_parts); });
  endpoint.AddCounter("gridsync_shard_reply_parts_total",
                      "Messages of the pull replies sent in parts",
                      [s] { return static_cast<double>(s->serving_stats().reply_parts); });
  endpoint.AddGauge("gridsync_shard_job", "The job served (0: none yet)",
                    [s] { return static_cast<double>(s->serving_stats().job); });
  endpoint.AddGauge("gridsync_shard_epoch",
                    "The epoch of the job served: rollbacks to a checkpoint so far",
                    [s] { return static_cast<double>(s->serving_stats().epoch); });
  endpoint.AddCounter("gridsync_shard_checkpoints_total", "Checkpoints this shard wrote",
                      [s] { return static_cast<double>(s->serving_stats().checkpoints_written); });
  endpoint.AddCounter(
      "gridsync_shard_checkpoint_failures_total",
      "Checkpoints this shard failed to write (training goes on; the previous one stays)",
      [s] { return static_cast<double>(s->serving_stats().checkpoint_failures); });
  endpoint.AddGauge("gridsync_shard_checkpoint_step", "The newest step it wrote (0: none)",
                    [s] { return static_cast<double>(s->serving_stats().checkpoint_step); });
  endpoint.AddCounters("gridsync_shard_refusals_total",
                       "Error replies, by reason (the status code, or unreadable)", [s] {
                         std::vector<MetricSample> out;
                         for (const auto& [reason, n] : s->serving_stats().refusals)
                           out.push_back({{{"reason", reason}}, static_cast<double>(n)});
                         return out;
                       });
  endpoint.AddGauge("gridsync_shard_connections", "TCP connections open to the shard's socket",
                    [s] { return static_cast<double>(s->open_connections()); });
  endpoint.AddGauge("gridsync_shard_largest_unread_bytes",
                    "The most bytes one connection sent that the shard has not read as whole "
                    "messages (an unfinished message; cut past the bound)",
                    [s] { return static_cast<double>(s->largest_unread_bytes()); });
  endpoint.AddCounter(
      "gridsync_shard_refused_connections_total",
      "Connections refused: keys the ZAP handler did not admit, and connections past the caps",
      [s] { return static_cast<double>(s->refused_connections()); });
  endpoint.AddHistogram("gridsync_shard_apply_seconds",
                        "Time to apply a step (every push of it summed and stepped)",
                        [s] { return s->apply_latency().Read(); });
}

namespace {

// One read of the coordinator's serving thread serves every metric of a
// scrape: the figures are taken again only when 100 ms old.
class CoordinatorStatsCache {
 public:
  explicit CoordinatorStatsCache(Coordinator* coordinator) : coordinator_(coordinator) {}
  std::optional<CoordinatorStats> Get() {
    std::lock_guard<std::mutex> lock(mu_);
    const auto now = std::chrono::steady_clock::now();
    if (!stats_ || now - taken_ > std::chrono::milliseconds(100)) {
      auto read = coordinator_->stats(std::chrono::milliseconds(1000));
      stats_ = read.ok() ? std::optional<CoordinatorStats>(*read) : std::nullopt;
      taken_ = now;
    }
    return stats_;
  }

 private:
  Coordinator* const coordinator_;
  std::mutex mu_;
  std::optional<CoordinatorStats> stats_;
  std::chrono::steady_clock::time_point taken_{};
};

}  // namespace

void ExposeCoordinatorMetrics(MetricsEndpoint& endpoint, Coordinator& coordinator) {
  auto cache = std::make_shared<CoordinatorStatsCache>(&coordinator);
  // A figure (-1 when the serving thread does not answer).
  auto stat = [cache](auto field) {
    return [cache, field]() -> double {
      auto s = cache->Get();
      return s ? static_cast<double>((*s).*field) : -1.0;
    };
  };
  // Two figures as one metric with a label telling them apart.
  auto pair = [cache](const char* label, const char* a, auto field_a, const char* b, auto field_b) {
    return [=]() -> std::vector<MetricSample> {
      auto s = cache->Get();
      if (!s) return {};
      return {{{{label, a}}, static_cast<double>((*s).*field_a)},
              {{{label, b}}, static_cast<double>((*s).*field_b)}};
    };
  };
  // member_role, not role: the endpoint's own role label ("coordinator")
  // was overwritten, and these read as shard 0's figures.
  endpoint.AddGauges("gridsync_coordinator_members", "Registered members by role",
                     pair("member_role", "shard", &CoordinatorStats::shards, "worker",
                          &CoordinatorStats::workers));
  endpoint.AddGauges("gridsync_coordinator_expected_members", "Members the cluster expects",
                     pair("member_role", "shard", &CoordinatorStats::expected_shards, "worker",
                          &CoordinatorStats::expected_workers));
  endpoint.AddGauge("gridsync_coordinator_generation", "Cluster map generation",
                    stat(&CoordinatorStats::generation));
  endpoint.AddGauge("gridsync_coordinator_job", "The cluster's job", stat(&CoordinatorStats::job));
  endpoint.AddGauge("gridsync_coordinator_epoch",
                    "The job's epoch: rollbacks to a checkpoint after a rejoin",
                    stat(&CoordinatorStats::epoch));
  endpoint.AddGauge("gridsync_coordinator_connections", "Open control-plane connections",
                    stat(&CoordinatorStats::connections));
  endpoint.AddGauge("gridsync_coordinator_barrier_waiting", "Members waiting at a barrier now",
                    stat(&CoordinatorStats::barrier_waiting));
  endpoint.AddGauge("gridsync_coordinator_barriers", "Barriers with members waiting now",
                    stat(&CoordinatorStats::barriers));
  endpoint.AddGauges("gridsync_coordinator_held_request_bytes",
                     "Bytes of requests held (max_pending_bytes): unfinished ones and those "
                     "queued behind a waiting one",
                     pair("kind", "unfinished", &CoordinatorStats::pending_bytes, "queued",
                          &CoordinatorStats::queued_bytes));
  endpoint.AddCounter("gridsync_coordinator_barriers_passed_total", "Completed barrier rounds",
                      stat(&CoordinatorStats::barriers_passed));
  endpoint.AddCounter("gridsync_coordinator_barrier_timeouts_total", "Barrier waits that timed out",
                      stat(&CoordinatorStats::barrier_timeouts));
  endpoint.AddCounters(
      "gridsync_coordinator_store_operations_total", "Key-value store operations",
      pair("operation", "set", &CoordinatorStats::kv_sets, "get", &CoordinatorStats::kv_gets));
  endpoint.AddCounter("gridsync_coordinator_registrations_total", "Members admitted",
                      stat(&CoordinatorStats::registrations));
  endpoint.AddCounter("gridsync_coordinator_registrations_refused_total", "Registrations refused",
                      stat(&CoordinatorStats::registrations_refused));
}

}  // namespace gridsync
