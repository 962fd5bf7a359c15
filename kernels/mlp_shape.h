// The shape of the model's MLP, as tiny-cuda-nn's FullyFusedMLP has it: ReLU
// hidden layers of equal width, a linear output layer, no biases. Matrix i
// is rows(i) x cols(i). Shared by the CPU MLP (kernels/cpu/mlp.h) and the
// GPU trainer (kernels/cuda/device_trainer.h); no Eigen here, so nvcc
// compiles it as it is.
//
// Thread safety: a plain value.
#pragma once

#include <cstdint>

namespace gridsync {

struct MlpShape {
  int input_width = 32;
  int hidden_width = 64;
  int hidden_layers = 2;
  int output_width = 3;

  int n_matrices() const { return hidden_layers + 1; }
  int rows(int i) const { return i == hidden_layers ? output_width : hidden_width; }
  int cols(int i) const { return i == 0 ? input_width : hidden_width; }
  int64_t n_params() const {
    int64_t total = 0;
    for (int i = 0; i < n_matrices(); ++i) total += int64_t{rows(i)} * cols(i);
    return total;
  }
};

}  // namespace gridsync
