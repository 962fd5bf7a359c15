// The progress line of a run on a terminal: one line, redrawn in place,
//   [#########-----------]  230/500  46% | 131k samples/s | loss 0.00612 |
//   PSNR 31.4 dB | 12 s, ETA 14 s
// gridsync-worker draws it on stderr when that is a terminal (and then
// leaves out its periodic step log lines); gridsync launch draws it for
// worker 0 from the "@progress {json}" lines a worker writes on stdout when
// GRIDSYNC_PROGRESS_LINES=1 (the launcher sets it when its own output is a
// terminal). Elsewhere output stays plain periodic lines.
//
// Thread safety: one thread per ProgressLine.
#pragma once

#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <string>

namespace gridsync {

struct ProgressState {
  uint64_t step = 0;   // steps done
  uint64_t steps = 0;  // of
  double samples_per_second = 0;
  double loss = 0;
  double psnr = NAN;  // the last evaluation, if any
  double elapsed_seconds = 0;

  std::string ToJson() const;
  static bool FromJson(const std::string& text, ProgressState* out);
};

// The line's text, `width` columns at most (no escape codes).
std::string FormatProgress(const ProgressState& state, int width);

class ProgressLine {
 public:
  explicit ProgressLine(std::FILE* out) : out_(out) {}
  // Whether `out` is a terminal: only then is a line redrawn in place.
  static bool IsTerminal(std::FILE* out);

  void Update(
      const ProgressState& state);  // redraws (at most 10 times a second, and the last step)
  void Clear();                     // before other output: the line goes
  void Redraw();                    // after it: the line comes back
  void Finish();                    // ends the line for good

 private:
  std::FILE* out_;
  ProgressState state_;
  bool drawn_ = false, has_state_ = false;
  std::chrono::steady_clock::time_point last_draw_{};
};

}  // namespace gridsync
