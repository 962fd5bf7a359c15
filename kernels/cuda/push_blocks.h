// The device half of ps pushes encoded before the copy (DeviceTrainer's
// PrepareGridPush ... LoadResiduals, device_trainer.h): the touched gradient
// rows are prepared in place, each block of a push is gathered on the
// device with its error-feedback residuals, encoded there by the codecs'
// CUDA twins (codec_kernels.h), decoded there for the residuals, and only
// its payload is copied out.
//
// Residuals: per key ((level << 32) | first column), a dense table of the
// level's rows x the slice's width floats and a byte per row saying which
// rows hold an entry, made when the key is first encoded with feedback.
// The entries follow cpu::ErrorFeedback's rule exactly (a row becomes an
// entry only when its residual is not all zero; an entry adds its residual
// to the row's next values), so CopyResidualsTo yields what the CPU's
// client would hold.
//
// With Adam on the worker (ps.optimizer worker), GridWorkerAdam turns the
// prepared rows into updates with WorkerAdam's rule, on the trainer's grid
// m, v and step counts (which ps leaves to it), EncodePushBlock masks m as
// WorkerAdam::MaskMomentum does, and AddResidualsToGridRows adds the
// pending updates to freshly uploaded rows.
//
// Needs no nvcc (the only CUDA type is the opaque stream); built only with
// CUDA.
//
// Thread safety: every call is serialised by the object (the PS client
// encodes blocks from its pool's threads); work runs on the stream given.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <vector>

#include "common/status.h"
#include "kernels/adam_math.h"
#include "kernels/cpu/codec.h"
#include "kernels/cpu/error_feedback.h"
#include "kernels/cuda/device_trainer.h"
#include "kernels/hash_grid_layout.h"

typedef struct CUstream_st* cudaStream_t;  // NOLINT: matches cuda_runtime_api.h

namespace gridsync::cuda {

class PushBlocks {
 public:
  // The trainer's grid buffers (device memory on CUDA device `device`,
  // alive as long as this object): the gradient, the parameters and their
  // fp16 working copy (null without mixed precision), and Adam's m, v and
  // per-row step counts, which worker Adam (GridWorkerAdam) uses in ps.
  struct Grid {
    float* grad = nullptr;
    float* params = nullptr;
    uint16_t* half = nullptr;
    float* m = nullptr;
    float* v = nullptr;
    uint32_t* steps = nullptr;
  };
  static std::unique_ptr<PushBlocks> Create(const HashGridLayout& layout, const AdamHyper& hyper,
                                            int device, const Grid& grid, cudaStream_t stream);
  virtual ~PushBlocks() = default;

  // As DeviceTrainer's calls of the same names.
  virtual Result<bool> PrepareGridPush(const uint32_t* rows, size_t n, bool round_to_half,
                                       float scale) = 0;
  virtual Status FetchPushBlock(const DeviceTrainer::PushBlock& block, float* values) = 0;
  virtual Status EncodePushBlock(const DeviceTrainer::PushBlock& block, const CodecOptions& options,
                                 uint64_t seed, bool feedback, bool mask_momentum,
                                 uint8_t* payload) = 0;
  virtual Status GridWorkerAdam(uint32_t level, const uint32_t* rows, size_t n,
                                std::vector<uint32_t>* kept) = 0;
  virtual Status AddResidualsToGridRows(const uint32_t* rows, size_t n) = 0;
  virtual Status CopyGridAdamState(uint32_t level, float* m, float* v, uint32_t* steps) = 0;
  virtual Status LoadGridAdamState(uint32_t level, const float* m, const float* v,
                                   const uint32_t* steps) = 0;
  virtual Status ZeroGridGradientRows(const uint32_t* rows, size_t n) = 0;
  virtual Status CopyResidualsTo(cpu::ErrorFeedback* into) = 0;
  virtual Status LoadResiduals(const cpu::ErrorFeedback& from) = 0;
};

}  // namespace gridsync::cuda
