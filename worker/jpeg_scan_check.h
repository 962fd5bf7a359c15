// Whether a baseline JPEG's scans hold every block their frame promises.
// stb_image 2.27 decodes entropy-coded data until it meets a marker and
// takes zero bits after it, so a file cut short with an EOI put back
// (a hostile probe: the first 20% of a photo, then FF D9) decoded the rest
// of the image from zeros; the one-bit-a-block bound of
// image_data_checks::CheckJpegFrame passes it. This walks each scan's
// Huffman codes block by block, as a decoder does without dequantising or
// transforming, and refuses a scan whose data ends before its last block.
// Baseline and extended sequential Huffman frames (SOF0, SOF1) are walked
// here, progressive ones (SOF2) by jpeg_progressive_scan.h, which also
// wants every coefficient sent to its last bit. For every frame it checks
// that each component is in a scan (progressive: a first DC scan), since
// stb converts the others from a buffer nothing wrote, and that a restart
// interval's markers are there (stb stops at a missing one).
//
// Thread safety: a pure function.
#pragma once

#include <cstddef>
#include <cstdint>

#include "common/status.h"

namespace gridsync::jpeg_scan_check {

// `start`: the byte after SOI. OK when the frame is not Huffman-coded
// (refused elsewhere), or when every scan decodes all its blocks (and a
// progressive frame's scans send every coefficient); InvalidArgument naming
// the scan and how far its data went, a Huffman table no DHT defined, or
// what was never sent, otherwise. Damage stb itself refuses (a bad Huffman
// code, a frame or scan header it calls corrupt) is left to stb: OK.
Status CheckScans(const uint8_t* data, size_t size, size_t start);

}  // namespace gridsync::jpeg_scan_check
