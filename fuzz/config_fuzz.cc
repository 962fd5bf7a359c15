// libFuzzer target: the config loader (JSON with comments, strict
// validation, the cluster layout), on the text and on one --set override.
// Input: [u8 override length][override][config text].
#include <cstdint>
#include <string>
#include <vector>

#include "common/config.h"
#include "fuzz/fuzz_input.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  gridsync::fuzz::FuzzInput in(data, size);
  const std::string override_text = in.Bytes(in.Take<uint8_t>());
  const std::string text = in.Rest();
  auto config = gridsync::Config::Parse(text, "fuzz.json");
  if (config.ok()) {
    // What check-config prints must load again.
    auto again = gridsync::Config::Parse(config->ToJson().dump(), "resolved");
    if (!again.ok()) __builtin_trap();
  }
  if (!override_text.empty()) (void)gridsync::Config::Parse(text, "fuzz.json", {override_text});
  return 0;
}
