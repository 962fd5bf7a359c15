// Debian's libgloo-dev lacks gloo/common/memory.h, which gloo/transport/tcp/
// {pair,context,unbound_buffer}.h include; only headers that compile without
// it are used here: the TCP device, rendezvous and the algorithm headers.
#include "worker/collective/gloo_collective.h"

#include <gloo/allgatherv.h>
#include <gloo/allreduce.h>
#include <gloo/barrier.h>
#include <gloo/broadcast.h>
#include <gloo/common/error.h>
#include <gloo/common/logging.h>
#include <gloo/math.h>
#include <gloo/rendezvous/context.h>
#include <gloo/rendezvous/store.h>
#include <gloo/transport/tcp/device.h>
#include <gloo/transport/unbound_buffer.h>
#include <gloo/types.h>
#include <spdlog/fmt/fmt.h>

#include <algorithm>
#include <condition_variable>
#include <csignal>
#include <cstring>
#include <exception>
#include <mutex>
#include <set>
#include <string_view>
#include <thread>
#include <utility>

#include "worker/collective/gloo_internal.h"
#include "worker/collective/half_format.h"
#include "worker/collective/sealed_ring.h"

namespace gridsync {
namespace {

using Clock = std::chrono::steady_clock;

// Slot prefix of our ring reduce-scatter; Gloo's own collectives use
// 0x01..0x08 (gloo/types.h).
constexpr uint8_t kReduceScatterSlotPrefix = 0x40;

// Gloo reports failures as exceptions; this turns the one in flight into a
// Status. A wait that timed out says "Timed out"; anything else from the
// transport (connection reset or closed by a peer, a pair closed because
// another operation timed out) is an I/O error.
Status StatusFromCurrentException(const std::string& what) {
  try {
    throw;
  } catch (const gloo::IoException& e) {
    const std::string_view message = e.what();
    if (message.find("Timed out") != std::string_view::npos ||
        message.find("timed out") != std::string_view::npos) {
      return Status::Timeout(fmt::format("{}: {}", what, message));
    }
    return Status::IOError(fmt::format("{}: {}", what, message));
  } catch (const gloo::EnforceNotMet& e) {
    return Status::Internal(fmt::format("{}: Gloo check failed: {}", what, e.what()));
  } catch (const gloo::Exception& e) {
    return Status::IOError(fmt::format("{}: {}", what, e.what()));
  } catch (const std::exception& e) {
    return Status::Internal(fmt::format("{}: {}", what, e.what()));
  } catch (...) {
    return Status::Internal(fmt::format("{}: unknown exception from Gloo", what));
  }
}

void SumFloats(void* c, const void* a, const void* b, size_t n) { gloo::sum<float>(c, a, b, n); }

// Gloo's reduce functions take a plain function pointer, one per format.
template <HalfFormat kFormat>
void SumHalfValues(void* c, const void* a, const void* b, size_t n) {
  SumHalves(kFormat, static_cast<uint16_t*>(c), static_cast<const uint16_t*>(a),
            static_cast<const uint16_t*>(b), n);
}

class GlooCollective final : public Collective {
 public:
  GlooCollective(int rank, int size, std::string group, std::chrono::milliseconds timeout,
                 std::shared_ptr<gloo::Context> context, const CollectiveSeal* seal)
      : Collective(rank, size, std::move(group), timeout), context_(std::move(context)) {
    if (seal != nullptr)
      sealed_ = std::make_unique<SealedRing>(rank, size, context_, *seal, this->timeout());
  }

  std::string_view name() const override { return "gloo"; }

  Status AllReduceSum(float* data, size_t n) override {
    const std::string op = fmt::format("AllReduceSum({} floats)", n);
    GRIDSYNC_RETURN_IF_ERROR(CheckBuffer(op, data, n));
    return Guarded(op, Ring(), [&] {
      if (n == 0 || size() == 1) return Status::OK();
      return AllReduceLocked(op, data, n);
    });
  }

