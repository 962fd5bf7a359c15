#include "worker/collective/sealed_ring.h"

#include <gloo/transport/unbound_buffer.h>
#include <gloo/types.h>
#include <spdlog/fmt/fmt.h>

#include <algorithm>
#include <cstring>
#include <utility>

namespace gridsync {

namespace {

// Slot prefix of the sealed messages; Gloo's own collectives use 0x01..0x08
// (gloo/types.h) and GlooCollective's plain reduce-scatter 0x40.
constexpr uint8_t kSealedSlotPrefix = 0x41;

// Slices of n elements over `size` ranks: the first n % size one longer.
void EvenSlices(size_t n, int size, std::vector<size_t>* counts, std::vector<size_t>* offsets) {
  const auto p = static_cast<size_t>(size);
  counts->assign(p, n / p);
  offsets->assign(p, 0);
  for (size_t i = 0; i < n % p; ++i) ++(*counts)[i];
  for (size_t i = 1; i < p; ++i) (*offsets)[i] = (*offsets)[i - 1] + (*counts)[i - 1];
}

}  // namespace

SealedRing::SealedRing(int rank, int size, std::shared_ptr<gloo::Context> context,
                       CollectiveSeal seal, std::chrono::milliseconds wait_timeout)
    : rank_(rank),
      size_(size),
      left_((rank + size - 1) % size),
      right_((rank + 1) % size),
      context_(std::move(context)),
      seal_(std::move(seal)),
      wait_timeout_(wait_timeout) {}

size_t SealedRing::Slice(int s) const { return static_cast<size_t>(((s % size_) + size_) % size_); }

Status SealedRing::Step(const std::string& what, const void* send, size_t send_bytes, void* recv,
                        size_t recv_bytes, uint32_t index) {
  const uint64_t slot = gloo::Slot::build(kSealedSlotPrefix, 0);
  constexpr size_t kTag = CollectiveSeal::kTagBytes;
  // A message goes in parts, each sealed apart, so that sealing a part
  // overlaps the sending of the parts before it and opening one the
  // receiving of those after it (sealed whole, the cipher and the link took
  // turns: nearly twice the plain ring's time over a 1 Gbit link). Both
  // ends cut the same bytes alike.
  const auto parts = [](size_t bytes) { return (bytes + kPartBytes - 1) / kPartBytes; };
  const auto part_bytes = [](size_t bytes, size_t k) {
    return std::min(kPartBytes, bytes - k * kPartBytes);
  };
  // A part's number is 32 bits of its nonce: no message may have more parts
  // (1 PiB at 256 KiB a part), or two would share a nonce.
  if (parts(send_bytes) > UINT32_MAX || parts(recv_bytes) > UINT32_MAX) {
    return Status::InvalidArgument(
        fmt::format("{}: a message of {} bytes; allowed: at most {} parts of {} bytes", what,
                    std::max(send_bytes, recv_bytes), UINT32_MAX, kPartBytes));
  }
  std::unique_ptr<gloo::transport::UnboundBuffer> in, out;
  // Every receive posted first: no part waits for its receive.
  const size_t recv_parts = parts(recv_bytes);
  if (recv_parts > 0) {
    sealed_in_.resize(recv_bytes + recv_parts * kTag);
    in = context_->createUnboundBuffer(sealed_in_.data(), sealed_in_.size());
    for (size_t k = 0; k < recv_parts; ++k)
      in->recv(left_, slot, k * (kPartBytes + kTag), part_bytes(recv_bytes, k) + kTag);
  }
  const size_t send_parts = parts(send_bytes);
  if (send_parts > 0) {
    sealed_out_.resize(send_bytes + send_parts * kTag);
    out = context_->createUnboundBuffer(sealed_out_.data(), sealed_out_.size());
    for (size_t k = 0; k < send_parts; ++k) {
      const size_t at = k * (kPartBytes + kTag), n = part_bytes(send_bytes, k);
      seal_.Seal(static_cast<const uint8_t*>(send) + k * kPartBytes, n,
                 {static_cast<uint32_t>(rank_), static_cast<uint32_t>(right_), operation_, index,
                  static_cast<uint32_t>(k)},
                 sealed_out_.data() + at);
      out->send(right_, slot, at, n + kTag);
    }
  }
  // The parts of one slot and pair arrive in the order they were sent.
  for (size_t k = 0; k < recv_parts; ++k) {
    if (!in->waitRecv(wait_timeout_)) {
      return Status::IOError(fmt::format("{}: receive from rank {} aborted", what, left_));
    }
    GRIDSYNC_RETURN_IF_ERROR(seal_
                                 .Open(sealed_in_.data() + k * (kPartBytes + kTag),
                                       part_bytes(recv_bytes, k) + kTag,
                                       {static_cast<uint32_t>(left_), static_cast<uint32_t>(rank_),
                                        operation_, index, static_cast<uint32_t>(k)},
                                       static_cast<uint8_t*>(recv) + k * kPartBytes)
                                 .WithContext(what));
  }
  for (size_t k = 0; k < send_parts; ++k) {
    if (!out->waitSend(wait_timeout_)) {
      return Status::IOError(fmt::format("{}: send to rank {} aborted", what, right_));
    }
  }
  return Status::OK();
}

Status SealedRing::AllReduce(const std::string& what, void* data, size_t n, size_t element_bytes,
                             SumFn sum) {
  ++operation_;
  if (size_ == 1 || n == 0) return Status::OK();
  std::vector<size_t> counts, offsets;
  EvenSlices(n, size_, &counts, &offsets);
  auto* bytes = static_cast<uint8_t*>(data);
  const auto at = [&](size_t i) { return bytes + offsets[i] * element_bytes; };
  // Reduce-scatter: in step s rank r sends its running sum of slice r - s
  // and adds its left neighbour's of slice r - s - 1; it ends holding the
  // whole sum of slice r + 1.
  for (int s = 0; s + 1 < size_; ++s) {
    const size_t send = Slice(rank_ - s), recv = Slice(rank_ - s - 1);
    plain_in_.resize(counts[recv] * element_bytes);
    GRIDSYNC_RETURN_IF_ERROR(Step(what, at(send), counts[send] * element_bytes, plain_in_.data(),
                                  plain_in_.size(), static_cast<uint32_t>(s)));
    if (counts[recv] > 0) sum(at(recv), at(recv), plain_in_.data(), counts[recv]);
  }
  // All-gather: the whole sums passed on around the ring.
  for (int s = 0; s + 1 < size_; ++s) {
    const size_t send = Slice(rank_ + 1 - s), recv = Slice(rank_ - s);
    GRIDSYNC_RETURN_IF_ERROR(Step(what, at(send), counts[send] * element_bytes, at(recv),
                                  counts[recv] * element_bytes,
                                  static_cast<uint32_t>(size_ - 1 + s)));
  }
  return Status::OK();
}

Status SealedRing::ReduceScatter(const std::string& what, const float* in, float* out,
                                 const std::vector<size_t>& counts,
                                 const std::vector<size_t>& offsets) {
  ++operation_;
  std::vector<float> work(in, in + offsets.back());
  // As GlooCollective's plain ring: in step s rank r sends its running sum of
  // slice r - s - 1 and adds its left neighbour's of slice r - s - 2.
  for (int s = 0; s + 1 < size_; ++s) {
    const size_t send = Slice(rank_ - s - 1), recv = Slice(rank_ - s - 2);
    plain_in_.resize(counts[recv] * sizeof(float));
    GRIDSYNC_RETURN_IF_ERROR(Step(what, work.data() + offsets[send], counts[send] * sizeof(float),
                                  plain_in_.data(), plain_in_.size(), static_cast<uint32_t>(s)));
    const auto* got = reinterpret_cast<const float*>(plain_in_.data());
    float* acc = work.data() + offsets[recv];
    for (size_t i = 0; i < counts[recv]; ++i) acc[i] += got[i];
  }
  const auto me = static_cast<size_t>(rank_);
  if (counts[me] > 0) std::memcpy(out, work.data() + offsets[me], counts[me] * sizeof(float));
  return Status::OK();
}

Status SealedRing::AllGatherV(const std::string& what, const float* in,
                              const std::vector<size_t>& counts, const std::vector<size_t>& offsets,
                              float* out) {
  ++operation_;
  const auto me = static_cast<size_t>(rank_);
  if (counts[me] > 0) std::memcpy(out + offsets[me], in, counts[me] * sizeof(float));
  // In step s rank r passes on block r - s and takes block r - s - 1.
  for (int s = 0; s + 1 < size_; ++s) {
    const size_t send = Slice(rank_ - s), recv = Slice(rank_ - s - 1);
    GRIDSYNC_RETURN_IF_ERROR(Step(what, out + offsets[send], counts[send] * sizeof(float),
                                  out + offsets[recv], counts[recv] * sizeof(float),
                                  static_cast<uint32_t>(s)));
  }
  return Status::OK();
}

Status SealedRing::Broadcast(const std::string& what, void* data, size_t bytes, int root) {
  ++operation_;
  if (size_ == 1 || bytes == 0) return Status::OK();
  // Hop d of the chain carries message d: rank root + d takes it from its
  // left neighbour and passes it on unless the next rank is the root.
  const int hop = (rank_ - root + size_) % size_;
  if (hop > 0) {
    GRIDSYNC_RETURN_IF_ERROR(Step(what, nullptr, 0, data, bytes, static_cast<uint32_t>(hop - 1)));
  }
  if (hop + 1 < size_) {
    GRIDSYNC_RETURN_IF_ERROR(Step(what, data, bytes, nullptr, 0, static_cast<uint32_t>(hop)));
  }
  return Status::OK();
}

Status SealedRing::Barrier(const std::string& what) {
  ++operation_;
  uint8_t token = 1, got = 0;
  for (int s = 0; s + 1 < size_; ++s) {
    GRIDSYNC_RETURN_IF_ERROR(
        Step(what, &token, sizeof(token), &got, sizeof(got), static_cast<uint32_t>(s)));
  }
  return Status::OK();
}

}  // namespace gridsync
