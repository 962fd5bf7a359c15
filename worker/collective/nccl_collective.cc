// The NCCL backend (nccl_collective.h). Loading NCCL and the checked CUDA
// and NCCL calls it is written with live in nccl_api.h.
#include "worker/collective/nccl_collective.h"

#include <spdlog/fmt/fmt.h>

#ifndef GRIDSYNC_HAVE_NCCL
#define GRIDSYNC_HAVE_NCCL 0
#endif

#if GRIDSYNC_HAVE_NCCL

#include <cuda_runtime_api.h>
#include <nccl.h>

#include <algorithm>
#include <cstring>
#include <functional>
#include <mutex>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "worker/collective/nccl_api.h"

namespace gridsync {
namespace {

using namespace nccl_internal;  // NOLINT: this file's own helpers (nccl_api.h)

std::string StoreKey(const std::string& group, const std::string& what) { return "nccl/" + group + "/" + what; }

class NcclCollective final : public Collective {
 public:
  NcclCollective(int rank, int size, std::string group, std::chrono::milliseconds timeout, int device,
                 ncclComm_t comm, cudaStream_t stream, bool own_stream)
      : Collective(rank, size, std::move(group), timeout),
        device_(device),
        comm_(comm),
        stream_(stream),
        own_stream_(own_stream) {}

  ~NcclCollective() override {
    std::lock_guard<std::mutex> lock(mu_);
    (void)cudaSetDevice(device_);
    if (comm_ != nullptr) {
      bool clean = broken_.ok();
      if (clean) {
        const ncclResult_t finalized = Nccl().CommFinalize(comm_);
        clean = finalized == ncclSuccess || finalized == ncclInProgress;
      }
      if (clean) {
        clean = WaitComm(comm_, Clock::now() + timeout(), "ncclCommFinalize", timeout()).ok();
      }
      if (clean) {
        (void)Nccl().CommDestroy(comm_);
      } else {
        (void)Nccl().CommAbort(comm_);
      }
    }
    if (scratch_ != nullptr) (void)cudaFree(scratch_);
    if (own_stream_ && stream_ != nullptr) (void)cudaStreamDestroy(stream_);
    (void)cudaGetLastError();
  }

  std::string_view name() const override { return "nccl"; }

  Status AllReduceSum(float* data, size_t n) override {
    const std::string op = fmt::format("AllReduceSum({} floats)", n);
    GRIDSYNC_RETURN_IF_ERROR(CheckBuffer(op, data, n));
    if (n == 0) return Status::OK();
    return Run(op, data, n, data, n, [&](const float* in, float* out) -> Status {
      GRIDSYNC_NCCL_CHECK(comm_, Nccl().AllReduce(in, out, n, ncclFloat, ncclSum, comm_, stream_));
      return Status::OK();
    });
  }

  Status AllReduceSumHalf(uint16_t* data, size_t n, HalfFormat format) override {
    const std::string op = fmt::format("AllReduceSumHalf({} {} values)", n, ToString(format));
    GRIDSYNC_RETURN_IF_ERROR(CheckBuffer(op, data, n));
    if (n == 0) return Status::OK();
    const ncclDataType_t type = format == HalfFormat::kFp16 ? ncclHalf : ncclBfloat16;
    return Guarded(op, [&]() -> Status {
      GRIDSYNC_NCCL_CUDA_CHECK(cudaSetDevice(device_));
      const auto deadline = Clock::now() + timeout();
      void* buffer = data;
      if (!IsDevicePointer(data)) {
        // Staged through the float scratch: n 16-bit values fill n/2 floats.
        GRIDSYNC_RETURN_IF_ERROR(EnsureScratch((n + 1) / 2));
        buffer = scratch_;
        GRIDSYNC_NCCL_CUDA_CHECK(
            cudaMemcpyAsync(buffer, data, n * sizeof(uint16_t), cudaMemcpyHostToDevice, stream_));
      }
      GRIDSYNC_NCCL_CHECK(comm_,
                          Nccl().AllReduce(buffer, buffer, n, type, ncclSum, comm_, stream_));
      if (buffer != data) {
        GRIDSYNC_NCCL_CUDA_CHECK(
            cudaMemcpyAsync(data, buffer, n * sizeof(uint16_t), cudaMemcpyDeviceToHost, stream_));
      }
      return Complete(op, deadline);
    });
  }

