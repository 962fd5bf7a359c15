#include "common/wire/row_ids.h"

#include <spdlog/fmt/fmt.h>

#include <algorithm>
#include <cstring>

#ifdef __AVX2__
#include <immintrin.h>
#endif

#include "common/check.h"
#include "common/wire/message.h"  // kMaxVarintBytes

namespace gridsync::wire {

namespace {

// Bytes of `v` as an unsigned LEB128 varint. Branch-free, so that the sizing
// pass over a million-row block vectorises.
inline size_t VarintBytes(uint32_t v) {
  return 1 + size_t{v >= (1u << 7)} + size_t{v >= (1u << 14)} + size_t{v >= (1u << 21)} +
         size_t{v >= (1u << 28)};
}

inline uint8_t* PutVarint(uint32_t v, uint8_t* out) {
  while (v >= 0x80) {
    *out++ = static_cast<uint8_t>(v | 0x80);
    v >>= 7;
  }
  *out++ = static_cast<uint8_t>(v);
  return out;
}

}  // namespace

size_t DeltaVarintBytes(const std::vector<uint32_t>& rows) {
  if (rows.empty()) return 0;
  size_t bytes = VarintBytes(rows[0]);
  uint32_t bad = 0;
  // 32-bit sums over chunks that cannot overflow them (at most 5 bytes a
  // row): the vectorised loop then adds 8 lanes a step instead of widening
  // every lane to 64 bits (perf: twice as fast).
  constexpr size_t kChunk = size_t{1} << 28;
  for (size_t begin = 1; begin < rows.size(); begin += kChunk) {
    const size_t end = std::min(rows.size(), begin + kChunk);
    uint32_t chunk = 0;
    for (size_t i = begin; i < end; ++i) {
      const uint32_t gap = rows[i] - rows[i - 1] - 1;
      bad |= static_cast<uint32_t>(rows[i] <= rows[i - 1]);
      chunk += 1 + uint32_t{gap >= (1u << 7)} + uint32_t{gap >= (1u << 14)} +
               uint32_t{gap >= (1u << 21)} + uint32_t{gap >= (1u << 28)};
    }
    bytes += chunk;
  }
  return bad == 0 ? bytes : kNotAscending;
}

bool EncodeDeltaVarintIfSmaller(const std::vector<uint32_t>& rows, UninitVector<uint8_t>* out) {
  const size_t n = rows.size();
  const size_t raw = n * sizeof(uint32_t);
  if (n == 0) return false;  // 0 bytes either way: a tie goes raw
  // Room for the varints up to raw's size, then one more step of at most
  // 8 five-byte varints (or the tail's 7): the size check runs once a step.
  out->resize(raw + 8 * kMaxVarintBytes);
  uint8_t* const begin = out->data();
  uint8_t* const full = begin + raw;
  uint8_t* o = PutVarint(rows[0], begin);
  const uint32_t* r = rows.data();
  uint32_t bad = 0;
  // Row j's gap as a varint of any length, noting a row that does not ascend.
  const auto put_gap = [&](size_t j) {
    bad |= static_cast<uint32_t>(r[j] <= r[j - 1]);
    o = PutVarint(r[j] - r[j - 1] - 1, o);
  };
  size_t i = 1;
  // Eight rows a step (a batch's rows are mostly close): when all eight
  // gaps fit in one byte and the rows ascend, they are stored as 8 bytes.
  for (; i + 8 <= n; i += 8) {
#ifdef __AVX2__
    const __m256i cur = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(r + i));
    const __m256i prev = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(r + i - 1));
    const __m256i gap = _mm256_sub_epi32(_mm256_sub_epi32(cur, prev), _mm256_set1_epi32(1));
    // Unsigned cur > prev, as a signed compare with the sign bits flipped:
    // a one-byte gap can still wrap past 2^32 - 1.
    const __m256i flip = _mm256_set1_epi32(static_cast<int32_t>(0x80000000u));
    const __m256i ascending =
        _mm256_cmpgt_epi32(_mm256_xor_si256(cur, flip), _mm256_xor_si256(prev, flip));
    if (_mm256_testz_si256(gap, _mm256_set1_epi32(~0x7F)) &&
        _mm256_movemask_epi8(ascending) == -1) {
      const __m128i words =
          _mm_packus_epi32(_mm256_castsi256_si128(gap), _mm256_extracti128_si256(gap, 1));
      _mm_storel_epi64(reinterpret_cast<__m128i*>(o), _mm_packus_epi16(words, words));
      o += 8;
    } else {
      for (size_t k = 0; k < 8; ++k) put_gap(i + k);
    }
#else
    uint32_t gap[8];
    uint32_t wide = 0;
    for (int k = 0; k < 8; ++k) {
      gap[k] = r[i + k] - r[i + k - 1] - 1;
      wide |= gap[k];
      bad |= static_cast<uint32_t>(r[i + k] <= r[i + k - 1]);
    }
    if (wide < 0x80) {
      for (int k = 0; k < 8; ++k) o[k] = static_cast<uint8_t>(gap[k]);
      o += 8;
    } else {
      for (int k = 0; k < 8; ++k) o = PutVarint(gap[k], o);
    }
#endif
    if (o >= full) return false;  // raw is no larger
  }
  for (; i < n; ++i) put_gap(i);
  const size_t bytes = static_cast<size_t>(o - begin);
  if (bad != 0 || bytes >= raw) return false;
  out->resize(bytes);
  return true;
}

