// Gradient codecs: workers encode the values of the hash-grid rows a step
// touched, shards decode them and aggregate. This header defines the codecs,
// their wire formats and the CPU implementation, which is the reference:
// the CUDA twins (kernels/cuda/codec_kernels.h) include it and write the
// same bytes.
//
// A payload carries the n float32 values of the touched rows of one table
// (rows x width, packed as SparseRows packs them); row ids travel beside it,
// uncompressed. Every codec's size is a function of (options, n) alone, so
// the receiver knows how many bytes to expect before it reads one.
//
// Wire formats (little-endian; sizes include every header and index):
//   none     n float32                                          4n bytes
//   fp16     per block of `block` values (the last may be       ceil(n/block)*2 + 2n
//            shorter): an int16 exponent e in [-112, 100],
//            then one IEEE binary16 per value, h = x * 2^e
//            rounded to nearest even (finite values beyond
//            +-65504 saturate to +-65504); decoded x = h *
//            2^-e. e = clamp(14 - ilogb(max|x|), -112, 100)
//            (Fp16BlockExponent), so the block's largest lands
//            in [2^14, 2^15) and every value keeps half's 11
//            bits down to 2^-28 of it, however small the block
//            (plain halves flush values under 6e-8); e is 0 for
//            an all-zero block. The bounds keep 2^e, 2^-e and
//            every decoded value normal, finite floats, so a
//            decoder scales exactly
//   bf16     n bfloat16 (the high half of a float32), round to  2n bytes
//            nearest even; finite values beyond its range
//            saturate to +-3.3895e38
//   int8     per block of `block` values (the last may be       ceil(n/block)*4 + n
//            shorter): a float32 scale = max|x| / 127, then
//            one int8 per value, q = round_even(x * (127 /
//            max|x|)) in [-127, 127]; decoded x = q * scale
//   qsgd     a float32 norm = ||x||_2, then n codes of          4 + ceil(n*(bits+1)/8)
//            (bits+1) bits packed LSB first (value i occupies
//            stream bits [i*(bits+1), (i+1)*(bits+1)), stream
//            bit j is bit j%8 of byte j/8; the last byte's
//            unused bits are 0). A code is `level` in its low
//            `bits` bits and the sign (1 = negative) above; the
//            level is |x|/norm*s, s = 2^bits - 1, rounded down
//            or up at random with the probability of its
//            fraction (unbiased); level 0 is always written
//            with sign 0. Decoded x = +-level * (norm / s).
//   onebit   a float32 scale = mean|x|, then ceil(n/8) bytes    4 + ceil(n/8)
//            of sign bits, LSB first (bit 1: x >= 0; negative
//            values and NaN give 0; unused bits are 0).
//            Decoded x = bit ? scale : -scale.
//   topk     u32 k, then k u32 indices (strictly ascending),    4 + 8k
//            then the k float32 values at those indices; the
//            k entries of largest |x|, ties to the lower index
//   randomk  the k float32 values at k indices drawn from       4k
//            (seed, n) alone, ascending; decoded x = v * n / k
//            at those indices (unbiased), 0 elsewhere
// with k = KeptCount(options, n) = clamp(round(ratio * n), 1, n) (0 for n 0).
//
// Randomness is a pure function of `seed` (callers mix the training seed,
// step and table into it so that a worker and the shard agree): qsgd's draw
// for value i is CounterRandom(seed, 0, i) and randomk's index set comes
// from CounterRandom(seed, 1, .) with Floyd's sampling, so only values
// travel. Sums (onebit's mean, qsgd's norm) use one fixed order (see
// codec_math::kReduceChunk), so every implementation writes identical bytes.
//
// Non-finite input (a diverged worker) is marked rather than encoded: an
// int8 block, onebit or qsgd payload holding one gets the canonical NaN
// (0x7FC00000) as its scale or norm; topk ranks NaN and infinity above
// every number, so they are sent; none/bf16 carry them as they are and fp16
// as infinity or 0x7E00 (their block's exponent 0). Decode refuses all of
// these, so such a push cannot reach a shard's parameters (randomk refuses
// them only when sampled).
//
// Decode is THE decode boundary for compressed values: it never asserts on
// the bytes and answers kCorruption naming what is wrong and what is
// allowed (size; non-finite, negative or overflowing scales and norms;
// non-finite values; fp16's exponents out of range; topk's k and its
// indices' range and order; qsgd's negative-zero codes and padding bits;
// onebit's padding bits; int8's code -128), or kInvalidArgument for bad
// options or arguments. A qsgd level cannot exceed s: the field is `bits`
// wide. Encode's inputs come from this process, so bad options there are
// bugs and fail a GRIDSYNC_CHECK.
//
// Thread safety: the free functions are reentrant and keep no state.
// ErrorFeedback is not safe for concurrent use (one per worker, or external
// locking).
#pragma once

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <iosfwd>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "common/codec_format.h"
#include "common/counter_rng.h"
#include "common/status.h"
#include "kernels/host_device.h"

