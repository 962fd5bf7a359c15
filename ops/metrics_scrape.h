// The reading side of ops/metrics.h: GET http://host:port/metrics (Boost.Beast)
// and parse Prometheus' text format into samples, for `gridsync monitor` and
// the tests that check the figures.
//
// Thread safety: free functions; reentrant.
#pragma once

#include <chrono>
#include <map>
#include <string>
#include <vector>

#include "common/status.h"

namespace gridsync {

struct ScrapedSample {
  std::map<std::string, std::string> labels;
  double value = 0;
};

// Metric name -> its samples (histograms as name_bucket/_sum/_count).
using ScrapedMetrics = std::map<std::string, std::vector<ScrapedSample>>;

// Fetches and parses host:port's /metrics; the error names the address.
Result<ScrapedMetrics> ScrapeMetrics(const std::string& address, std::chrono::milliseconds timeout);

// Parses the text exposition format; malformed lines are an error naming
// the line.
Result<ScrapedMetrics> ParseMetricsText(const std::string& text);

// The value of `name` whose labels include `match` (all of them), summed
// over every such sample; 0 when there is none.
double MetricValue(const ScrapedMetrics& metrics, const std::string& name,
                   const std::map<std::string, std::string>& match = {});

}  // namespace gridsync
