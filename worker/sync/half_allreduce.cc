#include "worker/sync/half_allreduce.h"

#include <spdlog/fmt/fmt.h>

#include <algorithm>
#include <cmath>

#include "worker/collective/half_format.h"

namespace gridsync {
namespace {

constexpr size_t kChunk = size_t{1} << 16;  // elements per ParallelFor index

// Header layout: [overflowed workers, sum of max|g|, count low 16 bits,
// count high bits, the fp32 tensors...]. The count travels in 16-bit pieces
// so that its sum over ranks stays an exact float.
constexpr size_t kHeaderFields = 4;

// fp16: the power of two that brings `bound` (a bound on every partial sum)
// near 2^15, well inside 65504. Limited so that the scale itself and the
// unscaled results stay normal floats.
float Fp16Scale(float bound) {
  if (!(bound > 0.0f)) return 1.0f;
  const int exponent = static_cast<int>(std::floor(std::log2(32768.0 / bound)));
  return std::ldexp(1.0f, std::clamp(exponent, -100, 100));
}

// Runs fn(begin, end) over [0, n) in chunks on the pool (inline without one).
template <typename Fn>
void ForChunks(ThreadPool* pool, size_t n, Fn&& fn) {
  const size_t chunks = (n + kChunk - 1) / kChunk;
  auto body = [&](size_t c) { fn(c * kChunk, std::min(n, (c + 1) * kChunk)); };
  if (pool == nullptr || chunks <= 1) {
    for (size_t c = 0; c < chunks; ++c) body(c);
  } else {
    pool->ParallelFor(chunks, body);
  }
}

}  // namespace

HalfAllReduce::HalfAllReduce(HalfFormat format, bool error_feedback, size_t min_bytes,
                             size_t bucket_bytes)
    : format_(format),
      error_feedback_(error_feedback),
      min_bytes_(min_bytes),
      bucket_values_(std::max<size_t>(1, bucket_bytes / sizeof(uint16_t))) {}

Result<bool> HalfAllReduce::Run(Collective& group, std::span<const std::span<float>> tensors,
                                bool overflow, float loss_scale, ThreadPool* pool) {
  // Which tensors travel in 16 bits, and where each starts in packed_.
  std::vector<size_t> offsets(tensors.size(), 0);
  std::vector<bool> wide(tensors.size(), false);
  size_t packed = 0;
  size_t small = 0;
  for (size_t t = 0; t < tensors.size(); ++t) {
    wide[t] = tensors[t].size() * sizeof(float) < min_bytes_;
    if (wide[t]) {
      small += tensors[t].size();
    } else {
      offsets[t] = packed;
      packed += tensors[t].size();
    }
  }
  packed_.resize(packed);
  if (error_feedback_ && residual_.size() != packed) residual_.assign(packed, 0.0f);

  // Error feedback, then this rank's largest magnitude (NaN counts as an
  // overflow: the comparison below is false for it).
  float local_max = 0.0f;
  bool finite = true;
  for (size_t t = 0; t < tensors.size(); ++t) {
    if (wide[t]) continue;
    float* g = tensors[t].data();
    const float* res = error_feedback_ ? residual_.data() + offsets[t] : nullptr;
    const size_t n = tensors[t].size();
    std::vector<float> maxima((n + kChunk - 1) / kChunk, 0.0f);
    ForChunks(pool, n, [&](size_t begin, size_t end) {
      float m = 0.0f;
      for (size_t i = begin; i < end; ++i) {
        // Only values this worker touched: an untouched grid row must stay
        // exactly zero, or sparse Adam would take a step on it.
        if (res != nullptr && g[i] != 0.0f) g[i] += res[i] * loss_scale;
        const float a = std::fabs(g[i]);
        m = a > m || std::isnan(a) ? a : m;
      }
      maxima[begin / kChunk] = m;
    });
    for (float m : maxima) {
      if (!std::isfinite(m)) finite = false;
      local_max = std::max(local_max, m);
    }
  }

  header_.assign(kHeaderFields + small, 0.0f);
  header_[0] = overflow || !finite ? 1.0f : 0.0f;
  header_[1] = finite ? local_max : 0.0f;
  header_[2] = static_cast<float>(packed & 0xFFFF);
  header_[3] = static_cast<float>(packed >> 16);
  size_t at = kHeaderFields;
  for (size_t t = 0; t < tensors.size(); ++t) {
    if (!wide[t]) continue;
    std::copy(tensors[t].begin(), tensors[t].end(),
              header_.begin() + static_cast<std::ptrdiff_t>(at));
    at += tensors[t].size();
  }
  GRIDSYNC_RETURN_IF_ERROR(group.AllReduceSum(header_.data(), header_.size()));
  const auto world = static_cast<float>(group.size());
  if (header_[2] != world * static_cast<float>(packed & 0xFFFF) ||
      header_[3] != world * static_cast<float>(packed >> 16)) {
    return Status::InvalidArgument(fmt::format(
        "{} all-reduce in group '{}': rank {} packs {} 16-bit values per step, but the ranks' "
        "counts do not agree (their sum is {} + 65536 x {}, not {} x {}); every rank must hold "
        "the same model",
        ToString(format_), group.group(), group.rank(), packed, header_[2], header_[3],
        group.size(), packed));
  }
  bytes_per_step_ = packed * sizeof(uint16_t) + header_.size() * sizeof(float);
  if (header_[0] > 0.0f) return false;

  const float scale = format_ == HalfFormat::kFp16 ? Fp16Scale(header_[1]) : 1.0f;
  const float inverse = 1.0f / scale;
  const float unscale_residual = 1.0f / loss_scale;
  for (size_t t = 0; t < tensors.size(); ++t) {
    if (wide[t]) continue;
    const float* g = tensors[t].data();
    uint16_t* h = packed_.data() + offsets[t];
    float* res = error_feedback_ ? residual_.data() + offsets[t] : nullptr;
    ForChunks(pool, tensors[t].size(), [&](size_t begin, size_t end) {
      for (size_t i = begin; i < end; ++i) {
        h[i] = FloatToHalf(format_, g[i] * scale);
        if (res != nullptr && g[i] != 0.0f)
          res[i] = (g[i] - HalfToFloat(format_, h[i]) * inverse) * unscale_residual;
      }
    });
  }
  for (size_t off = 0; off < packed; off += bucket_values_) {
    GRIDSYNC_RETURN_IF_ERROR(group.AllReduceSumHalf(
        packed_.data() + off, std::min(bucket_values_, packed - off), format_));
  }

  bool sums_finite = true;
  at = kHeaderFields;
  for (size_t t = 0; t < tensors.size(); ++t) {
    float* g = tensors[t].data();
    if (wide[t]) {
      std::copy_n(header_.begin() + static_cast<std::ptrdiff_t>(at), tensors[t].size(), g);
      at += tensors[t].size();
      continue;
    }
    const uint16_t* h = packed_.data() + offsets[t];
    const size_t n = tensors[t].size();
    std::vector<char> ok((n + kChunk - 1) / kChunk, 1);
    ForChunks(pool, n, [&](size_t begin, size_t end) {
      bool all = true;
      for (size_t i = begin; i < end; ++i) {
        g[i] = HalfToFloat(format_, h[i]) * inverse;
        all = all && std::isfinite(g[i]);
      }
      ok[begin / kChunk] = all ? 1 : 0;
    });
    sums_finite = sums_finite && std::all_of(ok.begin(), ok.end(), [](char c) { return c != 0; });
  }
  return sums_finite;
}

}  // namespace gridsync
