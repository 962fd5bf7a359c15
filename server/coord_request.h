// The control plane's decode boundary: one flat Cap'n Proto CoordRequest
// (common/wire/gridsync.capnp) turned into plain C++ values. Every Cap'n
// Proto exception (bad segment table, pointer out of bounds, traversal or
// nesting limit) becomes a Corruption Status naming what is allowed; the
// coordinator's handlers see validated values only. Fuzzed by
// fuzz/coord_request_fuzz.cc.
//
// Thread safety: a pure function.
#pragma once

#include <capnp/common.h>
#include <kj/common.h>

#include <cstdint>
#include <string>
#include <variant>
#include <vector>

#include "common/cluster_map.h"
#include "common/status.h"

namespace gridsync {

struct GetMapRequest {
  bool wait_complete = false;
  uint32_t timeout_ms = 0;
};
struct BarrierRequest {
  std::string name;
  uint32_t count = 0;
  uint32_t timeout_ms = 0;
  std::string member;
};
struct KvSetRequest {
  std::string key;
  std::string value;
};
struct KvGetRequest {
  std::vector<std::string> keys;
  uint32_t timeout_ms = 0;
};
struct HeartbeatRequest {};
struct AuthHelloRequest {};
struct AuthRequest {
  Role role = Role::kWorker;
  std::string nonce;
  std::string box;
};

struct Request {
  uint64_t id = 0;
  std::variant<RegisterInfo, GetMapRequest, BarrierRequest, KvSetRequest, KvGetRequest,
               HeartbeatRequest, AuthHelloRequest, AuthRequest>
      body;
};

// Decodes one frame (whole 8-byte words). Never throws. `request_id` is set
// as soon as it can be read, so that even a refusal can echo it.
Result<Request> DecodeRequest(kj::ArrayPtr<const capnp::word> words, uint64_t* request_id);

}  // namespace gridsync
