// DeviceTrainer (device_trainer.h): the hash-grid model trained on one
// CUDA device. Layouts follow the CPU model: features are n x input_width
// floats, sample-major, which is the MLP's input matrix (input_width x n,
// column-major) without a copy; every activation is width x n column-major.
//
// Thread safety: see device_trainer.h.
#include <cublas_v2.h>
#include <cuda_runtime.h>
#include <dlfcn.h>

#include <algorithm>
#include <cstring>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

#include "kernels/adam_math.h"
#include "kernels/cuda/cuda_check.h"
#include "kernels/cuda/cuda_kernels.h"
#include "kernels/cuda/device_buffer.h"
#include "kernels/cuda/device_trainer.h"

namespace gridsync::cuda {
namespace {

constexpr uint32_t kBlockSize = 256;
constexpr size_t kMaxBlocks = 65535;

unsigned Blocks(size_t n) {
  return static_cast<unsigned>(
      std::max<size_t>(1, std::min((n + kBlockSize - 1) / kBlockSize, kMaxBlocks)));
}

// cuBLAS, loaded when a trainer is made rather than linked: every binary
// links the kernels, and a CPU host need not have NVIDIA's BLAS (linked, it
// also broke civetweb's server start in the worker).
struct CublasApi {
  decltype(&cublasCreate_v2) create = nullptr;
  decltype(&cublasDestroy_v2) destroy = nullptr;
  decltype(&cublasSetStream_v2) set_stream = nullptr;
  decltype(&cublasSetMathMode) set_math_mode = nullptr;
  decltype(&cublasSgemm_v2) sgemm = nullptr;
  decltype(&cublasGetStatusString) status_string = nullptr;
};

Result<const CublasApi*> LoadCublas() {
  static CublasApi api;
  static std::string error;
  static std::once_flag once;
  std::call_once(once, [] {
    void* library = nullptr;
    for (const char* name : {"libcublas.so.13", "libcublas.so.12", "libcublas.so"}) {
      library = dlopen(name, RTLD_NOW | RTLD_LOCAL);
      if (library != nullptr) break;
    }
    if (library == nullptr) {
      const char* why = dlerror();
      error = std::string("cannot load cuBLAS (libcublas.so.13): ") + (why ? why : "not found");
      return;
    }
    auto sym = [&](const char* name) { return dlsym(library, name); };
    api.create = reinterpret_cast<decltype(api.create)>(sym("cublasCreate_v2"));
    api.destroy = reinterpret_cast<decltype(api.destroy)>(sym("cublasDestroy_v2"));
    api.set_stream = reinterpret_cast<decltype(api.set_stream)>(sym("cublasSetStream_v2"));
    api.set_math_mode = reinterpret_cast<decltype(api.set_math_mode)>(sym("cublasSetMathMode"));
    api.sgemm = reinterpret_cast<decltype(api.sgemm)>(sym("cublasSgemm_v2"));
    api.status_string = reinterpret_cast<decltype(api.status_string)>(sym("cublasGetStatusString"));
    if (!api.create || !api.destroy || !api.set_stream || !api.set_math_mode || !api.sgemm ||
        !api.status_string) {
      error = "the cuBLAS library found lacks a function the trainer needs";
    }
  });
  if (!error.empty()) return Status::Unsupported(error);
  return &api;
}

const CublasApi& Cublas() { return **LoadCublas(); }  // after a successful LoadCublas

Status CublasStatus(cublasStatus_t status, const char* expr) {
  if (status == CUBLAS_STATUS_SUCCESS) return Status::OK();
  return Status::Internal(std::string(expr) + " failed: " + Cublas().status_string(status));
}
#define GRIDSYNC_CUBLAS_RETURN_IF_ERROR(expr) GRIDSYNC_RETURN_IF_ERROR(CublasStatus((expr), #expr))

__global__ void ReluKernel(float* __restrict__ x, size_t n) {
  const size_t stride = size_t{gridDim.x} * blockDim.x;
  for (size_t i = size_t{blockIdx.x} * blockDim.x + threadIdx.x; i < n; i += stride)
    x[i] = fmaxf(x[i], 0.0f);
}

// delta *= (activation > 0): ReLU passes the gradient where its output was
// positive.
__global__ void ReluBackwardKernel(const float* __restrict__ activation, float* __restrict__ delta,
                                   size_t n) {
  const size_t stride = size_t{gridDim.x} * blockDim.x;
  for (size_t i = size_t{blockIdx.x} * blockDim.x + threadIdx.x; i < n; i += stride)
    delta[i] = activation[i] > 0.0f ? delta[i] : 0.0f;
}

// dy = (y - t) * dy_scale; *sse += sum (y - t)^2 (a block's partial sum in
// shared memory, one atomic per block).
__global__ void __launch_bounds__(kBlockSize)
    MseKernel(const float* __restrict__ y, const float* __restrict__ t, float dy_scale, size_t n,
              float* __restrict__ dy, double* __restrict__ sse) {
  __shared__ double partial[kBlockSize];
  double mine = 0.0;
  const size_t stride = size_t{gridDim.x} * blockDim.x;
  for (size_t i = size_t{blockIdx.x} * blockDim.x + threadIdx.x; i < n; i += stride) {
    const float d = y[i] - t[i];
    mine += static_cast<double>(d) * d;
    dy[i] = d * dy_scale;
  }
  partial[threadIdx.x] = mine;
  __syncthreads();
  for (uint32_t s = kBlockSize / 2; s > 0; s /= 2) {
    if (threadIdx.x < s) partial[threadIdx.x] += partial[threadIdx.x + s];
    __syncthreads();
  }
  if (threadIdx.x == 0) atomicAdd(sse, partial[0]);
}

// Adam on every grid row whose gradient is not all zero (the CPU rule:
// untouched rows keep their step count, m and v), each row with its own step
// count; the gradient row is zeroed for the next step.
__global__ void __launch_bounds__(kBlockSize)
    GridAdamKernel(const AdamHyper hyper, uint32_t width, size_t rows, float* __restrict__ grad,
                   float* __restrict__ params, float* __restrict__ m, float* __restrict__ v,
                   uint32_t* __restrict__ steps) {
  const size_t stride = size_t{gridDim.x} * blockDim.x;
  for (size_t row = size_t{blockIdx.x} * blockDim.x + threadIdx.x; row < rows; row += stride) {
    const size_t base = row * width;
    float* g = grad + base;
    if (!AdamUpdateRow(hyper, width, g, 1.0f, params + base, m + base, v + base, steps + row))
      continue;
    for (uint32_t f = 0; f < width; ++f) g[f] = 0.0f;
  }
}

// Adam on every weight of a matrix (the MLP's always step); gradient zeroed.
__global__ void DenseAdamKernel(const AdamHyper hyper, float step_size, size_t n,
                                float* __restrict__ grad, float* __restrict__ params,
                                float* __restrict__ m, float* __restrict__ v) {
  const size_t stride = size_t{gridDim.x} * blockDim.x;
  for (size_t i = size_t{blockIdx.x} * blockDim.x + threadIdx.x; i < n; i += stride) {
    AdamUpdate(hyper, step_size, grad[i], &params[i], &m[i], &v[i]);
    grad[i] = 0.0f;
  }
}

class DeviceTrainerImpl : public DeviceTrainer {
 public:
  DeviceTrainerImpl(const HashGridLayout& layout, const MlpShape& dims, const AdamHyper& hyper,
                    int device, size_t max_batch)
      : layout_(layout), dims_(dims), hyper_(hyper), device_(device), max_batch_(max_batch) {}

