// Where a CPU step's compute goes: the seconds HashGridModel's
// AccumulateGradients spends in each phase, summed since the model was made.
// The training loop turns them into per-step deltas (StepRecord::compute)
// and `gridsync-bench train` prints the steady steps' means, so that a
// change to one kernel is measured where it runs rather than guessed from a
// step's total.
//
// Thread safety: a plain value.
#pragma once

namespace gridsync {

struct ComputeTimes {
  double lookup = 0;         // HashGridLookup: each sample's corner rows and weights
  double grid_forward = 0;   // the encoding's gather of those rows
  double mlp = 0;            // the MLP's forward, loss and backward
  double grid_backward = 0;  // the encoding's scatter into the grid's gradient

  double total() const { return lookup + grid_forward + mlp + grid_backward; }
  ComputeTimes operator-(const ComputeTimes& earlier) const {
    return {lookup - earlier.lookup, grid_forward - earlier.grid_forward, mlp - earlier.mlp,
            grid_backward - earlier.grid_backward};
  }
  ComputeTimes& operator+=(const ComputeTimes& more) {
    lookup += more.lookup;
    grid_forward += more.grid_forward;
    mlp += more.mlp;
    grid_backward += more.grid_backward;
    return *this;
  }
};

}  // namespace gridsync
