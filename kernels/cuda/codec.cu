// CUDA twins of the CPU codecs (kernels/cpu/codec.cc), writing the same
// bytes: every rounding goes through codec_math or an explicit _rn
// intrinsic (so nvcc cannot fuse a multiply into an add), and the two sums
// (onebit's sum |x|, qsgd's sum x^2) follow codec_math's fixed order:
// kReduceLanes threads per chunk each add one lane in index order, a
// shuffle tree combines them as the CPU does, and one thread adds the chunk
// sums in chunk order.
//
// Work split: elementwise codecs use grid-stride loops; int8 and fp16 give
// one thread block to each codec block (a block max, then quantisation or
// scaling); onebit
// writes one sign byte and qsgd one 8-value group (bits+1 bytes) per thread,
// so no two threads share an output byte; topk is a stable radix sort of
// |x| keys (ties stay in index order, i.e. go to the lower index) followed
// by a sort of the k winning indices; randomk's indices come from
// cpu::RandomkIndices on the host (Floyd's sampling is sequential).
//
// Decoders write their outputs while setting a device flag on any invalid
// field (out-of-range indices are never written); the host reads the flag
// and, when set, runs cpu::Decode on a host copy for the exact Status.
//
// The host-side support (scratch memory on the stream, randomk's indices,
// that Status) is codec_support.cu, so that this file holds the kernels and
// their launches.
//
// Thread safety: may be called from any thread; work on one stream is
// ordered by the stream.
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <bit>
#include <cfloat>
#include <cstdint>
#include <cub/device/device_radix_sort.cuh>

#include "kernels/cpu/codec.h"
#include "kernels/cuda/codec_kernels.h"
#include "kernels/cuda/codec_support.h"
#include "kernels/cuda/cuda_check.h"
#include "kernels/cuda/grid_stride.h"

