// gridsync-bench train --scaling (bench_train_setup.h): one training on
// several thread counts, alternated over rounds in one process.
#include <bit>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "tools/bench.h"
#include "tools/bench_stats.h"
#include "tools/bench_train_setup.h"
#include "worker/sync/train.h"

namespace gridsync::bench {

// --scaling: every thread count in every round, the order reversed every
// other round so that a host getting slower or faster during the run favours
// no count. A round's speedups compare runs made back to back, which the
// host's drift moves less than it moves runs minutes apart; the table gives
// both the per-round median and the ratio of the throughput medians. The
// runs must end bit for bit alike (results do not depend on the thread
// count): a PSNR that differs is reported and fails the command.
int RunScaling(const TrainArgs& args) {
  std::vector<Config> configs;
  for (const int threads : args.scaling) {
    auto config = TrainConfig(args, threads);
    if (!config.ok()) {
      std::fprintf(stderr, "%s\n", config.status().message().c_str());
      return kConfigErrorExitCode;
    }
    configs.push_back(*std::move(config));
  }
  auto image = ImageTask::Load(configs[0].task.image);
  if (!image.ok()) {
    std::fprintf(stderr, "%s\n", image.status().message().c_str());
    return kConfigErrorExitCode;
  }
  for (const Config& config : configs) {
    if (Status fits = CheckBeforeTraining(args, config, *image); !fits.ok()) {
      std::fprintf(stderr, "gridsync-bench train: %s\n", fits.message().c_str());
      return kConfigErrorExitCode;
    }
  }
  SetGemm(args.gemm);
  TrainOptions options;
  options.quiet = true;
  options.write_png = false;
  options.timing_warmup_steps = WarmupSteps(args, args.steps);
  const size_t counts = configs.size();
  // Whole runs, and the steady state after --warmup-steps.
  std::vector<std::vector<double>> rates(counts), speedups(counts);
  std::vector<std::vector<double>> steady(counts), steady_speedups(counts);
  std::vector<double> psnr(counts, 0.0);
  std::string device;
  for (int round = 0; round < args.repeats; ++round) {
    std::vector<double> this_round(counts, 0.0), this_steady(counts, 0.0);
    for (size_t k = 0; k < counts; ++k) {
      const size_t i = round % 2 == 0 ? k : counts - 1 - k;
      std::fprintf(stderr, "round %d of %d: %d thread(s), %d steps...\n", round + 1, args.repeats,
                   args.scaling[i], args.steps);
      auto run = TrainImage(configs[i], *image, options);
      if (!run.ok()) {
        std::fprintf(stderr, "gridsync training failed on %d thread(s): %s\n", args.scaling[i],
                     run.status().ToString().c_str());
        return 1;
      }
      this_round[i] = run->samples_per_second;
      rates[i].push_back(run->samples_per_second);
      this_steady[i] = run->steady_samples_per_second;
      steady[i].push_back(run->steady_samples_per_second);
      if (round == 0) psnr[i] = run->psnr;
      // Bit for bit (a diverged run's NaN equals itself here).
      const auto bits = [](double x) { return std::bit_cast<uint64_t>(x); };
      if (bits(run->psnr) != bits(psnr[i]) || bits(run->psnr) != bits(psnr[0])) {
        std::fprintf(stderr,
                     "the runs differ: %d thread(s) ended at %.6f dB, %d thread(s) at %.6f dB; "
                     "results must not depend on the thread count\n",
                     args.scaling[i], run->psnr, args.scaling[0], psnr[0]);
        return 1;
      }
      device = run->device;
    }
    for (size_t i = 0; i < counts; ++i) {
      speedups[i].push_back(this_round[i] / this_round[0]);
      steady_speedups[i].push_back(this_steady[i] / this_steady[0]);
    }
  }
  std::printf(
      "# gridsync-bench train --scaling: %zu thread counts x %d rounds of %d steps in one process "
      "(order reversed every other round); trained on %s; every run ended at %.2f dB\n",
      counts, args.repeats, args.steps, device.c_str(), psnr[0]);
  // The table of one timing (whole runs, or the steady state); its JSON
  // per thread count.
  const auto table = [&](const std::vector<std::vector<double>>& of,
                         const std::vector<std::vector<double>>& ups) {
    std::printf("%-8s %14s %-40s %16s %18s\n", "threads", "samples/s_p50", "runs (samples/s)",
                "speedup_rounds", "speedup_of_p50s");
    nlohmann::json rows = nlohmann::json::array();
    for (size_t i = 0; i < counts; ++i) {
      const std::string runs = FormatThousands(of[i]);
      const double p50 = Median(of[i]);
      const double round_speedup = Median(ups[i]);
      const double p50_speedup = p50 / Median(of[0]);
      std::printf("%-8d %14.0f %-40s %16.2f %18.2f\n", args.scaling[i], p50, runs.c_str(),
                  round_speedup, p50_speedup);
      rows.push_back({{"threads", args.scaling[i]},
                      {"samples_per_s", of[i]},
                      {"samples_per_s_median", p50},
                      {"speedup_median_of_rounds", round_speedup},
                      {"speedup_of_medians", p50_speedup}});
    }
    return rows;
  };
  nlohmann::json result = table(rates, speedups);
  if (options.timing_warmup_steps > 0) {
    std::printf("# steady state: steps %llu..%d of each run (the first %llu not timed)\n",
                static_cast<unsigned long long>(options.timing_warmup_steps + 1), args.steps,
                static_cast<unsigned long long>(options.timing_warmup_steps));
    const nlohmann::json rows = table(steady, steady_speedups);
    for (size_t i = 0; i < counts; ++i) result[i]["steady"] = rows[i];
  }
  if (!args.json_out.empty()) {
    std::ofstream out(args.json_out);
    out << nlohmann::json{{"scaling", result}}.dump(2) << "\n";
    if (!out) {
      std::fprintf(stderr, "cannot write %s\n", args.json_out.c_str());
      return 1;
    }
  }
  return 0;
}

}  // namespace gridsync::bench
