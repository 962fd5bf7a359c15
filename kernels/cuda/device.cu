// Device discovery and the host convenience API of cuda_kernels.h: validate
// the host vectors, copy them to the device, run the kernel on the default
// stream, copy the results back.
//
// Device memory is owned by DeviceBuffer, so an early return on any error
// frees everything; on the success path buffers are freed explicitly so that
// cudaFree's status is checked too.
//
// Thread safety: every function may be called from any thread.
#include <cuda_runtime.h>

#include <cstdint>
#include <string>
#include <vector>

#include "kernels/cuda/cuda_check.h"
#include "kernels/cuda/cuda_kernels.h"
#include "kernels/cuda/device_buffer.h"
#include "kernels/cuda/device_trainer.h"

namespace gridsync::cuda {
namespace {

// Waits for the kernel just launched, so that a fault inside it is reported
// here, as the kernel's, rather than by the copy that follows.
Status SyncDefaultStream() {
  GRIDSYNC_CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(nullptr));
  return Status::OK();
}

std::string Count(size_t n, const char* unit) { return std::to_string(n) + " " + unit; }

// positions: n x dims floats. Sets *n.
Status CheckPositions(const char* name, const HashGridLayout& layout,
                      const std::vector<float>& positions, size_t* n) {
  const uint32_t dims = layout.spec().dims;
  if (positions.size() % dims != 0) {
    return Status::InvalidArgument(std::string(name) + ": positions has " +
                                   Count(positions.size(), "floats") +
                                   "; must be a multiple of dims (" + std::to_string(dims) + ")");
  }
  *n = positions.size() / dims;
  return Status::OK();
}

Status CheckSize(const char* name, const char* what, size_t got, size_t want) {
  if (got == want) return Status::OK();
  return Status::InvalidArgument(std::string(name) + ": " + what + " has " + std::to_string(got) +
                                 " elements; expected " + std::to_string(want));
}

Status CheckOutput(const char* name, const void* out) {
  if (out != nullptr) return Status::OK();
  return Status::InvalidArgument(std::string(name) + ": output pointer is null");
}

// Shared body of the fp32 and fp16 forward passes.
template <typename P, typename Launch>
Status HostForward(const char* name, const HashGridLayout& layout,
                   const std::vector<float>& positions, const std::vector<P>& params,
                   std::vector<float>* features, Launch launch) {
  GRIDSYNC_RETURN_IF_ERROR(CheckOutput(name, features));
  size_t n = 0;
  GRIDSYNC_RETURN_IF_ERROR(CheckPositions(name, layout, positions, &n));
  GRIDSYNC_RETURN_IF_ERROR(CheckSize(name, "params", params.size(), layout.total_params()));
  if (n == 0) {
    features->clear();
    return Status::OK();
  }
  DeviceBuffer<float> d_positions;
  DeviceBuffer<P> d_params;
  DeviceBuffer<float> d_features;
  GRIDSYNC_RETURN_IF_ERROR(d_positions.Upload(positions));
  GRIDSYNC_RETURN_IF_ERROR(d_params.Upload(params));
  GRIDSYNC_RETURN_IF_ERROR(d_features.AllocateZeroed(n * layout.output_width()));
  GRIDSYNC_RETURN_IF_ERROR(launch(d_positions.get(), n, d_params.get(), d_features.get()));
  GRIDSYNC_RETURN_IF_ERROR(SyncDefaultStream());
  GRIDSYNC_RETURN_IF_ERROR(d_features.Download(features));
  GRIDSYNC_RETURN_IF_ERROR(d_features.Free());
  GRIDSYNC_RETURN_IF_ERROR(d_params.Free());
  GRIDSYNC_RETURN_IF_ERROR(d_positions.Free());
  return Status::OK();
}

}  // namespace

bool Available(std::string* reason) {
  int count = 0;
  const cudaError_t error = cudaGetDeviceCount(&count);
  if (error != cudaSuccess) {
    (void)cudaGetLastError();
    if (reason != nullptr) *reason = std::string("no CUDA device: ") + cudaGetErrorString(error);
    return false;
  }
  if (count == 0) {
    if (reason != nullptr) *reason = "no CUDA device: cudaGetDeviceCount reported 0 devices";
    return false;
  }
  if (reason != nullptr) reason->clear();
  return true;
}