  Status AllReduceSumGroup(std::span<const std::span<float>> buffers) override {
    bool all_device = true;
    size_t total = 0;
    for (const auto& buffer : buffers) {
      total += buffer.size();
      if (!buffer.empty()) all_device = all_device && IsDevicePointer(buffer.data());
    }
    // Host buffers: one staged all-reduce each (the base class).
    if (!all_device) return Collective::AllReduceSumGroup(buffers);
    const std::string op = fmt::format("AllReduceSumGroup({} buffers, {} floats)", buffers.size(), total);
    if (total == 0) return Status::OK();
    return Guarded(op, [&]() -> Status {
      GRIDSYNC_NCCL_CUDA_CHECK(cudaSetDevice(device_));
      const auto deadline = Clock::now() + timeout();
      GRIDSYNC_RETURN_IF_ERROR(EnqueueGroup(buffers));
      return Complete(op, deadline);
    });
  }

  bool enqueues_on_device() const override { return true; }

  Status EnqueueAllReduceSumGroup(std::span<const std::span<float>> buffers, void* ready) override {
    size_t total = 0;
    for (const auto& buffer : buffers) {
      total += buffer.size();
      if (!buffer.empty() && !IsDevicePointer(buffer.data())) {
        return Status::InvalidArgument(
            Describe("EnqueueAllReduceSumGroup") +
            ": a buffer is host memory; only device buffers can be enqueued");
      }
    }
    const std::string op =
        fmt::format("EnqueueAllReduceSumGroup({} buffers, {} floats)", buffers.size(), total);
    return Guarded(op, [&]() -> Status {
      GRIDSYNC_NCCL_CUDA_CHECK(cudaSetDevice(device_));
      if (ready != nullptr)
        GRIDSYNC_NCCL_CUDA_CHECK(cudaStreamWaitEvent(stream_, static_cast<cudaEvent_t>(ready), 0));
      if (total == 0) return Status::OK();
      GRIDSYNC_RETURN_IF_ERROR(EnqueueGroup(buffers));
      enqueued_floats_ += total;
      ++enqueued_groups_;
      return Status::OK();
    });
  }

  Status WaitEnqueued() override {
    const std::string op =
        fmt::format("WaitEnqueued({} groups, {} floats)", enqueued_groups_, enqueued_floats_);
    enqueued_groups_ = 0;
    enqueued_floats_ = 0;
    return Guarded(op, [&]() -> Status {
      GRIDSYNC_NCCL_CUDA_CHECK(cudaSetDevice(device_));
      return Complete(op, Clock::now() + timeout());
    });
  }

  Status ReduceScatterSum(const float* in, float* out, const std::vector<size_t>& counts) override {
    const std::string op = "ReduceScatterSum";
    GRIDSYNC_ASSIGN_OR_RETURN(const auto offsets, CheckSliced(op, counts, in, out));
    const auto me = static_cast<size_t>(rank());
    if (offsets.back() == 0) return Status::OK();
    const bool even = std::all_of(counts.begin(), counts.end(), [&](size_t c) { return c == counts[0]; });
    const std::string described = fmt::format("ReduceScatterSum({} floats, {} to this rank)", offsets.back(), counts[me]);
    return Run(described, in, offsets.back(), out, counts[me], [&](const float* d_in, float* d_out) -> Status {
      if (even) {
        GRIDSYNC_NCCL_CHECK(comm_, Nccl().ReduceScatter(d_in, d_out, counts[0], ncclFloat, ncclSum,
                                                        comm_, stream_));
        return Status::OK();
      }
      // Uneven slices: one ncclReduce per slice, rooted at its owner, fused.
      GRIDSYNC_NCCL_CHECK(comm_, Nccl().GroupStart());
      for (size_t r = 0; r < counts.size(); ++r) {
        if (counts[r] == 0) continue;
        const ncclResult_t result = Nccl().Reduce(d_in + offsets[r], d_out, counts[r], ncclFloat,
                                                  ncclSum, static_cast<int>(r), comm_, stream_);
        if (result != ncclSuccess && result != ncclInProgress) {
          (void)Nccl().GroupEnd();
          return NcclFailure(result, comm_, "Nccl().Reduce(d_in + offsets[r], d_out, ...)",
                             __FILE__, __LINE__);
        }
      }
      GRIDSYNC_NCCL_CHECK(comm_, Nccl().GroupEnd());
      return Status::OK();
    });
  }

