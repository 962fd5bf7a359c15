// What this machine can still give a process: the kernel's MemAvailable
// (/proc/meminfo). Checks that refuse a run before it allocates compare
// their estimates with it.
//
// Thread safety: reads a file; safe from any thread.
#pragma once

#include <cstdint>

namespace gridsync {

// Bytes of MemAvailable, or 0 when it cannot be read (then no check refuses).
uint64_t AvailableMemoryBytes();

}  // namespace gridsync