  Status AllReduceSumHalf(uint16_t* data, size_t n, HalfFormat format) override {
    const std::string op = fmt::format("AllReduceSumHalf({} {} values)", n, ToString(format));
    GRIDSYNC_RETURN_IF_ERROR(CheckBuffer(op, data, n));
    return Guarded(op, Ring(), [&] {
      if (n == 0 || size() == 1) return Status::OK();
      const auto sum = format == HalfFormat::kFp16 ? &SumHalfValues<HalfFormat::kFp16>
                                                   : &SumHalfValues<HalfFormat::kBf16>;
      if (sealed_) return sealed_->AllReduce(Describe(op), data, n, sizeof(uint16_t), sum);
      gloo::AllreduceOptions opts(context_);
      opts.setOutput(data, n);  // 2-byte elements: the ring moves half the bytes
      opts.setAlgorithm(gloo::AllreduceOptions::Algorithm::RING);
      opts.setReduceFunction(sum);
      opts.setTimeout(timeout());
      gloo::allreduce(opts);
      return Status::OK();
    });
  }

  Status AllReduceSumGroup(std::span<const std::span<float>> buffers) override {
    size_t total = 0;
    for (const auto& buffer : buffers) total += buffer.size();
    const std::string op =
        fmt::format("AllReduceSumGroup({} buffers, {} floats)", buffers.size(), total);
    for (const auto& buffer : buffers)
      GRIDSYNC_RETURN_IF_ERROR(CheckBuffer(op, buffer.data(), buffer.size()));
    return Guarded(op, Ring(), [&] {
      if (total == 0 || size() == 1) return Status::OK();
      // One packed all-reduce: one ring pass instead of one per buffer.
      scratch_.resize(total);
      size_t at = 0;
      for (const auto& buffer : buffers) {
        std::copy(buffer.begin(), buffer.end(), scratch_.begin() + static_cast<std::ptrdiff_t>(at));
        at += buffer.size();
      }
      GRIDSYNC_RETURN_IF_ERROR(AllReduceLocked(op, scratch_.data(), total));
      at = 0;
      for (const auto& buffer : buffers) {
        std::copy_n(scratch_.begin() + static_cast<std::ptrdiff_t>(at), buffer.size(),
                    buffer.begin());
        at += buffer.size();
      }
      return Status::OK();
    });
  }

  Status ReduceScatterSum(const float* in, float* out, const std::vector<size_t>& counts) override {
    const std::string op = "ReduceScatterSum";
    GRIDSYNC_ASSIGN_OR_RETURN(const auto offsets, CheckSliced(op, counts, in, out));
    const auto me = static_cast<size_t>(rank());
    const std::string described =
        fmt::format("ReduceScatterSum({} floats, {} to this rank)", offsets.back(), counts[me]);
    return Guarded(described, Ring(), [&] {
      if (size() == 1 || offsets.back() == 0) {
        if (counts[me] > 0) std::memcpy(out, in, counts[me] * sizeof(float));
        return Status::OK();
      }
      if (sealed_) {
        return sealed_->ReduceScatter(Describe(described), in, out, counts, offsets);
      }
      return RingReduceScatterLocked(described, in, out, counts, offsets);
    });
  }

  Status AllGatherV(const float* in, const std::vector<size_t>& counts, float* out) override {
    const std::string op = "AllGatherV";
    GRIDSYNC_ASSIGN_OR_RETURN(const auto offsets, CheckSliced(op, counts, out, in));
    const auto me = static_cast<size_t>(rank());
    const std::string described =
        fmt::format("AllGatherV({} floats, {} from this rank)", offsets.back(), counts[me]);
    return Guarded(described, Ring(), [&] {
      if (size() == 1 || offsets.back() == 0) {
        if (counts[me] > 0) std::memcpy(out, in, counts[me] * sizeof(float));
        return Status::OK();
      }
      if (sealed_) {
        return sealed_->AllGatherV(Describe(described), in, counts, offsets, out);
      }
      // Gloo wants a writable input pointer, and one even for 0 elements; it
      // only reads from it.
      float dummy = 0.0f;
      float* input = counts[me] > 0 ? const_cast<float*>(in) : &dummy;
      gloo::AllgathervOptions opts(context_);
      opts.setInput(input, counts[me]);
      opts.setOutput(out, counts);
      opts.setTimeout(timeout());
      gloo::allgatherv(opts);
      return Status::OK();
    });
  }

