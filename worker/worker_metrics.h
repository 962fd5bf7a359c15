// A worker's Prometheus metrics (ops/metrics.h), fed by the training loop's
// step records: steps, time per phase (prepare, compute, apply; push, pull
// wait, all-reduce), samples and samples/s, loss, PSNR at evaluations, the
// loss scale and bytes each way. At the end the totals are set from the
// run's report, so a final scrape reads what the JSON summary says.
//
// Thread safety: OnStep/OnEnd on the training thread; the endpoint's scrape
// threads read under the same mutex.
#pragma once

#include <map>
#include <memory>
#include <mutex>
#include <string>

#include "ops/gpu_stats.h"
#include "ops/latency_histogram.h"
#include "ops/metrics.h"
#include "worker/sync/step_observer.h"

namespace gridsync {

class WorkerMetrics : public StepObserver {
 public:
  // Registers the worker's metrics on `endpoint` (which must outlive this);
  // with a GPU at `gpu` (NVML's index; -1: none), its utilisation and memory.
  explicit WorkerMetrics(MetricsEndpoint& endpoint, int gpu = -1);
  ~WorkerMetrics() override;

  void OnStep(const StepRecord& record) override;
  void OnEnd(const TrainReport& report) override;

 private:
  mutable std::mutex mu_;
  uint64_t steps_done_ = 0, steps_planned_ = 0, skipped_ = 0;
  double samples_ = 0, samples_per_second_ = 0;
  double loss_ = 0, psnr_ = 0, loss_scale_ = 1;
  std::map<std::string, double> phase_seconds_;  // by phase
  double bytes_sent_ = 0, bytes_received_ = 0;
  LatencyHistogram step_seconds_;
  std::unique_ptr<GpuStats> gpu_;
};

}  // namespace gridsync