  ~DeviceTrainerImpl() override {
    if (cublas_ != nullptr) (void)Cublas().destroy(cublas_);
    if (stream_ != nullptr) (void)cudaStreamDestroy(stream_);
    (void)cudaGetLastError();
  }

  Status Init(const std::vector<float>& grid, const std::vector<std::vector<float>>& mlp) {
    GRIDSYNC_CUDA_RETURN_IF_ERROR(cudaSetDevice(device_));
    cudaDeviceProp props{};
    GRIDSYNC_CUDA_RETURN_IF_ERROR(cudaGetDeviceProperties(&props, device_));
    name_ = std::string(props.name) + " (device " + std::to_string(device_) + ")";
    GRIDSYNC_CUDA_RETURN_IF_ERROR(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking));
    GRIDSYNC_CUBLAS_RETURN_IF_ERROR(Cublas().create(&cublas_));
    GRIDSYNC_CUBLAS_RETURN_IF_ERROR(Cublas().set_stream(cublas_, stream_));
    // fp32 as the CPU twin computes it: no TF32 tensor-core rounding.
    GRIDSYNC_CUBLAS_RETURN_IF_ERROR(Cublas().set_math_mode(cublas_, CUBLAS_PEDANTIC_MATH));

    const size_t total = layout_.total_params();
    const uint32_t width = layout_.features();
    GRIDSYNC_RETURN_IF_ERROR(grid_.Upload(grid));
    GRIDSYNC_RETURN_IF_ERROR(grid_m_.AllocateZeroed(total));
    GRIDSYNC_RETURN_IF_ERROR(grid_v_.AllocateZeroed(total));
    GRIDSYNC_RETURN_IF_ERROR(grid_grad_.AllocateZeroed(total));
    GRIDSYNC_RETURN_IF_ERROR(grid_steps_.AllocateZeroed(total / width));
    for (int i = 0; i < dims_.n_matrices(); ++i) {
      const size_t n = static_cast<size_t>(dims_.rows(i)) * static_cast<size_t>(dims_.cols(i));
      mlp_.emplace_back();
      mlp_m_.emplace_back();
      mlp_v_.emplace_back();
      mlp_grad_.emplace_back();
      GRIDSYNC_RETURN_IF_ERROR(mlp_.back().Upload(mlp[static_cast<size_t>(i)]));
      GRIDSYNC_RETURN_IF_ERROR(mlp_m_.back().AllocateZeroed(n));
      GRIDSYNC_RETURN_IF_ERROR(mlp_v_.back().AllocateZeroed(n));
      GRIDSYNC_RETURN_IF_ERROR(mlp_grad_.back().AllocateZeroed(n));
    }
    const size_t b = max_batch_;
    const size_t dims = layout_.spec().dims;
    const size_t in = static_cast<size_t>(dims_.input_width);
    const size_t hidden = static_cast<size_t>(dims_.hidden_width);
    const size_t out = static_cast<size_t>(dims_.output_width);
    GRIDSYNC_RETURN_IF_ERROR(positions_.AllocateZeroed(b * dims));
    GRIDSYNC_RETURN_IF_ERROR(targets_.AllocateZeroed(b * out));
    GRIDSYNC_RETURN_IF_ERROR(features_.AllocateZeroed(b * in));
    GRIDSYNC_RETURN_IF_ERROR(d_features_.AllocateZeroed(b * in));
    for (int l = 0; l < dims_.hidden_layers; ++l) {
      hidden_.emplace_back();
      GRIDSYNC_RETURN_IF_ERROR(hidden_.back().AllocateZeroed(b * hidden));
    }
    for (auto& d : delta_) GRIDSYNC_RETURN_IF_ERROR(d.AllocateZeroed(b * std::max(hidden, out)));
    GRIDSYNC_RETURN_IF_ERROR(y_.AllocateZeroed(b * out));
    GRIDSYNC_RETURN_IF_ERROR(sse_.AllocateZeroed(1));
    GRIDSYNC_RETURN_IF_ERROR(positions_host_.Allocate(b * dims));
    GRIDSYNC_RETURN_IF_ERROR(targets_host_.Allocate(b * out));
    GRIDSYNC_RETURN_IF_ERROR(sse_host_.Allocate(1));
    GRIDSYNC_CUDA_RETURN_IF_ERROR(cudaDeviceSynchronize());
    return Status::OK();
  }

