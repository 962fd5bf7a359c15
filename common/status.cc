#include "common/status.h"

namespace gridsync {

std::string_view StatusCodeName(StatusCode code) {
  switch (code) {
    case StatusCode::kOk:
      return "OK";
    case StatusCode::kInvalidArgument:
      return "InvalidArgument";
    case StatusCode::kNotFound:
      return "NotFound";
    case StatusCode::kIOError:
      return "IOError";
    case StatusCode::kCorruption:
      return "Corruption";
    case StatusCode::kTimeout:
      return "Timeout";
    case StatusCode::kUnsupported:
      return "Unsupported";
    case StatusCode::kInternal:
      return "Internal";
    case StatusCode::kUnavailable:
      return "Unavailable";
    case StatusCode::kFailedPrecondition:
      return "FailedPrecondition";
    case StatusCode::kCheckpointsHeld:
      return "CheckpointsHeld";
  }
  return "Unknown";
}

bool IsWireStatusCode(uint32_t code) {
  return (code > static_cast<uint32_t>(StatusCode::kOk) &&
          code <= static_cast<uint32_t>(StatusCode::kInternal)) ||
         code == static_cast<uint32_t>(StatusCode::kFailedPrecondition) ||
         code == static_cast<uint32_t>(StatusCode::kCheckpointsHeld);
}

Status::Status(StatusCode code, std::string message) {
  if (code != StatusCode::kOk)
    state_ = std::make_shared<const State>(State{code, std::move(message)});
}

const std::string& Status::message() const {
  static const std::string kEmpty;
  return ok() ? kEmpty : state_->message;
}

std::string Status::ToString() const {
  if (ok()) return "OK";
  return std::string(StatusCodeName(state_->code)) + ": " + state_->message;
}

Status Status::WithContext(std::string_view context) const {
  if (ok()) return *this;
  return Status(state_->code, std::string(context) + ": " + state_->message);
}

}  // namespace gridsync
