// libFuzzer target: the coordinator's state file (server/coordinator_state.h).
// Any bytes decode or are refused without a crash, and a state that decodes
// encodes to a file that decodes to the same state (what a restart reads is
// what the coordinator wrote).
#include <cstdint>
#include <string_view>

#include "server/coordinator_state.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string_view bytes(reinterpret_cast<const char*>(data), size);
  auto state = gridsync::DecodeCoordinatorState(bytes, "fuzz.json");
  if (state.ok()) {
    auto again =
        gridsync::DecodeCoordinatorState(gridsync::EncodeCoordinatorState(*state), "again");
    if (!again.ok() || !(*again == *state)) __builtin_trap();
  }
  return 0;
}
