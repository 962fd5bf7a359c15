// The process's heap tuned for wire messages of megabytes: glibc keeps
// them in its arenas instead of mapping and unmapping each one.
//
// Why: glibc serves an allocation above its mmap threshold (128 KiB at
// first, then the size of the largest mapped block freed, until a threshold
// is set by hand) with a fresh mmap and returns it with munmap on free. A
// push or pull of a few MiB is built, handed to ZeroMQ and freed on its I/O
// thread every step, so each one took fresh zeroed pages: a page fault per
// 4 KiB, expensive under virtualisation. In `gridsync-bench pushpull` over
// 1-64 MiB (one table for all sizes; shard and client in one process, both
// tuned unless --default-heap) gridsync moved 0.34-0.54 GB/s with the defaults and
// 1.1-1.9 GB/s at sizes up to 16 MiB with the thresholds below (2026-12-03,
// 2-core EPYC VM, runs back to back).
//
// Where: gridsync-ps (and the load bench's shard), and gridsync-worker
// when it exchanges messages with shards (gradient_sync ps or hybrid,
// SyncSpec::ps_messages). In `gridsync launch configs/local.json --set
// training.steps=300` (2 workers, 2 shards, loopback; 4 alternated runs,
// 2026-12-03) the tuned worker trained 376k-388k samples/s against
// 299k-344k, its time blocked in communication 7.7-8.2 s against
// 9.1-11.9 s. The worker's tables map their own memory (common/huge_pages.h):
// taken from the heap, they had started on small pages, and the standalone
// trainer had fallen from 0.88M to 0.64M samples/s with these thresholds.
// A standalone or nccl worker keeps the defaults: it sends no such
// messages.
//
// The cost: freed message memory stays in the process (up to kTrimBytes at
// the heap's top, and what the bins hold), so the resident size follows
// the peak of messages in flight, which the shard's caps bound.
//
// Thread safety: call once, early in main, before the large allocations
// (glibc's mallopt takes its own locks; a thread already running is safe).
#pragma once

#include <cstddef>

namespace gridsync {

// Blocks up to this size come from the arenas (glibc's upper bound for a
// fixed threshold on 64-bit hosts).
constexpr size_t kMessageMmapThreshold = size_t{32} << 20;
// Free space at the heap's top kept rather than returned to the system.
constexpr size_t kTrimBytes = size_t{256} << 20;

// Sets both thresholds (glibc only; elsewhere a no-op). Returns false when
// the C library refused either: the process runs on with its defaults.
bool TuneHeapForMessages();

}  // namespace gridsync
