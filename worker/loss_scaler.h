// Dynamic loss scaling for mixed precision (the first seed article, §3.3):
// the loss is multiplied by `scale` so that small gradients survive fp16;
// a step whose gradients overflow fp16 (inf, NaN or above 65504) is skipped
// and the scale halved; after `growth_interval` good steps in a row the scale
// doubles. Defaults follow PyTorch's GradScaler.
//
// Thread safety: not thread-safe; one per optimizer.
#pragma once

#include <cstdint>

namespace gridsync {

class LossScaler {
 public:
  struct Options {
    float initial_scale = 65536.0f;
    float backoff = 0.5f;
    float growth = 2.0f;
    uint32_t growth_interval = 2000;
    float min_scale = 1.0f;
    float max_scale = 16777216.0f;
  };

  explicit LossScaler(bool enabled) : LossScaler(enabled, Options{}) {}
  LossScaler(bool enabled, Options options)
      : enabled_(enabled), options_(options), scale_(enabled ? options.initial_scale : 1.0f) {}

  bool enabled() const { return enabled_; }
  float scale() const { return scale_; }
  uint64_t skipped_steps() const { return skipped_; }
  // The scale can fall no further: a step that overflows now overflows
  // fp16 unscaled, and every later one will.
  bool at_min_scale() const { return scale_ <= options_.min_scale; }

  // Reports whether the step's gradients were finite; returns true when the
  // step may be applied.
  bool Update(bool gradients_finite) {
    if (!enabled_) return gradients_finite;
    if (!gradients_finite) {
      ++skipped_;
      good_ = 0;
      scale_ = scale_ * options_.backoff < options_.min_scale ? options_.min_scale
                                                              : scale_ * options_.backoff;
      return false;
    }
    if (++good_ >= options_.growth_interval) {
      good_ = 0;
      scale_ = scale_ * options_.growth > options_.max_scale ? options_.max_scale
                                                             : scale_ * options_.growth;
    }
    return true;
  }

 private:
  bool enabled_;
  Options options_;
  float scale_;
  uint32_t good_ = 0;
  uint64_t skipped_ = 0;
};

}  // namespace gridsync
