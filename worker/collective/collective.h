// Collective: the seam between the sync strategies and the collective
// backends, kept as small as Gloo's algorithm entry points.
//
// A Collective is one member (rank) of a fixed group of `size` ranks. Every
// operation is collective: each rank of the group must issue the same
// operations, with the same sizes, in the same order. Backends:
//   - LocalCollective (local_collective.h): ranks are threads of one process
//     sharing an in-memory hub; the twin for tests of the sync strategies.
//   - Gloo (gloo_collective.h): TCP between processes, host memory.
//   - NCCL (nccl_collective.h): device memory, one GPU per rank.
// MakeCollective (factory.h) picks one by name.
//
// Buffers are float32 in host memory (Local, Gloo) or device memory (NCCL;
// host pointers are accepted there too and staged through the device);
// AllReduceSumHalf sums 16-bit floats (fp16 or bf16), half the bytes.
// A count of 0 is a valid no-op.
//
// Failure: every operation has a timeout, fixed when the collective is
// created. A timeout, a peer that died or left, or an I/O error returns a
// non-OK Status naming the backend, the operation, the group and this rank,
// and where the backend can tell, the ranks that are missing, instead of
// hanging. After a failed operation (other than InvalidArgument for bad
// arguments) the group is broken, as an aborted NCCL communicator is: later
// operations fail at once with the original cause. Build a new group (a new
// group name) to continue.
//
// Thread safety: rank(), size(), name(), group() and timeout() may be called
// from any thread. Operations on one Collective are serialised internally,
// but since all ranks must agree on their order, callers should issue them
// from one thread. Distinct Collective objects are independent.
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "common/status.h"

namespace gridsync {

// The 16-bit float formats AllReduceSumHalf carries.
enum class HalfFormat { kFp16, kBf16 };
std::string_view ToString(HalfFormat format);

class Collective {
 public:
  virtual ~Collective() = default;
  Collective(const Collective&) = delete;
  Collective& operator=(const Collective&) = delete;

  int rank() const { return rank_; }
  int size() const { return size_; }
  // The backend: "local", "gloo" or "nccl".
  virtual std::string_view name() const = 0;
  // The group's name, as passed at creation (for example "flat",
  // "intra-node-0", "inter-node").
  const std::string& group() const { return group_; }
  std::chrono::milliseconds timeout() const { return timeout_; }

  // data[0..n) becomes the element-wise sum over all ranks, in place.
  virtual Status AllReduceSum(float* data, size_t n) = 0;

  // data[0..n) holds 16-bit floats in `format`; it becomes their
  // element-wise sum over all ranks, in place, in the same format. Each
  // partial sum is rounded to the format along the backend's reduction order
  // (as NCCL's ncclHalf/ncclBfloat16 sums do): Local adds in rank order,
  // Gloo around its ring. The caller scales the values so that no partial
  // sum overflows (fp16's largest value is 65504); an overflow gives inf.
  virtual Status AllReduceSumHalf(uint16_t* data, size_t n, HalfFormat format) = 0;

  // Sums each buffer across ranks, in place, as one operation where the
  // backend can fuse them (NCCL: one ncclGroup; Gloo: packed into one
  // buffer). The default, which Local uses, is one AllReduceSum per buffer.
  // All ranks pass buffers of the same sizes in the same order.
  virtual Status AllReduceSumGroup(std::span<const std::span<float>> buffers);

  // Overlapping a backward pass with its all-reduce (the device all-reduce
  // sync): enqueues AllReduceSumGroup of device buffers to start once
  // `ready` (a cudaEvent_t the producer's stream records; null: at once) has
  // fired, and returns without waiting; WaitEnqueued waits for all that was
  // enqueued, within the timeout. Only a backend that reduces device memory
  // on a stream of its own can (NCCL: enqueues_on_device()); the others
  // return Unsupported and the caller reduces as each bucket is final.
  virtual bool enqueues_on_device() const { return false; }
  virtual Status EnqueueAllReduceSumGroup(std::span<const std::span<float>> buffers, void* ready);
  virtual Status WaitEnqueued();

  // `in` holds sum(counts) elements on every rank, laid out as slices of
  // counts[0], counts[1], ... elements. Rank r receives in `out`
  // (counts[rank()] elements) the element-wise sum over all ranks of slice
  // r. counts has size() entries and may be uneven (zeros allowed); every
  // rank passes the same counts. `in` and `out` must not overlap.
  virtual Status ReduceScatterSum(const float* in, float* out,
                                  const std::vector<size_t>& counts) = 0;

  // Rank r contributes counts[r] elements from `in`; every rank receives all
  // contributions, concatenated in rank order, in `out` (sum(counts)
  // elements). Uneven counts and zeros are allowed; every rank passes the
  // same counts. `in` and `out` must not overlap.
  virtual Status AllGatherV(const float* in, const std::vector<size_t>& counts, float* out) = 0;

  // AllGatherV with `count` elements from every rank (out: count * size()).
  Status AllGather(const float* in, size_t count, float* out);

  // data[0..n) of rank `root` is copied to data on every rank.
  virtual Status Broadcast(float* data, size_t n, int root) = 0;

  // Returns once every rank has entered the barrier.
  virtual Status Barrier() = 0;

 protected:
  Collective(int rank, int size, std::string group, std::chrono::milliseconds timeout)
      : rank_(rank), size_(size), group_(std::move(group)), timeout_(timeout) {}

  // "gloo AllReduceSum(1000 floats) in group 'flat' (rank 1 of 3)": the
  // prefix of every error message.
  std::string Describe(std::string_view op) const;

  // Argument checks shared by the backends (InvalidArgument, with Describe()
  // as the prefix).
  Status CheckBuffer(std::string_view op, const void* ptr, size_t n) const;
  Status CheckCounts(std::string_view op, const std::vector<size_t>& counts) const;
  // A reduce-scatter's or all-gather's arguments: the counts, the whole
  // buffer (sum(counts) floats) and this rank's slice (counts[rank()]).
  // Returns CollectiveOffsets(counts).
  Result<std::vector<size_t>> CheckSliced(std::string_view op, const std::vector<size_t>& counts,
                                          const float* whole, const float* slice) const;
  Status CheckRoot(std::string_view op, int root) const;

 private:
  const int rank_;
  const int size_;
  const std::string group_;
  const std::chrono::milliseconds timeout_;
};

// Element-wise sum of `counts` laid out contiguously: offsets[r] is where
// slice r starts; offsets has counts.size() + 1 entries (the last is the
// total).
std::vector<size_t> CollectiveOffsets(const std::vector<size_t>& counts);

// "2.0 s"
std::string FormatSeconds(std::chrono::milliseconds duration);

// "0, 2, 3" (for lists of ranks in error messages).
std::string FormatRanks(const std::vector<int>& ranks);

}  // namespace gridsync
