// Bucketed all-reduce of gradient tensors, as DDP does it: the tensors, in
// their fixed order, are laid end to end and cut into buckets of at most
// `bucket_bytes`; each bucket is summed across ranks with one
// Collective::AllReduceSumGroup (packed by Gloo and Local, fused in one
// ncclGroup by NCCL). A tensor may straddle two buckets.
//
// Check headers: before each bucket's all-reduce the ranks all-gather a small
// header (step, bucket id, bucket count, the bucket's element count, a hash
// of the tensor layout in the bucket and the total element count). If any
// rank disagrees, every rank fails fast with InvalidArgument naming the
// fields and which ranks hold which value, for example
//   "bucket 3 at step 12: ... elements: rank 1 has 4096, rank 0 has 8192"
// instead of hanging in, or silently corrupting, a mismatched all-reduce.
// Header fields travel as 16-bit pieces in exact float values, so any
// backend carries them unchanged.
//
// Thread safety: the functions are reentrant; the collective is used as
// collective.h describes.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <vector>

#include "common/status.h"
#include "worker/collective/collective.h"

namespace gridsync {

inline constexpr size_t kDefaultBucketBytes = size_t{25} << 20;  // 25 MiB, as DDP

struct BucketOptions {
  size_t bucket_bytes = kDefaultBucketBytes;  // at least sizeof(float)
  bool check_headers = true;                  // all-gather and compare a header per bucket
};

// A contiguous piece of one tensor inside a bucket.
struct BucketPiece {
  size_t tensor = 0;  // index in the tensor list
  size_t offset = 0;  // first element within the tensor
  size_t count = 0;   // elements
};

struct Bucket {
  std::vector<BucketPiece> pieces;
  size_t elements = 0;
  uint64_t layout_hash = 0;  // FNV-1a over (tensor, tensor size, offset, count) of each piece
};

// The fixed-order buckets for tensors of these sizes (elements). Empty
// tensors take no space; no tensors (or only empty ones) give no buckets.
std::vector<Bucket> PlanBuckets(const std::vector<size_t>& tensor_sizes, size_t bucket_bytes);

// Sums every tensor across the ranks of `collective`, in place, bucket by
// bucket. `step` is the training step, checked across ranks and named in
// errors.
Status BucketedAllReduceSum(Collective& collective, std::span<const std::span<float>> tensors,
                            uint64_t step, const BucketOptions& options = {});

}  // namespace gridsync
