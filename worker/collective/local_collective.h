// LocalCollective: the in-memory twin of the collective backends. N ranks are
// threads of one process that share a hub (a mutex and a condition
// variable), so tests of the sync strategies run without sockets, with the
// same semantics as Gloo and NCCL, including timeouts and broken groups.
//
// Deterministic reduction order: every sum is evaluated in rank order,
// left to right in float arithmetic,
//     out[i] = ((in_0[i] + in_1[i]) + in_2[i]) + ... + in_{N-1}[i],
// on every rank, so results are bit-for-bit reproducible from run to run and
// identical on all ranks. (Gloo's ring and NCCL sum in their own orders;
// their results agree with this one within float rounding.)
//
// Each operation copies the caller's input into the hub, waits until every
// rank has arrived (up to the timeout), then each rank computes its own
// output from the copies. Beyond what the real backends do, the hub compares
// what the ranks called: if they disagree (different operations, sizes,
// counts or roots) every rank gets InvalidArgument naming each rank's call.
//
// Failure model (what a dead process is to Gloo):
//   - a rank that does not arrive within the timeout: the waiting ranks get
//     Timeout naming the missing ranks, and the group is broken;
//   - a LocalCollective destroyed while others still use the group, or
//     Abort(): every pending and later operation fails with that cause.
//
// Thread safety: see collective.h. Each rank's LocalCollective is meant to be
// driven by its own thread; Abort() may be called from any thread.
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "worker/collective/collective.h"

namespace gridsync {

class LocalCollective final : public Collective {
 public:
  // Creates the `size` ranks of one group; element r is rank r.
  static std::vector<std::unique_ptr<LocalCollective>> CreateGroup(
      int size, std::chrono::milliseconds timeout, std::string group = "local");
  ~LocalCollective() override;

  std::string_view name() const override { return "local"; }

  Status AllReduceSum(float* data, size_t n) override;
  Status AllReduceSumHalf(uint16_t* data, size_t n, HalfFormat format) override;
  Status ReduceScatterSum(const float* in, float* out, const std::vector<size_t>& counts) override;
  Status AllGatherV(const float* in, const std::vector<size_t>& counts, float* out) override;
  Status Broadcast(float* data, size_t n, int root) override;
  Status Barrier() override;

  // Fault injection: breaks the group, as a crashed peer would. Every
  // pending and later operation on every rank fails with `reason`.
  void Abort(const std::string& reason);

 private:
  struct Hub;   // shared by the ranks of one group (local_collective.cc)
  struct Call;  // what one rank asked for in one operation
  LocalCollective(std::shared_ptr<Hub> hub, int rank, int size, std::string group,
                  std::chrono::milliseconds timeout);
  // Arrives at the next round with `call` and a copy of `contribution`, waits
  // for everyone, then runs `compute` on the complete round.
  Status Run(const Call& call, std::vector<float> contribution,
             const std::function<void(const std::vector<std::vector<float>>&)>& compute);

  std::shared_ptr<Hub> hub_;
  uint64_t next_round_ = 0;  // this rank's count of operations issued
};

}  // namespace gridsync
