#include "worker/collective/local_collective.h"

#include <spdlog/fmt/fmt.h>

#include <algorithm>
#include <condition_variable>
#include <cstring>
#include <map>
#include <mutex>
#include <optional>
#include <utility>

#include "common/check.h"
#include "worker/collective/half_format.h"

namespace gridsync {

enum class LocalOp {
  kAllReduceSum,
  kAllReduceSumHalf,
  kReduceScatterSum,
  kAllGatherV,
  kBroadcast,
  kBarrier
};

// What one rank asked for in one round; the ranks must agree on it.
struct LocalCollective::Call {
  LocalOp op = LocalOp::kBarrier;
  size_t n = 0;                // AllReduceSum(Half), Broadcast
  int format = -1;             // AllReduceSumHalf: the HalfFormat
  std::vector<size_t> counts;  // ReduceScatterSum, AllGatherV
  int root = -1;               // Broadcast

  bool operator==(const Call&) const = default;

  std::string ToString() const {
    auto join = [](const std::vector<size_t>& v) {
      std::string out;
      for (size_t x : v) {
        if (!out.empty()) out += ',';
        out += std::to_string(x);
      }
      return out;
    };
    switch (op) {
      case LocalOp::kAllReduceSum:
        return fmt::format("AllReduceSum({} floats)", n);
      case LocalOp::kAllReduceSumHalf:
        return fmt::format("AllReduceSumHalf({} {} values)", n,
                           gridsync::ToString(static_cast<HalfFormat>(format)));
      case LocalOp::kReduceScatterSum:
        return fmt::format("ReduceScatterSum(counts [{}])", join(counts));
      case LocalOp::kAllGatherV:
        return fmt::format("AllGatherV(counts [{}])", join(counts));
      case LocalOp::kBroadcast:
        return fmt::format("Broadcast({} floats, root {})", n, root);
      case LocalOp::kBarrier:
        return "Barrier";
    }
    return "?";
  }
};

struct LocalCollective::Hub {
  explicit Hub(int n) : size(n) {}

  // One collective operation: the i-th call of every rank.
  struct Round {
    std::vector<std::optional<Call>> calls;  // by rank; set on arrival
    std::vector<std::vector<float>> data;    // by rank: the copied input
    int arrived = 0;
    int departed = 0;
  };