namespace host {

Status HashGridForward(const HashGridLayout& layout, const std::vector<float>& positions,
                       uint32_t active_levels, const std::vector<float>& params,
                       std::vector<float>* features) {
  return HostForward("cuda::host::HashGridForward", layout, positions, params, features,
                     [&](const float* d_positions, size_t n, const float* d_params, float* d_out) {
                       return ::gridsync::cuda::HashGridForward(
                           layout, d_positions, n, active_levels, d_params, d_out, nullptr);
                     });
}

Status HashGridForwardHalf(const HashGridLayout& layout, const std::vector<float>& positions,
                           uint32_t active_levels, const std::vector<uint16_t>& params_half,
                           std::vector<float>* features) {
  return HostForward(
      "cuda::host::HashGridForwardHalf", layout, positions, params_half, features,
      [&](const float* d_positions, size_t n, const uint16_t* d_params, float* d_out) {
        return ::gridsync::cuda::HashGridForwardHalf(layout, d_positions, n, active_levels,
                                                     d_params, d_out, nullptr);
      });
}

// *grad is added into, like the device-pointer API: pass it empty to get
// the gradient alone (it is then sized to total_params and zeroed first).
Status HashGridBackward(const HashGridLayout& layout, const std::vector<float>& positions,
                        uint32_t active_levels, const std::vector<float>& d_features,
                        std::vector<float>* grad) {
  const char* name = "cuda::host::HashGridBackward";
  GRIDSYNC_RETURN_IF_ERROR(CheckOutput(name, grad));
  size_t n = 0;
  GRIDSYNC_RETURN_IF_ERROR(CheckPositions(name, layout, positions, &n));
  GRIDSYNC_RETURN_IF_ERROR(
      CheckSize(name, "d_features", d_features.size(), n * layout.output_width()));
  if (!grad->empty())
    GRIDSYNC_RETURN_IF_ERROR(CheckSize(name, "grad", grad->size(), layout.total_params()));
  if (grad->empty()) grad->assign(layout.total_params(), 0.0f);
  if (n == 0) return Status::OK();
  DeviceBuffer<float> d_positions;
  DeviceBuffer<float> d_d_features;
  DeviceBuffer<float> d_grad;
  GRIDSYNC_RETURN_IF_ERROR(d_positions.Upload(positions));
  GRIDSYNC_RETURN_IF_ERROR(d_d_features.Upload(d_features));
  GRIDSYNC_RETURN_IF_ERROR(d_grad.Upload(*grad));
  GRIDSYNC_RETURN_IF_ERROR(::gridsync::cuda::HashGridBackward(
      layout, d_positions.get(), n, active_levels, d_d_features.get(), d_grad.get(), nullptr));
  GRIDSYNC_RETURN_IF_ERROR(SyncDefaultStream());
  GRIDSYNC_RETURN_IF_ERROR(d_grad.Download(grad));
  GRIDSYNC_RETURN_IF_ERROR(d_grad.Free());
  GRIDSYNC_RETURN_IF_ERROR(d_d_features.Free());
  GRIDSYNC_RETURN_IF_ERROR(d_positions.Free());
  return Status::OK();
}

Status AdamUpdateRows(const AdamHyper& hyper, const SparseRows& grad, float grad_scale,
                      std::vector<float>* params, std::vector<float>* m, std::vector<float>* v,
                      std::vector<uint32_t>* steps) {
  const char* name = "cuda::host::AdamUpdateRows";
  if (params == nullptr || m == nullptr || v == nullptr || steps == nullptr)
    return Status::InvalidArgument(std::string(name) + ": params, m, v and steps must be non-null");
  const uint32_t width = grad.width;
  if (width == 0)
    return Status::InvalidArgument(std::string(name) + ": grad.width 0; allowed: >= 1");
  GRIDSYNC_RETURN_IF_ERROR(
      CheckSize(name, "grad.values", grad.values.size(), grad.rows.size() * width));
  if (params->size() % width != 0) {
    return Status::InvalidArgument(
        std::string(name) + ": params has " + Count(params->size(), "floats") +
        "; must be a multiple of grad.width (" + std::to_string(width) + ")");
  }
  const size_t table_rows = params->size() / width;
  GRIDSYNC_RETURN_IF_ERROR(CheckSize(name, "m", m->size(), params->size()));
  GRIDSYNC_RETURN_IF_ERROR(CheckSize(name, "v", v->size(), params->size()));
  GRIDSYNC_RETURN_IF_ERROR(CheckSize(name, "steps", steps->size(), table_rows));
  // One GPU thread owns each row, so rows must be distinct: hold them to the
  // SparseRows contract (ascending) and to the table's size.
  for (size_t i = 0; i < grad.rows.size(); ++i) {
    if (grad.rows[i] >= table_rows) {
      return Status::InvalidArgument(std::string(name) + ": grad.rows[" + std::to_string(i) +
                                     "] = " + std::to_string(grad.rows[i]) + "; the table has " +
                                     Count(table_rows, "rows"));
    }
    if (i > 0 && grad.rows[i] <= grad.rows[i - 1]) {
      return Status::InvalidArgument(
          std::string(name) + ": grad.rows must be strictly ascending; row " +
          std::to_string(grad.rows[i]) + " at index " + std::to_string(i) + " follows " +
          std::to_string(grad.rows[i - 1]));
    }
  }
  if (grad.rows.empty()) return Status::OK();
  DeviceBuffer<uint32_t> d_rows;
  DeviceBuffer<float> d_values;
  DeviceBuffer<float> d_params;
  DeviceBuffer<float> d_m;
  DeviceBuffer<float> d_v;
  DeviceBuffer<uint32_t> d_steps;
  GRIDSYNC_RETURN_IF_ERROR(d_rows.Upload(grad.rows));
  GRIDSYNC_RETURN_IF_ERROR(d_values.Upload(grad.values));
  GRIDSYNC_RETURN_IF_ERROR(d_params.Upload(*params));
  GRIDSYNC_RETURN_IF_ERROR(d_m.Upload(*m));
  GRIDSYNC_RETURN_IF_ERROR(d_v.Upload(*v));
  GRIDSYNC_RETURN_IF_ERROR(d_steps.Upload(*steps));
  GRIDSYNC_RETURN_IF_ERROR(::gridsync::cuda::AdamUpdateRows(
      hyper, width, d_rows.get(), grad.rows.size(), d_values.get(), grad_scale, d_params.get(),
      d_m.get(), d_v.get(), d_steps.get(), nullptr));
  GRIDSYNC_RETURN_IF_ERROR(SyncDefaultStream());
  GRIDSYNC_RETURN_IF_ERROR(d_params.Download(params));
  GRIDSYNC_RETURN_IF_ERROR(d_m.Download(m));
  GRIDSYNC_RETURN_IF_ERROR(d_v.Download(v));
  GRIDSYNC_RETURN_IF_ERROR(d_steps.Download(steps));
  for (auto* buffer : {&d_params, &d_m, &d_v, &d_values}) GRIDSYNC_RETURN_IF_ERROR(buffer->Free());
  GRIDSYNC_RETURN_IF_ERROR(d_steps.Free());
  GRIDSYNC_RETURN_IF_ERROR(d_rows.Free());
  return Status::OK();
}

}  // namespace host
Result<int> DeviceForLocalRank(int local_rank) {
  std::string reason;
  if (!Available(&reason)) return Status::Unsupported(reason);
  int count = 0;
  GRIDSYNC_CUDA_RETURN_IF_ERROR(cudaGetDeviceCount(&count));
  if (local_rank < 0) {
    return Status::InvalidArgument("local rank " + std::to_string(local_rank) +
                                   "; allowed: 0 or more");
  }
  return local_rank % count;
}

}  // namespace gridsync::cuda