namespace gridsync::cuda {
namespace {

namespace cm = ::gridsync::codec_math;
using codec_support::ExplainBadPayload;
using codec_support::Prefix;
using codec_support::RandomkFactor;
using codec_support::Scratch;
using codec_support::UploadRandomkIndices;

// Payload fields carry no alignment: bytes, little-endian.
__device__ __forceinline__ void StoreU32(uint8_t* p, uint32_t v) {
  p[0] = static_cast<uint8_t>(v);
  p[1] = static_cast<uint8_t>(v >> 8);
  p[2] = static_cast<uint8_t>(v >> 16);
  p[3] = static_cast<uint8_t>(v >> 24);
}
__device__ __forceinline__ void StoreU16(uint8_t* p, uint16_t v) {
  p[0] = static_cast<uint8_t>(v);
  p[1] = static_cast<uint8_t>(v >> 8);
}
__device__ __forceinline__ uint32_t LoadU32(const uint8_t* p) {
  return uint32_t{p[0]} | (uint32_t{p[1]} << 8) | (uint32_t{p[2]} << 16) | (uint32_t{p[3]} << 24);
}
__device__ __forceinline__ uint16_t LoadU16(const uint8_t* p) {
  return static_cast<uint16_t>(p[0] | (p[1] << 8));
}
__device__ __forceinline__ size_t MinSize(size_t a, size_t b) { return a < b ? a : b; }
__device__ __forceinline__ bool IsFinite(float x) { return cm::IsFiniteBits(cm::FloatBits(x)); }

// ---------------------------------------------------------------------------
// Elementwise codecs.

__global__ void NoneDecodeKernel(const uint8_t* __restrict__ bytes, size_t n,
                                 float* __restrict__ out, unsigned* bad) {
  GRIDSYNC_FOR_EACH(i, n) {
    const uint32_t bits = LoadU32(bytes + 4 * i);
    if (!cm::IsFiniteBits(bits)) *bad = 1;
    out[i] = cm::BitsFloat(bits);
  }
}

__global__ void Bf16EncodeKernel(const float* __restrict__ x, size_t n, uint8_t* __restrict__ out) {
  GRIDSYNC_FOR_EACH(i, n) { StoreU16(out + 2 * i, cm::FloatToBf16(x[i])); }
}

__global__ void Bf16DecodeKernel(const uint8_t* __restrict__ bytes, size_t n,
                                 float* __restrict__ out, unsigned* bad) {
  GRIDSYNC_FOR_EACH(i, n) {
    const uint16_t h = LoadU16(bytes + 2 * i);
    if ((h & 0x7F80u) == 0x7F80u) *bad = 1;
    out[i] = cm::Bf16ToFloat(h);
  }
}

// ---------------------------------------------------------------------------
// int8: one thread block per codec block.

// Max |x| of a codec block, read by every thread of the thread block, and
// whether the codec block holds a non-finite value. Every thread must call
// it; warp_max is shared scratch the caller must not reuse before its next
// __syncthreads().
__device__ float CodecBlockMax(const float* __restrict__ v, size_t len, float* warp_max,
                               int* non_finite) {
  float max = 0.0f;
  int bad = 0;
  for (size_t i = threadIdx.x; i < len; i += blockDim.x) {
    const float a = fabsf(v[i]);
    max = fmaxf(max, a);  // ignores NaN; bad covers it
    bad |= !(a <= FLT_MAX);
  }
  for (int offset = 16; offset > 0; offset /= 2)
    max = fmaxf(max, __shfl_xor_sync(0xFFFFFFFFu, max, offset));
  if (threadIdx.x % 32 == 0) warp_max[threadIdx.x / 32] = max;
  *non_finite = __syncthreads_or(bad);  // also publishes warp_max
  max = warp_max[0];
  for (uint32_t w = 1; w < kBlockSize / 32; ++w) max = fmaxf(max, warp_max[w]);
  return max;
}

// int8's codec block: a float32 scale, then the codes. Every thread of the
// thread block calls EncodeBlock with the block's max and flag.
struct Int8Block {
  static __host__ __device__ size_t Stride(uint32_t block) { return size_t{block} + 4; }
  static __device__ void EncodeBlock(const float* __restrict__ v, size_t len, float max,
                                     int non_finite, uint8_t* __restrict__ dst) {
    if (non_finite || max == 0.0f) {
      if (threadIdx.x == 0) StoreU32(dst, non_finite ? cm::kCanonicalNan : 0u);
      for (size_t i = threadIdx.x; i < len; i += blockDim.x) dst[4 + i] = 0;
      return;
    }
    if (threadIdx.x == 0) StoreU32(dst, cm::FloatBits(__fdiv_rn(max, 127.0f)));
    const float inv = __fdiv_rn(127.0f, max);
    if (IsFinite(inv)) {
      for (size_t i = threadIdx.x; i < len; i += blockDim.x)
        dst[4 + i] = static_cast<uint8_t>(cm::ClampInt8Code(cm::Int8Code(v[i], inv)));
    } else {
      const double wide = __ddiv_rn(127.0, static_cast<double>(max));
      for (size_t i = threadIdx.x; i < len; i += blockDim.x)
        dst[4 + i] = static_cast<uint8_t>(cm::ClampInt8Code(cm::Int8CodeWide(v[i], wide)));
    }
  }
};

// The codecs with a scale per codec block (int8, fp16): one thread block
// per codec block, its max first.
template <typename CodecBlock>
__global__ void __launch_bounds__(kBlockSize)
    PerBlockEncodeKernel(const float* __restrict__ x, size_t n, uint32_t block, size_t n_blocks,
                         uint8_t* __restrict__ out) {
  __shared__ float warp_max[kBlockSize / 32];
  for (size_t b = blockIdx.x; b < n_blocks; b += gridDim.x) {
    const size_t begin = b * block;
    const size_t len = MinSize(block, n - begin);
    int non_finite = 0;
    const float max = CodecBlockMax(x + begin, len, warp_max, &non_finite);
    CodecBlock::EncodeBlock(x + begin, len, max, non_finite, out + b * CodecBlock::Stride(block));
    __syncthreads();  // warp_max is reused by the next codec block
  }
}

__global__ void Int8DecodeKernel(const uint8_t* __restrict__ bytes, size_t n, uint32_t block,
                                 float* __restrict__ out, unsigned* bad) {
  GRIDSYNC_FOR_EACH(i, n) {
    const uint8_t* src = bytes + (i / block) * (size_t{block} + 4);
    const float scale = cm::BitsFloat(LoadU32(src));
    if (!(scale >= 0.0f) || !IsFinite(__fmul_rn(scale, 127.0f))) *bad = 1;
    const int8_t q = static_cast<int8_t>(src[4 + i % block]);
    if (q == -128) *bad = 1;
    out[i] = __fmul_rn(static_cast<float>(q), scale);
  }
}

// ---------------------------------------------------------------------------
// fp16: one thread block per codec block (PerBlockEncodeKernel), as int8.

__device__ __forceinline__ uint16_t HalfOf(float x) {
  const float v = cm::PrepareForHalf(x);
  // PrepareForHalf leaves only the canonical NaN, whose half is 0x7E00 on
  // the CPU (F16C keeps the payload's top bits); __float2half_rn may differ.
  return (cm::FloatBits(v) & 0x7FFFFFFFu) > cm::kInfBits ? cm::kHalfCanonicalNan
                                                         : __half_as_ushort(__float2half_rn(v));
}

// fp16's codec block: an int16 exponent, then the halves.
struct Fp16Block {
  static __host__ __device__ size_t Stride(uint32_t block) { return 2 * size_t{block} + 2; }
  static __device__ void EncodeBlock(const float* __restrict__ v, size_t len, float max,
                                     int non_finite, uint8_t* __restrict__ dst) {
    const int32_t e = non_finite ? 0 : cm::Fp16BlockExponent(cm::FloatBits(max));
    if (threadIdx.x == 0) StoreU16(dst, static_cast<uint16_t>(static_cast<int16_t>(e)));
    const float scale = cm::Pow2(e);
    for (size_t i = threadIdx.x; i < len; i += blockDim.x)
      StoreU16(dst + 2 + 2 * i, HalfOf(__fmul_rn(v[i], scale)));
  }
};

__global__ void Fp16DecodeKernel(const uint8_t* __restrict__ bytes, size_t n, uint32_t block,
                                 float* __restrict__ out, unsigned* bad) {
  GRIDSYNC_FOR_EACH(i, n) {
    const uint8_t* src = bytes + (i / block) * (2 * size_t{block} + 2);
    const int32_t e = static_cast<int16_t>(LoadU16(src));
    const bool e_ok = e >= cm::kFp16MinExponent && e <= cm::kFp16MaxExponent;
    const uint16_t h = LoadU16(src + 2 + 2 * (i % block));
    if (!e_ok || (h & 0x7C00u) == 0x7C00u) *bad = 1;
    out[i] = __fmul_rn(__half2float(__ushort_as_half(h)), cm::Pow2(e_ok ? -e : 0));
  }
}

// ---------------------------------------------------------------------------
// Fixed-order sums (codec_math::kReduceChunk) and the scale header.

template <bool kSquare>
__global__ void __launch_bounds__(kBlockSize)
    ChunkSumKernel(const float* __restrict__ x, size_t n, size_t n_chunks,
                   double* __restrict__ partials) {
  static_assert(32 % cm::kReduceLanes == 0, "a lane group must sit inside one warp");
  const size_t thread = size_t{blockIdx.x} * blockDim.x + threadIdx.x;
  const size_t chunk = thread / cm::kReduceLanes;
  const uint32_t lane = static_cast<uint32_t>(thread % cm::kReduceLanes);
  double acc = 0.0;
  if (chunk < n_chunks) {
    const size_t begin = chunk * cm::kReduceChunk;
    const size_t end = MinSize(n, begin + cm::kReduceChunk);
    for (size_t i = begin + lane; i < end; i += cm::kReduceLanes) {
      const double d = static_cast<double>(x[i]);
      acc = __dadd_rn(acc, kSquare ? __dmul_rn(d, d) : fabs(d));
    }
  }
  // Lane j adds lane j^offset: (l0+l1), then ((l0+l1)+(l2+l3)), ... as the
  // CPU combines; a + b == b + a exactly, so both partners hold the same sum.
  for (uint32_t offset = 1; offset < cm::kReduceLanes; offset *= 2)
    acc = __dadd_rn(acc, __shfl_xor_sync(0xFFFFFFFFu, acc, offset));
  if (chunk < n_chunks && lane == 0) partials[chunk] = acc;
}

// Adds the chunk sums in order and writes the header (onebit: mean |x|;
// qsgd: the L2 norm), canonical NaN when not finite; also keeps it in *scale.
__global__ void FinishScaleKernel(const double* __restrict__ partials, size_t n_chunks, size_t n,
                                  bool norm, uint8_t* __restrict__ out, float* __restrict__ scale) {
  double total = 0.0;
  for (size_t c = 0; c < n_chunks; ++c) total = __dadd_rn(total, partials[c]);
  float value = norm ? __double2float_rn(__dsqrt_rn(total))
                     : __double2float_rn(__ddiv_rn(total, static_cast<double>(n)));
  if (!IsFinite(value)) value = cm::BitsFloat(cm::kCanonicalNan);
  StoreU32(out, cm::FloatBits(value));
  *scale = value;
}

// ---------------------------------------------------------------------------
// onebit: one sign byte per thread.

__global__ void OnebitPackKernel(const float* __restrict__ x, size_t n,
                                 uint8_t* __restrict__ signs) {
  GRIDSYNC_FOR_EACH(j, (n + 7) / 8) {
    uint32_t byte = 0;
    for (uint32_t b = 0; b < 8; ++b) {
      const size_t i = 8 * j + b;
      if (i < n && x[i] >= 0.0f) byte |= 1u << b;
    }
    signs[j] = static_cast<uint8_t>(byte);
  }
}

__global__ void OnebitDecodeKernel(const uint8_t* __restrict__ bytes, size_t n,
                                   float* __restrict__ out, unsigned* bad) {
  const float scale = cm::BitsFloat(LoadU32(bytes));
  if (blockIdx.x == 0 && threadIdx.x == 0 && (!(scale >= 0.0f) || !IsFinite(scale))) *bad = 1;
  GRIDSYNC_FOR_EACH(j, (n + 7) / 8) {
    const uint32_t byte = bytes[4 + j];
    for (uint32_t b = 0; b < 8; ++b) {
      const size_t i = 8 * j + b;
      const bool set = (byte >> b) & 1u;
      if (i < n) {
        out[i] = set ? scale : -scale;
      } else if (set) {
        *bad = 1;  // padding bit
      }
    }
  }
}

// ---------------------------------------------------------------------------
// qsgd: one group of 8 codes (bits+1 whole bytes) per thread.

__global__ void QsgdEncodeKernel(const float* __restrict__ x, size_t n, int bits, uint64_t key,
                                 const float* __restrict__ norm_ptr, uint8_t* __restrict__ codes) {
  const float norm = *norm_ptr;
  const uint32_t width = static_cast<uint32_t>(bits) + 1;
  const uint32_t s = (1u << bits) - 1;
  const bool zero = !(norm > 0.0f) || !IsFinite(norm);
  const double inv = zero ? 0.0 : __ddiv_rn(static_cast<double>(s), static_cast<double>(norm));
  const size_t total_bytes = (n * width + 7) / 8;
  GRIDSYNC_FOR_EACH(g, (n + 7) / 8) {
    uint64_t lo = 0;  // stream bits [0, 64) of the group
    uint32_t hi = 0;  // stream bits [64, 72)
    for (uint32_t b = 0; b < 8; ++b) {
      const size_t i = 8 * g + b;
      uint32_t code = 0;
      if (i < n && !zero) {
        double r = __dmul_rn(fabs(static_cast<double>(x[i])), inv);
        if (r > s) r = s;
        const uint32_t level = cm::QsgdLevel(r, cm::RandomAt(key, i));
        const uint32_t sign = (level != 0 && x[i] < 0.0f) ? 1u : 0u;
        code = level | (sign << bits);
      }
      const uint32_t pos = b * width;  // < 64 for width <= 9
      lo |= uint64_t{code} << pos;
      if (pos + width > 64) hi |= code >> (64 - pos);
    }
    const size_t first = g * width;
    const size_t count = MinSize(width, total_bytes - first);
    for (size_t t = 0; t < count; ++t)
      codes[first + t] = static_cast<uint8_t>(t < 8 ? lo >> (8 * t) : hi);
  }
}

__global__ void QsgdDecodeKernel(const uint8_t* __restrict__ bytes, size_t n, int bits,
                                 float* __restrict__ out, unsigned* bad) {
  const float norm = cm::BitsFloat(LoadU32(bytes));
  const uint32_t width = static_cast<uint32_t>(bits) + 1;
  const uint32_t s = (1u << bits) - 1;
  const float step = __fdiv_rn(norm, static_cast<float>(s));
  if (blockIdx.x == 0 && threadIdx.x == 0 &&
      (!(norm >= 0.0f) || !IsFinite(norm) || !IsFinite(__fmul_rn(step, static_cast<float>(s)))))
    *bad = 1;
  const uint8_t* codes = bytes + 4;
  const size_t total_bytes = (n * width + 7) / 8;
  GRIDSYNC_FOR_EACH(g, (n + 7) / 8) {
    const size_t first = g * width;
    const size_t count = MinSize(width, total_bytes - first);
    uint64_t lo = 0;
    uint32_t hi = 0;
    for (size_t t = 0; t < count; ++t) {
      if (t < 8) {
        lo |= uint64_t{codes[first + t]} << (8 * t);
      } else {
        hi = codes[first + t];
      }
    }
    for (uint32_t b = 0; b < 8; ++b) {
      const size_t i = 8 * g + b;
      const uint32_t pos = b * width;
      uint32_t code = static_cast<uint32_t>(lo >> pos);
      if (pos + width > 64) code |= hi << (64 - pos);
      code &= (1u << width) - 1;
      if (i >= n) {
        if (code != 0) *bad = 1;  // padding bits
        continue;
      }
      const uint32_t level = code & s;
      const bool negative = (code >> bits) != 0;
      if (negative && level == 0) *bad = 1;
      const float magnitude = __fmul_rn(static_cast<float>(level), step);
      out[i] = negative ? -magnitude : magnitude;
    }
  }
}

// ---------------------------------------------------------------------------
// topk and randomk.

__global__ void TopkKeysKernel(const float* __restrict__ x, size_t n, uint32_t* __restrict__ keys,
                               uint32_t* __restrict__ indices) {
  GRIDSYNC_FOR_EACH(i, n) {
    keys[i] = cm::MagnitudeKey(x[i]);
    indices[i] = static_cast<uint32_t>(i);
  }
}

// Writes k, the (ascending) indices and their values.
__global__ void TopkWriteKernel(const float* __restrict__ x, const uint32_t* __restrict__ indices,
                                uint32_t k, uint8_t* __restrict__ out) {
  if (blockIdx.x == 0 && threadIdx.x == 0) StoreU32(out, k);
  GRIDSYNC_FOR_EACH(j, k) {
    const uint32_t index = indices[j];
    StoreU32(out + 4 + 4 * j, index);
    StoreU32(out + 4 + 4 * size_t{k} + 4 * j, cm::FloatBits(x[index]));
  }
}

__global__ void TopkDecodeKernel(const uint8_t* __restrict__ bytes, size_t n, uint32_t k,
                                 float* __restrict__ out, unsigned* bad) {
  if (blockIdx.x == 0 && threadIdx.x == 0 && LoadU32(bytes) != k) *bad = 1;
  const uint8_t* idx = bytes + 4;
  const uint8_t* val = bytes + 4 + 4 * size_t{k};
  GRIDSYNC_FOR_EACH(j, k) {
    const uint32_t index = LoadU32(idx + 4 * j);
    const uint32_t bits = LoadU32(val + 4 * j);
    if (index >= n || (j > 0 && index <= LoadU32(idx + 4 * (j - 1))) || !cm::IsFiniteBits(bits))
      *bad = 1;
    if (index < n) out[index] = cm::BitsFloat(bits);
  }
}

__global__ void RandomkGatherKernel(const float* __restrict__ x,
                                    const uint32_t* __restrict__ indices, uint32_t k,
                                    uint8_t* __restrict__ out) {
  GRIDSYNC_FOR_EACH(j, k) { StoreU32(out + 4 * j, cm::FloatBits(x[indices[j]])); }
}

__global__ void RandomkScatterKernel(const uint8_t* __restrict__ bytes,
                                     const uint32_t* __restrict__ indices, uint32_t k, float factor,
                                     float* __restrict__ out, unsigned* bad) {
  GRIDSYNC_FOR_EACH(j, k) {
    const float scaled = __fmul_rn(cm::BitsFloat(LoadU32(bytes + 4 * j)), factor);
    if (!IsFinite(scaled)) *bad = 1;
    out[indices[j]] = scaled;
  }
}

// ---------------------------------------------------------------------------
// Host side: the launches (the scratch memory, randomk's upload and the
// explanation of a flagged payload are in codec_support.h).

// onebit and qsgd: the fixed-order sum and the header; *scale (device) gets
// the header's value.
Status LaunchScale(const float* values, size_t n, bool norm, uint8_t* out, float* scale,
                   Scratch* scratch, cudaStream_t stream) {
  const size_t n_chunks = (n + cm::kReduceChunk - 1) / cm::kReduceChunk;
  double* partials = nullptr;
  GRIDSYNC_RETURN_IF_ERROR(scratch->Allocate(n_chunks, &partials));
  const size_t threads = n_chunks * cm::kReduceLanes;
  const auto blocks = static_cast<unsigned>((threads + kBlockSize - 1) / kBlockSize);
  if (norm) {
    ChunkSumKernel<true><<<blocks, kBlockSize, 0, stream>>>(values, n, n_chunks, partials);
  } else {
    ChunkSumKernel<false><<<blocks, kBlockSize, 0, stream>>>(values, n, n_chunks, partials);
  }
  GRIDSYNC_CUDA_RETURN_IF_LAUNCH_ERROR();
  FinishScaleKernel<<<1, 1, 0, stream>>>(partials, n_chunks, n, norm, out, scale);
  GRIDSYNC_CUDA_RETURN_IF_LAUNCH_ERROR();
  return Status::OK();
}

Status LaunchTopk(const float* values, size_t n, uint32_t k, uint8_t* out, Scratch* scratch,
                  cudaStream_t stream) {
  uint32_t *keys = nullptr, *sorted_keys = nullptr, *indices = nullptr, *sorted = nullptr;
  uint32_t* top = nullptr;
  GRIDSYNC_RETURN_IF_ERROR(scratch->Allocate(n, &keys));
  GRIDSYNC_RETURN_IF_ERROR(scratch->Allocate(n, &sorted_keys));
  GRIDSYNC_RETURN_IF_ERROR(scratch->Allocate(n, &indices));
  GRIDSYNC_RETURN_IF_ERROR(scratch->Allocate(n, &sorted));
  GRIDSYNC_RETURN_IF_ERROR(scratch->Allocate(k, &top));
  const auto count = static_cast<int64_t>(n);
  const auto kept = static_cast<int64_t>(k);
  // Keys are 31 bits (|x| as an integer); indices need bit_width(n - 1).
  const int key_bits = 31;
  const int index_bits =
      std::max(1, static_cast<int>(std::bit_width(static_cast<uint64_t>(n - 1))));
  size_t sort_bytes = 0, top_bytes = 0;
  GRIDSYNC_CUDA_RETURN_IF_ERROR(cub::DeviceRadixSort::SortPairsDescending(
      nullptr, sort_bytes, keys, sorted_keys, indices, sorted, count, 0, key_bits, stream));
  GRIDSYNC_CUDA_RETURN_IF_ERROR(
      cub::DeviceRadixSort::SortKeys(nullptr, top_bytes, sorted, top, kept, 0, index_bits, stream));
  uint8_t* temp = nullptr;
  size_t temp_bytes = std::max(sort_bytes, top_bytes);
  GRIDSYNC_RETURN_IF_ERROR(scratch->Allocate(temp_bytes, &temp));

  TopkKeysKernel<<<Blocks(n), kBlockSize, 0, stream>>>(values, n, keys, indices);
  GRIDSYNC_CUDA_RETURN_IF_LAUNCH_ERROR();
  // Stable: equal keys keep index order, so the first k are exactly the k
  // largest |x| with ties to the lower index.
  GRIDSYNC_CUDA_RETURN_IF_ERROR(cub::DeviceRadixSort::SortPairsDescending(
      temp, temp_bytes, keys, sorted_keys, indices, sorted, count, 0, key_bits, stream));
  temp_bytes = std::max(sort_bytes, top_bytes);
  GRIDSYNC_CUDA_RETURN_IF_ERROR(
      cub::DeviceRadixSort::SortKeys(temp, temp_bytes, sorted, top, kept, 0, index_bits, stream));
  TopkWriteKernel<<<Blocks(k), kBlockSize, 0, stream>>>(values, top, k, out);
  GRIDSYNC_CUDA_RETURN_IF_LAUNCH_ERROR();
  return Status::OK();
}

}  // namespace

Status Encode(const CodecOptions& options, const float* values, size_t n, uint64_t seed,
              uint8_t* out, cudaStream_t stream) {
  GRIDSYNC_RETURN_IF_ERROR(CheckCodecArguments(options, n));
  const size_t size = EncodedSize(options, n);
  if (n > 0 && values == nullptr)
    return Status::InvalidArgument(Prefix(options) + "values is null");
  if (size > 0 && out == nullptr) return Status::InvalidArgument(Prefix(options) + "out is null");
  if (n == 0) {
    // Only a header (at most 4 bytes): the CPU writes it.
    uint8_t header[4] = {};
    cpu::Encode(options, nullptr, 0, seed, header);
    // header lives on this stack: an asynchronous copy from pageable memory
    // may still read it after the call returns (CUDA promises only that it
    // "might be synchronous"), so wait for it.
    if (size > 0) {
      GRIDSYNC_CUDA_RETURN_IF_ERROR(
          cudaMemcpyAsync(out, header, size, cudaMemcpyHostToDevice, stream));
      GRIDSYNC_CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(stream));
    }
    return Status::OK();
  }
  Scratch scratch(stream);
  switch (options.codec) {
    case Codec::kNone:
      GRIDSYNC_CUDA_RETURN_IF_ERROR(
          cudaMemcpyAsync(out, values, 4 * n, cudaMemcpyDeviceToDevice, stream));
      break;
    case Codec::kFp16:
    case Codec::kInt8: {
      const size_t n_blocks = (n + options.block - 1) / options.block;
      const auto grid = static_cast<unsigned>(std::min(n_blocks, kMaxBlocks));
      if (options.codec == Codec::kFp16) {
        PerBlockEncodeKernel<Fp16Block>
            <<<grid, kBlockSize, 0, stream>>>(values, n, options.block, n_blocks, out);
      } else {
        PerBlockEncodeKernel<Int8Block>
            <<<grid, kBlockSize, 0, stream>>>(values, n, options.block, n_blocks, out);
      }
      GRIDSYNC_CUDA_RETURN_IF_LAUNCH_ERROR();
      break;
    }
    case Codec::kBf16:
      Bf16EncodeKernel<<<Blocks(n), kBlockSize, 0, stream>>>(values, n, out);
      GRIDSYNC_CUDA_RETURN_IF_LAUNCH_ERROR();
      break;
    case Codec::kQsgd: {
      float* norm = nullptr;
      GRIDSYNC_RETURN_IF_ERROR(scratch.Allocate(1, &norm));
      GRIDSYNC_RETURN_IF_ERROR(LaunchScale(values, n, true, out, norm, &scratch, stream));
      const uint64_t key = cm::RandomKey(seed, cm::kQsgdStream);
      QsgdEncodeKernel<<<Blocks((n + 7) / 8), kBlockSize, 0, stream>>>(values, n, options.bits, key,
                                                                       norm, out + 4);
      GRIDSYNC_CUDA_RETURN_IF_LAUNCH_ERROR();
      break;
    }
    case Codec::kOnebit: {
      float* scale = nullptr;
      GRIDSYNC_RETURN_IF_ERROR(scratch.Allocate(1, &scale));
      GRIDSYNC_RETURN_IF_ERROR(LaunchScale(values, n, false, out, scale, &scratch, stream));
      OnebitPackKernel<<<Blocks((n + 7) / 8), kBlockSize, 0, stream>>>(values, n, out + 4);
      GRIDSYNC_CUDA_RETURN_IF_LAUNCH_ERROR();
      break;
    }
    case Codec::kTopk:
      GRIDSYNC_RETURN_IF_ERROR(LaunchTopk(values, n, KeptCount(options, n), out, &scratch, stream));
      break;
    case Codec::kRandomk: {
      const uint32_t k = KeptCount(options, n);
      uint32_t* indices = nullptr;
      GRIDSYNC_RETURN_IF_ERROR(UploadRandomkIndices(seed, n, k, &indices, &scratch, stream));
      RandomkGatherKernel<<<Blocks(k), kBlockSize, 0, stream>>>(values, indices, k, out);
      GRIDSYNC_CUDA_RETURN_IF_LAUNCH_ERROR();
      break;
    }
  }
  return scratch.Release();
}

