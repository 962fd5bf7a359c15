// gridsync-bench train: standalone training throughput and quality, and with
// --vs-torch the same model, image, batches and hyperparameters through the
// PyTorch peer (tools/peers/torch_hashgrid.py), one thread each, in one run
// (with --torch-rounds, alternated over rounds: medians and their ratio).
// With --scaling the same training on several thread counts, alternated
// over --repeats rounds in one process: throughput medians and speedups.
#include <algorithm>
#include <bit>
#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iomanip>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

#include "common/cli_parse.h"
#include "common/config.h"
#include "kernels/cpu/gemm.h"
#include "spec/run_spec.h"
#include "tools/bench.h"
#include "tools/bench_pipe.h"
#include "tools/bench_stats.h"
#include "tools/bench_train_setup.h"
#include "tools/roofline.h"
#include "worker/image_task.h"
#include "worker/sync/train.h"
#include "worker/worker_precheck.h"

namespace gridsync::bench {
namespace {

std::string FormatPsnrAt(const std::map<uint64_t, double>& at) {
  std::ostringstream out;
  for (const auto& [step, psnr] : at)
    out << " @" << step << ":" << std::fixed << std::setprecision(2) << psnr;
  return out.str();
}

// Runs the peer and returns its last stdout line parsed as JSON.
Result<nlohmann::json> RunTorchPeer(const TrainArgs& args, const Config& config,
                                    const ImageTask& image, int steps) {
  // A folder of this run's own: a fixed one let concurrent runs overwrite
  // each other's image (and another user's file there) (a hostile probe).
  std::string pattern = (std::filesystem::temp_directory_path() / "gridsync-bench-XXXXXX").string();
  if (mkdtemp(pattern.data()) == nullptr)
    return Status::IOError(Errno(("cannot create a folder like " + pattern).c_str()));
  const std::filesystem::path dir = pattern;
  struct RemoveDir {
    std::filesystem::path dir;
    ~RemoveDir() {
      std::error_code ec;
      std::filesystem::remove_all(dir, ec);
    }
  } remove_dir{dir};
  const auto raw = dir / "image.f32";
  {
    const std::vector<float> pixels = image.Floats();
    std::ofstream out(raw, std::ios::binary);
    out.write(reinterpret_cast<const char*>(pixels.data()),
              static_cast<std::streamsize>(pixels.size() * sizeof(float)));
    if (!out) return Status::IOError("cannot write " + raw.string());
  }
  std::string eval;
  for (uint64_t s : args.eval_steps) eval += (eval.empty() ? "" : ",") + std::to_string(s);
  const auto& e = config.encoding;
  std::ostringstream cmd;
  cmd << ShellQuote(args.python) << " "
      << ShellQuote(std::string(GRIDSYNC_SOURCE_DIR) + "/tools/peers/torch_hashgrid.py")
      << " --image-raw " << ShellQuote(raw.string()) << " --width " << image.width() << " --height "
      << image.height() << " --steps " << steps << " --batch " << config.training.batch_size
      << " --lr " << config.training.learning_rate << " --seed " << config.training.seed
      << " --threads " << args.threads << " --n-levels " << e.n_levels << " --n-features "
      << e.n_features_per_level << " --log2-hashmap-size " << e.log2_hashmap_size
      << " --base-resolution " << e.base_resolution << " --per-level-scale " << e.per_level_scale
      << " --n-neurons " << config.network.n_neurons << " --n-hidden-layers "
      << config.network.n_hidden_layers << " --warmup-steps " << WarmupSteps(args, steps)
      << (eval.empty() ? "" : " --eval-steps " + eval);
  std::fprintf(stderr, "running the PyTorch peer: %s\n", cmd.str().c_str());
  std::unique_ptr<FILE, int (*)(FILE*)> pipe(popen(cmd.str().c_str(), "r"), pclose);
  if (!pipe) return Status::IOError("cannot start " + args.python);
  std::string last, line;
  char buf[4096];
  while (std::fgets(buf, sizeof(buf), pipe.get()) != nullptr) {
    line += buf;
    if (!line.empty() && line.back() == '\n') {
      if (line.size() > 1) last = line;
      line.clear();
    }
  }
  if (!line.empty()) last = line;
  const int rc = pclose(pipe.release());
  if (rc != 0)
    return Status::Internal("the PyTorch peer (" + args.python + ") " + DescribeExit(rc));
  auto parsed = nlohmann::json::parse(last, nullptr, false);
  if (parsed.is_discarded())
    return Status::Corruption("the PyTorch peer printed no JSON summary: " + last);
  return parsed;
}

// Sums the steady steps' phases (not the warmup's), for the line that says
// where a CPU step goes.
class StepPhases : public StepObserver {
 public:
  explicit StepPhases(uint64_t warmup) : warmup_(warmup) {}
  void OnStep(const StepRecord& record) override {
    if (record.step < record.first + warmup_) return;
    ++steps;
    prepare += record.prepare_seconds;
    compute += record.compute_seconds;
    apply += record.apply_seconds;
    model += record.compute;
  }

