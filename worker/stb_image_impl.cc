// stb_image and stb_image_write, compiled here from Debian's headers
// (libstb-dev) instead of linked from libstb.so, so that
// - only the decoders the image task takes exist in our binaries (JPEG, PNG,
//   BMP, TGA, GIF, PNM): PSD, HDR and PIC, which stb would otherwise try on
//   any file, are not compiled in;
// - the fuzz build instruments the decoders themselves (fuzz/image_decode_fuzz.cc),
//   not only our code around them.
//
// Thread safety: stb_image's failure reason is thread-local (STBI_THREAD_LOCAL,
// C++11); the decoders keep no other state.
#define STBI_ONLY_JPEG
#define STBI_ONLY_PNG
#define STBI_ONLY_BMP
#define STBI_ONLY_TGA
#define STBI_ONLY_GIF
#define STBI_ONLY_PNM
// Zeroed allocations: stb 2.27 keeps parts it never wrote as pixels (a
// progressive JPEG's coefficients without their scan), which would
// otherwise be heap garbage, and differ between workers.
#include <cstdlib>
#define STBI_MALLOC(size) std::calloc(1, size)
#define STBI_REALLOC(p, size) std::realloc(p, size)
#define STBI_FREE(p) std::free(p)
#define STB_IMAGE_IMPLEMENTATION
#include <stb_image.h>
#define STB_IMAGE_WRITE_IMPLEMENTATION
#include <stb_image_write.h>

#include <climits>

#include "worker/stb_header_refusal.h"

namespace gridsync {

std::string StbHeaderRefusal(std::string_view format, const uint8_t* data, size_t size) {
  if (size > static_cast<size_t>(INT_MAX)) return "";
  stbi__context s;
  stbi__start_mem(&s, data, static_cast<int>(size));
  int x = 0, y = 0, comp = 0;
  int read = 1;
  stbi__g_failure_reason = "";
  if (format == "JPEG") {
    read = stbi__jpeg_info(&s, &x, &y, &comp);
  } else if (format == "PNG") {
    read = stbi__png_info(&s, &x, &y, &comp);
  } else if (format == "BMP") {
    read = stbi__bmp_info(&s, &x, &y, &comp);
  } else if (format == "GIF") {
    read = stbi__gif_info(&s, &x, &y, &comp);
  } else if (format == "TGA") {
    read = stbi__tga_info(&s, &x, &y, &comp);
  } else if (format == "PNM") {
    read = stbi__pnm_info(&s, &x, &y, &comp);
  }
  if (read != 0) return "";
  const char* why = stbi_failure_reason();
  return why != nullptr ? std::string(why) : std::string();
}

}  // namespace gridsync
