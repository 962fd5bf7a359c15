#include "server/serve_metrics.h"

#include <chrono>

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
  endpoint.AddGauge("gridsync_shard_job", "The job served (0: none yet)",
                    [s] { return static_cast<double>(s->serving_stats().job); });
  endpoint.AddCounters("gridsync_shard_refusals_total",
                       "Error replies, by reason (the status code, or unreadable)", [s] {
                         std::vector<MetricSample> out;
                         for (const auto& [reason, n] : s->serving_stats().refusals)
                           out.push_back({{{"reason", reason}}, static_cast<double>(n)});
                         return out;
                       });
  endpoint.AddHistogram("gridsync_shard_apply_seconds",
                        "Time to apply a step (every push of it summed and stepped)",
                        [s] { return s->apply_latency().Read(); });
}

void ExposeCoordinatorMetrics(MetricsEndpoint& endpoint, Coordinator& coordinator) {
  Coordinator* c = &coordinator;
  // One read of the serving thread per metric: scrapes are rare.
  auto stat = [c](auto field) {
    return [c, field]() -> double {
      auto s = c->stats(std::chrono::milliseconds(1000));
      return s.ok() ? static_cast<double>((*s).*field) : -1.0;
    };
  };
  endpoint.AddGauges("gridsync_coordinator_members", "Registered members by role", [c] {
    auto s = c->stats(std::chrono::milliseconds(1000));
    if (!s.ok()) return std::vector<MetricSample>{};
    return std::vector<MetricSample>{{{{"role", "shard"}}, static_cast<double>(s->shards)},
                                     {{{"role", "worker"}}, static_cast<double>(s->workers)}};
  });
  endpoint.AddGauges("gridsync_coordinator_expected_members", "Members the cluster expects", [c] {
    auto s = c->stats(std::chrono::milliseconds(1000));
    if (!s.ok()) return std::vector<MetricSample>{};
    return std::vector<MetricSample>{
        {{{"role", "shard"}}, static_cast<double>(s->expected_shards)},
        {{{"role", "worker"}}, static_cast<double>(s->expected_workers)}};
  });
  endpoint.AddGauge("gridsync_coordinator_generation", "Cluster map generation",
                    stat(&CoordinatorStats::generation));
  endpoint.AddGauge("gridsync_coordinator_job", "The cluster's job", stat(&CoordinatorStats::job));
  endpoint.AddGauge("gridsync_coordinator_connections", "Open control-plane connections",
                    stat(&CoordinatorStats::connections));
  endpoint.AddGauge("gridsync_coordinator_barrier_waiting", "Members waiting at a barrier now",
                    stat(&CoordinatorStats::barrier_waiting));
  endpoint.AddCounter("gridsync_coordinator_barriers_passed_total", "Completed barrier rounds",
                      stat(&CoordinatorStats::barriers_passed));
  endpoint.AddCounter("gridsync_coordinator_barrier_timeouts_total", "Barrier waits that timed out",
                      stat(&CoordinatorStats::barrier_timeouts));
  endpoint.AddCounters(
      "gridsync_coordinator_store_operations_total", "Key-value store operations", [c] {
        auto s = c->stats(std::chrono::milliseconds(1000));
        if (!s.ok()) return std::vector<MetricSample>{};
        return std::vector<MetricSample>{{{{"operation", "set"}}, static_cast<double>(s->kv_sets)},
                                         {{{"operation", "get"}}, static_cast<double>(s->kv_gets)}};
      });
  endpoint.AddCounter("gridsync_coordinator_registrations_total", "Members admitted",
                      stat(&CoordinatorStats::registrations));
  endpoint.AddCounter("gridsync_coordinator_registrations_refused_total", "Registrations refused",
                      stat(&CoordinatorStats::registrations_refused));
}

}  // namespace gridsync