  uint64_t steps = 0;
  double prepare = 0, compute = 0, apply = 0;
  ComputeTimes model;

 private:
  const uint64_t warmup_;
};

// "where a steady step goes" in ms, and the same as JSON.
void PrintStepPhases(const StepPhases& phases, nlohmann::json* out) {
  const double ms = 1e3 / static_cast<double>(phases.steps);
  const ComputeTimes& m = phases.model;
  const double other = std::max(0.0, phases.compute - m.total());
  std::printf(
      "where a steady step goes (ms, mean of %llu): sampling %.2f; lookup %.2f, grid forward "
      "%.2f, MLP %.2f, grid backward %.2f, other compute %.2f; Adam (apply) %.2f\n",
      static_cast<unsigned long long>(phases.steps), phases.prepare * ms, m.lookup * ms,
      m.grid_forward * ms, m.mlp * ms, m.grid_backward * ms, other * ms, phases.apply * ms);
  *out = {{"steps", phases.steps},       {"sampling", phases.prepare * ms},
          {"lookup", m.lookup * ms},     {"grid_forward", m.grid_forward * ms},
          {"mlp", m.mlp * ms},           {"grid_backward", m.grid_backward * ms},
          {"other_compute", other * ms}, {"apply", phases.apply * ms}};
}

int RunTrain(const TrainArgs& args) {
  if (args.warmup_steps >= args.steps) {
    std::fprintf(stderr,
                 "gridsync-bench train: --warmup-steps %d leaves no step of --steps %d to time; "
                 "allowed: 0..%d\n",
                 args.warmup_steps, args.steps, args.steps - 1);
    return kConfigErrorExitCode;
  }
  if (!args.scaling.empty()) return RunScaling(args);
  auto config = TrainConfig(args, args.threads);
  if (!config.ok()) {
    std::fprintf(stderr, "%s\n", config.status().message().c_str());
    return kConfigErrorExitCode;
  }
  auto image = ImageTask::Load(config->task.image);
  if (!image.ok()) {
    std::fprintf(stderr, "%s\n", image.status().message().c_str());
    return kConfigErrorExitCode;
  }
  if (Status fits = CheckBeforeTraining(args, *config, *image); !fits.ok()) {
    std::fprintf(stderr, "gridsync-bench train: %s\n", fits.message().c_str());
    return kConfigErrorExitCode;
  }
  SetGemm(args.gemm);
  const cpu::MatmulFormat format = config->training.mlp_precision == MlpPrecision::kBf16
                                       ? cpu::MatmulFormat::kBf16
                                       : cpu::MatmulFormat::kFp32;
  TrainOptions options;
  options.eval_steps = args.eval_steps;
  options.quiet = true;
  options.timing_warmup_steps = WarmupSteps(args, args.steps);
  StepPhases phases(options.timing_warmup_steps);
  options.observers.push_back(&phases);
  std::fprintf(stderr, "training gridsync for %d steps...\n", args.steps);
  auto ours = TrainImage(*config, *image, options);
  if (!ours.ok()) {
    std::fprintf(stderr, "gridsync training failed: %s\n", ours.status().ToString().c_str());
    return 1;
  }
  const auto& e = config->encoding;
  std::printf(
      "# image %s (%dx%d); encoding %d levels x %d features, log2 T %d, base %d, scale %g; "
      "MLP %d x %d; batch %d; lr %g; threads %d; training.device %s\n",
      config->task.image.c_str(), image->width(), image->height(), e.n_levels,
      e.n_features_per_level, e.log2_hashmap_size, e.base_resolution, e.per_level_scale,
      config->network.n_hidden_layers, config->network.n_neurons, config->training.batch_size,
      config->training.learning_rate, args.threads, args.device.c_str());
  std::printf("%-9s %6s %12s %10s %12s %s\n", "impl", "steps", "samples/s", "psnr_dB", "final_loss",
              "psnr_at");
  std::printf("%-9s %6llu %12.0f %10.2f %12.6f%s\n", "gridsync",
              static_cast<unsigned long long>(ours->steps), ours->samples_per_second, ours->psnr,
              ours->final_loss, FormatPsnrAt(ours->psnr_at).c_str());
  const uint64_t warmup = options.timing_warmup_steps;
  if (ours->steady_steps > 0) {
    std::printf(
        "steady state (steps %llu..%llu timed, the first %llu not): gridsync "
        "%.0f samples/s, %.2f ms a step\n",
        static_cast<unsigned long long>(warmup + 1), static_cast<unsigned long long>(ours->steps),
        static_cast<unsigned long long>(warmup), ours->steady_samples_per_second,
        1e3 * ours->steady_seconds / static_cast<double>(ours->steady_steps));
  }
  std::printf("trained on: %s\n", ours->device.c_str());
  nlohmann::json phases_json;
  if (ours->device == "CPU") {
    std::printf("MLP GEMMs: %s, %s operands\n", cpu::GemmEngineName(format).c_str(),
                cpu::MatmulFormatName(format));
    if (phases.steps > 0) PrintStepPhases(phases, &phases_json);
  }
  if (ours->kernel_seconds > 0 && ours->kernel_peak_bytes_per_second > 0) {
    // Bytes the encoding and Adam kernels must move (a lower bound) over the
    // time they took, against the device's memory bandwidth.
    const double achieved = ours->kernel_bytes / ours->kernel_seconds;
    std::printf("kernel bandwidth: %.1f GB/s of %.1f GB/s peak (%.0f%%), %.3f s in the kernels\n",
                achieved / 1e9, ours->kernel_peak_bytes_per_second / 1e9,
                100.0 * achieved / ours->kernel_peak_bytes_per_second, ours->kernel_seconds);
    // Where a step's time goes: the device's timed spans (CUDA events, so
    // they include the GPU's idle gaps between launches inside them) against
    // the step's wall time; the rest is outside them (the batch drawn and
    // uploaded, the loss read back, the host's share of the sync).
    if (ours->steps > 0) {
      const double per_step = 1e6 / static_cast<double>(ours->steps);
      std::printf(
          "device step: %.0f us wall; timed spans %.0f us (forward and MLP %.0f; grid backward "
          "%.0f; grid Adam %.0f); outside them %.0f us\n",
          ours->train_seconds * per_step, ours->kernel_seconds * per_step,
          ours->kernel_forward_seconds * per_step, ours->kernel_grid_backward_seconds * per_step,
          ours->kernel_grid_adam_seconds * per_step,
          (ours->train_seconds - ours->kernel_seconds) * per_step);
    }
  }
  // The CPU step against this machine's roofline (tools/roofline.h).
  std::optional<StepWork> work;
  std::optional<GridLines> lines;
  double peak_flops = 0, bandwidth = 0, step_seconds = 0;
  if (ours->device == "CPU" && ours->steps > 0) {
    work = ModelStepWork(*config, ours->grid_rows_per_step);
    std::fprintf(stderr, "measuring this machine's peaks on %d thread(s)...\n", args.threads);
    peak_flops =
        MeasurePeakFlops(config->network.n_neurons, std::min(config->training.batch_size, 4096),
                         args.threads, format);
    bandwidth = MeasureBandwidth(args.threads);
    step_seconds = ours->train_seconds / static_cast<double>(ours->steps);
    std::printf("%s\n",
                RooflineLine(*work, peak_flops, bandwidth, step_seconds, args.threads).c_str());
    auto measured = MeasureGridLines(*config, *image, 4);
    if (!measured.ok()) {
      std::fprintf(stderr, "gridsync-bench train: %s\n", measured.status().ToString().c_str());
      return 1;
    }
    lines = *measured;
    std::printf("%s\n",
                LineRooflineLine(*work, *lines, peak_flops, bandwidth, step_seconds).c_str());
    if (ours->steady_steps > 0 && warmup > 0) {
      // The same model at the steady step: the first touches of the
      // tables' and Adam's memory are not the roofline's work.
      const double steady_step = ours->steady_seconds / static_cast<double>(ours->steady_steps);
      std::printf(
          "roofline at the steady step (%.2f ms): fraction reached %.2f (at rows), %.2f (at "
          "lines)\n",
          1e3 * steady_step,
          RooflineFraction(*work, work->bytes, peak_flops, bandwidth, steady_step),
          RooflineFraction(*work, LineBytes(*work, *lines), peak_flops, bandwidth, steady_step));
    }
  }
  nlohmann::json result = {{"gridsync",
                            {{"steps", ours->steps},
                             {"device", args.device},
                             {"gemm", ours->device == "CPU" ? cpu::GemmEngineName(format) : ""},
                             {"mlp_precision", cpu::MatmulFormatName(format)},
                             {"trained_on", ours->device},
                             {"kernel_bytes", ours->kernel_bytes},
                             {"kernel_seconds", ours->kernel_seconds},
                             {"kernel_peak_bytes_per_second", ours->kernel_peak_bytes_per_second},
                             {"kernel_forward_seconds", ours->kernel_forward_seconds},
                             {"kernel_grid_backward_seconds", ours->kernel_grid_backward_seconds},
                             {"kernel_grid_adam_seconds", ours->kernel_grid_adam_seconds},
                             {"samples_per_s", ours->samples_per_second},
                             {"warmup_steps", warmup},
                             {"steady_samples_per_s", ours->steady_samples_per_second},
                             {"psnr", ours->psnr},
                             {"final_loss", ours->final_loss},
                             {"seconds", ours->train_seconds}}}};
  for (const auto& [step, psnr] : ours->psnr_at)
    result["gridsync"]["psnr_at"][std::to_string(step)] = psnr;
  if (!phases_json.is_null()) result["gridsync"]["step_phases_ms"] = phases_json;
  if (work) {
    result["gridsync"]["roofline"] = {
        {"step_seconds", step_seconds},
        {"flops", work->flops},
        {"bytes", work->bytes},
        {"peak_flops", peak_flops},
        {"bandwidth", bandwidth},
        {"fraction", RooflineFraction(*work, work->bytes, peak_flops, bandwidth, step_seconds)}};
  }
  if (work && lines) {
    const double line_bytes = LineBytes(*work, *lines);
    result["gridsync"]["roofline_lines"] = {
        {"grid_rows", lines->rows},
        {"grid_lines", lines->wide_lines},
        {"grid_bytes_at_lines", lines->bytes()},
        {"grid_bytes_at_rows", work->grid_bytes},
        {"bytes", line_bytes},
        {"fraction", RooflineFraction(*work, line_bytes, peak_flops, bandwidth, step_seconds)}};
  }
  int rc = 0;
  if (args.vs_torch) {
    const int torch_steps = args.torch_steps > 0 ? args.torch_steps : args.steps;
    auto torch = RunTorchPeer(args, *config, *image, torch_steps);
    if (!torch.ok()) {
      std::fprintf(stderr, "%s\n", torch.status().ToString().c_str());
      return 1;
    }
    const auto& t = *torch;
    // A comparison needs the peer's figures: a summary without them is an
    // error, never a ratio against a made-up throughput.
    for (const char* key : {"samples_per_s", "psnr", "steps"}) {
      if (!t.contains(key) || !t[key].is_number() ||
          (std::string(key) == "samples_per_s" && !(t[key].get<double>() > 0))) {
        std::fprintf(stderr, "the PyTorch peer's summary lacks a positive '%s': %s\n", key,
                     t.dump().c_str());
        return 1;
      }
    }
    std::map<uint64_t, double> torch_at;
    if (t.contains("psnr_at")) {
      for (const auto& [k, v] : t["psnr_at"].items()) torch_at[std::stoull(k)] = v.get<double>();
    }
    std::printf("%-9s %6d %12.0f %10.2f %12.6f%s\n", "torch", t.value("steps", 0),
                t.value("samples_per_s", 0.0), t.value("psnr", 0.0), t.value("final_loss", 0.0),
                FormatPsnrAt(torch_at).c_str());
    const double ratio = ours->samples_per_second / t["samples_per_s"].get<double>();
    if (!std::isfinite(ratio) || !(ratio > 0)) {
      std::fprintf(stderr, "no ratio: gridsync %.0f samples/s against torch's %s\n",
                   ours->samples_per_second, t["samples_per_s"].dump().c_str());
      return 1;
    }
    std::printf("ratio gridsync/torch samples/s: %.2fx", ratio);
    if (torch_steps == args.steps) {
      std::printf("; PSNR difference at step %d: %+.2f dB", args.steps,
                  ours->psnr - t.value("psnr", 0.0));
    }
    std::printf(" (torch %s)\n", t.value("torch_version", std::string("?")).c_str());
    result["torch"] = t;
    result["ratio_samples_per_s"] = ratio;
    // The steady rates, where both sides timed the same steps.
    auto steady_of = [&](const nlohmann::json& peer) {
      const bool same = peer.value("warmup_steps", -1) == static_cast<int64_t>(warmup) &&
                        torch_steps == args.steps && peer.contains("steady_samples_per_s") &&
                        peer["steady_samples_per_s"].is_number();
      return same ? peer["steady_samples_per_s"].get<double>() : 0.0;
    };
    const double torch_steady = steady_of(t);
    if (ours->steady_steps > 0 && torch_steady > 0) {
      std::printf(
          "steady state (steps %llu..%d): gridsync %.0f, torch %.0f samples/s; ratio %.2fx\n",
          static_cast<unsigned long long>(warmup + 1), args.steps, ours->steady_samples_per_second,
          torch_steady, ours->steady_samples_per_second / torch_steady);
      result["steady_ratio_samples_per_s"] = ours->steady_samples_per_second / torch_steady;
    }
    if (args.torch_rounds > 1) {
      // More rounds, each pair in the other order from the one before, so
      // that a noisy neighbour or a warm cache favours neither side: the
      // ratio of the medians is the figure to quote.
      std::vector<double> ours_rates = {ours->samples_per_second};
      std::vector<double> torch_rates = {t["samples_per_s"].get<double>()};
      std::vector<double> ours_steady = {ours->steady_samples_per_second};
      std::vector<double> torch_steady_rates = {torch_steady};
      for (int round = 1; round < args.torch_rounds; ++round) {
        // Round 1 (the first) ran gridsync first; odd rounds from 1 on
        // (counted from 0) run the peer first.
        const bool torch_first = round % 2 == 1;
        for (int side = 0; side < 2; ++side) {
          const bool torch_now = (side == 0) == torch_first;
          if (torch_now) {
            std::fprintf(stderr, "round %d of %d: the PyTorch peer...\n", round + 1,
                         args.torch_rounds);
            auto again = RunTorchPeer(args, *config, *image, torch_steps);
            const double rate = again.ok() ? again->value("samples_per_s", 0.0) : std::nan("");
            if (!(rate > 0)) {
              std::fprintf(stderr, "round %d: the PyTorch peer gave no throughput: %s\n", round + 1,
                           again.ok() ? again->dump().c_str() : again.status().ToString().c_str());
              return 1;
            }
            torch_rates.push_back(rate);
            torch_steady_rates.push_back(steady_of(*again));
          } else {
            std::fprintf(stderr, "round %d of %d: gridsync...\n", round + 1, args.torch_rounds);
            auto again = TrainImage(*config, *image, options);
            if (!again.ok()) {
              std::fprintf(stderr, "round %d: gridsync training failed: %s\n", round + 1,
                           again.status().ToString().c_str());
              return 1;
            }
            ours_rates.push_back(again->samples_per_second);
            ours_steady.push_back(again->steady_samples_per_second);
          }
        }
      }
      const double ours_median = Median(ours_rates), torch_median = Median(torch_rates);
      std::printf(
          "rounds %d (alternating order): gridsync samples/s %s, median %.0f; torch %s, median "
          "%.0f; ratio of the medians %.2fx\n",
          args.torch_rounds, FormatThousands(ours_rates).c_str(), ours_median,
          FormatThousands(torch_rates).c_str(), torch_median, ours_median / torch_median);
      result["rounds"] = {{"gridsync_samples_per_s", ours_rates},
                          {"torch_samples_per_s", torch_rates},
                          {"ratio_of_medians", ours_median / torch_median}};
      const double ours_steady_median = Median(ours_steady);
      const double torch_steady_median = Median(torch_steady_rates);
      if (ours_steady_median > 0 && torch_steady_median > 0) {
        std::printf(
            "steady state (steps %llu..%d): gridsync samples/s %s, median %.0f; torch %s, median "
            "%.0f; ratio of the medians %.2fx\n",
            static_cast<unsigned long long>(warmup + 1), args.steps,
            FormatThousands(ours_steady).c_str(), ours_steady_median,
            FormatThousands(torch_steady_rates).c_str(), torch_steady_median,
            ours_steady_median / torch_steady_median);
        result["rounds"]["gridsync_steady_samples_per_s"] = ours_steady;
        result["rounds"]["torch_steady_samples_per_s"] = torch_steady_rates;
        result["rounds"]["steady_ratio_of_medians"] = ours_steady_median / torch_steady_median;
      }
    }
  }
  if (!args.json_out.empty()) {
    std::ofstream out(args.json_out);
    out << result.dump(2) << "\n";
    if (!out) {
      std::fprintf(stderr, "gridsync-bench train: cannot write %s\n", args.json_out.c_str());
      rc = 1;
    }
  }
  return rc;
}

}  // namespace

Runner AddTrainCommand(CLI::App* app) {
  auto args = std::make_shared<TrainArgs>();
  auto* cmd = app->add_subcommand(
      "train", "Standalone training throughput and PSNR (optionally vs PyTorch)");
  cmd->add_option("-c,--config", args->config, "JSON config (encoding, network, training)");
  cmd->add_option("--set", args->overrides, "Override a config key (repeatable)");
  cmd->add_option("--steps", args->steps, "Training steps")->check(CLI::Range(1, 100000000));
  cmd->add_option("--threads", args->threads, "Threads for each implementation")
      ->check(CLI::Range(1, 1024));
  cmd->add_flag("--vs-torch", args->vs_torch,
                "Also run the PyTorch peer on the same image and settings");
  // The peer's flags without --vs-torch did nothing; --torch-steps 0 or
  // below quietly meant --steps (hostile probes).
  auto* vs_torch = cmd->get_option("--vs-torch");
  cmd->add_option("--torch-steps", args->torch_steps, "Steps for the peer (default: --steps)")
      ->check(CLI::Range(1, 100000000))
      ->needs(vs_torch);
  cmd->add_option("--warmup-steps", args->warmup_steps,
                  "Steps not timed for the steady-state figures, on both sides (default: a tenth "
                  "of --steps, at most 50); the whole-run figures time every step")
      ->check(CLI::Range(0, 100000000));
  cmd->add_option("--torch-rounds", args->torch_rounds,
                  "With --vs-torch: rounds of both, each pair in the other order from the one "
                  "before; prints every round's throughput and the ratio of the medians "
                  "(default 1)")
      ->check(CLI::Range(1, 100))
      ->needs(cmd->get_option("--vs-torch"));
  cmd->add_option("--eval-steps", args->eval_steps, "Also report PSNR after these steps")
      ->delimiter(',');
  cmd->add_option("--json", args->json_out, "Write the results as JSON to this file")
      ->check(OutputFile());
  cmd->add_option("--python", args->python, "Python interpreter for the peer")
      ->check(NotEmpty("a Python interpreter"))
      ->needs(vs_torch);
  cmd->add_option("--device", args->device,
                  "Where gridsync trains: cpu (default), cuda (fails without a device) or auto")
      ->check(CLI::IsMember({"cpu", "cuda", "auto"}));
  cmd->add_option(
         "--gemm", args->gemm,
         "The CPU MLP's GEMM engine: auto (oneDNN where present, default), eigen or onednn")
      ->check(CLI::IsMember({"auto", "eigen", "onednn"}));
  auto* scaling =
      cmd->add_option("--scaling", args->scaling,
                      "Compare these thread counts (e.g. 1,2), alternated over --repeats "
                      "rounds in one process: medians and speedups over the first");
  scaling->delimiter(',')->check(CLI::Range(1, 1024))->expected(1, 64);
  cmd->add_option("--repeats", args->repeats, "Rounds for --scaling (default 5)")
      ->check(CLI::Range(1, 1000))
      ->needs(scaling);
  scaling->excludes(cmd->get_option("--vs-torch"))
      ->excludes(cmd->get_option("--threads"))
      ->excludes(cmd->get_option("--eval-steps"));
  return [args] { return RunTrain(*args); };
}

}  // namespace gridsync::bench
