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
#include "common/uninit_vector.h"

namespace gridsync::wire {

inline constexpr size_t kNotAscending = std::numeric_limits<size_t>::max();

// The exact deltaVarint size of `rows`, or kNotAscending when they are not
// strictly ascending (the gaps would wrap; such a block goes raw, so that the
// receiver's order check names the caller's mistake).
size_t DeltaVarintBytes(const std::vector<uint32_t>& rows);

// Writes the deltaVarint frame of `rows` into *out and returns true when
// the rows are strictly ascending and it is smaller than raw ids (4 bytes a
// row); else returns false and the block goes raw (*out is then
// unspecified). One pass: it sizes and writes together, giving up as soon
// as the varints reach raw's size, so a block never pays for both layouts.
bool EncodeDeltaVarintIfSmaller(const std::vector<uint32_t>& rows, UninitVector<uint8_t>* out);

// Expands `size` bytes of untrusted input into exactly `row_count` ids in
// *out. Checks the bytes (varint length, 32-bit overflow, truncation, the
// exact count), each refusal prefixed with name(); range and order are the
// caller's to check, as for raw ids.
Status DecodeDeltaVarint(const uint8_t* bytes, size_t size, uint32_t row_count,
                         const std::function<std::string()>& name, UninitVector<uint32_t>* out);

}  // namespace gridsync::wire
