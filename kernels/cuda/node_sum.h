// The device half of hybrid's node sum (DeviceTrainer's PackNodeGradients
// ... DownloadGridRows, device_trainer.h): the node's union of gradient
// rows and the MLP's gradients packed for the node's reduce-scatter, the
// slice it returns put back into the gradient rows for the push to encode
// there, and the rows' checks and copies around it.
//
// Buffers: `packed` and `slice` in device memory (NCCL reads them there)
// or, when the collective reads host memory, pinned host copies of them;
// both grow by half again and are kept.
//
// Needs no nvcc (the only CUDA type is the opaque stream); built only with
// CUDA.
//
// Thread safety: none; the trainer's thread calls it, and its work runs on
// the trainer's stream.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <vector>

#include "common/status.h"
#include "kernels/cuda/device_trainer.h"
#include "kernels/hash_grid_layout.h"

typedef struct CUstream_st* cudaStream_t;  // NOLINT: matches cuda_runtime_api.h

namespace gridsync::cuda {

class NodeSum {
 public:
  // The trainer's buffers (device memory on `device`, alive as long as this
  // object): the grid's gradient and parameters, and each MLP matrix's
  // gradient.
  static std::unique_ptr<NodeSum> Create(const HashGridLayout& layout, int device, float* grid_grad,
                                         const float* grid_params,
                                         std::vector<std::span<float>> mlp_grads,
                                         cudaStream_t stream);
  virtual ~NodeSum() = default;

  // As DeviceTrainer's calls of the same names.
  virtual Result<DeviceTrainer::NodeExchange> PackNodeGradients(const uint32_t* rows, size_t n,
                                                                size_t slice_floats,
                                                                bool round_to_half, bool host) = 0;
  virtual Status UnpackNodeSlice(const uint32_t* rows, size_t n, float* mlp_values,
                                 size_t mlp_floats) = 0;
  virtual Status GridRowsWithGradient(const uint32_t* rows, size_t n, uint8_t* has) = 0;
  virtual Status DownloadGridRows(const uint32_t* rows, size_t n, float* values) = 0;
};

}  // namespace gridsync::cuda
