// Status and Result<T>: the error type of every network, I/O and config path.
//
// Modelled on LevelDB's Status: an OK status holds no allocation, an error
// holds a code and a message that names what is wrong and what is allowed.
// Bugs are not Statuses; they use the GRIDSYNC_CHECK macros in check.h.
//
// Thread safety: Status and Result are values. Distinct objects may be used
// from different threads freely; one object needs external synchronization.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <variant>

namespace gridsync {

enum class StatusCode : int {
  kOk = 0,
  kInvalidArgument = 1,  // bad config, bad CLI value, bad request field
  kNotFound = 2,
  kIOError = 3,
  kCorruption = 4,  // bytes that do not decode
  kTimeout = 5,
  kUnsupported = 6,  // accepted by the schema, not implemented yet
  kInternal = 7,
  // A peer the process depends on is gone (its coordinator). Never sent on
  // the wire (the decoders read codes above kInternal as Internal).
  kUnavailable = 8,
  // The request is well formed but the state it needs is gone for good: a
  // process that joins a job whose training started, with no complete
  // checkpoint to rejoin from. Sent on the wire; a retry gets the same.
  kFailedPrecondition = 9,
  // Checkpoint files on disk are another run's than the one starting: a
  // fresh start would delete them, or a step's parts are two runs'. Nothing
  // a restart mends (the processes exit kCheckpointsHeldExitCode). Sent on
  // the wire too (a shard whose rollback met them answers with it), so
  // that a worker exits 3 on it as the shard does.
  kCheckpointsHeld = 10,
};

// Whether a peer may send `code` in an error reply: every code but OK and
// kUnavailable, which names a local condition (common/wire/error_code.h
// sends it as IOError). The decoders read the others as kInternal (a newer
// build's code, or a hostile one).
bool IsWireStatusCode(uint32_t code);

std::string_view StatusCodeName(StatusCode code);

class Status {
 public:
  Status() = default;  // OK
  Status(StatusCode code, std::string message);

  static Status OK() { return Status(); }
  static Status InvalidArgument(std::string msg) {
    return {StatusCode::kInvalidArgument, std::move(msg)};
  }
  static Status NotFound(std::string msg) { return {StatusCode::kNotFound, std::move(msg)}; }
  static Status IOError(std::string msg) { return {StatusCode::kIOError, std::move(msg)}; }
  static Status Corruption(std::string msg) { return {StatusCode::kCorruption, std::move(msg)}; }
  static Status Timeout(std::string msg) { return {StatusCode::kTimeout, std::move(msg)}; }
  static Status Unsupported(std::string msg) { return {StatusCode::kUnsupported, std::move(msg)}; }
  static Status Internal(std::string msg) { return {StatusCode::kInternal, std::move(msg)}; }
  static Status CheckpointsHeld(std::string msg) {
    return {StatusCode::kCheckpointsHeld, std::move(msg)};
  }
  static Status Unavailable(std::string msg) { return {StatusCode::kUnavailable, std::move(msg)}; }
  static Status FailedPrecondition(std::string msg) {
    return {StatusCode::kFailedPrecondition, std::move(msg)};
  }

  bool ok() const { return state_ == nullptr; }
  StatusCode code() const { return ok() ? StatusCode::kOk : state_->code; }
  const std::string& message() const;
  std::string ToString() const;

  // Prefixes the message with context ("loading configs/local.json: ...").
  Status WithContext(std::string_view context) const;

 private:
  struct State {
    StatusCode code;
    std::string message;
  };
  std::shared_ptr<const State> state_;  // null means OK
};

// Result<T>: a T or a non-OK Status.
template <typename T>
class Result {
 public:
  Result(T value) : value_(std::move(value)) {}          // NOLINT: implicit by design
  Result(Status status) : status_(std::move(status)) {}  // NOLINT: implicit by design

  bool ok() const { return value_.has_value(); }
  const Status& status() const { return status_; }
  T& value() & { return *value_; }
  const T& value() const& { return *value_; }
  T&& value() && { return std::move(*value_); }
  T* operator->() { return &*value_; }
  const T* operator->() const { return &*value_; }
  T& operator*() { return *value_; }
  const T& operator*() const { return *value_; }

 private:
  std::optional<T> value_;
  Status status_;
};

}  // namespace gridsync

#define GRIDSYNC_CONCAT_INNER(a, b) a##b
#define GRIDSYNC_CONCAT(a, b) GRIDSYNC_CONCAT_INNER(a, b)

// Returns from the enclosing function when `expr` yields a non-OK Status.
#define GRIDSYNC_RETURN_IF_ERROR(expr)                   \
  do {                                                   \
    ::gridsync::Status gridsync_status_ = (expr);        \
    if (!gridsync_status_.ok()) return gridsync_status_; \
  } while (0)

// `GRIDSYNC_ASSIGN_OR_RETURN(auto x, MakeX());`
#define GRIDSYNC_ASSIGN_OR_RETURN(lhs, expr) \
  GRIDSYNC_ASSIGN_OR_RETURN_IMPL(GRIDSYNC_CONCAT(gridsync_result_, __LINE__), lhs, expr)
#define GRIDSYNC_ASSIGN_OR_RETURN_IMPL(tmp, lhs, expr) \
  auto tmp = (expr);                                   \
  if (!tmp.ok()) return tmp.status();                  \
  lhs = std::move(tmp).value()
