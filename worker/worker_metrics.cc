#include "worker/worker_metrics.h"

#include <cmath>

#include "worker/sync/train_report.h"

namespace gridsync {

WorkerMetrics::~WorkerMetrics() = default;

WorkerMetrics::WorkerMetrics(MetricsEndpoint& endpoint, int gpu) {
  if (gpu >= 0) {
    std::string why;
    gpu_ = GpuStats::Open(static_cast<unsigned>(gpu), &why);
    if (gpu_) {
      GpuStats* g = gpu_.get();
      endpoint.AddGauge("gridsync_gpu_utilization_ratio", "This worker's GPU: busy fraction (NVML)",
                        [g] {
                          auto s = g->Read();
                          return s ? s->utilization : -1.0;
                        });
      endpoint.AddGauge("gridsync_gpu_memory_used_bytes", "This worker's GPU: memory in use (NVML)",
                        [g] {
                          auto s = g->Read();
                          return s ? static_cast<double>(s->memory_used) : -1.0;
                        });
    }
  }
  auto read = [this](auto field) {
    return [this, field]() -> double {
      std::lock_guard<std::mutex> lock(mu_);
      return static_cast<double>(this->*field);
    };
  };
  endpoint.AddCounter("gridsync_worker_steps_total", "Training steps this worker ran",
                      read(&WorkerMetrics::steps_done_));
  endpoint.AddGauge("gridsync_worker_steps_planned", "training.steps",
                    read(&WorkerMetrics::steps_planned_));
  endpoint.AddCounter("gridsync_worker_skipped_steps_total",
                      "Steps skipped for a mixed-precision overflow",
                      read(&WorkerMetrics::skipped_));
  endpoint.AddCounter("gridsync_worker_samples_total", "Samples this worker computed",
                      read(&WorkerMetrics::samples_));
  endpoint.AddGauge("gridsync_worker_samples_per_second",
                    "Global samples per second over the last step",
                    read(&WorkerMetrics::samples_per_second_));
  endpoint.AddGauge("gridsync_worker_loss", "Mean squared error of the last step",
                    read(&WorkerMetrics::loss_));
  endpoint.AddGauge("gridsync_worker_psnr_db", "PSNR of the last evaluation (the model holder)",
                    read(&WorkerMetrics::psnr_));
  endpoint.AddGauge("gridsync_worker_loss_scale", "Mixed precision's loss scale",
                    read(&WorkerMetrics::loss_scale_));
  endpoint.AddCounters("gridsync_worker_phase_seconds_total",
                       "Seconds spent per phase of the step (prepare, compute, apply; of "
                       "these, push, pull_wait and allreduce in communication)",
                       [this] {
                         std::lock_guard<std::mutex> lock(mu_);
                         std::vector<MetricSample> out;
                         for (const auto& [phase, s] : phase_seconds_)
                           out.push_back({{{"phase", phase}}, s});
                         return out;
                       });
  endpoint.AddCounters("gridsync_worker_bytes_total",
                       "Bytes sent (pushed or all-reduced) and received (pulled)", [this] {
                         std::lock_guard<std::mutex> lock(mu_);
                         return std::vector<MetricSample>{
                             {{{"direction", "sent"}}, bytes_sent_},
                             {{{"direction", "received"}}, bytes_received_}};
                       });
  endpoint.AddHistogram("gridsync_worker_step_seconds", "Wall time of a training step",
                        [this] { return step_seconds_.Read(); });
}

void WorkerMetrics::OnStep(const StepRecord& r) {
  step_seconds_.Observe(r.seconds());
  std::lock_guard<std::mutex> lock(mu_);
  steps_done_ = r.step + 1 - r.first;
  steps_planned_ = r.steps;
  skipped_ += r.skipped ? 1 : 0;
  samples_ += static_cast<double>(r.samples);
  samples_per_second_ = r.samples_per_second();
  loss_ = r.loss;
  loss_scale_ = r.loss_scale;
  if (!std::isnan(r.psnr)) psnr_ = r.psnr;
  phase_seconds_["prepare"] += r.prepare_seconds;
  phase_seconds_["compute"] += r.compute_seconds;
  phase_seconds_["apply"] += r.apply_seconds;
  phase_seconds_["push"] += r.sync.push_seconds;
  phase_seconds_["pull_wait"] += r.sync.pull_wait_seconds;
  phase_seconds_["allreduce"] += r.sync.allreduce_seconds;
  bytes_sent_ += r.sync.bytes_sent;
  bytes_received_ += r.sync.bytes_received;
}

void WorkerMetrics::OnEnd(const TrainReport& report) {
  std::lock_guard<std::mutex> lock(mu_);
  // The run's own totals, which also count the initial push, the final pull
  // and a residual flush outside the steps.
  const double steps = static_cast<double>(report.steps);
  bytes_sent_ = report.bytes_pushed_per_step * steps;
  bytes_received_ = report.bytes_pulled_per_step * steps;
  samples_ = static_cast<double>(report.my_samples);
  loss_ = report.final_loss;
  if (report.psnr > 0) psnr_ = report.psnr;
}

}  // namespace gridsync
