// DeviceTrainer for builds without nvcc: Create and DeviceForLocalRank say
// why there is no GPU path (kernels/cuda/device_trainer.h).
//
// Thread safety: stateless; any thread.
#include "kernels/cuda/device_trainer.h"

namespace gridsync::cuda {
namespace {

constexpr char kWithoutCuda[] =
    "gridsync was built without CUDA (nvcc not found at configure time)";

}  // namespace

Result<int> DeviceForLocalRank(int /*local_rank*/) { return Status::Unsupported(kWithoutCuda); }

Result<std::unique_ptr<DeviceTrainer>> DeviceTrainer::Create(
    const HashGridLayout& /*layout*/, const MlpShape& /*mlp*/, const AdamHyper& /*hyper*/,
    const std::vector<float>& /*grid*/, const std::vector<std::vector<float>>& /*mlp_weights*/,
    int /*device*/, size_t /*max_batch*/, bool /*mixed_precision*/) {
  return Status::Unsupported(std::string("training.device cuda: ") + kWithoutCuda);
}

}  // namespace gridsync::cuda