Status Decode(const CodecOptions& options, const uint8_t* bytes, size_t size, size_t n,
              uint64_t seed, float* out, cudaStream_t stream) {
  GRIDSYNC_RETURN_IF_ERROR(CheckCodecArguments(options, n));
  if (n > 0 && out == nullptr) return Status::InvalidArgument(Prefix(options) + "out is null");
  GRIDSYNC_RETURN_IF_ERROR(CheckPayloadSize(options, size, n));
  if (size > 0 && bytes == nullptr)
    return Status::InvalidArgument(Prefix(options) + "bytes is null");
  if (n == 0) {
    // At most a 4-byte header, nothing to write: the CPU judges it.
    GRIDSYNC_CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(stream));
    uint8_t header[4] = {};
    if (size > 0)
      GRIDSYNC_CUDA_RETURN_IF_ERROR(cudaMemcpy(header, bytes, size, cudaMemcpyDeviceToHost));
    return cpu::Decode(options, header, size, 0, seed, nullptr);
  }
  Scratch scratch(stream);
  unsigned* bad = nullptr;
  GRIDSYNC_RETURN_IF_ERROR(scratch.Allocate(1, &bad));
  GRIDSYNC_CUDA_RETURN_IF_ERROR(cudaMemsetAsync(bad, 0, sizeof(unsigned), stream));
  switch (options.codec) {
    case Codec::kNone:
      NoneDecodeKernel<<<Blocks(n), kBlockSize, 0, stream>>>(bytes, n, out, bad);
      break;
    case Codec::kFp16:
      Fp16DecodeKernel<<<Blocks(n), kBlockSize, 0, stream>>>(bytes, n, options.block, out, bad);
      break;
    case Codec::kBf16:
      Bf16DecodeKernel<<<Blocks(n), kBlockSize, 0, stream>>>(bytes, n, out, bad);
      break;
    case Codec::kInt8:
      Int8DecodeKernel<<<Blocks(n), kBlockSize, 0, stream>>>(bytes, n, options.block, out, bad);
      break;
    case Codec::kQsgd:
      QsgdDecodeKernel<<<Blocks((n + 7) / 8), kBlockSize, 0, stream>>>(bytes, n, options.bits, out,
                                                                       bad);
      break;
    case Codec::kOnebit:
      OnebitDecodeKernel<<<Blocks((n + 7) / 8), kBlockSize, 0, stream>>>(bytes, n, out, bad);
      break;
    case Codec::kTopk: {
      const uint32_t k = KeptCount(options, n);
      GRIDSYNC_CUDA_RETURN_IF_ERROR(cudaMemsetAsync(out, 0, n * sizeof(float), stream));
      TopkDecodeKernel<<<Blocks(k), kBlockSize, 0, stream>>>(bytes, n, k, out, bad);
      break;
    }
    case Codec::kRandomk: {
      const uint32_t k = KeptCount(options, n);
      uint32_t* indices = nullptr;
      GRIDSYNC_RETURN_IF_ERROR(UploadRandomkIndices(seed, n, k, &indices, &scratch, stream));
      GRIDSYNC_CUDA_RETURN_IF_ERROR(cudaMemsetAsync(out, 0, n * sizeof(float), stream));
      RandomkScatterKernel<<<Blocks(k), kBlockSize, 0, stream>>>(bytes, indices, k,
                                                                 RandomkFactor(n, k), out, bad);
      break;
    }
  }
  GRIDSYNC_CUDA_RETURN_IF_LAUNCH_ERROR();
  unsigned flagged = 0;
  GRIDSYNC_CUDA_RETURN_IF_ERROR(
      cudaMemcpyAsync(&flagged, bad, sizeof(unsigned), cudaMemcpyDeviceToHost, stream));
  GRIDSYNC_RETURN_IF_ERROR(scratch.Release());
  GRIDSYNC_CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(stream));
  if (flagged != 0) return ExplainBadPayload(options, bytes, size, n, seed);
  return Status::OK();
}

}  // namespace gridsync::cuda
