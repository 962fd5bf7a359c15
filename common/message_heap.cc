#include "common/message_heap.h"

#if defined(__GLIBC__)
#include <malloc.h>
#endif

namespace gridsync {

bool TuneHeapForMessages() {
#if defined(__GLIBC__)
  // Setting either stops glibc's dynamic threshold; both are set.
  const bool mmap_set = mallopt(M_MMAP_THRESHOLD, static_cast<int>(kMessageMmapThreshold)) == 1;
  const bool trim_set = mallopt(M_TRIM_THRESHOLD, static_cast<int>(kTrimBytes)) == 1;
  return mmap_set && trim_set;
#else
  return true;
#endif
}

}  // namespace gridsync
