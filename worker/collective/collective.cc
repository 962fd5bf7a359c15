#include "worker/collective/collective.h"

#include <spdlog/fmt/fmt.h>

namespace gridsync {

std::string Collective::Describe(std::string_view op) const {
  return fmt::format("{} {} in group '{}' (rank {} of {})", name(), op, group_, rank_, size_);
}

Status Collective::CheckBuffer(std::string_view op, const void* ptr, size_t n) const {
  if (n > 0 && ptr == nullptr) {
    return Status::InvalidArgument(fmt::format("{}: null buffer for {} elements", Describe(op), n));
  }
  return Status::OK();
}

Status Collective::CheckCounts(std::string_view op, const std::vector<size_t>& counts) const {
  if (counts.size() != static_cast<size_t>(size_)) {
    return Status::InvalidArgument(fmt::format("{}: {} counts given, the group has {} ranks (one count per rank)",
                                               Describe(op), counts.size(), size_));
  }
  return Status::OK();
}

Status Collective::CheckRoot(std::string_view op, int root) const {
  if (root < 0 || root >= size_) {
    return Status::InvalidArgument(
        fmt::format("{}: root {} is not a rank of the group (allowed: 0..{})", Describe(op), root, size_ - 1));
  }
  return Status::OK();
}

std::string_view ToString(HalfFormat format) {
  return format == HalfFormat::kFp16 ? "fp16" : "bf16";
}

Status Collective::AllGather(const float* in, size_t count, float* out) {
  return AllGatherV(in, std::vector<size_t>(static_cast<size_t>(size_), count), out);
}

Status Collective::AllReduceSumGroup(std::span<const std::span<float>> buffers) {
  for (const auto& buffer : buffers) {
    GRIDSYNC_RETURN_IF_ERROR(AllReduceSum(buffer.data(), buffer.size()));
  }
  return Status::OK();
}

Status Collective::EnqueueAllReduceSumGroup(std::span<const std::span<float>>, void*) {
  return Status::Unsupported(Describe("EnqueueAllReduceSumGroup") +
                             ": this backend cannot wait for the device on a stream of its own; "
                             "only nccl can");
}

Status Collective::WaitEnqueued() { return Status::OK(); }

std::vector<size_t> CollectiveOffsets(const std::vector<size_t>& counts) {
  std::vector<size_t> offsets(counts.size() + 1, 0);
  for (size_t i = 0; i < counts.size(); ++i) offsets[i + 1] = offsets[i] + counts[i];
  return offsets;
}

std::string FormatSeconds(std::chrono::milliseconds duration) {
  return fmt::format("{:.1f} s", static_cast<double>(duration.count()) / 1000.0);
}

std::string FormatRanks(const std::vector<int>& ranks) {
  std::string out;
  for (int rank : ranks) {
    if (!out.empty()) out += ", ";
    out += std::to_string(rank);
  }
  return out.empty() ? "none" : out;
}

Result<std::vector<size_t>> Collective::CheckSliced(std::string_view op,
                                                    const std::vector<size_t>& counts,
                                                    const float* whole, const float* slice) const {
  GRIDSYNC_RETURN_IF_ERROR(CheckCounts(op, counts));
  auto offsets = CollectiveOffsets(counts);
  GRIDSYNC_RETURN_IF_ERROR(CheckBuffer(op, whole, offsets.back()));
  GRIDSYNC_RETURN_IF_ERROR(CheckBuffer(op, slice, counts[static_cast<size_t>(rank())]));
  return offsets;
}

}  // namespace gridsync
