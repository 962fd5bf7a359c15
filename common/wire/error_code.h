// The status code an error reply carries on the wire, for both protocols
// (the data plane's EncodeError, the control plane's StatusToWire).
//
// Two codes name conditions local to the process that hit them and are
// never sent as they are (IsWireStatusCode refuses them, so a peer would
// read them as Internal, which says "a bug"): kUnavailable (a peer this
// process depends on is gone) goes as IOError, what the requester met is a
// failure on the far side of a connection; kCheckpointsHeld (this
// process's checkpoint files are another run's) goes as
// FailedPrecondition, the state the request needs is gone for good and a
// retry gets the same. The text still says which it was.
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
    case StatusCode::kCheckpointsHeld:
      return static_cast<uint32_t>(StatusCode::kFailedPrecondition);
    default:
      return static_cast<uint32_t>(code);
  }
}

}  // namespace gridsync::wire
