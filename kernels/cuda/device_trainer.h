// Training the hash-grid model on one CUDA device (training.device: cuda).
// The whole model lives in device memory: the grid and MLP parameters and
// Adam's m, v and step counts. A step copies only the batch in (through
// pinned host memory, on the trainer's own stream) and runs everything else
// there: the encoding forward (kernels/cuda/hash_encoding.cu), the MLP
// through cuBLAS, the mean squared error and its gradient, the MLP and
// encoding backward passes, and Adam (grid rows whose gradient is not all
// zero, each with its own step count; MLP matrices every step), gradients
// zeroed in place for the next step.
//
// The maths is worker/model.cc's and worker/local_optimizer.cc's in fp32
// (kernels/adam_math.h is shared), so a run ends within rounding of the CPU
// run: the encoding's backward pass sums with atomics and cuBLAS orders its
// sums its own way. Mixed precision and gradient accumulation are not here
// yet (Config::CheckRunnable refuses them with training.device cuda).
//
// This header needs no nvcc. Without CUDA in the build, or without a device,
// Create fails saying which.
//
// Thread safety: one trainer per thread; it owns its stream and cuBLAS
// handle.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "common/status.h"
#include "kernels/adam_math.h"
#include "kernels/hash_grid_layout.h"
#include "kernels/mlp_shape.h"

namespace gridsync::cuda {

class DeviceTrainer {
 public:
  // `grid`: layout.total_params() floats; `mlp_weights`: one column-major
  // matrix per layer. `device`: the CUDA device (after CUDA_VISIBLE_DEVICES);
  // `max_batch`: the most samples a Step or Predict call takes.
  static Result<std::unique_ptr<DeviceTrainer>> Create(
      const HashGridLayout& layout, const MlpShape& mlp, const AdamHyper& hyper,
      const std::vector<float>& grid, const std::vector<std::vector<float>>& mlp_weights,
      int device, size_t max_batch);
  virtual ~DeviceTrainer() = default;

  // One step on n samples (positions n x dims, targets n x output_width, host
  // memory) of a global batch of `global_batch`: gradient of the mean squared
  // error, then Adam. Returns the sum of squared errors of the n samples.
  virtual Result<double> Step(const float* positions, const float* targets, size_t n,
                              size_t global_batch, uint32_t active_levels) = 0;

  // Predictions (n x output_width, host memory) at n positions.
  virtual Status Predict(const float* positions, size_t n, uint32_t active_levels, float* out) = 0;

  // The parameters, copied to the host (evaluations, the final model).
  virtual Status Download(std::vector<float>* grid,
                          std::vector<std::vector<float>>* mlp_weights) = 0;

  // "NVIDIA H200 (device 0)": for logs.
  virtual std::string device_name() const = 0;
};

// The device a worker of local rank `local_rank` uses: local_rank modulo the
// devices this process sees (CUDA_VISIBLE_DEVICES already applied by the
// runtime); an error naming why there is none.
Result<int> DeviceForLocalRank(int local_rank);

}  // namespace gridsync::cuda