  Status AllGatherV(const float* in, const std::vector<size_t>& counts, float* out) override {
    const std::string op = "AllGatherV";
    GRIDSYNC_ASSIGN_OR_RETURN(const auto offsets, CheckSliced(op, counts, out, in));
    const auto me = static_cast<size_t>(rank());
    if (offsets.back() == 0) return Status::OK();
    const bool even = std::all_of(counts.begin(), counts.end(), [&](size_t c) { return c == counts[0]; });
    const std::string described = fmt::format("AllGatherV({} floats, {} from this rank)", offsets.back(), counts[me]);
    return Run(described, in, counts[me], out, offsets.back(), [&](const float* d_in, float* d_out) -> Status {
      if (even) {
        GRIDSYNC_NCCL_CHECK(comm_,
                            Nccl().AllGather(d_in, d_out, counts[0], ncclFloat, comm_, stream_));
        return Status::OK();
      }
      // Uneven contributions: one ncclBroadcast per rank into its place.
      GRIDSYNC_NCCL_CHECK(comm_, Nccl().GroupStart());
      for (size_t r = 0; r < counts.size(); ++r) {
        if (counts[r] == 0) continue;
        const float* send = r == me ? d_in : d_out + offsets[r];
        const ncclResult_t result = Nccl().Broadcast(send, d_out + offsets[r], counts[r], ncclFloat,
                                                     static_cast<int>(r), comm_, stream_);
        if (result != ncclSuccess && result != ncclInProgress) {
          (void)Nccl().GroupEnd();
          return NcclFailure(result, comm_, "Nccl().Broadcast(send, d_out + offsets[r], ...)",
                             __FILE__, __LINE__);
        }
      }
      GRIDSYNC_NCCL_CHECK(comm_, Nccl().GroupEnd());
      return Status::OK();
    });
  }

  Status Broadcast(float* data, size_t n, int root) override {
    const std::string op = fmt::format("Broadcast({} floats, root {})", n, root);
    GRIDSYNC_RETURN_IF_ERROR(CheckRoot(op, root));
    GRIDSYNC_RETURN_IF_ERROR(CheckBuffer(op, data, n));
    if (n == 0) return Status::OK();
    return Run(op, data, n, data, n, [&](const float* in, float* out) -> Status {
      GRIDSYNC_NCCL_CHECK(comm_, Nccl().Broadcast(in, out, n, ncclFloat, root, comm_, stream_));
      return Status::OK();
    });
  }

  // NCCL has no barrier: an all-reduce of one float on the device.
  Status Barrier() override {
    return Guarded("Barrier", [&]() -> Status {
      GRIDSYNC_NCCL_CUDA_CHECK(cudaSetDevice(device_));
      const auto deadline = Clock::now() + timeout();
      GRIDSYNC_RETURN_IF_ERROR(EnsureScratch(1));
      GRIDSYNC_NCCL_CUDA_CHECK(cudaMemsetAsync(scratch_, 0, sizeof(float), stream_));
      GRIDSYNC_NCCL_CHECK(
          comm_, Nccl().AllReduce(scratch_, scratch_, 1, ncclFloat, ncclSum, comm_, stream_));
      return Complete("Barrier", deadline);
    });
  }

 private:
  // Runs `body` under the lock; any failure but a bad argument aborts the
  // communicator and breaks the group.
  Status Guarded(const std::string& op, const std::function<Status()>& body) {
    std::lock_guard<std::mutex> lock(mu_);
    if (!broken_.ok()) {
      return Status(broken_.code(),
                    fmt::format("{}: the group is broken by an earlier failure: {}", Describe(op), broken_.message()));
    }
    Status status = body();
    if (status.ok()) return status;
    status = Status(status.code(), fmt::format("{}: {}", Describe(op), status.message()));
    if (status.code() != StatusCode::kInvalidArgument) {
      broken_ = status;
      (void)Nccl().CommAbort(comm_);
      comm_ = nullptr;
      (void)cudaGetLastError();
    }
    return status;
  }

