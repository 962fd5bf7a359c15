// The status code an error reply carries on the wire, for both protocols
// (the data plane's EncodeError, the control plane's StatusToWire).
//
// kUnavailable names a condition local to the process that hit it (a peer
// it depends on is gone) and is never sent as it is (IsWireStatusCode
// refuses it, so a peer would read Internal, which says "a bug"): it goes
// as IOError, what the requester met, a failure on the far side of a
// connection. The text still says which it was. (kCheckpointsHeld goes as
// it is: a worker whose shard refused another run's files exits 3 on it,
// as the shard does; it went as FailedPrecondition, on which a worker
// exits 5, "cannot rejoin", the wrong advice.)
//
// Thread safety: a pure function.
#pragma once

#include <cstdint>

#include "common/status.h"

namespace gridsync::wire {

inline uint32_t WireErrorCode(StatusCode code) {
  switch (code) {
    case StatusCode::kUnavailable:
      return static_cast<uint32_t>(StatusCode::kIOError);
    default:
      return static_cast<uint32_t>(code);
  }
}

}  // namespace gridsync::wire