  Status Broadcast(float* data, size_t n, int root) override {
    const std::string op = fmt::format("Broadcast({} floats, root {})", n, root);
    GRIDSYNC_RETURN_IF_ERROR(CheckRoot(op, root));
    GRIDSYNC_RETURN_IF_ERROR(CheckBuffer(op, data, n));
    const std::string peers = rank() == root ? "every rank receives from the root or a forwarder"
                                             : fmt::format("root: rank {}", root);
    return Guarded(op, peers, [&] {
      if (n == 0 || size() == 1) return Status::OK();
      if (sealed_) return sealed_->Broadcast(Describe(op), data, n * sizeof(float), root);
      gloo::BroadcastOptions opts(context_);
      opts.setOutput(data, n);  // in place: the root's output is its input
      opts.setRoot(root);
      opts.setTimeout(timeout());
      gloo::broadcast(opts);
      return Status::OK();
    });
  }

  Status Barrier() override {
    return Guarded("Barrier", "all ranks", [&] {
      if (size() == 1) return Status::OK();
      if (sealed_) return sealed_->Barrier(Describe("Barrier"));
      gloo::BarrierOptions opts(context_);
      opts.setTimeout(timeout());
      gloo::barrier(opts);
      return Status::OK();
    });
  }

 private:
  // "ring neighbours: receives from rank 0, sends to rank 2"
  std::string Ring() const {
    const int left = (rank() + size() - 1) % size();
    const int right = (rank() + 1) % size();
    return fmt::format("ring neighbours: receives from rank {}, sends to rank {}", left, right);
  }

  // Runs `body` under the lock, turning Gloo's exceptions into a Status and
  // breaking the group on any failure.
  template <typename Body>
  Status Guarded(const std::string& op, const std::string& peers, Body&& body) {
    std::lock_guard<std::mutex> lock(mu_);
    if (!broken_.ok()) {
      return Status(broken_.code(), fmt::format("{}: the group is broken by an earlier failure: {}",
                                                Describe(op), broken_.message()));
    }
    Status status;
    try {
      status = body();
    } catch (...) {
      status = StatusFromCurrentException(
          fmt::format("{} failed (timeout {}; {})", Describe(op), FormatSeconds(timeout()), peers));
    }
    if (!status.ok() && status.code() != StatusCode::kInvalidArgument) broken_ = status;
    return status;
  }

  Status AllReduceLocked(const std::string& op, float* data, size_t n) {
    if (sealed_) return sealed_->AllReduce(Describe(op), data, n, sizeof(float), &SumFloats);
    gloo::AllreduceOptions opts(context_);
    opts.setOutput(data, n);  // in place: the output is also the input
    opts.setAlgorithm(gloo::AllreduceOptions::Algorithm::RING);
    opts.setReduceFunction(&SumFloats);
    opts.setTimeout(timeout());
    gloo::allreduce(opts);
    return Status::OK();
  }

