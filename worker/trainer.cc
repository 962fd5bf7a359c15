#include "worker/trainer.h"

#include <chrono>
#include <filesystem>

#include <spdlog/spdlog.h>

#include "common/thread_pool.h"
#include "worker/local_optimizer.h"
#include "worker/model.h"

namespace gridsync {
namespace {

using Clock = std::chrono::steady_clock;

double EvalPsnr(HashGridModel* model, const ImageTask& image, const std::vector<float>& centres,
                uint32_t active_levels, ThreadPool* pool, std::vector<float>* prediction) {
  prediction->resize(centres.size() / 2 * 3);
  model->Predict(centres.data(), centres.size() / 2, active_levels, prediction->data(), pool);
  return image.Psnr(*prediction);
}

}  // namespace

Status EvaluateAndSave(HashGridModel& model, const ImageTask& image, const Config& config,
                       bool write_png, ThreadPool* pool, TrainReport* report) {
  std::vector<float> prediction;
  report->psnr = EvalPsnr(&model, image, image.PixelCentres(), model.ActiveLevels(report->steps), pool,
                          &prediction);
  if (!write_png) return Status::OK();
  report->png_path = (std::filesystem::path(config.task.output) / "reconstruction.png").string();
  return ImageTask::WritePng(report->png_path, image.width(), image.height(), prediction);
}

Result<TrainReport> TrainImage(const Config& config, const ImageTask& image,
                               const TrainOptions& options) {
  GRIDSYNC_ASSIGN_OR_RETURN(std::shared_ptr<HashGridModel> model, HashGridModel::Create(config, 2, 3));
  ThreadPool pool(config.training.threads);
  LocalOptimizer optimizer(model.get(), config);
  ModelGradients grads(model->layout(), model->mlp_shape());
  // With accumulation, each micro-batch sums into `partial` from zero and is
  // then added to `grads`, the same reduction a distributed step performs.
  std::unique_ptr<ModelGradients> partial;
  if (config.training.gradient_accumulation > 1) {
    partial = std::make_unique<ModelGradients>(model->layout(), model->mlp_shape());
  }

  const auto& t = config.training;
  const size_t batch = static_cast<size_t>(t.batch_size);
  const size_t micro = batch / static_cast<size_t>(t.gradient_accumulation);
  std::vector<float> positions(micro * 2);
  std::vector<float> targets(micro * 3);
  const std::vector<float> centres = image.PixelCentres();
  std::vector<float> prediction;

  TrainReport report;
  report.n_params = model->n_params();
  if (!options.quiet) {
    spdlog::info("model: {} grid levels, {} grid rows, {} parameters; batch {} in {} micro-batches; {} thread(s){}",
                 model->layout().n_levels(), model->layout().total_rows(), report.n_params, batch,
                 t.gradient_accumulation, pool.size(), t.mixed_precision ? "; mixed precision" : "");
  }
  double timed = 0;
  uint64_t applied = 0, grid_rows = 0;
  size_t next_eval = 0;
  std::vector<uint64_t> eval_steps = options.eval_steps;
  std::sort(eval_steps.begin(), eval_steps.end());
  auto interval_start = Clock::now();
  for (uint64_t step = 0; step < static_cast<uint64_t>(t.steps); ++step) {
    const auto start = Clock::now();
    const uint32_t active = model->ActiveLevels(step);
    double sse = 0;
    for (int m = 0; m < t.gradient_accumulation; ++m) {
      image.SampleBatch(t.seed, step, static_cast<uint64_t>(m) * micro, micro, positions.data(),
                        targets.data());
      ModelGradients* target = partial ? partial.get() : &grads;
      sse += model->AccumulateGradients(positions.data(), targets.data(), micro, batch,
                                        optimizer.loss_scale(), active, target, &pool);
      if (partial) grads.AddFrom(partial.get(), &pool);
    }
    const auto stats = optimizer.Step(&grads, &pool);
    timed += std::chrono::duration<double>(Clock::now() - start).count();
    report.final_loss = sse / static_cast<double>(batch * 3);
    if (stats.applied) {
      ++applied;
      grid_rows += stats.grid_rows;
    }
    const uint64_t done = step + 1;
    while (next_eval < eval_steps.size() && eval_steps[next_eval] <= done) {
      if (eval_steps[next_eval] == done) {
        report.psnr_at[done] = EvalPsnr(model.get(), image, centres, active, &pool, &prediction);
      }
      ++next_eval;
    }
    if (!options.quiet && t.log_every > 0 && (done % static_cast<uint64_t>(t.log_every) == 0 || done == static_cast<uint64_t>(t.steps))) {
      const double secs = std::chrono::duration<double>(Clock::now() - interval_start).count();
      spdlog::info("step {:>6} loss {:.6f} levels {:>2} loss_scale {:g} skipped {} | {:.0f} samples/s (incl. eval)",
                   done, report.final_loss, active, stats.loss_scale,
                   optimizer.scaler().skipped_steps(),
                   static_cast<double>(t.log_every) * static_cast<double>(batch) / secs);
      interval_start = Clock::now();
    }
  }
  report.steps = static_cast<uint64_t>(t.steps);
  report.samples = report.steps * batch;
  report.train_seconds = timed;
  report.samples_per_second = static_cast<double>(report.samples) / timed;
  report.skipped_steps = optimizer.scaler().skipped_steps();
  report.final_loss_scale = optimizer.loss_scale();
  report.grid_rows_per_step = applied ? static_cast<double>(grid_rows) / applied : 0.0;
  GRIDSYNC_RETURN_IF_ERROR(EvaluateAndSave(*model, image, config, options.write_png, &pool, &report));
  report.model = std::move(model);
  return report;
}

}  // namespace gridsync