  Result<double> Step(const float* positions, const float* targets, size_t n, size_t global_batch,
                      uint32_t active_levels) override {
    GRIDSYNC_RETURN_IF_ERROR(CheckBatch(n, "Step"));
    if (n == 0) return 0.0;
    GRIDSYNC_CUDA_RETURN_IF_ERROR(cudaSetDevice(device_));
    GRIDSYNC_RETURN_IF_ERROR(UploadBatch(positions, targets, n));
    GRIDSYNC_RETURN_IF_ERROR(Forward(n, active_levels));
    const int out = dims_.output_width;
    // d(mean squared error)/dy, as worker/model.cc folds it.
    const float dy_scale = 2.0f / static_cast<float>(global_batch * static_cast<size_t>(out));
    GRIDSYNC_CUDA_RETURN_IF_ERROR(cudaMemsetAsync(sse_.get(), 0, sizeof(double), stream_));
    float* dy = delta_[0].get();
    MseKernel<<<Blocks(n * out), kBlockSize, 0, stream_>>>(
        y_.get(), targets_.get(), dy_scale, n * static_cast<size_t>(out), dy, sse_.get());
    GRIDSYNC_CUDA_RETURN_IF_LAUNCH_ERROR();
    GRIDSYNC_RETURN_IF_ERROR(Backward(n));
    GRIDSYNC_RETURN_IF_ERROR(HashGridBackward(layout_, positions_.get(), n, active_levels,
                                              d_features_.get(), grid_grad_.get(), stream_));
    GRIDSYNC_RETURN_IF_ERROR(Adam());
    GRIDSYNC_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(sse_host_.get(), sse_.get(), sizeof(double),
                                                  cudaMemcpyDeviceToHost, stream_));
    GRIDSYNC_CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(stream_));
    return *sse_host_.get();
  }

  Status Predict(const float* positions, size_t n, uint32_t active_levels, float* out) override {
    GRIDSYNC_CUDA_RETURN_IF_ERROR(cudaSetDevice(device_));
    const size_t dims = layout_.spec().dims;
    const size_t width = static_cast<size_t>(dims_.output_width);
    for (size_t begin = 0; begin < n; begin += max_batch_) {
      const size_t count = std::min(max_batch_, n - begin);
      std::memcpy(positions_host_.get(), positions + begin * dims, count * dims * sizeof(float));
      GRIDSYNC_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(positions_.get(), positions_host_.get(),
                                                    count * dims * sizeof(float),
                                                    cudaMemcpyHostToDevice, stream_));
      GRIDSYNC_RETURN_IF_ERROR(Forward(count, active_levels));
      GRIDSYNC_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(out + begin * width, y_.get(),
                                                    count * width * sizeof(float),
                                                    cudaMemcpyDeviceToHost, stream_));
      GRIDSYNC_CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(stream_));
    }
    return Status::OK();
  }

  Status Download(std::vector<float>* grid, std::vector<std::vector<float>>* mlp) override {
    GRIDSYNC_CUDA_RETURN_IF_ERROR(cudaSetDevice(device_));
    GRIDSYNC_CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(stream_));
    GRIDSYNC_RETURN_IF_ERROR(grid_.Download(grid));
    mlp->resize(mlp_.size());
    for (size_t i = 0; i < mlp_.size(); ++i) GRIDSYNC_RETURN_IF_ERROR(mlp_[i].Download(&(*mlp)[i]));
    return Status::OK();
  }

  std::string device_name() const override { return name_; }

 private:
  Status CheckBatch(size_t n, const char* what) const {
    if (n <= max_batch_) return Status::OK();
    return Status::InvalidArgument(std::string("DeviceTrainer::") + what + ": " +
                                   std::to_string(n) + " samples; allowed: at most " +
                                   std::to_string(max_batch_) + " (the batch it was made for)");
  }

  Status UploadBatch(const float* positions, const float* targets, size_t n) {
    const size_t dims = layout_.spec().dims;
    const size_t out = static_cast<size_t>(dims_.output_width);
    // The previous step synchronised the stream, so the pinned staging is
    // free to overwrite.
    std::memcpy(positions_host_.get(), positions, n * dims * sizeof(float));
    std::memcpy(targets_host_.get(), targets, n * out * sizeof(float));
    GRIDSYNC_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(positions_.get(), positions_host_.get(),
                                                  n * dims * sizeof(float), cudaMemcpyHostToDevice,
                                                  stream_));
    GRIDSYNC_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(targets_.get(), targets_host_.get(),
                                                  n * out * sizeof(float), cudaMemcpyHostToDevice,
                                                  stream_));
    return Status::OK();
  }

  // C (m x n) = op(A) * op(B) + beta * C, column-major.
  Status Gemm(cublasOperation_t ta, cublasOperation_t tb, int m, int n, int k, const float* a,
              int lda, const float* b, int ldb, float beta, float* c, int ldc) {
    const float one = 1.0f;
    GRIDSYNC_CUBLAS_RETURN_IF_ERROR(
        Cublas().sgemm(cublas_, ta, tb, m, n, k, &one, a, lda, b, ldb, &beta, c, ldc));
    return Status::OK();
  }

  // Encoding, then the MLP: y_ (output_width x n); hidden_ keep the
  // post-ReLU activations for the backward pass.
  Status Forward(size_t n, uint32_t active_levels) {
    GRIDSYNC_RETURN_IF_ERROR(HashGridForward(layout_, positions_.get(), n, active_levels,
                                             grid_.get(), features_.get(), stream_));
    const int cols = static_cast<int>(n);
    const float* input = features_.get();
    for (int i = 0; i < dims_.n_matrices(); ++i) {
      const bool last = i == dims_.hidden_layers;
      float* output = last ? y_.get() : hidden_[static_cast<size_t>(i)].get();
      GRIDSYNC_RETURN_IF_ERROR(Gemm(CUBLAS_OP_N, CUBLAS_OP_N, dims_.rows(i), cols, dims_.cols(i),
                                    mlp_[static_cast<size_t>(i)].get(), dims_.rows(i), input,
                                    dims_.cols(i), 0.0f, output, dims_.rows(i)));
      if (!last) {
        const size_t count = static_cast<size_t>(dims_.rows(i)) * n;
        ReluKernel<<<Blocks(count), kBlockSize, 0, stream_>>>(output, count);
        GRIDSYNC_CUDA_RETURN_IF_LAUNCH_ERROR();
      }
      input = output;
    }
    return Status::OK();
  }

  // From dy (delta_[0]): the MLP weight gradients (added) and d_features_.
  Status Backward(size_t n) {
    const int cols = static_cast<int>(n);
    int current = 0;  // delta_[current] holds dLoss/d(pre-activation) of layer i
    for (int i = dims_.hidden_layers; i >= 0; --i) {
      const size_t index = static_cast<size_t>(i);
      const float* activation = i == 0 ? features_.get() : hidden_[index - 1].get();
      const int rows = dims_.rows(i), inner = dims_.cols(i);
      // dW_i += delta_i * a_{i-1}^T
      GRIDSYNC_RETURN_IF_ERROR(Gemm(CUBLAS_OP_N, CUBLAS_OP_T, rows, inner, cols,
                                    delta_[current].get(), rows, activation, inner, 1.0f,
                                    mlp_grad_[index].get(), rows));
      // d a_{i-1} = W_i^T * delta_i
      float* below = i == 0 ? d_features_.get() : delta_[1 - current].get();
      GRIDSYNC_RETURN_IF_ERROR(Gemm(CUBLAS_OP_T, CUBLAS_OP_N, inner, cols, rows, mlp_[index].get(),
                                    rows, delta_[current].get(), rows, 0.0f, below, inner));
      if (i > 0) {
        const size_t count = static_cast<size_t>(inner) * n;
        ReluBackwardKernel<<<Blocks(count), kBlockSize, 0, stream_>>>(activation, below, count);
        GRIDSYNC_CUDA_RETURN_IF_LAUNCH_ERROR();
        current = 1 - current;
      }
    }
    return Status::OK();
  }

  Status Adam() {
    const uint32_t width = layout_.features();
    const size_t rows = layout_.total_params() / width;
    GridAdamKernel<<<Blocks(rows), kBlockSize, 0, stream_>>>(hyper_, width, rows, grid_grad_.get(),
                                                             grid_.get(), grid_m_.get(),
                                                             grid_v_.get(), grid_steps_.get());
    GRIDSYNC_CUDA_RETURN_IF_LAUNCH_ERROR();
    // MLP weights step together: one count, the step size computed here as
    // the CPU's AdamTable does.
    ++mlp_step_;
    const float step_size = AdamStepSize(hyper_, mlp_step_);
    for (size_t i = 0; i < mlp_.size(); ++i) {
      const size_t n = mlp_[i].size();
      DenseAdamKernel<<<Blocks(n), kBlockSize, 0, stream_>>>(hyper_, step_size, n,
                                                             mlp_grad_[i].get(), mlp_[i].get(),
                                                             mlp_m_[i].get(), mlp_v_[i].get());
      GRIDSYNC_CUDA_RETURN_IF_LAUNCH_ERROR();
    }
    return Status::OK();
  }

  const HashGridLayout layout_;
  const MlpShape dims_;
  const AdamHyper hyper_;
  const int device_;
  const size_t max_batch_;
  std::string name_;
  cudaStream_t stream_ = nullptr;
  cublasHandle_t cublas_ = nullptr;
  uint32_t mlp_step_ = 0;

  DeviceBuffer<float> grid_, grid_m_, grid_v_, grid_grad_;
  DeviceBuffer<uint32_t> grid_steps_;
  std::vector<DeviceBuffer<float>> mlp_, mlp_m_, mlp_v_, mlp_grad_;
  DeviceBuffer<float> positions_, targets_, features_, d_features_, y_;
  std::vector<DeviceBuffer<float>> hidden_;
  DeviceBuffer<float> delta_[2];
  DeviceBuffer<double> sse_;
  PinnedBuffer<float> positions_host_, targets_host_;
  PinnedBuffer<double> sse_host_;
};

}  // namespace

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

