// What the device trainer's interface shares in every build, with or
// without nvcc (kernels/cuda/device_trainer.h).
//
// Thread safety: stateless; any thread.
#include <string>

#include "kernels/cuda/device_trainer.h"

namespace gridsync::cuda {

Status CheckBufferShapes(const std::vector<std::span<float>>& host,
                         const std::vector<std::span<float>>& buffers, const char* what) {
  if (host.size() != buffers.size()) {
    return Status::InvalidArgument(std::string(what) + ": " + std::to_string(host.size()) +
                                   " buffers; the trainer has " + std::to_string(buffers.size()));
  }
  for (size_t i = 0; i < host.size(); ++i) {
    if (host[i].size() != buffers[i].size()) {
      return Status::InvalidArgument(std::string(what) + ": buffer " + std::to_string(i) +
                                     " holds " + std::to_string(host[i].size()) +
                                     " floats; the trainer's holds " +
                                     std::to_string(buffers[i].size()));
    }
  }
  return Status::OK();
}

}  // namespace gridsync::cuda
