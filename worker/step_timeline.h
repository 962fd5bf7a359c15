// The training loop's steps on a Chrome-trace timeline (ops/timeline.h): per
// step a "step N" span holding its prepare (sampling; under ps the pull's
// wait), compute and apply (push, all-reduce, optimizer) spans, plus loss,
// PSNR and bytes counters. `gridsync-worker --timeline FILE` turns it on.
//
// Thread safety: OnStep/OnEnd on the training thread.
#pragma once

#include <chrono>
#include <cmath>

#include "ops/timeline.h"
#include "worker/sync/step_observer.h"

namespace gridsync {

class StepTimeline : public StepObserver {
 public:
  explicit StepTimeline(TimelineWriter& writer) : writer_(writer) {}

  void OnStep(const StepRecord& r) override {
    using std::chrono::duration;
    using std::chrono::duration_cast;
    using Clock = std::chrono::steady_clock;
    auto after = [&](double seconds) {
      return r.begin + duration_cast<Clock::duration>(duration<double>(seconds));
    };
    const double wall = r.seconds();
    writer_.Span("step " + std::to_string(r.step), r.begin, wall, 0,
                 {{"samples", static_cast<double>(r.samples)}, {"loss", r.loss}});
    writer_.Span("prepare", r.begin, r.prepare_seconds, 1,
                 {{"pull_wait_s", r.sync.pull_wait_seconds}});
    writer_.Span("compute", after(r.prepare_seconds), r.compute_seconds, 1);
    writer_.Span("apply", after(r.prepare_seconds + r.compute_seconds), r.apply_seconds, 1,
                 {{"push_s", r.sync.push_seconds},
                  {"allreduce_s", r.sync.allreduce_seconds},
                  {"bytes_sent", r.sync.bytes_sent},
                  {"bytes_received", r.sync.bytes_received}});
    writer_.Counter("loss", after(wall), r.loss);
    if (!std::isnan(r.psnr)) {
      writer_.Span("evaluation", after(wall), r.eval_seconds, 1);
      writer_.Counter("psnr_db", after(wall), r.psnr);
    }
  }
  // Its status is the worker's to report (worker/main.cc closes it again).
  void OnEnd(const TrainReport& /*report*/) override { (void)writer_.Close(); }

 private:
  TimelineWriter& writer_;
};

}  // namespace gridsync