Status DecodeDeltaVarint(const uint8_t* bytes, size_t size, uint32_t row_count,
                         const std::function<std::string()>& name, UninitVector<uint32_t>* out) {
  // Every varint takes at least one byte. Refusing a short frame up front
  // also bounds the allocation below by 4x the bytes actually received.
  if (size < row_count) {
    return Status::Corruption(fmt::format(
        "{}: deltaVarint, {} bytes hold fewer varints than rowCount {}; allowed: 1 to {} bytes "
        "per row id ({} to {} bytes)",
        name(), size, row_count, kMaxVarintBytes, row_count,
        uint64_t{row_count} * kMaxVarintBytes));
  }
  UninitVector<uint32_t>& ids = *out;
  ids.resize(row_count);  // every id is written below, or the decode fails
  size_t pos = 0;
  uint64_t row = 0;
  for (uint32_t r = 0; r < row_count; ++r) {
    // Eight one-byte varints at once (a batch's rows are mostly close): no
    // continuation bit among the next 8 bytes, and the last of the 8 rows,
    // the largest, within 32 bits. Same ids as the byte loops below.
    while (r > 0 && row_count - r >= 8 && size - pos >= 8) {  // no wrap-around
      uint64_t word;
      std::memcpy(&word, bytes + pos, sizeof(word));
      if ((word & 0x8080808080808080ull) != 0) break;
#ifdef __AVX2__
      // The 8 gaps + 1 summed in one register: a prefix sum within each
      // 128-bit half, then the low half's total added to the high half.
      // Exact in 32 bits once the last id is known to fit (checked first).
      const __m256i step =
          _mm256_add_epi32(_mm256_cvtepu8_epi32(_mm_cvtsi64_si128(static_cast<int64_t>(word))),
                           _mm256_set1_epi32(1));
      __m256i sum = _mm256_add_epi32(step, _mm256_slli_si256(step, 4));
      sum = _mm256_add_epi32(sum, _mm256_slli_si256(sum, 8));
      sum = _mm256_add_epi32(
          sum, _mm256_blend_epi32(_mm256_setzero_si256(),
                                  _mm256_permutevar8x32_epi32(sum, _mm256_set1_epi32(3)), 0xF0));
      const uint64_t next = row + static_cast<uint32_t>(_mm256_extract_epi32(sum, 7));
      if (next > std::numeric_limits<uint32_t>::max()) break;  // the byte loops name it
      _mm256_storeu_si256(reinterpret_cast<__m256i*>(ids.data() + r),
                          _mm256_add_epi32(sum, _mm256_set1_epi32(static_cast<int32_t>(row))));
#else
      uint64_t next = row;
      for (int k = 0; k < 8; ++k) {
        next += 1 + bytes[pos + k];
        ids[r + k] = static_cast<uint32_t>(next);
      }
      if (next > std::numeric_limits<uint32_t>::max()) break;  // the byte loops name it
#endif
      row = next;
      r += 8;
      pos += 8;
    }
    if (r == row_count) break;
    const size_t start = pos;
    uint32_t v = 0;
    // Most gaps between a batch's rows fit one byte: take it without the
    // general loop's checks, which a one-byte varint cannot fail.
    if (pos < size && bytes[pos] < 0x80) {
      v = bytes[pos++];
      const uint64_t next = r == 0 ? uint64_t{v} : row + 1 + v;
      if (next <= std::numeric_limits<uint32_t>::max()) {
        row = next;
        ids[r] = static_cast<uint32_t>(row);
        continue;
      }
      pos = start;  // the general path below names the overflow
      v = 0;
    }
    for (unsigned shift = 0;; shift += 7) {
      if (pos == size) {
        if (shift == 0) {
          return Status::Corruption(fmt::format(
              "{}: deltaVarint, fewer varints than rowCount: the frame ends after {} of {}; "
              "allowed: exactly rowCount varints",
              name(), r, row_count));
        }
        return Status::Corruption(fmt::format(
            "{}: deltaVarint, varint {} at byte {} truncated: the frame ends after {} byte(s) with "
            "the continuation bit set; allowed: a last byte below 0x80",
            name(), r, start, pos - start));
      }
      const uint8_t byte = bytes[pos++];
      if (shift == 7 * (kMaxVarintBytes - 1) && byte > 0x0f) {
        if ((byte & 0x80) != 0) {
          return Status::Corruption(fmt::format(
              "{}: deltaVarint, varint {} at byte {} longer than {} bytes; allowed: at most {} "
              "bytes (32 bits)",
              name(), r, start, kMaxVarintBytes, kMaxVarintBytes));
        }
        return Status::Corruption(fmt::format(
            "{}: deltaVarint, varint {} at byte {} overflows 32 bits (fifth byte 0x{:02x}); "
            "allowed: a fifth byte of at most 0x0f",
            name(), r, start, unsigned{byte}));
      }
      v |= static_cast<uint32_t>(byte & 0x7f) << shift;
      if ((byte & 0x80) == 0) break;
    }
    const uint64_t next = r == 0 ? uint64_t{v} : row + 1 + v;
    if (next > std::numeric_limits<uint32_t>::max()) {
      return Status::InvalidArgument(fmt::format(
          "{}: deltaVarint, row at index {} overflows 32 bits: row {} + 1 + varint {} = {}; "
          "allowed: row ids up to {}",
          name(), r, row, v, next, std::numeric_limits<uint32_t>::max()));
    }
    row = next;
    ids[r] = static_cast<uint32_t>(row);
  }
  if (pos != size) {
    return Status::Corruption(fmt::format(
        "{}: deltaVarint, {} trailing bytes after rowCount {} varints ({} bytes); allowed: "
        "exactly rowCount varints and nothing else",
        name(), size - pos, row_count, pos));
  }
  return Status::OK();
}

}  // namespace gridsync::wire