  // Ring reduce-scatter with slices of any size. In step s (0..size-2) rank
  // r sends its running sum of slice (r-s-1) to rank r+1 and adds what rank
  // r-1 sends of slice (r-s-2); after size-1 steps it holds the full sum of
  // slice r. Both ends skip empty slices, since both know the counts.
  Status RingReduceScatterLocked(const std::string& op, const float* in, float* out,
                                 const std::vector<size_t>& counts,
                                 const std::vector<size_t>& offsets) {
    const int n = size();
    const int left = (rank() + n - 1) % n;
    const int right = (rank() + 1) % n;
    const size_t max_slice = *std::max_element(counts.begin(), counts.end());
    work_.assign(in, in + offsets.back());
    recv_.resize(std::max<size_t>(max_slice, 1));
    auto work = context_->createUnboundBuffer(work_.data(), work_.size() * sizeof(float));
    auto recv = context_->createUnboundBuffer(recv_.data(), recv_.size() * sizeof(float));
    const uint64_t slot = gloo::Slot::build(kReduceScatterSlotPrefix, 0);
    const auto deadline = Clock::now() + timeout();
    auto remaining = [&] {
      return std::max(
          std::chrono::milliseconds(1),
          std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now()));
    };
    for (int step = 0; step + 1 < n; ++step) {
      const auto send_slice = static_cast<size_t>((rank() - step - 1 + 2 * n) % n);
      const auto recv_slice = static_cast<size_t>((rank() - step - 2 + 2 * n) % n);
      if (counts[send_slice] > 0) {
        work->send(right, slot, offsets[send_slice] * sizeof(float),
                   counts[send_slice] * sizeof(float));
      }
      if (counts[recv_slice] > 0) {
        recv->recv(left, slot, 0, counts[recv_slice] * sizeof(float));
        if (!recv->waitRecv(remaining())) {
          return Status::IOError(
              fmt::format("{}: receive from rank {} aborted", Describe(op), left));
        }
        float* acc = work_.data() + offsets[recv_slice];
        for (size_t i = 0; i < counts[recv_slice]; ++i) acc[i] += recv_[i];
      }
      if (counts[send_slice] > 0 && !work->waitSend(remaining())) {
        return Status::IOError(fmt::format("{}: send to rank {} aborted", Describe(op), right));
      }
    }
    const auto me = static_cast<size_t>(rank());
    if (counts[me] > 0) std::memcpy(out, work_.data() + offsets[me], counts[me] * sizeof(float));
    return Status::OK();
  }

  std::mutex mu_;  // serialises operations
  std::shared_ptr<gloo::Context> context_;
  Status broken_;               // guarded by mu_
  std::vector<float> scratch_;  // guarded by mu_: AllReduceSumGroup's packed buffer
  std::vector<float> work_;     // guarded by mu_: reduce-scatter running sums
  std::vector<float> recv_;     // guarded by mu_: reduce-scatter receive slice
  // Set when the group seals its messages (security.curve): every operation
  // then runs over it instead of Gloo's algorithms. Guarded by mu_.
  std::unique_ptr<SealedRing> sealed_;
};

// Gloo's TCP pairs write without MSG_NOSIGNAL: when a peer dies mid
// collective, the default SIGPIPE would kill this process instead of letting
// the write fail and Gloo report it (the error that names the group and the
// rank). Nothing in gridsync wants SIGPIPE (ZeroMQ and Asio handle EPIPE),
// so it is ignored process-wide, once, before the first Gloo socket exists.
void IgnoreSigpipe() {
  static std::once_flag once;
  std::call_once(once, [] { std::signal(SIGPIPE, SIG_IGN); });
}

}  // namespace

std::unique_ptr<Collective> gloo_internal::MakeGlooCollective(
    int rank, int size, std::string group, std::chrono::milliseconds timeout,
    std::shared_ptr<gloo::Context> context, const CollectiveSeal* seal) {
  return std::unique_ptr<Collective>(
      new GlooCollective(rank, size, std::move(group), timeout, std::move(context), seal));
}

Status gloo_internal::StatusFromCurrentException(const std::string& what) {
  return gridsync::StatusFromCurrentException(what);
}

void gloo_internal::IgnoreSigpipe() { gridsync::IgnoreSigpipe(); }

}  // namespace gridsync
