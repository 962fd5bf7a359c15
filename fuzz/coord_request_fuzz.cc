// libFuzzer target: the control plane's decode boundary (DecodeRequest).
// Input: the frame body; padded to whole 8-byte words as the coordinator's
// framing guarantees.
#include <capnp/common.h>

#include <cstdint>
#include <cstring>
#include <vector>

#include "server/coord_request.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  std::vector<capnp::word> words((size + 7) / 8);
  if (size > 0) std::memcpy(words.data(), data, size);
  uint64_t request_id = 0;
  (void)gridsync::DecodeRequest(kj::ArrayPtr<const capnp::word>(words.data(), words.size()),
                                &request_id);
  return 0;
}
