// The progress of the training loop for a person watching: a progress line
// redrawn on the worker's terminal (ops/progress_line.h), or "@progress
// {json}" lines on stdout for gridsync launch to draw (GRIDSYNC_PROGRESS_LINES=1).
//
// Thread safety: OnStep/OnEnd on the training thread.
#pragma once

#include <chrono>
#include <cmath>
#include <cstdio>

#include "ops/progress_line.h"
#include "worker/sync/step_observer.h"

namespace gridsync {

class StepProgress : public StepObserver {
 public:
  // line: draw here (null: no line); emit_lines: "@progress" lines on stdout.
  StepProgress(ProgressLine* line, bool emit_lines) : line_(line), emit_lines_(emit_lines) {}

  void OnStep(const StepRecord& r) override {
    if (!started_) {
      start_ = r.begin;
      started_ = true;
    }
    const double rate = r.samples_per_second();
    // A short moving average: one slow step (an evaluation's pull) does not
    // swing the figure.
    rate_ = rate_ == 0 ? rate : 0.8 * rate_ + 0.2 * rate;
    state_.step = r.step + 1;
    state_.steps = r.steps;
    state_.samples_per_second = rate_;
    state_.loss = r.loss;
    if (!std::isnan(r.psnr)) state_.psnr = r.psnr;
    state_.elapsed_seconds =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - start_).count();
    if (line_ != nullptr) line_->Update(state_);
    const auto now = std::chrono::steady_clock::now();
    if (emit_lines_ && (state_.step == state_.steps || now - last_emit_ >= kEmitEvery)) {
      last_emit_ = now;
      std::printf("@progress %s\n", state_.ToJson().c_str());
      std::fflush(stdout);
    }
  }
  void OnEnd(const TrainReport& /*report*/) override {
    if (line_ != nullptr) line_->Finish();
  }

 private:
  static constexpr std::chrono::milliseconds kEmitEvery{250};
  ProgressLine* line_;
  const bool emit_lines_;
  ProgressState state_;
  double rate_ = 0;
  bool started_ = false;
  std::chrono::steady_clock::time_point start_{}, last_emit_{};
};

}  // namespace gridsync
