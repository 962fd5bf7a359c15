// What the PS client's files share (worker/ps_client*.cc): the split of a
// push's or pull's rows among shards, the error-feedback key of a table's
// column slice, and the stage timers of PsCounters. Not for use elsewhere.
//
// Thread safety: stateless functions; a ScopedSeconds belongs to its scope.
#pragma once

#include <chrono>
#include <cstdint>
#include <vector>

#include "common/sharding.h"
#include "common/wire/message.h"
#include "worker/ps_client.h"

namespace gridsync::ps_internal {

using Clock = std::chrono::steady_clock;

inline double Seconds(Clock::time_point since) {
  return std::chrono::duration<double>(Clock::now() - since).count();
}

// Adds the seconds of its life to *total: a stage timer for every exit.
class ScopedSeconds {
 public:
  explicit ScopedSeconds(double* total) : total_(total) {}
  ~ScopedSeconds() { *total_ += Seconds(start_); }
  ScopedSeconds(const ScopedSeconds&) = delete;
  ScopedSeconds& operator=(const ScopedSeconds&) = delete;

 private:
  double* total_;
  Clock::time_point start_ = Clock::now();
};

// One pass over each table deals its rows to their owners: in every column
// group, rows go to the shard Partition::Owner names; a dense table becomes a
// dense block where a shard's rows are contiguous. Refs without values (a
// pull, or values on the model's device) make blocks without values. A ref
// that offers its vectors (TableRowsRef::give_*) and goes to one shard whole
// gives them to its block instead of being copied.
std::vector<std::vector<wire::OutBlock>> SplitAll(const Partition& partition,
                                                  const std::vector<TableRowsRef>& tables,
                                                  bool with_values);

// One error-feedback key per (table, column slice): both halves whole, so
// no two slices share residuals however wide a table is.
inline uint64_t FeedbackKey(uint32_t table, uint32_t col_begin) {
  return (uint64_t{table} << 32) | col_begin;
}

}  // namespace gridsync::ps_internal
