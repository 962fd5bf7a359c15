// RaiseOpenFileLimit (file_limit.h).
//
// Thread safety: see file_limit.h.
#include "common/file_limit.h"

#include <spdlog/spdlog.h>
#include <sys/resource.h>

#include <algorithm>

namespace gridsync {
namespace {

uint64_t Value(rlim_t v) { return v == RLIM_INFINITY ? UINT64_MAX : static_cast<uint64_t>(v); }

}  // namespace

FileLimit RaiseOpenFileLimit(uint64_t want) {
  FileLimit out;
  rlimit limit{};
  if (getrlimit(RLIMIT_NOFILE, &limit) != 0) return out;
  out.before = out.after = Value(limit.rlim_cur);
  out.hard = Value(limit.rlim_max);
  const uint64_t target = want == 0 ? out.hard : std::min(want, out.hard);
  if (target <= out.before) return out;
  rlimit raised = limit;
  raised.rlim_cur = target == UINT64_MAX ? RLIM_INFINITY : static_cast<rlim_t>(target);
  if (setrlimit(RLIMIT_NOFILE, &raised) == 0) out.after = target;
  return out;
}

void RaiseOpenFileLimitForServing() {
  if (const FileLimit files = RaiseOpenFileLimit(); files.raised())
    spdlog::info("open files: soft limit raised from {} to {}", files.before, files.after);
}

}  // namespace gridsync