  const int size;
  std::mutex mu;
  std::condition_variable changed;
  // Rounds in progress, by operation index. std::map keeps references to a
  // Round valid while other rounds are added or erased.
  std::map<uint64_t, Round> rounds;  // guarded by mu
  Status broken;                     // guarded by mu; non-OK once the group failed
};

std::vector<std::unique_ptr<LocalCollective>> LocalCollective::CreateGroup(int size,
                                                                           std::chrono::milliseconds timeout,
                                                                           std::string group) {
  GRIDSYNC_CHECK_GT(size, 0);
  auto hub = std::make_shared<Hub>(size);
  std::vector<std::unique_ptr<LocalCollective>> ranks;
  ranks.reserve(static_cast<size_t>(size));
  for (int r = 0; r < size; ++r) {
    ranks.emplace_back(new LocalCollective(hub, r, size, group, timeout));
  }
  return ranks;
}

LocalCollective::LocalCollective(std::shared_ptr<Hub> hub, int rank, int size, std::string group,
                                 std::chrono::milliseconds timeout)
    : Collective(rank, size, std::move(group), timeout), hub_(std::move(hub)) {}

LocalCollective::~LocalCollective() {
  // A rank that goes away breaks the group for anyone still using it, as a
  // closed process does for Gloo. After a clean finish nobody notices.
  if (hub_->size > 1) {
    Abort(fmt::format("rank {} left group '{}' (its LocalCollective was destroyed)", rank(), group()));
  }
}

void LocalCollective::Abort(const std::string& reason) {
  {
    std::lock_guard<std::mutex> lock(hub_->mu);
    if (hub_->broken.ok()) hub_->broken = Status::IOError(reason);
  }
  hub_->changed.notify_all();
}

Status LocalCollective::Run(const Call& call, std::vector<float> contribution,
                            const std::function<void(const std::vector<std::vector<float>>&)>& compute) {
  Hub& hub = *hub_;
  const int n_ranks = size();
  std::unique_lock<std::mutex> lock(hub.mu);
  if (!hub.broken.ok()) {
    return Status(hub.broken.code(),
                  fmt::format("{}: the group is broken by an earlier failure: {}", Describe(call.ToString()),
                              hub.broken.message()));
  }
  const uint64_t id = next_round_++;
  Hub::Round& round = hub.rounds[id];
  if (round.calls.empty()) {
    round.calls.resize(static_cast<size_t>(n_ranks));
    round.data.resize(static_cast<size_t>(n_ranks));
  }
  round.calls[static_cast<size_t>(rank())] = call;
  round.data[static_cast<size_t>(rank())] = std::move(contribution);
  ++round.arrived;
  hub.changed.notify_all();

  const auto deadline = std::chrono::steady_clock::now() + timeout();
  hub.changed.wait_until(lock, deadline, [&] { return round.arrived == n_ranks || !hub.broken.ok(); });
  if (round.arrived != n_ranks) {
    // The round stays in the map: ranks still waiting in it hold references.
    // The broken hub keeps anyone from joining it later.
    if (!hub.broken.ok()) {
      return Status(hub.broken.code(),
                    fmt::format("{}: failed while waiting for peers: {}", Describe(call.ToString()),
                                hub.broken.message()));
    }
    std::vector<int> missing;
    std::vector<int> arrived;
    for (int r = 0; r < n_ranks; ++r) {
      (round.calls[static_cast<size_t>(r)].has_value() ? arrived : missing).push_back(r);
    }
    Status status = Status::Timeout(fmt::format("{}: timed out after {}; missing ranks: {} (arrived: {})",
                                                Describe(call.ToString()), FormatSeconds(timeout()),
                                                FormatRanks(missing), FormatRanks(arrived)));
    hub.broken = Status::Timeout(fmt::format("rank {} timed out in operation #{} ({}); missing ranks: {}", rank(),
                                             id, call.ToString(), FormatRanks(missing)));
    hub.changed.notify_all();
    return status;
  }

  // Every rank arrived: they must have asked for the same thing.
  Status status;
  bool agree = true;
  for (const auto& other : round.calls) agree = agree && (*other == *round.calls[0]);
  if (!agree) {
    std::string calls;
    std::vector<bool> listed(static_cast<size_t>(n_ranks), false);
    for (int r = 0; r < n_ranks; ++r) {
      if (listed[static_cast<size_t>(r)]) continue;
      std::vector<int> same;
      for (int q = r; q < n_ranks; ++q) {
        if (*round.calls[static_cast<size_t>(q)] == *round.calls[static_cast<size_t>(r)]) {
          same.push_back(q);
          listed[static_cast<size_t>(q)] = true;
        }
      }
      calls += fmt::format("{}{} {} called {}", calls.empty() ? "" : "; ", same.size() == 1 ? "rank" : "ranks",
                           FormatRanks(same), round.calls[static_cast<size_t>(r)]->ToString());
    }
    status = Status::InvalidArgument(fmt::format("{}: the ranks disagree on operation #{}: {}",
                                                 Describe(call.ToString()), id, calls));
  }

  // The copies are not modified again until the last rank departs, so every
  // rank reads them without the lock.
  lock.unlock();
  if (status.ok()) compute(round.data);
  lock.lock();
  if (++round.departed == n_ranks) hub.rounds.erase(id);
  return status;
}

Status LocalCollective::AllReduceSum(float* data, size_t n) {
  GRIDSYNC_RETURN_IF_ERROR(CheckBuffer("AllReduceSum", data, n));
  Call call{LocalOp::kAllReduceSum, n, -1, {}, -1};
  return Run(call, std::vector<float>(data, data + n), [&](const std::vector<std::vector<float>>& in) {
    // Rank order, left to right (see the header).
    std::copy(in[0].begin(), in[0].end(), data);
    for (size_t r = 1; r < in.size(); ++r) {
      const float* src = in[r].data();
      for (size_t i = 0; i < n; ++i) data[i] += src[i];
    }
  });
}

Status LocalCollective::AllReduceSumHalf(uint16_t* data, size_t n, HalfFormat format) {
  GRIDSYNC_RETURN_IF_ERROR(CheckBuffer("AllReduceSumHalf", data, n));
  Call call{LocalOp::kAllReduceSumHalf, n, static_cast<int>(format), {}, -1};
  // The hub carries floats: every 16-bit value converts to one exactly.
  std::vector<float> mine(n);
  for (size_t i = 0; i < n; ++i) mine[i] = HalfToFloat(format, data[i]);
  return Run(call, std::move(mine), [&](const std::vector<std::vector<float>>& in) {
    // Rank order, left to right, each partial sum rounded to the format.
    for (size_t i = 0; i < n; ++i) {
      uint16_t acc = FloatToHalf(format, in[0][i]);
      for (size_t r = 1; r < in.size(); ++r)
        acc = FloatToHalf(format, HalfToFloat(format, acc) + in[r][i]);
      data[i] = acc;
    }
  });
}

Status LocalCollective::ReduceScatterSum(const float* in, float* out, const std::vector<size_t>& counts) {
  GRIDSYNC_RETURN_IF_ERROR(CheckCounts("ReduceScatterSum", counts));
  const auto offsets = CollectiveOffsets(counts);
  const size_t mine = counts[static_cast<size_t>(rank())];
  GRIDSYNC_RETURN_IF_ERROR(CheckBuffer("ReduceScatterSum", in, offsets.back()));
  GRIDSYNC_RETURN_IF_ERROR(CheckBuffer("ReduceScatterSum", out, mine));
  Call call{LocalOp::kReduceScatterSum, 0, -1, counts, -1};
  return Run(call, std::vector<float>(in, in + offsets.back()), [&](const std::vector<std::vector<float>>& all) {
    const size_t begin = offsets[static_cast<size_t>(rank())];
    std::copy(all[0].begin() + static_cast<std::ptrdiff_t>(begin),
              all[0].begin() + static_cast<std::ptrdiff_t>(begin + mine), out);
    for (size_t r = 1; r < all.size(); ++r) {
      const float* src = all[r].data() + begin;
      for (size_t i = 0; i < mine; ++i) out[i] += src[i];
    }
  });
}

Status LocalCollective::AllGatherV(const float* in, const std::vector<size_t>& counts, float* out) {
  GRIDSYNC_RETURN_IF_ERROR(CheckCounts("AllGatherV", counts));
  const auto offsets = CollectiveOffsets(counts);
  const size_t mine = counts[static_cast<size_t>(rank())];
  GRIDSYNC_RETURN_IF_ERROR(CheckBuffer("AllGatherV", in, mine));
  GRIDSYNC_RETURN_IF_ERROR(CheckBuffer("AllGatherV", out, offsets.back()));
  Call call{LocalOp::kAllGatherV, 0, -1, counts, -1};
  return Run(call, std::vector<float>(in, in + mine), [&](const std::vector<std::vector<float>>& all) {
    for (size_t r = 0; r < all.size(); ++r) {
      if (!all[r].empty()) std::memcpy(out + offsets[r], all[r].data(), all[r].size() * sizeof(float));
    }
  });
}

Status LocalCollective::Broadcast(float* data, size_t n, int root) {
  GRIDSYNC_RETURN_IF_ERROR(CheckRoot("Broadcast", root));
  GRIDSYNC_RETURN_IF_ERROR(CheckBuffer("Broadcast", data, n));
  Call call{LocalOp::kBroadcast, n, -1, {}, root};
  std::vector<float> contribution;
  if (rank() == root) contribution.assign(data, data + n);
  return Run(call, std::move(contribution), [&](const std::vector<std::vector<float>>& all) {
    if (rank() != root && n > 0) std::memcpy(data, all[static_cast<size_t>(root)].data(), n * sizeof(float));
  });
}

Status LocalCollective::Barrier() {
  return Run(Call{}, {}, [](const std::vector<std::vector<float>>&) {});
}

}  // namespace gridsync