  // Enqueues `enqueue` on device pointers, staging host buffers through the
  // scratch buffer, and waits for completion.
  Status Run(const std::string& op, const float* in, size_t in_n, float* out, size_t out_n,
             const std::function<Status(const float*, float*)>& enqueue) {
    return Guarded(op, [&]() -> Status {
      GRIDSYNC_NCCL_CUDA_CHECK(cudaSetDevice(device_));
      const auto deadline = Clock::now() + timeout();
      const bool in_place = static_cast<const void*>(in) == static_cast<const void*>(out);
      const bool device = (in_n == 0 || IsDevicePointer(in)) && (out_n == 0 || IsDevicePointer(out));
      if (device) {
        GRIDSYNC_RETURN_IF_ERROR(enqueue(in, out));
        return Complete(op, deadline);
      }
      // Host memory: copy in, run on the device copy, copy out.
      const size_t need = in_place ? std::max(in_n, out_n) : in_n + out_n;
      GRIDSYNC_RETURN_IF_ERROR(EnsureScratch(need));
      float* d_in = scratch_;
      float* d_out = in_place ? scratch_ : scratch_ + in_n;
      if (in_n > 0) {
        GRIDSYNC_NCCL_CUDA_CHECK(
            cudaMemcpyAsync(d_in, in, in_n * sizeof(float), cudaMemcpyHostToDevice, stream_));
      }
      GRIDSYNC_RETURN_IF_ERROR(enqueue(d_in, d_out));
      if (out_n > 0) {
        GRIDSYNC_NCCL_CUDA_CHECK(
            cudaMemcpyAsync(out, d_out, out_n * sizeof(float), cudaMemcpyDeviceToHost, stream_));
      }
      return Complete(op, deadline);
    });
  }

  // One ncclGroup of in-place sums of device buffers on stream_; under mu_.
  Status EnqueueGroup(std::span<const std::span<float>> buffers) {
    GRIDSYNC_NCCL_CHECK(comm_, Nccl().GroupStart());
    for (const auto& buffer : buffers) {
      if (buffer.empty()) continue;
      const ncclResult_t result = Nccl().AllReduce(buffer.data(), buffer.data(), buffer.size(),
                                                   ncclFloat, ncclSum, comm_, stream_);
      if (result != ncclSuccess && result != ncclInProgress) {
        (void)Nccl().GroupEnd();
        return NcclFailure(result, comm_, "Nccl().AllReduce(buffer.data(), ...)", __FILE__,
                           __LINE__);
      }
    }
    GRIDSYNC_NCCL_CHECK(comm_, Nccl().GroupEnd());
    return Status::OK();
  }

  // Waits for the enqueued work: first the communicator (calls that returned
  // ncclInProgress), then the stream, watching for asynchronous NCCL errors
  // (a peer that died) and the deadline.
  Status Complete(const std::string& op, Clock::time_point deadline) {
    const std::string what = fmt::format("waiting for {}", op);
    GRIDSYNC_RETURN_IF_ERROR(WaitComm(comm_, deadline, what, timeout()));
    int round = 0;
    for (;;) {
      const cudaError_t query = cudaStreamQuery(stream_);
      if (query == cudaSuccess) return Status::OK();
      if (query != cudaErrorNotReady) return CudaFailure(query, "cudaStreamQuery(stream_)", __FILE__, __LINE__);
      ncclResult_t state = ncclSuccess;
      GRIDSYNC_NCCL_CHECK(comm_, Nccl().CommGetAsyncError(comm_, &state));
      if (state != ncclSuccess && state != ncclInProgress) {
        return NcclFailure(state, comm_, "Nccl().CommGetAsyncError(comm_, &state)", __FILE__,
                           __LINE__);
      }
      if (Clock::now() >= deadline) {
        return Status::Timeout(fmt::format(
            "did not complete within {}; the communicator was aborted (a peer may have died, stalled or not "
            "entered the operation)",
            FormatSeconds(timeout())));
      }
      Backoff(&round);
    }
  }

