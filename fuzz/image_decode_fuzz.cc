// libFuzzer target: the image decode boundary (ImageTask::Decode), with
// stb_image's JPEG, PNG, BMP, TGA, GIF and PNM decoders compiled in and
// instrumented. Input: the file's bytes.
//
// A success must be an image Decode allows (sides > 0, at most kMaxPixels,
// 3 bytes a pixel, channels in [0, 1]); a refusal must say what is allowed.
//
// Memory: a header of a few bytes can claim up to kMaxPixels (2^28)
// pixels, which Decode accepts, and stb then decodes them (JPEG, BMP and TGA
// decode zeros past the end of the data; GIF clears 9 bytes a pixel before
// reading anything): measured in a release build, up to 3.0 GiB at the peak
// for a 35-byte GIF and 3.75 GiB for a 359-byte progressive CMYK JPEG, and
// seconds of decoding; over libFuzzer's -rss_limit_mb=2048 and -timeout on
// every such input, which would keep the fuzzer from anything else. So an
// input whose header (stbi_info_from_memory, the call Decode makes first)
// claims more than GRIDSYNC_IMAGE_FUZZ_MAX_PIXELS pixels (default 2^22)
// but no more than Decode allows is not decoded here. Headers over Decode's
// bounds, and headers stb cannot read, still go to Decode, which refuses
// them before decoding. Set GRIDSYNC_IMAGE_FUZZ_MAX_PIXELS=268435456 to
// decode every input as the product does (e.g. to run one reproducer).
//
#include <stb_image.h>

#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <string>

#include "worker/image_precheck.h"
#include "worker/image_task.h"

namespace {

uint64_t MaxDecodedPixels() {
  static const uint64_t max = [] {
    const char* env = std::getenv("GRIDSYNC_IMAGE_FUZZ_MAX_PIXELS");
    return env != nullptr && *env != '\0' ? std::strtoull(env, nullptr, 10) : uint64_t{1} << 22;
  }();
  return max;
}

// Whether the header claims an image Decode would accept but too large to
// decode here.
bool TooLargeToFuzz(const uint8_t* data, size_t size) {
  if (size > gridsync::ImageTask::kMaxFileBytes) return false;
  // Decode checks the structure before stb reads the header (stb's own
  // header parsers have the defects image_precheck.h lists): so here too.
  if (!gridsync::image_precheck::CheckStructure(data, size).ok()) return false;
  int w = 0, h = 0, channels = 0;
  if (stbi_info_from_memory(data, static_cast<int>(size), &w, &h, &channels) == 0) return false;
  if (w <= 0 || h <= 0) return false;
  const uint64_t pixels = uint64_t(w) * uint64_t(h);
  using gridsync::ImageTask;
  if (uint64_t(w) > ImageTask::kMaxSide || uint64_t(h) > ImageTask::kMaxSide ||
      pixels > ImageTask::kMaxPixels)
    return false;  // Decode refuses it from the header
  return pixels > MaxDecodedPixels();
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using gridsync::ImageTask;
  if (TooLargeToFuzz(data, size)) return 0;
  auto image = ImageTask::Decode(data, size, "fuzz.img");
  if (!image.ok()) {
    const std::string& message = image.status().message();
    if (message.empty() || message.find("allowed:") == std::string::npos) __builtin_trap();
    return 0;
  }
  const ImageTask& task = image.value();
  if (task.width() <= 0 || task.height() <= 0) __builtin_trap();
  if (uint64_t(task.width()) > ImageTask::kMaxSide || uint64_t(task.height()) > ImageTask::kMaxSide)
    __builtin_trap();
  const uint64_t pixels = task.pixel_count();
  if (pixels > ImageTask::kMaxPixels) __builtin_trap();
  if (task.memory_bytes() != pixels * 3) __builtin_trap();
  const size_t channels = pixels * 3;
  const size_t probes[] = {0, 1, 2, channels / 2, channels - 3, channels - 1};
  for (size_t i : probes) {
    const float c = task.Channel(i);
    if (!(c >= 0.0f && c <= 1.0f)) __builtin_trap();
  }
  // The trainer's lookups at two corners and the centre (bilinear: within
  // the channels' range, up to rounding).
  for (float uv : {0.0f, 0.5f, 0.999999f}) {
    float rgb[3];
    task.Target(uv, uv, rgb);
    for (float c : rgb) {
      if (!(c >= -1e-6f && c <= 1.0f + 1e-6f)) __builtin_trap();
    }
  }
  return 0;
}
