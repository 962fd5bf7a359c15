// The CPU twin of cuda::DeviceTrainer (kernels/cuda/device_trainer.h): the
// same phases on a HashGridModel of its own, with worker/model.cc's
// gradient and LocalOptimizer's dense Adam (the all-reduce mode's rule:
// rows whose summed gradient is not zero). Tests hand it to the device sync
// paths (WorkerOptions::make_trainer) so that every line of them runs, and
// is compared bit for bit with the CPU paths, on machines without a GPU.
// Its gradient buffers are host memory; `as_if_on_device` makes it say
// they are not (gradients_on_device()), so that the syncs take their
// staging paths (CopyGradients) as they would with a GPU.
//
// Thread safety: one trainer per thread; `pool` is used inside calls.
#pragma once

#include <memory>
#include <mutex>

#include "common/thread_pool.h"
#include "kernels/cpu/adam.h"
#include "kernels/cuda/device_trainer.h"
#include "spec/run_spec.h"
#include "worker/local_optimizer.h"
#include "worker/model.h"

namespace gridsync {

class HostTrainer : public cuda::DeviceTrainer {
 public:
  // A trainer holding a copy of `model`'s parameters.
  static Result<std::unique_ptr<HostTrainer>> Create(const RunSpec& spec,
                                                     const HashGridModel& model, ThreadPool* pool,
                                                     bool as_if_on_device = false);

  Result<double> ComputeGradients(const float* positions, const float* targets, size_t n,
                                  size_t global_batch, uint32_t active_levels,
                                  float loss_scale) override;
  Result<bool> RoundGradientsToHalf() override;
  std::vector<std::span<float>> GradientBuffers() override;
  bool gradients_on_device() const override { return as_if_on_device_; }
  std::vector<std::vector<std::span<float>>> CutBuckets(size_t bucket_bytes) override;
  // The whole pass runs here, as ComputeGradients (and RoundGradientsToHalf)
  // would: every bucket is final when it returns.
  Status BeginGradients(const float* positions, const float* targets, size_t n, size_t global_batch,
                        uint32_t active_levels, float loss_scale, bool round_to_half) override;
  void* BucketReady(size_t) override { return nullptr; }
  Status CopyBucket(size_t b, const std::vector<std::span<float>>& host, bool to_device) override;
  Result<Finished> FinishGradients() override { return finished_; }
  Status ApplyGradients(float loss_scale) override;
  Status ClearGradients() override;
  Status UploadGridRows(const uint32_t* rows, size_t n, const float* values) override;
  Status TakeGridGradientRows(const uint32_t* rows, size_t n, float* values) override;
  Status UploadMlp(const std::vector<std::span<const float>>& weights) override;
  Status TakeMlpGradients(const std::vector<std::span<float>>& grads) override;
  Status EncodeBlock(const CodecOptions& options, const float* values, size_t n, uint64_t seed,
                     uint8_t* payload, float* decoded) override;
  Result<bool> PrepareGridPush(const uint32_t* rows, size_t n, bool round_to_half,
                               float scale) override;
  Status FetchPushBlock(const PushBlock& block, float* values) override;
  // cpu::Encode, cpu::Decode and a cpu::ErrorFeedback of its own: the
  // semantics the device's kernels copy. Calls are serialised.
  Status EncodePushBlock(const PushBlock& block, const CodecOptions& options, uint64_t seed,
                         bool feedback, bool mask_momentum, uint8_t* payload) override;
  Status GridWorkerAdam(uint32_t level, const uint32_t* rows, size_t n,
                        std::vector<uint32_t>* kept) override;
  Status AddResidualsToGridRows(const uint32_t* rows, size_t n) override;
  Status CopyGridAdamState(uint32_t level, float* m, float* v, uint32_t* steps) override;
  Status LoadGridAdamState(uint32_t level, const float* m, const float* v,
                           const uint32_t* steps) override;
  Status ZeroGridGradientRows(const uint32_t* rows, size_t n) override;
  Status CopyResidualsTo(cpu::ErrorFeedback* into) override;
  Status LoadResiduals(const cpu::ErrorFeedback& from) override;
  Result<NodeExchange> PackNodeGradients(const uint32_t* rows, size_t n, size_t slice_floats,
                                         bool round_to_half, bool host) override;
  Status UnpackNodeSlice(const uint32_t* rows, size_t n, float* mlp_values,
                         size_t mlp_floats) override;
  Status GridRowsWithGradient(const uint32_t* rows, size_t n, uint8_t* has) override;
  Status DownloadGridRows(const uint32_t* rows, size_t n, float* values) override;
  Status Predict(const float* positions, size_t n, uint32_t active_levels, float* out) override;
  Status Download(std::vector<float>* grid, std::vector<std::vector<float>>* mlp) override;
  std::string device_name() const override { return "the CPU twin"; }

 private:
  HostTrainer(std::unique_ptr<HashGridModel> model, const AdamHyper& hyper, ThreadPool* pool);
  // The level of global row `row`, and its level-local id.
  std::pair<uint32_t, uint32_t> Locate(uint32_t row) const;
  Status CheckRows(const uint32_t* rows, size_t n) const;

  std::unique_ptr<HashGridModel> model_;
  ModelGradients grads_;
  LocalOptimizer optimizer_;
  ThreadPool* pool_;
  bool as_if_on_device_ = false;
  std::vector<std::vector<std::span<float>>> buckets_;
  Finished finished_;
  std::mutex push_mu_;            // EncodePushBlock's calls
  cpu::ErrorFeedback residuals_;  // EncodePushBlock's (guarded by push_mu_)
  AdamHyper hyper_;
  // GridWorkerAdam's state, per level (m, v: rows x features), made zeroed
  // on first use (guarded by push_mu_: EncodePushBlock masks m).
  std::vector<cpu::AdamTable> worker_adam_;
  cpu::AdamTable& WorkerAdamOf(uint32_t level);
  std::vector<float> node_packed_, node_slice_;  // PackNodeGradients' buffers
};

}  // namespace gridsync
