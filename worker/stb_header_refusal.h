// Why stb_image's own decoder for a file's format refuses its header.
//
// stb_image tries every decoder it has and keeps the last one's complaint:
// a valid file of a kind a decoder does not take (an RLE BMP, a JPEG of two
// components) read as "unknown image type", and so did an invalid header (a
// PNG of colour type 5), which the image task reported alike as a truncated
// or corrupt file. Asking the one decoder that the file's signature names
// gives its reason ("BMP RLE", "bad component count", "bad ctype").
//
// Thread safety: safe from any thread (stb's failure reason is
// thread-local); reads only [data, data + size).
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

namespace gridsync {

// `format` as image_precheck::SignatureFormat names it ("JPEG", "PNG",
// "BMP", "GIF", "TGA", "PNM"). Returns that decoder's reason for refusing
// the header, or "" when it reads the header (the damage, if any, lies in
// the data) or the format is none of these. Decodes no pixels.
std::string StbHeaderRefusal(std::string_view format, const uint8_t* data, size_t size);

}  // namespace gridsync
