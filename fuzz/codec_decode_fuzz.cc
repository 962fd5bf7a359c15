// libFuzzer target: the compressed-values decode boundary (cpu::Decode) for
// every codec and option a header can name; an accepted payload must have
// written every value, finite. Input: [u8 codec][f64 ratio]
// [u8 bits][u32 block][u32 n][u64 seed] then the payload.
#include <cmath>
#include <cstdint>
#include <limits>
#include <vector>

#include "fuzz/fuzz_input.h"
#include "kernels/cpu/codec.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace gridsync;
  fuzz::FuzzInput in(data, size);
  CodecOptions options;
  options.codec = static_cast<Codec>(in.Take<uint8_t>() % 8);
  options.ratio = in.Take<double>();
  options.bits = in.Take<uint8_t>();
  options.block = in.Take<uint32_t>();
  const size_t n = in.Take<uint32_t>() % (1u << 16);
  const uint64_t seed = in.Take<uint64_t>();
  const std::string payload = in.Rest();
  // The wire validates options and the payload's size before decoding.
  if (!ValidateCodecOptions(options).ok()) return 0;
  if (!CheckPayloadSize(options, payload.size(), n).ok()) return 0;
  // NaN first: an accepted payload must have written every value, finite
  // (the shard and the worker decode into buffers they do not zero).
  std::vector<float> out(n, std::numeric_limits<float>::quiet_NaN());
  const Status status = cpu::Decode(options, reinterpret_cast<const uint8_t*>(payload.data()),
                                    payload.size(), n, seed, out.data());
  if (status.ok()) {
    for (float v : out) {
      if (!std::isfinite(v)) __builtin_trap();
    }
  }
  return 0;
}
