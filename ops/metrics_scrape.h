// The reading side of ops/metrics.h: GET http://host:port/metrics (Boost.Beast)
// and parse Prometheus' text format into samples, for `gridsync monitor` and
// the tests that check the figures.
//
// Thread safety: free functions; reentrant.
#pragma once

#include <chrono>
#include <cstddef>
#include <functional>
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

// A gridsync endpoint serves a few KiB; a hostile one is refused at these
// (a 63 MB body held 1 GB of samples, a chunk header without its end of
// line grew the read buffer to 2 GB: a hostile probe).
inline constexpr size_t kMaxScrapedBodyBytes = size_t{4} << 20;
inline constexpr size_t kMaxScrapedBufferBytes = size_t{1} << 20;
inline constexpr size_t kMaxScrapedSamples = 100000;

// Fetches and parses host:port's /metrics within `timeout` for the whole
// exchange; the error names the address and what is allowed. `stopped`,
// when given, is asked every 50 ms: true ends the scrape (Unavailable).
Result<ScrapedMetrics> ScrapeMetrics(const std::string& address, std::chrono::milliseconds timeout,
                                     const std::function<bool()>& stopped = nullptr);

// Parses the text exposition format (tokens apart by spaces or tabs; label
// values with the escapes \\, \" and \n; values as Prometheus writes them,
// NaN and +-Inf included); a malformed line, a sample listed twice (same
// name and labels) or more than kMaxScrapedSamples is an error naming the
// line.
Result<ScrapedMetrics> ParseMetricsText(const std::string& text);

// The value of `name` whose labels include `match` (all of them), summed
// over every such sample; 0 when there is none.
double MetricValue(const ScrapedMetrics& metrics, const std::string& name,
                   const std::map<std::string, std::string>& match = {});

}  // namespace gridsync
