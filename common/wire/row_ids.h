// deltaVarint row ids, both ways: a block's strictly ascending row ids as
// the first id, then each gap minus one, in unsigned LEB128 varints (layout
// in message.h and gridsync.capnp). Internal to gridsync_wire: Encode picks
// the smaller of raw and deltaVarint (message.cc), Decode expands a frame
// (message_decode.cc, the decode boundary that names the frame).
//
// Thread safety: pure functions.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <limits>
#include <string>
#include <vector>

#include "common/status.h"

namespace gridsync::wire {

inline constexpr size_t kNotAscending = std::numeric_limits<size_t>::max();

// The exact deltaVarint size of `rows`, or kNotAscending when they are not
// strictly ascending (the gaps would wrap; such a block goes raw, so that the
// receiver's order check names the caller's mistake).
size_t DeltaVarintBytes(const std::vector<uint32_t>& rows);

// `bytes` is DeltaVarintBytes(rows): one exact allocation, no growth.
std::vector<uint8_t> EncodeDeltaVarint(const std::vector<uint32_t>& rows, size_t bytes);

// Expands `size` bytes of untrusted input into exactly `row_count` ids in
// *out. Checks the bytes (varint length, 32-bit overflow, truncation, the
// exact count), each refusal prefixed with name(); range and order are the
// caller's to check, as for raw ids.
Status DecodeDeltaVarint(const uint8_t* bytes, size_t size, uint32_t row_count,
                         const std::function<std::string()>& name, std::vector<uint32_t>* out);

}  // namespace gridsync::wire
