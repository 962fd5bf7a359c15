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
//   fp16     n IEEE binary16, round to nearest even; finite     2n bytes
//            values beyond +-65504 saturate to +-65504
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
// as infinity or 0x7E00. Decode refuses all of these, so such a push cannot
// reach a shard's parameters (randomk refuses them only when sampled).
//
// Decode is THE decode boundary for compressed values: it never asserts on
// the bytes and answers kCorruption naming what is wrong and what is
// allowed (size; non-finite, negative or overflowing scales and norms;
// non-finite values; topk's k and its indices' range and order; qsgd's
// negative-zero codes and padding bits; onebit's padding bits; int8's code
// -128), or kInvalidArgument for bad options or arguments. A qsgd level
// cannot exceed s: the field is `bits` wide. Encode's inputs come from this
// process, so bad options there are bugs and fail a GRIDSYNC_CHECK.
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
#include <unordered_map>
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

// Error feedback for lossy codecs: the part of a gradient that a codec did
// not deliver (corrected - decoded) is kept per (table, row) and added to the
// row's next gradient, so that over steps every row receives what it was
// owed.
//
// Memory is kept only for rows that were touched, and a row's residual is
// only ever added back when that row is touched again (or delivered whole
// by the final flush, PsClient::FlushResiduals, to rows that earned it).
// The reason: a sign codec such as onebit sends +-scale for every value it
// carries; if residual memory were dense, or were flushed into rows the step
// did not touch, those rows would receive +-scale pushes they never earned,
// and the shard's skip-untouched Adam (which leaves untouched rows' moments
// alone) would see them as touched and move them. Storing a zero residual
// for a row that has no entry is skipped, so lossless codecs cost no memory.
//
// Rows find their residual through a paged index (4096 rows a page, pages
// allocated on first store): one array lookup per row on the hot path, and
// index memory only for the stretches of a table that were touched.
//
// A table's row width is fixed by its first StoreResidual; a later call with
// another width is a bug (checked).
//
// Thread safety: const calls may run concurrently; StoreResidual calls on
// distinct keys may run concurrently once each key is Reserved; anything
// else needs one thread.
class ErrorFeedback {
 public:
  // Residuals are kept per key: one key per (table, column slice) the
  // caller pushes (64 bits, so no two slices can share one).
  // values (n_rows x width) += the stored residual of each row; rows with no
  // entry add nothing. Creates no entries.
  void AddResidual(uint64_t key, const uint32_t* rows, size_t n_rows, uint32_t width,
                   float* values) const;
  // The same into a full parameter array: params[row * row_stride + col + f]
  // += residual(row)[f], for rows[0..n) (or rows 0..n when rows is null).
  void AddResidualInPlace(uint64_t key, const uint32_t* rows, size_t n, float* params,
                          size_t row_stride, size_t col) const;
  // Makes the table of `key` (width floats a row) if it is missing, as the
  // first StoreResidual would: afterwards calls on distinct keys touch
  // distinct tables and may run on different threads at once.
  void Reserve(uint64_t key, uint32_t width);
  // residual(row) = corrected - decoded (both n_rows x width), for each row.
  // Rows must be distinct within a call.
  void StoreResidual(uint64_t key, const uint32_t* rows, size_t n_rows, uint32_t width,
                     const float* corrected, const float* decoded);

  // Rows holding a residual: over all tables, or in one.
  size_t Entries() const;
  size_t Entries(uint64_t key) const;
  // The row's `width` residual floats, or null when the row has no entry.
  const float* Residual(uint64_t key, uint32_t row) const;
  // The rows of `table` holding a residual, ascending.
  std::vector<uint32_t> Rows(uint64_t key) const;
  // Bytes held by residual values (the arenas' capacity).
  size_t ResidualBytes() const;
  // Bytes held by the row index pages.
  size_t IndexBytes() const;
  void Clear() { tables_.clear(); }

  // Checkpoints (worker/worker_checkpoint.h): every residual, keys in
  // ascending order, slots in their order (see Table::arena), so a restored
  // object equals the saved one. RestoreState replaces everything and
  // consumes its bytes from `in`; Corruption on a malformed or short state.
  void AppendState(std::string* out) const;
  Status RestoreState(std::string_view* in);

 private:
  static constexpr uint32_t kPageBits = 12;
  struct Table {
    uint32_t width = 0;
    // page (row >> kPageBits) -> per row, slot + 1 (0: no entry)
    std::vector<std::unique_ptr<uint32_t[]>> pages;
    std::vector<uint32_t> row_of_slot;
    // slots x width, in order of first touch, except that StoreResidual
    // sorts them by row once more than an eighth of them lie past the
    // longest ascending prefix (`sorted` slots), so that ascending rows read
    // their residuals in order rather than scattered. `sorted` is a function
    // of the slot order alone, so a restored table sorts when the saved one
    // would.
    std::vector<float> arena;
    size_t sorted = 0;

    const float* Find(uint32_t row) const {
      const size_t page = row >> kPageBits;
      if (page >= pages.size() || !pages[page]) return nullptr;
      const uint32_t slot = pages[page][row & ((1u << kPageBits) - 1)];
      return slot == 0 ? nullptr : arena.data() + size_t{slot - 1} * width;
    }
    float* Find(uint32_t row) {
      return const_cast<float*>(static_cast<const Table&>(*this).Find(row));
    }
    // Starts loading the row's slot in the index (no load waits here).
    void PrefetchSlot(uint32_t row) const {
      const size_t page = row >> kPageBits;
      if (page < pages.size() && pages[page])
        __builtin_prefetch(&pages[page][row & ((1u << kPageBits) - 1)]);
    }
    // Starts loading the row's residual (a hint: nothing when it has none);
    // reads its slot, which PrefetchSlot should have started loading.
    void Prefetch(uint32_t row) const {
      if (const float* residual = Find(row); residual != nullptr) __builtin_prefetch(residual, 1);
    }
    // Both, for the i-th of n rows: the slot of row i + 2 * distance, the
    // residual of row i + distance.
    void PrefetchAhead(const uint32_t* rows, size_t i, size_t n, size_t distance) const {
      if (i + 2 * distance < n) PrefetchSlot(rows[i + 2 * distance]);
      if (i + distance < n) Prefetch(rows[i + distance]);
    }
    // Puts the slots in ascending row order.
    void SortByRow();
    // The row's slot index (0: no entry), its page made when missing.
    uint32_t& Slot(uint32_t row) {
      const size_t page = row >> kPageBits;
      if (page >= pages.size()) pages.resize(page + 1);
      if (!pages[page]) pages[page] = std::make_unique<uint32_t[]>(size_t{1} << kPageBits);
      return pages[page][row & ((1u << kPageBits) - 1)];
    }
  };
  const Table* FindTable(uint64_t key) const;
  std::unordered_map<uint64_t, Table> tables_;
};

}  // namespace cpu
}  // namespace gridsync
