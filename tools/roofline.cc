#include "tools/roofline.h"

#include <Eigen/Dense>
#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <thread>
#include <vector>

#include "common/thread_pool.h"
#include "kernels/cpu/hash_encoding.h"
#include "kernels/hash_grid_layout.h"
#include "spec/run_spec.h"
#include "tools/bench_stats.h"

namespace gridsync::bench {
namespace {

using Clock = std::chrono::steady_clock;

// Runs fn(thread) on `threads` threads at once; returns the wall seconds.
template <typename Fn>
double TimeOnThreads(int threads, Fn&& fn) {
  std::vector<std::thread> pool;
  const auto start = Clock::now();
  for (int t = 0; t < threads; ++t) pool.emplace_back([&, t] { fn(t); });
  for (auto& th : pool) th.join();
  return std::chrono::duration<double>(Clock::now() - start).count();
}

}  // namespace

StepWork ModelStepWork(const Config& config, double grid_rows) {
  const double batch = config.training.batch_size;
  const double levels = config.encoding.n_levels;
  const double features = config.encoding.n_features_per_level;
  const double corners = 4;  // 2-D image fitting: bilinear
  const double hidden = config.network.n_neurons;
  const double layers = config.network.n_hidden_layers;
  const double input = levels * features;
  const double output = 3;
  // Weights of the MLP: input x hidden, (layers - 1) x hidden x hidden,
  // hidden x output.
  const double weights = layers == 0
                             ? input * output
                             : input * hidden + (layers - 1) * hidden * hidden + hidden * output;
  const bool half = config.training.mixed_precision;
  StepWork w;
  // GEMMs: forward 2 flops per weight and sample; backward twice that (the
  // weight gradient and the input gradient).
  w.flops += 6 * batch * weights;
  // Encoding: a multiply-add per corner and feature, forward and backward,
  // plus the corner weights.
  w.flops += 2 * 2 * batch * levels * corners * features + batch * levels * 8;
  // Adam: about 12 flops per parameter updated (grid rows touched, MLP).
  w.flops += 12 * (grid_rows * features + weights);

  const double param_bytes = half ? 2 : 4;
  // Grid: every corner's features read forward; the gradient scattered
  // (read and written) backward; Adam on touched grid rows: parameter, m
  // and v read and written, the gradient read and zeroed; the row's step
  // count read and written.
  w.grid_bytes += batch * levels * corners * features * param_bytes;
  w.grid_bytes += batch * levels * corners * features * 4 * 2;
  w.grid_bytes += grid_rows * (features * 4 * 8 + 8);
  w.bytes += w.grid_bytes;
  // The lookup (row id and weight per corner) written once and read twice.
  w.bytes += batch * levels * corners * 8 * 3;
  // Samples (positions, targets) and the feature matrix and its gradient.
  w.bytes += batch * (2 + 3) * 4 + batch * input * 4 * 2 * 2;
  // Activations: each hidden layer's written forward and read backward, its
  // gradient written and read.
  w.bytes += batch * hidden * layers * 4 * 4 + batch * output * 4 * 3;
  // MLP weights, their gradients and moments.
  w.bytes += weights * 4 * 8;
  return w;
}

double GridLines::bytes() const {
  // Parameters, gradient, m, v: each line read and written back; the step
  // counts likewise.
  return 64.0 * 2 * (4 * wide_lines + count_lines);
}

Result<GridLines> MeasureGridLines(const Config& config, const ImageTask& image, int steps) {
  GRIDSYNC_ASSIGN_OR_RETURN(const RunSpec spec, RunSpec::Resolve(config));
  GRIDSYNC_ASSIGN_OR_RETURN(const HashGridLayout layout, HashGridLayout::Make(spec.model.grid));
  const size_t batch = static_cast<size_t>(config.training.batch_size);
  const uint64_t run = static_cast<uint64_t>(std::max(config.training.steps, 1));
  const uint32_t dims = layout.spec().dims;
  const uint64_t row_bytes = uint64_t{layout.features()} * sizeof(float);
  ThreadPool pool(1);
  std::vector<float> positions(batch * dims), targets(batch * 3);
  cpu::GridBatchLookup lookup;
  cpu::GridRowSet touched(layout);
  GridLines sum;
  const int samples = std::max(steps, 1);
  for (int k = 0; k < samples; ++k) {
    const uint64_t step = run * static_cast<uint64_t>(k) / static_cast<uint64_t>(samples);
    image.SampleBatch(config.training.seed, step, 0, batch, positions.data(), targets.data());
    // Every level on: the full model's step (dynamic resolution switches
    // levels on during the first part of a run only).
    cpu::HashGridLookup(layout, positions.data(), batch, layout.n_levels(), &lookup, &pool);
    touched.Assign(lookup, &pool);  // each level's rows, ascending
    for (uint32_t l = 0; l < layout.n_levels(); ++l) {
      const uint64_t offset = layout.level(l).row_offset;
      // Lines of the level's rows in arrays that start the level on a line
      // (the whole tables are aligned; a level's start is within a line).
      uint64_t last_wide = UINT64_MAX, last_count = UINT64_MAX;
      for (const uint32_t row : touched.rows(l)) {
        sum.rows += 1;
        const uint64_t wide = (offset + row) * row_bytes / 64;
        const uint64_t count = (offset + row) * 4 / 64;
        sum.wide_lines += wide != last_wide;
        sum.count_lines += count != last_count;
        last_wide = wide;
        last_count = count;
      }
    }
  }
  // A line holds at most 64 / row_bytes rows (or parts of a row wider than
  // a line), and each touched row is in a line: anything else is a bug here.
  const double per_line = std::max(1.0, 64.0 / static_cast<double>(row_bytes));
  if (sum.wide_lines > sum.rows || sum.wide_lines * per_line < sum.rows ||
      sum.count_lines > sum.rows || sum.count_lines * 16 < sum.rows) {
    return Status::Internal("grid lines miscounted: " + std::to_string(sum.rows) + " rows in " +
                            std::to_string(sum.wide_lines) + " and " +
                            std::to_string(sum.count_lines) + " lines");
  }
  sum.rows /= samples;
  sum.wide_lines /= samples;
  sum.count_lines /= samples;
  return sum;
}

double LineBytes(const StepWork& work, const GridLines& lines) {
  return work.bytes - work.grid_bytes + lines.bytes();
}

std::string LineRooflineLine(const StepWork& work, const GridLines& lines, double peak_flops,
                             double bandwidth, double seconds) {
  const double bytes = LineBytes(work, lines);
  const double compute = work.flops / peak_flops;
  const double memory = bytes / bandwidth;
  char line[512];
  std::snprintf(line, sizeof(line),
                "roofline at 64-byte lines: %.0f grid rows a step in %.0f lines (%.1f rows a "
                "line); grid %.1f MB at lines against %.1f MB at rows; %.1f MB at %.1f GB/s "
                "(%.2f ms) + compute %.2f ms = %.2f ms; fraction reached %.2f",
                lines.rows, lines.wide_lines, lines.rows / std::max(lines.wide_lines, 1.0),
                lines.bytes() / 1e6, work.grid_bytes / 1e6, bytes / 1e6, bandwidth / 1e9,
                memory * 1e3, compute * 1e3, (compute + memory) * 1e3,
                RooflineFraction(work, bytes, peak_flops, bandwidth, seconds));
  return line;
}

double MeasurePeakFlops(int hidden, int batch, int threads, cpu::MatmulFormat format) {
  using Matrix = Eigen::Matrix<float, Eigen::Dynamic, Eigen::Dynamic>;
  std::vector<Matrix> a(threads), b(threads), c(threads);
  for (int t = 0; t < threads; ++t) {
    a[t] = Matrix::Random(hidden, hidden);
    b[t] = Matrix::Random(hidden, batch);
    c[t] = Matrix::Zero(hidden, batch);
  }
  const int reps = std::max(1, static_cast<int>(4e9 / (2.0 * hidden * hidden * batch)));
  // bf16: operands converted once, as the MLP keeps them (kernels/cpu/mlp.h).
  std::vector<std::vector<uint16_t>> a16(threads), b16(threads);
  for (int t = 0; t < threads; ++t) {
    a16[t].resize(size_t(a[t].size()));
    b16[t].resize(size_t(b[t].size()));
    cpu::ToBf16Bits(a[t].data(), a16[t].size(), a16[t].data());
    cpu::ToBf16Bits(b[t].data(), b16[t].size(), b16[t].data());
  }
  auto product = [&](int t) {
    if (format == cpu::MatmulFormat::kBf16) {
      cpu::GemmBf16(hidden, batch, hidden, {a16[t].data(), hidden}, {b16[t].data(), hidden},
                    c[t].data(), hidden, /*accumulate=*/false);
    } else {
      cpu::Gemm(format, hidden, batch, hidden, {a[t].data(), hidden}, {b[t].data(), hidden},
                c[t].data(), hidden, /*accumulate=*/false);
    }
  };
  TimeOnThreads(threads, product);  // JIT and caches warm
  std::vector<double> rates;
  for (int run = 0; run < 5; ++run) {
    const double seconds = TimeOnThreads(threads, [&](int t) {
      for (int r = 0; r < reps; ++r) product(t);
    });
    rates.push_back(2.0 * hidden * hidden * batch * reps * threads / seconds);
  }
  // A peak is the best run, as STREAM reports it: noise (another process,
  // the VM's neighbours) only ever slows a run, and the median of a
  // disturbed set read low, which flattered the fraction (one run read
  // 0.81 of the roofline where its neighbours read 0.61).
  return *std::max_element(rates.begin(), rates.end());
}

double MeasureBandwidth(int threads) {
  const size_t n = size_t{64} << 20 >> 2;  // 64 MiB of floats per array
  std::vector<std::vector<float>> a(threads), b(threads), c(threads);
  TimeOnThreads(threads, [&](int t) {  // first touch on the thread that uses them
    a[t].assign(n, 0.0f);
    b[t].assign(n, 1.0f);
    c[t].assign(n, 2.0f);
  });
  // Two kernels, each counted by the bytes it reads and writes (STREAM's
  // count): the triad a = b + s * c writes an array it does not read, so
  // the cores also read each line of a before writing it (a write-allocate
  // the count leaves out), while the update a += s * c reads what it
  // writes, as Adam and the gradient sums do. On this project's 2-core VM
  // the update moved 53-61 GB/s on one thread where the triad counted
  // 34-40 (2026-12-07): the triad alone understated the peak by a third.
  std::vector<double> rates;
  for (int run = 0; run < 5; ++run) {
    const double triad = TimeOnThreads(threads, [&](int t) {
      float* x = a[t].data();
      const float* y = b[t].data();
      const float* z = c[t].data();
      for (size_t i = 0; i < n; ++i) x[i] = y[i] + 0.5f * z[i];
    });
    rates.push_back(3.0 * 4.0 * static_cast<double>(n) * threads / triad);
    const double update = TimeOnThreads(threads, [&](int t) {
      float* x = a[t].data();
      const float* z = c[t].data();
      for (size_t i = 0; i < n; ++i) x[i] += 0.5f * z[i];
    });
    rates.push_back(3.0 * 4.0 * static_cast<double>(n) * threads / update);
  }
  volatile float sink = a[0][n / 2];  // keep the kernels
  (void)sink;
  return *std::max_element(rates.begin(), rates.end());  // the best run, as above
}

double RooflineFraction(const StepWork& work, double bytes, double peak_flops, double bandwidth,
                        double seconds) {
  return (work.flops / peak_flops + bytes / bandwidth) / seconds;
}

std::string RooflineLine(const StepWork& work, double peak_flops, double bandwidth, double seconds,
                         int threads) {
  const double compute = work.flops / peak_flops;
  const double memory = work.bytes / bandwidth;
  const double bound = compute + memory;
  char line[512];
  std::snprintf(line, sizeof(line),
                "roofline (%d thread%s): step %.2f ms measured; model %.3f GFLOP at %.1f GFLOP/s "
                "(%.2f ms) + %.1f MB at %.1f GB/s (%.2f ms) = %.2f ms; fraction reached %.2f",
                threads, threads == 1 ? "" : "s", seconds * 1e3, work.flops / 1e9, peak_flops / 1e9,
                compute * 1e3, work.bytes / 1e6, bandwidth / 1e9, memory * 1e3, bound * 1e3,
                RooflineFraction(work, work.bytes, peak_flops, bandwidth, seconds));
  return line;
}

}  // namespace gridsync::bench
