// Statistics every gridsync-bench subcommand reports with, so that a
// "median" means the same in every table and in the Python peers' output.
//
// Thread safety: pure functions.
#pragma once

#include <algorithm>
#include <cmath>
#include <vector>

namespace gridsync::bench {

// As Python's statistics.median (the torch peers'): the middle value, or
// the mean of the two middle values for an even count; 0 for none.
inline double Median(std::vector<double> v) {
  if (v.empty()) return 0.0;
  std::sort(v.begin(), v.end());
  const size_t mid = v.size() / 2;
  return v.size() % 2 == 1 ? v[mid] : (v[mid - 1] + v[mid]) / 2.0;
}

// The mean of the finite values (a run that failed leaves NaN); NaN when
// there are none.
inline double MeanOfFinite(const std::vector<double>& values) {
  double sum = 0;
  int n = 0;
  for (double v : values) {
    if (!std::isfinite(v)) continue;
    sum += v;
    ++n;
  }
  return n > 0 ? sum / n : NAN;
}

}  // namespace gridsync::bench