  Status EnsureScratch(size_t n) {
    if (n <= scratch_size_ && scratch_ != nullptr) return Status::OK();
    if (scratch_ != nullptr) {
      GRIDSYNC_NCCL_CUDA_CHECK(cudaStreamSynchronize(stream_));
      GRIDSYNC_NCCL_CUDA_CHECK(cudaFree(scratch_));
      scratch_ = nullptr;
      scratch_size_ = 0;
    }
    void* ptr = nullptr;
    GRIDSYNC_NCCL_CUDA_CHECK(cudaMalloc(&ptr, std::max<size_t>(n, 1) * sizeof(float)));
    scratch_ = static_cast<float*>(ptr);
    scratch_size_ = std::max<size_t>(n, 1);
    return Status::OK();
  }

  std::mutex mu_;  // serialises operations
  // Enqueued and not yet waited for (for WaitEnqueued's message).
  size_t enqueued_groups_ = 0;
  size_t enqueued_floats_ = 0;
  const int device_;
  ncclComm_t comm_;  // guarded by mu_; null once aborted
  cudaStream_t stream_;
  const bool own_stream_;
  Status broken_;              // guarded by mu_
  float* scratch_ = nullptr;   // guarded by mu_: device staging buffer
  size_t scratch_size_ = 0;    // guarded by mu_
};

// The ranks whose "joined" key is missing (a look, not a wait).
std::vector<int> MissingRanks(Store* store, const std::string& group, int size, int rank) {
  std::vector<int> missing;
  for (int r = 0; r < size; ++r) {
    if (r == rank) continue;
    if (!store->Get({StoreKey(group, "joined/" + std::to_string(r))}, std::chrono::milliseconds(0)).ok()) {
      missing.push_back(r);
    }
  }
  return missing;
}

Status CreateChecked(Store* store, int rank, int size, const std::string& group, const NcclCollectiveOptions& options,
                     const std::string& what, std::unique_ptr<Collective>* result) {
  const auto deadline = Clock::now() + options.timeout;
  int count = 0;
  const cudaError_t counted = cudaGetDeviceCount(&count);
  if (counted != cudaSuccess || count == 0) {
    (void)cudaGetLastError();
    return Status::Unsupported(fmt::format(
        "{}: no CUDA device: {}", what,
        counted != cudaSuccess ? fmt::format("cudaGetDeviceCount(&count) failed: {}: {}", cudaGetErrorName(counted),
                                             cudaGetErrorString(counted))
                               : std::string("cudaGetDeviceCount(&count) reports 0 devices")));
  }
  int device = options.device;
  if (device < 0) GRIDSYNC_NCCL_CUDA_CHECK(cudaGetDevice(&device));
  if (device >= count) {
    return Status::InvalidArgument(
        fmt::format("{}: CUDA device {} does not exist (this host has {})", what, device, count));
  }
  GRIDSYNC_NCCL_CUDA_CHECK(cudaSetDevice(device));

  // The unique id: created by rank 0, fetched by everyone else.
  ncclUniqueId id;
  std::memset(&id, 0, sizeof(id));
  const std::string id_key = StoreKey(group, "id");
  if (rank == 0) {
    GRIDSYNC_NCCL_CHECK(nullptr, Nccl().GetUniqueId(&id));
    GRIDSYNC_RETURN_IF_ERROR(
        store->Set(id_key, std::string(id.internal, sizeof(id.internal))).WithContext(what + ": publishing the ncclUniqueId"));
  } else {
    auto got = store->Get({id_key}, options.timeout);
    if (!got.ok()) {
      return Status(got.status().code(), fmt::format("{}: waiting {} for rank 0's ncclUniqueId (rank 0 did not join?): {}",
                                                     what, FormatSeconds(options.timeout), got.status().message()));
    }
    const std::string& bytes = got->front();
    if (bytes.size() != sizeof(id.internal)) {
      return Status::Corruption(fmt::format("{}: the ncclUniqueId under '{}' has {} bytes, expected {}", what, id_key,
                                            bytes.size(), sizeof(id.internal)));
    }
    std::memcpy(id.internal, bytes.data(), sizeof(id.internal));
  }
  GRIDSYNC_RETURN_IF_ERROR(store->Set(StoreKey(group, "joined/" + std::to_string(rank)), "1").WithContext(what));

  ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
  config.blocking = 0;
  ncclComm_t comm = nullptr;
  const ncclResult_t started = Nccl().CommInitRankConfig(&comm, size, id, rank, &config);
  Status status;
  if (started != ncclSuccess && started != ncclInProgress) {
    status = NcclFailure(started, comm, "Nccl().CommInitRankConfig(&comm, size, id, rank, &config)",
                         __FILE__, __LINE__);
  } else {
    status = WaitComm(comm, deadline, "ncclCommInitRankConfig", options.timeout);
  }
  if (!status.ok()) {
    if (comm != nullptr) (void)Nccl().CommAbort(comm);
    const auto missing = MissingRanks(store, group, size, rank);
    return Status(status.code(), fmt::format("{}: {}{}", what, status.message(),
                                             missing.empty() ? "" : "; ranks that did not join: " + FormatRanks(missing)));
  }

  cudaStream_t stream = options.stream;
  const bool own_stream = stream == nullptr;
  if (own_stream) {
    const cudaError_t created = cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking);
    if (created != cudaSuccess) {
      (void)Nccl().CommAbort(comm);
      return CudaFailure(created, "cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking)", __FILE__, __LINE__)
          .WithContext(what);
    }
  }
  result->reset(new NcclCollective(rank, size, group, options.timeout, device, comm, stream, own_stream));
  return Status::OK();
}

}  // namespace

