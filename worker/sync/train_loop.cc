#include "worker/sync/train_loop.h"

#include <spdlog/spdlog.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <filesystem>
#include <optional>
#include <thread>

#include "kernels/cpu/half.h"
#include "ops/trace_range.h"
#include "worker/loss_scaler.h"
#include "worker/params_file.h"

namespace gridsync {
namespace {

using Clock = std::chrono::steady_clock;

double Since(Clock::time_point t) {
  return std::chrono::duration<double>(Clock::now() - t).count();
}

// Pixels predicted at a time: a multiple of the model's own chunk, so every
// pixel is predicted exactly as one call over the whole image would, while
// the positions and predictions held stay bounded (5 MiB) at any image size.
constexpr size_t kEvalPixels = size_t{1} << 18;
static_assert(kEvalPixels % HashGridModel::kPredictChunk == 0);

}  // namespace

double EvalPsnr(HashGridModel& model, const ImageTask& image, uint32_t active_levels,
                ThreadPool* pool, std::vector<uint8_t>* png) {
  const uint64_t pixels = image.pixel_count();
  const size_t chunk = static_cast<size_t>(std::min<uint64_t>(kEvalPixels, pixels));
  std::vector<float> positions(chunk * 2), prediction(chunk * 3);
  if (png != nullptr) png->resize(pixels * 3);
  double se = 0;
  for (uint64_t begin = 0; begin < pixels; begin += chunk) {
    const size_t n = static_cast<size_t>(std::min<uint64_t>(chunk, pixels - begin));
    image.PixelCentres(begin, n, positions.data());
    model.Predict(positions.data(), n, active_levels, prediction.data(), pool);
    se = image.AddSquaredError(se, begin, n, prediction.data());
    if (png != nullptr) {
      uint8_t* out = png->data() + begin * 3;
      for (size_t i = 0; i < n * 3; ++i) out[i] = ImageTask::ToByte(prediction[i]);
    }
  }
  return image.PsnrOf(se);
}

namespace {

std::string FormatSeconds(double s) {
  if (s < 90) return fmt::format("{:.0f} s", s);
  if (s < 5400) return fmt::format("{:.0f} min {:02.0f} s", std::floor(s / 60), std::fmod(s, 60));
  return fmt::format("{:.0f} h {:02.0f} min", std::floor(s / 3600), std::fmod(s / 60, 60));
}

}  // namespace

Status EvaluateAndSave(HashGridModel& model, const ImageTask& image, const Config& config,
                       uint64_t steps, bool write_png, ThreadPool* pool, TrainReport* report) {
  // A large image's final pass takes long after the last step (a probe's
  // 16000 x 16000 pixels: 53 s without a word), so it is said, with its end.
  constexpr uint64_t kLongPassPixels = uint64_t{1} << 22;
  const bool long_pass = image.pixel_count() >= kLongPassPixels;
  const auto start = std::chrono::steady_clock::now();
  if (long_pass) {
    spdlog::info("evaluating all {} pixels for the final PSNR{}", image.pixel_count(),
                 write_png ? " and the reconstruction" : "");
  }
  std::vector<uint8_t> png;
  report->psnr =
      EvalPsnr(model, image, model.ActiveLevels(steps), pool, write_png ? &png : nullptr);
  if (!write_png) return Status::OK();
  report->png_path = (std::filesystem::path(config.task.output) / kReconstructionFile).string();
  if (long_pass) {
    spdlog::info(
        "evaluated in {}; writing {} ({} MB of pixels)",
        FormatSeconds(
            std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count()),
        report->png_path, png.size() >> 20);
  }
  return ImageTask::WritePng(report->png_path, image.width(), image.height(), png);
}

Result<TrainReport> RunTrainLoop(const RunSpec& spec, const ImageTask& image,
                                 std::shared_ptr<HashGridModel> model, GradientSync& sync,
                                 SplitSchedule& split, ThreadPool& pool,
                                 const WorkerOptions& options) {
  const Config& config = spec.config;
  const auto& t = config.training;
  const auto& d = config.distributed;
  const uint64_t steps = static_cast<uint64_t>(t.steps);
  const uint64_t first = options.start_step;
  if (first >= steps) {
    return Status::InvalidArgument("resuming at step " + std::to_string(first) +
                                   ", but training.steps is " + std::to_string(steps));
  }
  const size_t batch = static_cast<size_t>(t.batch_size);
  const uint64_t accumulation = static_cast<uint64_t>(t.gradient_accumulation);
  const bool quiet = options.train.quiet;
  const bool adaptive = d.enable && d.batch_splitting == BatchSplitting::kAdaptive;
  LossScaler scaler(t.mixed_precision);
  // Warnings said once a run: a loss that leaps (finite, so not refused
  // below) and gradients that overflow fp16 with nothing left to scale.
  double first_loss = -1;
  bool warned_leap = false, warned_overflow = false;
  ModelGradients grads(model->layout(), model->mlp_shape());
  // With accumulation each micro-batch sums into `partial` from zero and is
  // then added to `grads`: the reduction a distributed step performs, so
  // the two agree bit for bit.
  std::unique_ptr<ModelGradients> partial;
  if (accumulation > 1)
    partial = std::make_unique<ModelGradients>(model->layout(), model->mlp_shape());
  grads.compact_grid = accumulation == 1 && sync.applies_compact_gradients();

  std::vector<uint64_t> eval_steps = options.train.eval_steps;
  std::sort(eval_steps.begin(), eval_steps.end());
  size_t next_eval = 0;
  const uint64_t eval_every = options.train.eval_every;
  double eval_seconds = 0;  // excluded from the training time

  TrainReport report;
  report.rank = sync.rank();
  report.n_params = model->n_params();
  if (!quiet) {
    spdlog::info(
        "{}: {} grid levels, {} grid rows, {} parameters; batch {} in {} micro-batch(es); "
        "{} thread(s){}",
        sync.me(), model->layout().n_levels(), model->layout().total_rows(), report.n_params, batch,
        accumulation, pool.size(), t.mixed_precision ? "; mixed precision" : "");
  }
  if (d.enable && d.batch_splitting == BatchSplitting::kWeighted && d.nodes.empty() &&
      d.world_size > 1) {
    // weighted without distributed.nodes: each worker's share follows its
    // speed, measured once on a probe batch before step 0 (adaptive splitting
    // measures it again during the run).
    const uint64_t n = std::clamp<uint64_t>(batch / static_cast<size_t>(d.world_size), 1, 4096);
    StepBatch probe;
    BatchSource(image, t.seed).Fill(0, 0, n, &probe);
    ModelGradients scratch(model->layout(), model->mlp_shape());
    double secs = 0;
    for (int round = 0; round < 2; ++round) {  // the first warms caches and scratch
      const auto probe_start = Clock::now();
      model->AccumulateGradients(probe.positions.data(), probe.targets.data(), n, batch, 1.0f,
                                 model->ActiveLevels(first), &scratch, &pool);
      secs = Since(probe_start);
      scratch.Clear(&pool);
    }
    GRIDSYNC_ASSIGN_OR_RETURN(const std::vector<double> rates,
                              sync.GatherRates(0, static_cast<double>(n) / std::max(secs, 1e-9)));
    split.ResetAll(rates);
    if (!quiet && sync.holds_model()) {
      std::string shares;
      for (uint64_t c : split.At(first).counts())
        shares += (shares.empty() ? "" : ", ") + std::to_string(c);
      spdlog::info("weighted split by measured speed (no distributed.nodes): [{}] samples", shares);
    }
  }
  // A dead peer or coordinator is noticed between steps at this interval,
  // whatever the consistency mode (async steps never wait for a peer).
  const auto check_every = spec.sync.peer_check_every;
  auto last_check = Clock::now();
  uint64_t grid_rows = 0, applied = 0;
  double compute_in_interval = 0;
  uint64_t samples_in_interval = 0;
  auto interval_start = Clock::now();
  const auto loop_start = Clock::now();
  // TrainOptions::timing_warmup_steps: where the steady clock starts.
  bool warmed = options.train.timing_warmup_steps == 0;
  double warm_at_seconds = 0;
  uint64_t warm_done = first;
  // A failure the job survives (a restarted shard rejoined and the job
  // rolled back to its checkpoint): the sync follows it, and the loop goes
  // back to that step with its own state as it was there.
  auto recover = [&](const Status& failure) -> Result<uint64_t> {
    GRIDSYNC_ASSIGN_OR_RETURN(const uint64_t resumed, sync.Recover(failure));
    if (resumed >= steps) {
      return failure.WithContext("the job rolled back to step " + std::to_string(resumed) +
                                 ", past training.steps " + std::to_string(steps));
    }
    next_eval = static_cast<size_t>(
        std::upper_bound(eval_steps.begin(), eval_steps.end(), resumed) - eval_steps.begin());
    std::erase_if(report.psnr_curve, [&](const auto& point) { return point.step > resumed; });
    std::erase_if(report.psnr_at, [&](const auto& entry) { return entry.first > resumed; });
    last_check = Clock::now();
    // A step that failed while pushing leaves gradients behind (the MLP's
    // are cleared only once pushed): the step is computed again from zero.
    grads.Clear(&pool);
    if (partial) partial->Clear(&pool);
    ++report.rollbacks;
    return resumed;
  };
  uint64_t step = first;
  for (;;) {
    for (; step < steps;) {
      if (Clock::now() - last_check >= check_every) {
        const Status peers = sync.CheckPeers();
        if (!peers.ok()) {
          GRIDSYNC_ASSIGN_OR_RETURN(
              step, recover(peers.WithContext(sync.me() + " before step " + std::to_string(step))));
          continue;
        }
        last_check = Clock::now();
      }
      const auto step_begin = Clock::now();
      const SyncTimes sync_before = sync.times();
      const ComputeTimes compute_before = model->compute_times();
      std::optional<TraceRange> phase(std::in_place, "prepare");  // NVTX, for Nsight Systems
      auto prepared = sync.Prepare(step);
      if (!prepared.ok()) {
        GRIDSYNC_ASSIGN_OR_RETURN(
            step, recover(prepared.status().WithContext(sync.me() + " preparing step " +
                                                        std::to_string(step))));
        continue;
      }
      const StepBatch& b = **prepared;
      phase.emplace("compute");
      const auto compute_start = Clock::now();
      const uint32_t active = model->ActiveLevels(step);
      const float scale = scaler.scale();
      double sse = 0;
      uint64_t offset = 0;
      SyncOutcome trained_outcome;
      if (sync.trains_steps()) {
        // The model is on a GPU: gradient and update in one call there.
        auto trained = sync.TrainStep(b, batch, active, scale, &trained_outcome);
        if (!trained.ok()) {
          GRIDSYNC_ASSIGN_OR_RETURN(
              step,
              recover(trained.status().WithContext(sync.me() + " step " + std::to_string(step))));
          continue;
        }
        sse = *trained;
      }
      for (uint64_t m = 0; m < accumulation && !sync.trains_steps(); ++m) {
        const uint64_t part = b.count / accumulation + (m < b.count % accumulation ? 1 : 0);
        if (part == 0) continue;  // a share smaller than the micro-batch count
        ModelGradients* target = partial ? partial.get() : &grads;
        sse += model->AccumulateGradients(b.positions.data() + offset * 2,
                                          b.targets.data() + offset * 3, part, batch, scale, active,
                                          target, &pool);
        if (partial) grads.AddFrom(partial.get(), &pool);
        offset += part;
      }
      if (options.throttle_ms > 0)
        std::this_thread::sleep_for(std::chrono::milliseconds(options.throttle_ms));
      const double compute_seconds = Since(compute_start);
      compute_in_interval += compute_seconds;
      samples_in_interval += b.count;
      report.my_samples += b.count;
      report.final_loss = b.count ? sse / static_cast<double>(b.count * 3) : 0.0;
      if (!std::isfinite(report.final_loss)) {
        // The model's outputs are no longer finite: its parameters are not,
        // and no later step mends them (mixed precision's skipped steps
        // guard the gradients, not a forward pass). Stopping here, naming
        // it, beats a run that ends "done" with NaN parameters.
        return Status::InvalidArgument(fmt::format(
            "{} step {}: training diverged: the loss is {} (the model's outputs are no longer "
            "finite); allowed: a smaller training.learning_rate (now {:g}), a shallower "
            "network, or training.mixed_precision false",
            sync.me(), step, report.final_loss, t.learning_rate));
      }

      // A model that blew up but stayed finite (a probe's 16 x 1024 MLP at
      // learning rate 0.01: 0.18, then 3e14, every later step skipped) ran
      // to its end without a word.
      if (first_loss < 0 && b.count > 0) first_loss = report.final_loss;
      if (!warned_leap && report.final_loss > 10 && report.final_loss > 1000 * first_loss) {
        warned_leap = true;
        spdlog::warn(
            "{} step {}: the loss leapt to {:g} (it was {:g} at the first step): training is "
            "diverging; allowed: a smaller training.learning_rate (now {:g}), or a shallower or "
            "narrower network",
            sync.me(), step, report.final_loss, first_loss, t.learning_rate);
      }

      phase.emplace("apply");
      const auto apply_start = Clock::now();
      auto applied_step = sync.trains_steps() ? Result<SyncOutcome>(trained_outcome)
                                              : sync.Apply(step, &grads, scale);
      phase.reset();
      if (!applied_step.ok()) {
        GRIDSYNC_ASSIGN_OR_RETURN(step, recover(applied_step.status().WithContext(
                                            sync.me() + " step " + std::to_string(step))));
        continue;
      }
      const SyncOutcome outcome = *applied_step;
      grid_rows += outcome.grid_rows;
      // The scale the step ran at: Update halves it after an overflow.
      const bool at_least_scale = scaler.at_min_scale();
      if (scaler.Update(outcome.finite)) ++applied;
      if (!outcome.finite && scaler.enabled() && at_least_scale && !warned_overflow) {
        warned_overflow = true;
        spdlog::warn(
            "{} step {}: the gradients overflow fp16 at loss scale {:g}, the least: this step "
            "and every one like it is skipped ({} so far); allowed: training.mixed_precision "
            "false, or a smaller training.learning_rate (now {:g})",
            sync.me(), step, scale, scaler.skipped_steps(), t.learning_rate);
      }
      StepRecord record;
      record.step = step;
      record.first = first;
      record.steps = steps;
      record.begin = step_begin;
      record.prepare_seconds = std::chrono::duration<double>(compute_start - step_begin).count();
      record.compute_seconds = compute_seconds;
      record.compute = model->compute_times() - compute_before;
      record.apply_seconds = Since(apply_start);
      const SyncTimes sync_after = sync.times();
      record.sync.push_seconds = sync_after.push_seconds - sync_before.push_seconds;
      record.sync.pull_wait_seconds = sync_after.pull_wait_seconds - sync_before.pull_wait_seconds;
      record.sync.allreduce_seconds = sync_after.allreduce_seconds - sync_before.allreduce_seconds;
      record.sync.bytes_sent = sync_after.bytes_sent - sync_before.bytes_sent;
      record.sync.bytes_received = sync_after.bytes_received - sync_before.bytes_received;
      record.samples = b.count;
      record.global_batch = batch;
      record.loss = report.final_loss;
      record.loss_scale = scale;
      record.skipped = !outcome.finite;

      const uint64_t done = step + 1;
      // The steady clock starts once, at the end of the warmup's last step
      // (a rollback that replays steps does not restart it).
      if (!warmed && done >= first + options.train.timing_warmup_steps) {
        warmed = true;
        warm_at_seconds = Since(loop_start) - eval_seconds;
        warm_done = done;
      }
      bool evaluate = eval_every > 0 && done % eval_every == 0;
      while (next_eval < eval_steps.size() && eval_steps[next_eval] <= done) {
        evaluate = evaluate || eval_steps[next_eval] == done;
        ++next_eval;
      }
      if (evaluate && sync.holds_model()) {
        const double trained = Since(loop_start) - eval_seconds;
        const auto eval_start = Clock::now();
        auto snapshot = sync.Snapshot(done);
        if (!snapshot.ok()) {
          GRIDSYNC_ASSIGN_OR_RETURN(step, recover(snapshot.status().WithContext(
                                              sync.me() + " taking the model for the " +
                                              "evaluation after step " + std::to_string(done))));
          continue;
        }
        HashGridModel& evaluated = *snapshot != nullptr ? **snapshot : *model;
        const double psnr = EvalPsnr(evaluated, image, active, &pool, nullptr);
        eval_seconds += Since(eval_start);
        report.psnr_at[done] = psnr;
        report.psnr_curve.push_back({done, trained, psnr});
        record.psnr = psnr;
        record.eval_seconds = Since(eval_start);
      }
      for (StepObserver* observer : options.train.observers) observer->OnStep(record);
      if (adaptive && done % static_cast<uint64_t>(d.adaptive_interval) == 0 && done < steps) {
        // Samples per second of compute (not communication) on every worker.
        const double rate =
            static_cast<double>(samples_in_interval) / std::max(compute_in_interval, 1e-9);
        GRIDSYNC_ASSIGN_OR_RETURN(const std::vector<double> rates, sync.GatherRates(done, rate));
        if (split.Rebalance(done, rates) && !quiet && sync.holds_model()) {
          std::string shares;
          for (uint64_t c : split.At(done + 1).counts())
            shares += (shares.empty() ? "" : ", ") + std::to_string(c);
          spdlog::info("step {}: adaptive split re-balanced to [{}] samples from step {}", done,
                       shares, done + 1);
        }
        compute_in_interval = 0;
        samples_in_interval = 0;
      }
      if (!quiet && options.train.step_lines && t.log_every > 0 &&
          (done % static_cast<uint64_t>(t.log_every) == 0 || done == steps)) {
        const double secs = Since(interval_start);
        const double elapsed = Since(loop_start);
        const double eta =
            elapsed / static_cast<double>(done - first) * static_cast<double>(steps - done);
        TrainReport figures;
        figures.steps = done - first;
        sync.FillReport(&figures);
        std::string extra;
        if (figures.bytes_pushed_per_step > 0 || figures.bytes_pulled_per_step > 0) {
          extra =
              fmt::format(" | pushed {:.2f} MB/step, pulled {:.2f} MB/step",
                          figures.bytes_pushed_per_step / 1e6, figures.bytes_pulled_per_step / 1e6);
        }
        if (figures.max_staleness > 0)
          extra += fmt::format(", staleness <= {}", figures.max_staleness);
        if (scaler.enabled()) {
          extra +=
              fmt::format(" | loss scale {:g}, {} skipped", scaler.scale(), scaler.skipped_steps());
        }
        const uint64_t since_log =
            std::min<uint64_t>(done - first, static_cast<uint64_t>(t.log_every));
        spdlog::info(
            "{} step {}/{} ({:.0f}%) loss {:.6f} | {:.0f} samples/s | {} elapsed, ETA {}{}",
            sync.me(), done, steps, 100.0 * static_cast<double>(done) / static_cast<double>(steps),
            report.final_loss, static_cast<double>(since_log) * static_cast<double>(batch) / secs,
            FormatSeconds(elapsed), FormatSeconds(eta), extra);
        interval_start = Clock::now();
      }
      ++step;
    }
    const Status finished = sync.Finish(steps, &report);
    if (finished.ok()) break;
    GRIDSYNC_ASSIGN_OR_RETURN(step, recover(finished));
  }
  report.steps = steps - first;
  report.samples = report.steps * batch;
  report.train_seconds = Since(loop_start) - eval_seconds;
  report.samples_per_second = static_cast<double>(report.samples) / report.train_seconds;
  if (warmed && steps > warm_done) {
    report.steady_steps = steps - warm_done;
    report.steady_seconds = report.train_seconds - warm_at_seconds;
    report.steady_samples_per_second =
        static_cast<double>(report.steady_steps * batch) / report.steady_seconds;
  }
  report.skipped_steps = scaler.skipped_steps();
  report.final_loss_scale = scaler.scale();
  report.grid_rows_per_step =
      applied ? static_cast<double>(grid_rows) / static_cast<double>(applied) : 0.0;
  report.split_counts = split.At(steps - 1).counts();
  sync.FillReport(&report);
  if (sync.holds_model()) {
    GRIDSYNC_RETURN_IF_ERROR(
        EvaluateAndSave(*model, image, config, steps, options.train.write_png, &pool, &report));
    if (!options.dump_params.empty())
      GRIDSYNC_RETURN_IF_ERROR(WriteParams(options.dump_params, *model));
  }
  for (StepObserver* observer : options.train.observers) observer->OnEnd(report);
  report.model = std::move(model);
  return report;
}

}  // namespace gridsync
