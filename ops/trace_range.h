// An NVTX range around a phase (the seed's Nsight Systems workflow: `nsys
// profile` shows the training loop's prepare/compute/apply per step). NVTX
// is header-only (CUDA's nvtx3); builds without CUDA get an empty range.
//
// Thread safety: ranges nest per thread, as NVTX's do.
#pragma once

#if defined(GRIDSYNC_HAVE_NVTX) && GRIDSYNC_HAVE_NVTX
#include <nvtx3/nvToolsExt.h>
#endif

namespace gridsync {

class TraceRange {
 public:
#if defined(GRIDSYNC_HAVE_NVTX) && GRIDSYNC_HAVE_NVTX
  explicit TraceRange(const char* name) { nvtxRangePushA(name); }
  ~TraceRange() { nvtxRangePop(); }
#else
  explicit TraceRange(const char* /*name*/) {}
#endif
  TraceRange(const TraceRange&) = delete;
  TraceRange& operator=(const TraceRange&) = delete;
};

}  // namespace gridsync
