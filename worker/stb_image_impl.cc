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