Status LoadNcclLibrary() { return LoadNccl().status(); }

bool NcclAvailable(std::string* reason) {
  int count = 0;
  const cudaError_t counted = cudaGetDeviceCount(&count);
  if (counted != cudaSuccess || count == 0) {
    (void)cudaGetLastError();
    if (reason != nullptr) {
      *reason = counted != cudaSuccess
                    ? fmt::format("no CUDA device: cudaGetDeviceCount(&count) failed: {}: {}",
                                  cudaGetErrorName(counted), cudaGetErrorString(counted))
                    : "no CUDA device: cudaGetDeviceCount(&count) reports 0 devices";
    }
    return false;
  }
  if (auto loaded = LoadNccl(); !loaded.ok()) {
    if (reason != nullptr) *reason = loaded.status().message();
    return false;
  }
  return true;
}

Result<std::unique_ptr<Collective>> NewNcclCollective(Store* store, int rank, int size, const std::string& group,
                                                      const NcclCollectiveOptions& options) {
  const std::string what = fmt::format("nccl init of group '{}' (rank {} of {})", group, rank, size);
  if (store == nullptr) return Status::InvalidArgument(what + ": no store given");
  if (size < 1 || rank < 0 || rank >= size) {
    return Status::InvalidArgument(what + ": rank must be in 0..size-1 and size at least 1");
  }
  if (group.empty()) return Status::InvalidArgument(what + ": the group name is empty");
  if (options.timeout.count() <= 0) {
    return Status::InvalidArgument(fmt::format("{}: timeout must be positive, got {} ms", what, options.timeout.count()));
  }
  if (auto loaded = LoadNccl(); !loaded.ok()) return loaded.status().WithContext(what);
  std::unique_ptr<Collective> collective;
  Status status = CreateChecked(store, rank, size, group, options, what, &collective);
  if (!status.ok()) return status;
  return collective;
}

}  // namespace gridsync

#else  // !GRIDSYNC_HAVE_NCCL

namespace gridsync {

namespace {
constexpr const char* kNoNccl =
    "this build has no NCCL support (built without CUDA/NCCL, GRIDSYNC_HAVE_NCCL=0); use the gloo backend";
}

bool NcclAvailable(std::string* reason) {
  if (reason != nullptr) *reason = kNoNccl;
  return false;
}

Status LoadNcclLibrary() { return Status::Unsupported(kNoNccl); }

Result<std::unique_ptr<Collective>> NewNcclCollective(Store*, int rank, int size, const std::string& group,
                                                      const NcclCollectiveOptions&) {
  return Status::Unsupported(fmt::format("nccl init of group '{}' (rank {} of {}): {}", group, rank, size, kNoNccl));
}

}  // namespace gridsync

#endif  // GRIDSYNC_HAVE_NCCL
