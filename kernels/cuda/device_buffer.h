// DeviceBuffer: an owning allocation of device memory (and PinnedBuffer, of
// page-locked host memory for asynchronous copies), so that an early
// return on any error frees everything; on success paths callers free
// explicitly (Free) so that cudaFree's status is checked too. CUDA sources
// only (it needs cuda_runtime.h).
//
// Thread safety: a buffer is owned by one thread at a time.
#pragma once

#include <cuda_runtime.h>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <vector>

#include "common/status.h"
#include "kernels/cuda/cuda_check.h"

namespace gridsync::cuda {

// An owning device allocation of `size` elements of T.
template <typename T>
class DeviceBuffer {
 public:
  DeviceBuffer() = default;
  DeviceBuffer(DeviceBuffer&& other) noexcept : ptr_(other.ptr_), size_(other.size_) {
    other.ptr_ = nullptr;
    other.size_ = 0;
  }
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;
  ~DeviceBuffer() {
    // Only reached with memory still held on an error path, where a Status
    // is already on its way out; a second failure here adds nothing to it.
    if (ptr_ != nullptr) {
      (void)cudaFree(ptr_);
      (void)cudaGetLastError();
    }
  }

  T* get() const { return ptr_; }
  size_t size() const { return size_; }

  // Allocates and copies `src` in (nothing is allocated for an empty src).
  template <typename Alloc>
  Status Upload(const std::vector<T, Alloc>& src) {
    if (src.empty()) return Status::OK();
    GRIDSYNC_RETURN_IF_ERROR(Allocate(src.size()));
    GRIDSYNC_CUDA_RETURN_IF_ERROR(
        cudaMemcpy(ptr_, src.data(), src.size() * sizeof(T), cudaMemcpyHostToDevice));
    return Status::OK();
  }

  // Allocates `size` zeroed elements.
  // Zeroed in stream order on `stream`: work later enqueued there sees the
  // zeros (the overload without a stream zeroes on the legacy default
  // stream, which a non-blocking stream does not wait for).
  Status AllocateZeroed(size_t size, cudaStream_t stream) {
    if (size == 0) return Status::OK();
    GRIDSYNC_RETURN_IF_ERROR(Allocate(size));
    GRIDSYNC_CUDA_RETURN_IF_ERROR(cudaMemsetAsync(ptr_, 0, size * sizeof(T), stream));
    return Status::OK();
  }
  Status AllocateZeroed(size_t size) {
    if (size == 0) return Status::OK();
    GRIDSYNC_RETURN_IF_ERROR(Allocate(size));
    GRIDSYNC_CUDA_RETURN_IF_ERROR(cudaMemset(ptr_, 0, size * sizeof(T)));
    return Status::OK();
  }

  // Copies the whole buffer into *dst, resized to fit.
  template <typename Alloc>
  Status Download(std::vector<T, Alloc>* dst) const {
    dst->resize(size_);
    if (size_ == 0) return Status::OK();
    GRIDSYNC_CUDA_RETURN_IF_ERROR(
        cudaMemcpy(dst->data(), ptr_, size_ * sizeof(T), cudaMemcpyDeviceToHost));
    return Status::OK();
  }

  Status Free() {
    T* ptr = ptr_;
    ptr_ = nullptr;
    size_ = 0;
    if (ptr != nullptr) GRIDSYNC_CUDA_RETURN_IF_ERROR(cudaFree(ptr));
    return Status::OK();
  }

 private:
  // Takes the pointer only once cudaMalloc succeeded, so the destructor never
  // frees what a failed call left behind.
  Status Allocate(size_t size) {
    void* ptr = nullptr;
    GRIDSYNC_CUDA_RETURN_IF_ERROR(cudaMalloc(&ptr, size * sizeof(T)));
    ptr_ = static_cast<T*>(ptr);
    size_ = size;
    return Status::OK();
  }

  T* ptr_ = nullptr;
  size_t size_ = 0;
};

// Grows `buffer` to at least `n` elements, zeroed, by half again so that a
// run's sizes settle after a few calls (what it held is not kept; work on
// `stream` that used it is waited for first).
template <typename T>
Status GrowBuffer(DeviceBuffer<T>* buffer, size_t n, cudaStream_t stream) {
  if (buffer->size() >= std::max<size_t>(n, 1)) return Status::OK();
  GRIDSYNC_CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(stream));
  GRIDSYNC_RETURN_IF_ERROR(buffer->Free());
  return buffer->AllocateZeroed(std::max<size_t>(n + n / 2, 1), stream);
}

// Pinned host memory, for copies that run asynchronously on the stream.
template <typename T>
class PinnedBuffer {
 public:
  PinnedBuffer() = default;
  PinnedBuffer(const PinnedBuffer&) = delete;
  PinnedBuffer& operator=(const PinnedBuffer&) = delete;
  ~PinnedBuffer() {
    if (ptr_ != nullptr) {
      (void)cudaFreeHost(ptr_);
      (void)cudaGetLastError();
    }
  }
  // Replaces any earlier allocation (its contents are not kept).
  Status Allocate(size_t size) {
    if (ptr_ != nullptr) {
      T* old = ptr_;
      ptr_ = nullptr;
      GRIDSYNC_CUDA_RETURN_IF_ERROR(cudaFreeHost(old));
    }
    void* ptr = nullptr;
    GRIDSYNC_CUDA_RETURN_IF_ERROR(cudaMallocHost(&ptr, std::max<size_t>(size, 1) * sizeof(T)));
    ptr_ = static_cast<T*>(ptr);
    return Status::OK();
  }
  T* get() const { return ptr_; }

 private:
  T* ptr_ = nullptr;
};

// Row ids staged to the device through pinned memory on a stream, in a
// buffer that grows by half again. Stage waits for the stream first: the
// previous copy out of the pinned ids, or one a call that failed midway
// left pending, may still read them.
class StagedRows {
 public:
  Status Stage(const uint32_t* rows, size_t n, cudaStream_t stream) {
    GRIDSYNC_CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(stream));
    if (n > capacity_) {
      const size_t capacity = n + n / 2;
      capacity_ = 0;  // a failed allocation leaves nothing "in capacity"
      GRIDSYNC_RETURN_IF_ERROR(host_.Allocate(capacity));
      GRIDSYNC_RETURN_IF_ERROR(device_.Free());
      GRIDSYNC_RETURN_IF_ERROR(device_.AllocateZeroed(capacity, stream));
      capacity_ = capacity;
    }
    if (n == 0) return Status::OK();
    std::memcpy(host_.get(), rows, n * sizeof(uint32_t));
    GRIDSYNC_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(device_.get(), host_.get(), n * sizeof(uint32_t),
                                                  cudaMemcpyHostToDevice, stream));
    return Status::OK();
  }
  // The staged ids (device memory), valid until the next Stage.
  const uint32_t* get() const { return device_.get(); }

 private:
  DeviceBuffer<uint32_t> device_;
  PinnedBuffer<uint32_t> host_;
  size_t capacity_ = 0;
};

}  // namespace gridsync::cuda