Result<std::unique_ptr<DeviceTrainer>> DeviceTrainer::Create(
    const HashGridLayout& layout, const MlpShape& mlp, const AdamHyper& hyper,
    const std::vector<float>& grid, const std::vector<std::vector<float>>& mlp_weights, int device,
    size_t max_batch) {
  std::string reason;
  if (!Available(&reason)) return Status::Unsupported("training.device cuda: " + reason);
  GRIDSYNC_RETURN_IF_ERROR(LoadCublas().status().WithContext("training.device cuda"));
  if (grid.size() != layout.total_params()) {
    return Status::InvalidArgument("DeviceTrainer: grid has " + std::to_string(grid.size()) +
                                   " parameters; the layout has " +
                                   std::to_string(layout.total_params()));
  }
  if (mlp.input_width != static_cast<int>(layout.output_width())) {
    return Status::InvalidArgument("DeviceTrainer: MLP input width " +
                                   std::to_string(mlp.input_width) + ", encoding output width " +
                                   std::to_string(layout.output_width()));
  }
  if (mlp_weights.size() != static_cast<size_t>(mlp.n_matrices())) {
    return Status::InvalidArgument("DeviceTrainer: " + std::to_string(mlp_weights.size()) +
                                   " MLP matrices; expected " + std::to_string(mlp.n_matrices()));
  }
  for (int i = 0; i < mlp.n_matrices(); ++i) {
    const size_t want = static_cast<size_t>(mlp.rows(i)) * static_cast<size_t>(mlp.cols(i));
    if (mlp_weights[static_cast<size_t>(i)].size() != want) {
      return Status::InvalidArgument("DeviceTrainer: MLP matrix " + std::to_string(i) + " has " +
                                     std::to_string(mlp_weights[static_cast<size_t>(i)].size()) +
                                     " weights; expected " + std::to_string(want));
    }
  }
  if (max_batch == 0 || max_batch > (size_t{1} << 28)) {
    return Status::InvalidArgument("DeviceTrainer: max_batch " + std::to_string(max_batch) +
                                   "; allowed: 1..2^28");
  }
  auto trainer = std::make_unique<DeviceTrainerImpl>(layout, mlp, hyper, device, max_batch);
  GRIDSYNC_RETURN_IF_ERROR(
      trainer->Init(grid, mlp_weights)
          .WithContext("training.device cuda: preparing device " + std::to_string(device)));
  return std::unique_ptr<DeviceTrainer>(std::move(trainer));
}

}  // namespace gridsync::cuda
