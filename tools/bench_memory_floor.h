// The memory floor of a push + pull iteration, for gridsync-bench pushpull:
// the least work on memory any PS design with fp32 Adam must do for it, run
// as fast as this host runs it.
//
// Whatever the wire, the shard must read each pushed row's gradient and
// read and write that row's parameters and both Adam moments (fp32, laid
// out by row id), then read the pulled rows' parameters into the reply; the
// worker must write the pulled rows into its table. The floor does exactly
// that and nothing else: no sockets, no decoding or checks, no step counts
// or bias correction, one add or multiply-add per value, every index split
// over `threads` threads of a pool of its own, and the arrays warm in the
// caches from the iteration before (the real iteration has the sockets'
// buffers between its phases, so it can only find less in them). A design
// can overlap these phases with the sockets but cannot make them shorter
// than this on these cores and this memory: zmq_p50 / floor bounds the
// ratio to raw ZeroMQ any design reaches (at the same row stride, where a
// 64-byte line holds rows that are not pushed).
//
// Thread safety: MeasureMemoryFloor is reentrant but uses `threads`
// threads; run it with the host otherwise quiet.
#pragma once

#include <cstdint>

namespace gridsync::bench {

struct MemoryFloor {
  double apply_us = 0;    // median: gradient read, parameters and moments read and written
  double gather_us = 0;   // median: the pulled rows' parameters into a packed reply
  double scatter_us = 0;  // median: the packed reply into the worker's table
  double total_us = 0;    // median of the three together, per iteration
};

// Rows base + stride * i for i < n of tables `width` floats wide, `iters`
// timed iterations after one untimed. n, stride, width, threads, iters >= 1.
MemoryFloor MeasureMemoryFloor(uint32_t n, uint32_t stride, uint32_t width, int threads, int iters);

}  // namespace gridsync::bench
