// Checks of an image file's structure that stb_image 2.27 (Debian's
// libstb-dev, compiled into gridsync_image) does not make, run by
// ImageTask::Decode before stb reads anything. Each closes a defect the
// image_decode_fuzz campaign found in stb, reachable from a few bytes:
// - JPEG: a Huffman table whose 16 counts sum past 256 (stb writes past its
//   tables, in stbi_info already);
// - PNG: a chunk claiming more bytes than the file holds (stb reallocates to
//   the claim first), and rows whose raw bytes pass 2^31 - 1 (stb's int
//   sizes overflow), wherever IHDR is (stb takes CgBI chunks before it);
// - BMP, TGA, GIF and JPEG data shorter than the header promises, and
//   palette indices past the palette: image_data_checks.h;
// - PNM: integers past 2^24 (stb's parser overflows), 16-bit grey (stb's
//   conversion reads twice its buffer), and pixel data shorter than the
//   header says (stb keeps the uninitialised rest as the image).
// And for every format the memory the decoder takes for the header's size
// (GIF 12 bytes a pixel, progressive JPEG up to 16 before our copy), so a
// file of a few bytes claiming a huge image is refused by what it needs,
// against what this machine has.
//
// Thread safety: pure functions (and a read of /proc/meminfo).
#pragma once

#include <cstddef>
#include <cstdint>

#include "common/status.h"

namespace gridsync::image_precheck {

// The format's name when the bytes are one stb_image decodes but the task
// does not take (PSD, Radiance HDR, Softimage PIC, ASCII or 1-bit PNM),
// else nullptr.
const char* RefusedFormat(const uint8_t* data, size_t size);

// The format the bytes start as, by signature ("JPEG", "PNG", "GIF",
// "BMP", "PNM"), else nullptr: stb names a damaged file of a format it
// knows by its last guess ("unknown image type"), so the caller names it.
const char* SignatureFormat(const uint8_t* data, size_t size);

// Whether a file starting with `head` (its first kHeadBytes, or all of a
// shorter file) may be an image stb decodes: a signature (refused formats
// included), a TGA header, or 0xFF fill before a JPEG's SOI. False means no
// decoder takes it, known before the rest of a file of up to 2 GiB is read
// (a probe's 1.9 GB of zeros took 1.96 GB of memory and 12 s to refuse).
inline constexpr size_t kHeadBytes = 64;
bool MayBeImage(const uint8_t* head, size_t size);

// OK, or what is wrong (the caller adds the file's name and what is allowed).
Status CheckStructure(const uint8_t* data, size_t size);

// The dimensions in a PNG's first IHDR (after a CgBI chunk too), if the
// bytes start as a PNG does and hold it: stb refuses a PNG over its own
// bounds as "unknown image type", so the caller names the size from here.
bool PngDimensions(const uint8_t* data, size_t size, uint32_t* width, uint32_t* height);

// The bytes a PNG's image data inflates to: a filter byte and the packed
// samples (bits_per_pixel = depth x channels) of every row, of each of
// Adam7's seven passes when interlaced. CheckStructure refuses data
// inflating past it (stb inflates all there is, 1 GiB for a 1 x 1 image).
uint64_t PngInflatedBytes(uint64_t width, uint64_t height, uint64_t bits_per_pixel,
                          bool interlaced);

// Bytes decoding `pixels` pixels of this file's format takes at its peak
// (stb's buffers and the task's copy).
uint64_t DecodeBytes(const uint8_t* data, size_t size, uint64_t pixels);

}  // namespace gridsync::image_precheck
