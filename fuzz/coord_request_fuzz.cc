// libFuzzer target: the control plane's decode boundary (wire::DecodeRequest
// in common/wire/coord_codec.h). Input: the frame body; padded to whole
// 8-byte words as the coordinator's framing guarantees.
#include <capnp/common.h>

#include <cstdint>
#include <cstring>
#include <vector>

#include "common/wire/coord_codec.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  std::vector<capnp::word> words((size + 7) / 8);
  if (size > 0) std::memcpy(words.data(), data, size);
  uint64_t request_id = 0;
  (void)gridsync::wire::DecodeRequest(kj::ArrayPtr<const capnp::word>(words.data(), words.size()),
                                      &request_id);
  return 0;
}
