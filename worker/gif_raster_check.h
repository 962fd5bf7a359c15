// Whether a GIF's first frame (the one stb_image decodes) indexes only its
// colour table and codes every pixel of the frame. stb 2.27 draws a pixel
// whose index lies past the table from entries it never loaded (zero, so
// transparent black), and leaves the pixels after the end of the LZW data
// as they were (black); image_data_checks::CheckGif passes both, since
// their blocks are whole. A GIF cut short with its terminator put back, or
// one whose codes index past its table, trained on as black pixels.
//
// This walks the frame's LZW codes as stb's stbi__process_gif_raster does,
// without drawing: for each code it keeps the length of its string and the
// largest index in it (a string is its prefix's string and one index), so
// the walk costs one entry a code, whatever the image size.
//
// Thread safety: a pure function.
#pragma once

#include <cstddef>
#include <cstdint>

#include "common/status.h"

namespace gridsync::gif_raster_check {

// `pos`: the frame's LZW minimum code size byte, its data sub-blocks after
// it; `table_entries`: the colour table the frame uses; `pixels`: the
// frame's width x height. OK when every index is below table_entries and
// the codes cover `pixels` (or more: stb ignores the rest); InvalidArgument
// naming the index or the count otherwise. Damage stb refuses itself (no
// clear code first, an illegal code, too many codes, a code size over 12)
// is left to stb: OK.
Status CheckRaster(const uint8_t* data, size_t size, size_t pos, uint32_t table_entries,
                   uint64_t pixels);

}  // namespace gridsync::gif_raster_check
