// What the training loop tells about each step, and who listens: the
// Prometheus metrics of a worker, the Chrome-trace timeline, the progress
// line. One record per step, so every consumer sees the same figures.
//
// Thread safety: OnStep and OnEnd run on the training thread; an observer
// whose figures other threads read (a metrics scrape) guards them itself.
#pragma once

#include <chrono>
#include <cmath>
#include <cstdint>

#include "worker/compute_times.h"

namespace gridsync {

struct TrainReport;

// Cumulative communication figures of a GradientSync (see
// GradientSync::times): the loop turns them into per-step deltas.
struct SyncTimes {
  double push_seconds = 0;       // ps/hybrid: sending pushes, waiting for acks
  double pull_wait_seconds = 0;  // ps/hybrid: blocked waiting for pulled rows
  double allreduce_seconds = 0;  // nccl/hybrid: in the collective (and its Adam)
  double bytes_sent = 0;         // pushed, or all-reduced
  double bytes_received = 0;     // pulled, or all-reduced
};

struct StepRecord {
  uint64_t step = 0;                            // 0-based
  uint64_t first = 0;                           // the run's first step (after a resume, not 0)
  uint64_t steps = 0;                           // training.steps
  std::chrono::steady_clock::time_point begin;  // when the step started
  double prepare_seconds = 0;                   // sampling and, under ps, waiting for the pull
  double compute_seconds = 0;                   // forward and backward
  ComputeTimes compute;                         // of those, the model's phases (CPU)
  double apply_seconds = 0;                     // push, all-reduce, optimizer
  SyncTimes sync;                               // this step's share of the sync's figures
  uint64_t samples = 0;                         // this worker's share of the batch
  uint64_t global_batch = 0;
  double loss = 0;          // mean squared error of this worker's share
  float loss_scale = 1.0f;  // mixed precision (1 otherwise)
  bool skipped = false;     // mixed precision: an overflow skipped the step
  double psnr = NAN;        // an evaluation after this step (the model holder)
  double eval_seconds = 0;  // and the time it took (not training time)

  // The step's wall time (evaluations excluded), and the global samples per
  // second it reached.
  double seconds() const { return prepare_seconds + compute_seconds + apply_seconds; }
  double samples_per_second() const {
    return seconds() > 0 ? static_cast<double>(global_batch) / seconds() : 0.0;
  }
};

class StepObserver {
 public:
  virtual ~StepObserver() = default;
  virtual void OnStep(const StepRecord& record) = 0;
  // After the last step, with the run's report (the final evaluation done
  // on the model holder).
  virtual void OnEnd(const TrainReport& /*report*/) {}
};

}  // namespace gridsync
