// The pixels an image file's header claims, read from its first bytes with
// parsers of our own (stb's header readers are not safe on unchecked
// bytes: image_precheck.h), so that a file far larger than its image is
// refused before it is read: a 1 x 1 PPM or PNG followed by a gigabyte of
// anything was read whole, a gigabyte for each process that loads the
// image (the workers, check-config, the launcher), and trained.
//
// Thread safety: pure functions.
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>

namespace gridsync::image_dimensions {

struct Dimensions {
  uint64_t width = 0;
  uint64_t height = 0;
};

// The width and height the header in `data` (a file's first `size` bytes)
// claims: PNG (IHDR, after a CgBI chunk too), JPEG (its first SOF marker),
// GIF (the logical screen), BMP, binary PNM (P5, P6) and, failing those,
// TGA; nullopt when the bytes hold no such header (the decoder judges the
// file then, read whole).
std::optional<Dimensions> HeaderDimensions(const uint8_t* data, size_t size);

// The most bytes a file holding `pixels` pixels is allowed: 64 MiB (room
// for metadata: ICC profiles, EXIF, text chunks, GIF frames) plus 16 bytes
// a pixel (twice 16-bit RGBA, more than any format's data takes).
inline constexpr uint64_t kMetadataBytes = uint64_t{64} << 20;
inline constexpr uint64_t MaxFileBytes(uint64_t pixels) { return kMetadataBytes + 16 * pixels; }

}  // namespace gridsync::image_dimensions