namespace gridsync {

// The codec vocabulary (Codec, CodecOptions, names, sizes) lives in
// common/codec_format.h: the wire format knows it without the kernels.

// Arithmetic shared, bit for bit, by the CPU codec and its CUDA twins. Host
// code must run with the default rounding mode (round to nearest even).
namespace codec_math {

// Deterministic sums (onebit's sum |x|, qsgd's sum x^2), in double: values
// are cut into chunks of kReduceChunk; inside a chunk value i (counted from
// the chunk's start) goes to lane i % kReduceLanes, each lane adding in index
// order from +0.0; a chunk's lanes are combined pairwise, (l0+l1), (l2+l3),
// ... then ((l0+l1)+(l2+l3)), ... up to one sum; chunk sums are added in
// chunk order from +0.0. Squares and absolute values of floats are exact in
// double, so fused multiply-adds cannot change the result.
inline constexpr uint32_t kReduceLanes = 16;
inline constexpr uint32_t kReduceChunk = 4096;

inline constexpr uint32_t kCanonicalNan = 0x7FC00000u;
inline constexpr uint16_t kHalfCanonicalNan = 0x7E00u;
inline constexpr uint32_t kHalfMaxBits = 0x477FE000u;  // 65504.0f
inline constexpr uint32_t kInfBits = 0x7F800000u;
inline constexpr uint64_t kQsgdStream = 0;     // CounterRandom stream of qsgd
inline constexpr uint64_t kRandomkStream = 1;  // CounterRandom stream of randomk

GRIDSYNC_HOST_DEVICE inline uint32_t FloatBits(float x) {
#if defined(__CUDA_ARCH__)
  return __float_as_uint(x);
#else
  uint32_t bits;
  std::memcpy(&bits, &x, sizeof(bits));
  return bits;
#endif
}

GRIDSYNC_HOST_DEVICE inline float BitsFloat(uint32_t bits) {
#if defined(__CUDA_ARCH__)
  return __uint_as_float(bits);
#else
  float x;
  std::memcpy(&x, &bits, sizeof(x));
  return x;
#endif
}

GRIDSYNC_HOST_DEVICE inline bool IsFiniteBits(uint32_t bits) {
  return (bits & kInfBits) != kInfBits;
}

// topk's ranking key: |x| ordered as an integer. For numbers this is the
// order of |x|; NaN ranks above infinity.
GRIDSYNC_HOST_DEVICE inline uint32_t MagnitudeKey(float x) { return FloatBits(x) & 0x7FFFFFFFu; }

// CounterRandom(seed, stream, i) == RandomAt(RandomKey(seed, stream), i):
// the same SplitMix64 construction as common/counter_rng.h, callable on the
// device, with the per-call part hoisted (tests check the identity).
using ::gridsync::Mix64;
GRIDSYNC_HOST_DEVICE inline uint64_t RandomKey(uint64_t seed, uint64_t stream) {
  return Mix64(seed ^ Mix64(stream));
}
GRIDSYNC_HOST_DEVICE inline uint64_t RandomAt(uint64_t key, uint64_t index) {
  return Mix64(key ^ index);
}

// High 64 bits of a * b: maps a uniform 64-bit draw to [0, b) (Lemire).
GRIDSYNC_HOST_DEVICE inline uint64_t MulHi64(uint64_t a, uint64_t b) {
#if defined(__CUDA_ARCH__)
  return __umul64hi(a, b);
#else
  const uint64_t a_lo = a & 0xFFFFFFFFu, a_hi = a >> 32;
  const uint64_t b_lo = b & 0xFFFFFFFFu, b_hi = b >> 32;
  const uint64_t lo_lo = a_lo * b_lo;
  const uint64_t hi_lo = a_hi * b_lo;
  const uint64_t lo_hi = a_lo * b_hi;
  const uint64_t cross = (lo_lo >> 32) + (hi_lo & 0xFFFFFFFFu) + lo_hi;
  return a_hi * b_hi + (hi_lo >> 32) + (cross >> 32);
#endif
}

// fp16 encoding's input: finite values beyond +-65504 saturate, NaN becomes
// the canonical quiet NaN (which converts to 0x7E00), infinities stay.
GRIDSYNC_HOST_DEVICE inline float PrepareForHalf(float x) {
  const uint32_t bits = FloatBits(x);
  const uint32_t abs = bits & 0x7FFFFFFFu;
  if (abs > kInfBits) return BitsFloat(kCanonicalNan);
  if (abs > kHalfMaxBits && abs < kInfBits) return BitsFloat((bits & 0x80000000u) | kHalfMaxBits);
  return x;
}

// fp16's block exponent e for a block whose largest |x| is the finite
// float with bits max_bits (sign cleared): 14 - ilogb, clamped to
// [kFp16MinExponent, kFp16MaxExponent]; 0 for an all-zero block. Read
// from the bits, so every implementation agrees exactly.
inline constexpr int32_t kFp16MinExponent = -112;
inline constexpr int32_t kFp16MaxExponent = 100;
GRIDSYNC_HOST_DEVICE inline int32_t Fp16BlockExponent(uint32_t max_bits) {
  if (max_bits == 0) return 0;
  const int32_t biased = static_cast<int32_t>(max_bits >> 23);  // 0 for subnormals
  if (biased == 0) return kFp16MaxExponent;
  const int32_t e = 14 - (biased - 127);
  return e < kFp16MinExponent ? kFp16MinExponent : (e > kFp16MaxExponent ? kFp16MaxExponent : e);
}
// 2^e as a float, for e in [-126, 127].
GRIDSYNC_HOST_DEVICE inline float Pow2(int32_t e) {
  return BitsFloat(static_cast<uint32_t>(e + 127) << 23);
}

// float32 -> bfloat16, round to nearest even; finite values that would
// round to infinity saturate to +-0x7F7F; NaN stays NaN (made quiet).
GRIDSYNC_HOST_DEVICE inline uint16_t FloatToBf16(float x) {
  const uint32_t bits = FloatBits(x);
  const uint32_t abs = bits & 0x7FFFFFFFu;
  const uint32_t rounded = (bits + 0x7FFFu + ((bits >> 16) & 1u)) >> 16;
  const uint32_t saturated = ((bits >> 16) & 0x8000u) | 0x7F7Fu;
  const uint32_t quiet_nan = (bits >> 16) | 0x0040u;
  const uint32_t out = abs > kInfBits                                      ? quiet_nan
                       : (abs < kInfBits && (rounded & 0x7FFFu) == 0x7F80u) ? saturated
                                                                            : rounded;
  return static_cast<uint16_t>(out);
}

GRIDSYNC_HOST_DEVICE inline float Bf16ToFloat(uint16_t h) { return BitsFloat(uint32_t{h} << 16); }

// int8 code of x with inv = 127 / max|x| (a float), or, when that quotient
// overflows float (max|x| below ~3.7e-37), with the double quotient.
GRIDSYNC_HOST_DEVICE inline int32_t Int8Code(float x, float inv) {
#if defined(__CUDA_ARCH__)
  return __float2int_rn(__fmul_rn(x, inv));
#else
  return static_cast<int32_t>(std::nearbyint(x * inv));
#endif
}
GRIDSYNC_HOST_DEVICE inline int32_t Int8CodeWide(float x, double inv) {
#if defined(__CUDA_ARCH__)
  return __double2int_rn(__dmul_rn(static_cast<double>(x), inv));
#else
  return static_cast<int32_t>(std::nearbyint(static_cast<double>(x) * inv));
#endif
}
GRIDSYNC_HOST_DEVICE inline int32_t ClampInt8Code(int32_t q) {
  return q < -127 ? -127 : (q > 127 ? 127 : q);
}

// qsgd's stochastic level for r = |x| / norm * s in [0, s]: floor(r), plus
// one with probability frac(r), decided by a uniform 53-bit draw.
GRIDSYNC_HOST_DEVICE inline uint32_t QsgdLevel(double r, uint64_t random) {
#if defined(__CUDA_ARCH__)
  const double lower = floor(r);
#else
  const double lower = std::floor(r);
#endif
  const double frac = r - lower;  // exact
  const double u = static_cast<double>(random >> 11) * 0x1.0p-53;
  return static_cast<uint32_t>(lower) + (u < frac ? 1u : 0u);
}

}  // namespace codec_math

namespace cpu {

// Writes exactly EncodedSize(options, n) bytes to out. values may alias
// nothing in out. Checks (aborts on) invalid options, n > kMaxCodecValues
// and null pointers where bytes are due.
void Encode(const CodecOptions& options, const float* values, size_t n, uint64_t seed,
            uint8_t* out);

// Decodes a payload of `size` bytes into n floats, writing all n (0 where
// nothing was sent). On error the contents of out are unspecified and must be
// discarded. `seed` must be the encoder's (randomk's indices derive from it).
Status Decode(const CodecOptions& options, const uint8_t* bytes, size_t size, size_t n,
              uint64_t seed, float* out);

// randomk's index set: k distinct indices in [0, n), ascending, uniformly
// random among k-subsets (Floyd's algorithm over a bitmap), drawn from
// CounterRandom(seed, 1, j) for j in [n-k, n). Needs k <= n <= kMaxCodecValues.
void RandomkIndices(uint64_t seed, size_t n, uint32_t k, uint32_t* indices);

}  // namespace cpu
}  // namespace gridsync
