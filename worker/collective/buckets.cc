#include "worker/collective/buckets.h"

#include <spdlog/fmt/fmt.h>

#include <algorithm>
#include <array>
#include <map>
#include <string>

namespace gridsync {
namespace {

constexpr uint64_t kFnvOffset = 1469598103934665603ull;
constexpr uint64_t kFnvPrime = 1099511628211ull;

void HashWord(uint64_t* hash, uint64_t word) {
  for (int i = 0; i < 8; ++i) {
    *hash ^= (word >> (8 * i)) & 0xffu;
    *hash *= kFnvPrime;
  }
}

// The check header: each field is a uint64, sent as four 16-bit pieces, each
// an exactly representable float.
enum HeaderField : size_t { kMagic, kStep, kBucketId, kBucketCount, kElements, kLayoutHash, kTotalElements, kFields };
constexpr uint64_t kHeaderMagic = 0x6273'6b74'0001ull;  // "bskt" v1
constexpr size_t kPiecesPerField = 4;
constexpr size_t kHeaderFloats = kFields * kPiecesPerField;

using Header = std::array<uint64_t, kFields>;

void Encode(const Header& header, float* out) {
  for (size_t f = 0; f < kFields; ++f) {
    for (size_t p = 0; p < kPiecesPerField; ++p) {
      out[f * kPiecesPerField + p] = static_cast<float>((header[f] >> (16 * p)) & 0xffffu);
    }
  }
}

Header Decode(const float* in) {
  Header header{};
  for (size_t f = 0; f < kFields; ++f) {
    for (size_t p = 0; p < kPiecesPerField; ++p) {
      header[f] |= (static_cast<uint64_t>(in[f * kPiecesPerField + p]) & 0xffffu) << (16 * p);
    }
  }
  return header;
}

std::string FieldName(size_t field) {
  switch (field) {
    case kMagic:
      return "header version";
    case kStep:
      return "step";
    case kBucketId:
      return "bucket id";
    case kBucketCount:
      return "bucket count";
    case kElements:
      return "elements in the bucket";
    case kLayoutHash:
      return "tensor layout hash";
    case kTotalElements:
      return "total elements";
    default:
      return "?";
  }
}

std::string FieldValue(size_t field, uint64_t value) {
  if (field == kLayoutHash || field == kMagic) return fmt::format("{:#018x}", value);
  return std::to_string(value);
}

// "elements in the bucket: rank 1 has 4096, ranks 0, 2 have 8192"
std::string DescribeDisagreement(const std::vector<Header>& headers) {
  std::string out;
  for (size_t f = 0; f < kFields; ++f) {
    std::map<uint64_t, std::vector<int>> by_value;
    for (size_t r = 0; r < headers.size(); ++r) by_value[headers[r][f]].push_back(static_cast<int>(r));
    if (by_value.size() < 2) continue;
    // The minority first: it is usually the rank at fault.
    std::vector<std::pair<uint64_t, std::vector<int>>> groups(by_value.begin(), by_value.end());
    std::stable_sort(groups.begin(), groups.end(),
                     [](const auto& a, const auto& b) { return a.second.size() < b.second.size(); });
    std::string part;
    for (const auto& [value, ranks] : groups) {
      part += fmt::format("{}{} {} {} {}", part.empty() ? "" : ", ", ranks.size() == 1 ? "rank" : "ranks",
                          FormatRanks(ranks), ranks.size() == 1 ? "has" : "have", FieldValue(f, value));
    }
    out += fmt::format("{}{}: {}", out.empty() ? "" : "; ", FieldName(f), part);
  }
  return out;
}

}  // namespace

std::vector<Bucket> PlanBuckets(const std::vector<size_t>& tensor_sizes, size_t bucket_bytes) {
  const size_t capacity = std::max<size_t>(bucket_bytes / sizeof(float), 1);
  std::vector<Bucket> buckets;
  Bucket current;
  auto close = [&] {
    if (current.elements == 0) return;
    current.layout_hash = kFnvOffset;
    for (const auto& piece : current.pieces) {
      HashWord(&current.layout_hash, piece.tensor);
      HashWord(&current.layout_hash, tensor_sizes[piece.tensor]);
      HashWord(&current.layout_hash, piece.offset);
      HashWord(&current.layout_hash, piece.count);
    }
    buckets.push_back(std::move(current));
    current = Bucket{};
  };
  for (size_t t = 0; t < tensor_sizes.size(); ++t) {
    size_t offset = 0;
    while (offset < tensor_sizes[t]) {
      const size_t take = std::min(tensor_sizes[t] - offset, capacity - current.elements);
      current.pieces.push_back(BucketPiece{t, offset, take});
      current.elements += take;
      offset += take;
      if (current.elements == capacity) close();
    }
  }
  close();
  return buckets;
}

Status BucketedAllReduceSum(Collective& collective, std::span<const std::span<float>> tensors, uint64_t step,
                            const BucketOptions& options) {
  if (options.bucket_bytes < sizeof(float)) {
    return Status::InvalidArgument(fmt::format("bucketed all-reduce: bucket_bytes is {}, must be at least {}",
                                               options.bucket_bytes, sizeof(float)));
  }
  std::vector<size_t> sizes;
  sizes.reserve(tensors.size());
  size_t total = 0;
  for (const auto& tensor : tensors) {
    sizes.push_back(tensor.size());
    total += tensor.size();
  }
  const std::vector<Bucket> buckets = PlanBuckets(sizes, options.bucket_bytes);

  std::vector<float> header(kHeaderFloats);
  std::vector<float> headers(kHeaderFloats * static_cast<size_t>(collective.size()));
  std::vector<std::span<float>> spans;
  // With no buckets at all, still exchange one header, so that a rank with
  // nothing to send is noticed by ranks that have buckets.
  const size_t rounds = std::max<size_t>(buckets.size(), options.check_headers ? 1 : 0);
  for (size_t b = 0; b < rounds; ++b) {
    const bool real = b < buckets.size();
    if (options.check_headers) {
      Encode(Header{kHeaderMagic, step, b, buckets.size(), real ? buckets[b].elements : 0,
                    real ? buckets[b].layout_hash : 0, total},
             header.data());
      Status gathered = collective.AllGather(header.data(), kHeaderFloats, headers.data());
      if (!gathered.ok()) {
        return Status(gathered.code(), fmt::format("bucket {} at step {}: exchanging check headers: {}", b, step,
                                                   gathered.message()));
      }
      std::vector<Header> decoded;
      decoded.reserve(static_cast<size_t>(collective.size()));
      for (int r = 0; r < collective.size(); ++r) {
        decoded.push_back(Decode(headers.data() + static_cast<size_t>(r) * kHeaderFloats));
      }
      const std::string disagreement = DescribeDisagreement(decoded);
      if (!disagreement.empty()) {
        return Status::InvalidArgument(
            fmt::format("bucket {} at step {}: ranks disagree on the gradient buckets (this is rank {} of group '{}' "
                        "on {}): {}",
                        b, step, collective.rank(), collective.group(), collective.name(), disagreement));
      }
    }
    if (!real) continue;
    spans.clear();
    for (const auto& piece : buckets[b].pieces) spans.push_back(tensors[piece.tensor].subspan(piece.offset, piece.count));
    Status reduced = collective.AllReduceSumGroup(spans);
    if (!reduced.ok()) {
      return Status(reduced.code(), fmt::format("bucket {} of {} at step {} ({} floats): {}", b, buckets.size(), step,
                                                buckets[b].elements, reduced.message()));
    }
  }
  return Status::OK();
}

}  // namespace gridsync
