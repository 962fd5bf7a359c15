// The Prometheus metrics of the two server roles (ops/metrics.h), read at
// scrape time from what they already keep:
//   shard: pushes, pulls, errors, bytes each way, refusals by reason, owned
//          rows, applied version, waiting pulls, job, apply latency;
//   coordinator: members by role (and expected), generation, job,
//          connections, members waiting at barriers, barriers passed and
//          timed out, store operations, registrations (and refusals).
//
// Thread safety: the shard and coordinator must outlive the endpoint's use
// of them (stop the endpoint first); their accessors are thread-safe.
#pragma once

#include "ops/metrics.h"
#include "server/coordinator.h"
#include "server/ps_shard.h"

namespace gridsync {

void ExposeShardMetrics(MetricsEndpoint& endpoint, const PsShard& shard);
void ExposeCoordinatorMetrics(MetricsEndpoint& endpoint, Coordinator& coordinator);

}  // namespace gridsync
