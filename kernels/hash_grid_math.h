// The multiresolution hash encoding's geometry and index maths, exactly as
// instant-ngp / tiny-cuda-nn define them, shared by kernels/cpu and
// kernels/cuda.
//
// Per level l (float32 arithmetic, as tiny-cuda-nn does it, because the
// rounding of `scale` decides the resolution of some levels):
//   scale = 2^(l * log2(per_level_scale)) * base_resolution - 1
//   res   = ceil(scale) + 1
// A level is dense when res^d <= T = 2^log2_hashmap_size; it then holds
// res^d rows padded to a multiple of 8, and row = x + y*res (+ z*res^2).
// Otherwise it is hashed with T rows: row = (x*1 ^ y*2654435761 ^
// z*805459861) mod T. Both index forms are taken mod the level size, which
// matters for the corner one past the last grid line.
// A sample at position p in [0,1]^d is looked up at p*scale + 0.5 and
// d-linearly interpolated between the 2^d surrounding grid vertices.
//
// Thread safety: pure functions and immutable values.
#pragma once

#include <cmath>
#include <cstdint>

#include "kernels/host_device.h"

namespace gridsync {

inline constexpr uint32_t kMaxGridLevels = 32;
inline constexpr uint32_t kMaxGridDims = 3;

GRIDSYNC_HOST_DEVICE inline float GridLevelScale(uint32_t level, float log2_per_level_scale,
                                                 float base_resolution) {
  return exp2f(static_cast<float>(level) * log2_per_level_scale) * base_resolution - 1.0f;
}

GRIDSYNC_HOST_DEVICE inline uint32_t GridLevelResolution(float scale) {
  return static_cast<uint32_t>(ceilf(scale)) + 1u;
}

// The spatial hash of instant-ngp (Teschner et al. primes, first one 1 so
// that the hash stays coherent along x).
template <uint32_t D>
GRIDSYNC_HOST_DEVICE inline uint32_t GridHash(const uint32_t* coord) {
  constexpr uint32_t kPrimes[3] = {1u, 2654435761u, 805459861u};
  uint32_t h = 0;
  for (uint32_t d = 0; d < D; ++d) h ^= coord[d] * kPrimes[d];
  return h;
}

// One level's lookup parameters, small enough to pass to a kernel by value.
struct GridLevelInfo {
  uint64_t row_offset = 0;  // first row of the level in the concatenated table
  float scale = 0;          // positions are looked up at p*scale + 0.5
  uint32_t resolution = 0;  // grid vertices per dimension
  uint32_t rows = 0;        // rows in this level's table
  uint32_t hashed = 0;      // 1 when hashed, 0 when dense
};

template <uint32_t D>
GRIDSYNC_HOST_DEVICE inline uint32_t GridRow(const GridLevelInfo& level, const uint32_t* coord) {
  uint32_t index;
  if (level.hashed) {
    index = GridHash<D>(coord);
  } else {
    index = 0;
    uint32_t stride = 1;
    for (uint32_t d = 0; d < D; ++d) {
      index += coord[d] * stride;
      stride *= level.resolution;
    }
  }
  // Hashed levels have a power-of-two size and dense indices exceed the size
  // only for the corner past the last grid line; avoid the division otherwise.
  if (level.hashed) return index & (level.rows - 1u);
  return index < level.rows ? index : index % level.rows;
}

// Lookup of one sample on one level: the 2^D corner rows (level-local) and
// their d-linear weights. Corner c uses bit d of c for the +1 along dim d.
template <uint32_t D>
struct GridCorners {
  uint32_t row[1u << D];
  float weight[1u << D];
};

template <uint32_t D>
GRIDSYNC_HOST_DEVICE inline void GridLookup(const GridLevelInfo& level, const float* position,
                                            GridCorners<D>* out) {
  uint32_t base[D];
  float frac[D];
  for (uint32_t d = 0; d < D; ++d) {
    const float pos = fmaf(level.scale, position[d], 0.5f);
    const float fl = floorf(pos);
    base[d] = static_cast<uint32_t>(static_cast<int>(fl));
    frac[d] = pos - fl;
  }
  for (uint32_t c = 0; c < (1u << D); ++c) {
    float w = 1.0f;
    uint32_t coord[D];
    for (uint32_t d = 0; d < D; ++d) {
      const bool up = (c >> d) & 1u;
      w *= up ? frac[d] : 1.0f - frac[d];
      coord[d] = base[d] + (up ? 1u : 0u);
    }
    out->row[c] = GridRow<D>(level, coord);
    out->weight[c] = w;
  }
}

}  // namespace gridsync
