// The Gloo backend's algorithms over sealed messages (collective_seal.h):
// what GlooCollective runs instead of Gloo's own algorithms when the group
// seals (security.curve), since those send the buffers as they are.
//
// Every message goes to the right ring neighbour and comes from the left
// one, over Gloo's unbound buffers on the connected context:
//   all-reduce:     ring reduce-scatter, then ring all-gather, in size slices;
//   reduce-scatter: ring with the caller's uneven slices (as GlooCollective's
//                   plain ring);
//   all-gather(v):  ring, each rank's block passed on size - 1 times;
//   broadcast:      a chain from the root around the ring;
//   barrier:        size - 1 rounds of a token around the ring (after them
//                   every rank has heard, through its left neighbour, from
//                   every other rank's entry).
// Every operation counts one in the group's sequence and every message of
// it has an index (its ring step), which seal it: a message opened under
// another operation, index or pair fails (Corruption, naming the sender).
// Both ends skip empty slices, since both know the counts.
//
// Errors: a peer's failure or a timeout comes as Gloo's exception (the
// caller turns it into a Status); a message that does not open is
// Corruption; a wait that Gloo aborted is IOError naming the peer. What the
// seal cannot cover is Gloo's own framing around the sealed bytes: a frame
// header changed on the way, or a stranger that took a pair's listener
// while the mesh formed and sends one, fails Gloo's checks on its loop
// thread, which ends the process (as it would a plain group's).
//
// Thread safety: not thread-safe; GlooCollective runs one operation at a
// time under its lock.
#pragma once

#include <gloo/context.h>

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "common/status.h"
#include "worker/collective/collective_seal.h"

namespace gridsync {

class SealedRing {
 public:
  using Clock = std::chrono::steady_clock;
  // c[i] = a[i] + b[i] for n elements (Gloo's reduce function shape).
  using SumFn = void (*)(void* c, const void* a, const void* b, size_t n);

  // Every wait for a message or its send ends after `wait_timeout`, as
  // Gloo's own waits do (GlooCollective's timeout).
  SealedRing(int rank, int size, std::shared_ptr<gloo::Context> context, CollectiveSeal seal,
             std::chrono::milliseconds wait_timeout);

  // `what` names the operation in errors ("AllReduceSum(1000 floats)").
  Status AllReduce(const std::string& what, void* data, size_t n, size_t element_bytes, SumFn sum);
  // out = the sum of every rank's in[offsets[rank()] .. + counts[rank()]).
  Status ReduceScatter(const std::string& what, const float* in, float* out,
                       const std::vector<size_t>& counts, const std::vector<size_t>& offsets);
  // out = every rank's block at its offset; in is this rank's.
  Status AllGatherV(const std::string& what, const float* in, const std::vector<size_t>& counts,
                    const std::vector<size_t>& offsets, float* out);
  Status Broadcast(const std::string& what, void* data, size_t bytes, int root);
  Status Barrier(const std::string& what);

 private:
  // The rank (or slice) s places around the ring from rank 0, any s.
  size_t Slice(int s) const;

  // Parts of a message, each sealed apart (the last may be shorter).
  static constexpr size_t kPartBytes = size_t{256} << 10;

  // One message out to the right neighbour (send_bytes > 0) and one in from
  // the left (recv_bytes > 0, opened into `recv`), both of message `index`
  // of the current operation, in parts of kPartBytes.
  Status Step(const std::string& what, const void* send, size_t send_bytes, void* recv,
              size_t recv_bytes, uint32_t index);

  const int rank_;
  const int size_;
  const int left_;
  const int right_;
  std::shared_ptr<gloo::Context> context_;
  const CollectiveSeal seal_;
  const std::chrono::milliseconds wait_timeout_;
  uint64_t operation_ = 0;  // operations begun: the group's sequence
  std::vector<uint8_t> sealed_out_, sealed_in_, plain_in_;
};

}  // namespace gridsync
