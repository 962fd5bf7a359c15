// The events driver of gridsync-bench load (bench_load_worker.h): W
// simulated workers, each a DEALER connection to the shard and a small
// state machine (push, await its ack, pull, await the reply's parts, check
// them, next iteration), all driven from one thread by one epoll set of
// the connections' ZMQ_FDs. The shard sees what W training workers would
// send it: the same headers
// (rank, request ids from 1, step, job, epoch), the same row-id and value
// frames (wire::EncodeCopy writes them as PsClient does), one connection
// each. What it leaves out is the client's work around a message (its
// split among shards, its handshake watch, a thread per worker scattering
// replies into a whole table), which on a training worker's own host costs
// the shard's host nothing.
//
// Why epoll and not zmq::poll: zmq_poll asks every socket for its events
// on each call, and each ask is a few system calls (a getpid for ZeroMQ's
// fork check among them); at W = 128 that made the driver cost the host
// as much CPU per operation as the shard. A ZMQ_FD only says that the
// socket may have changed: it is readable until ZMQ_EVENTS is asked, and
// any call on the socket (a send too) may consume it. So a connection is
// drained whenever its fd fires, and asked again after a send made outside
// its own drain (a drain asks again anyway before it returns).
//
// Thread safety: see bench_load_worker.h.
#include <sys/epoll.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <string>
#include <vector>

#include "common/wire/message.h"
#include "tools/bench_load_worker.h"

namespace gridsync::bench::load {
namespace {

// The longest a wait sleeps: timeouts and the stop flag are looked at
// between waits.
constexpr int kWaitMs = 10;

enum class Phase { kIdle, kPush, kPull };

struct Sim {
  zmq::socket_t socket;
  Phase phase = Phase::kIdle;
  uint64_t step = 0;          // the iteration: pushes batch step, pulls batch step + 1
  uint64_t next_request = 1;  // 0 names a message the shard could not read
  uint64_t request = 0;       // the request out
  Clock::time_point sent;     // ... sent at
  bool timed = false;         // ... within the timed phase
  uint64_t reply_rows = 0;    // rows of the pull's reply so far (its parts)
  bool reply_ok = true;       // ... every one carried finite values
  int warmup_left = 0;
  bool gave_up = false;
};

class EventDriver {
 public:
  EventDriver(const LoadArgs& args, const std::vector<Batch>& pool, const ClusterMap& map,
              const std::vector<wire::TableShape>& shapes, uint32_t n,
              std::vector<WorkerStats>* stats)
      : args_(args),
        pool_(pool),
        map_(map),
        shapes_(shapes),
        stats_(*stats),
        timeout_(args.timeout_ms),
        sims_(n),
        epoll_(::epoll_create1(EPOLL_CLOEXEC)) {
    // Each pool batch as the blocks of its push and of its pull, written
    // by EncodeCopy for every message (as PsClient's pull is).
    for (const Batch& b : pool) {
      wire::OutBlock push;
      push.width = args.width;
      push.row_count = static_cast<uint32_t>(b.rows.size());
      push.rows = b.rows;
      push.values.assign(b.grad.begin(), b.grad.end());
      wire::OutBlock pull = push;
      pull.values.clear();
      pushes_.push_back({std::move(push)});
      pulls_.push_back({std::move(pull)});
    }
  }

  ~EventDriver() {
    if (epoll_ >= 0) ::close(epoll_);
  }
  EventDriver(const EventDriver&) = delete;
  EventDriver& operator=(const EventDriver&) = delete;

  // Connects every worker; a failure is each worker's first error.
  void Connect(zmq::context_t& context) {
    const std::string& endpoint = map_.shards.at(0).endpoint;
    for (uint32_t r = 0; r < sims_.size(); ++r) {
      Sim& sim = sims_[r];
      sim.warmup_left = args_.warmup;
      try {
        sim.socket = zmq::socket_t(context, zmq::socket_type::dealer);
        sim.socket.set(zmq::sockopt::linger, 0);
        sim.socket.set(zmq::sockopt::maxmsgsize, static_cast<int64_t>(limits_.max_frame_bytes));
        sim.socket.set(zmq::sockopt::sndhwm, 0);
        sim.socket.set(zmq::sockopt::rcvhwm, 0);
        sim.socket.set(zmq::sockopt::sndtimeo, args_.timeout_ms);
        sim.socket.connect(endpoint);
        epoll_event event{};
        event.events = EPOLLIN;
        event.data.u32 = r;
        if (epoll_ < 0 ||
            ::epoll_ctl(epoll_, EPOLL_CTL_ADD, sim.socket.get(zmq::sockopt::fd), &event) != 0) {
          throw zmq::error_t();  // errno says why
        }
      } catch (const zmq::error_t& e) {
        RecordFailure(&stats_[r], Status::IOError(std::string("connect: ") + e.what()), "connect");
        sim.gave_up = true;
      }
    }
  }

  // Starts every worker that has iterations to run (the warmup's, or the
  // timed phase's once `timed`), and serves them until all are idle: the
  // warmup's end, or the stop flag (`stop`) seen and every reply in.
  void Run(bool timed, const std::atomic<bool>* stop) {
    timing_ = timed;
    stop_ = stop;
    for (uint32_t r = 0; r < sims_.size(); ++r) StartIteration(r);
    std::vector<epoll_event> events(std::max<size_t>(sims_.size(), 1));
    for (;;) {
      // Connections a send may have left readable with their fd quiet.
      while (!recheck_.empty()) {
        const uint32_t r = recheck_.back();
        recheck_.pop_back();
        Drain(r);
      }
      if (std::none_of(sims_.begin(), sims_.end(),
                       [](const Sim& sim) { return sim.phase != Phase::kIdle; })) {
        return;
      }
      const int ready =
          ::epoll_wait(epoll_, events.data(), static_cast<int>(events.size()), kWaitMs);
      for (int k = 0; k < ready; ++k) Drain(events[static_cast<size_t>(k)].data.u32);
      // Timeouts, once a wait period: a pass over every worker after each
      // wake would cost W steps per reply.
      const auto now = Clock::now();
      if (now < next_timeout_check_) continue;
      next_timeout_check_ = now + std::chrono::milliseconds(kWaitMs);
      for (uint32_t r = 0; r < sims_.size(); ++r) {
        const Sim& sim = sims_[r];
        if (sim.phase == Phase::kIdle || now - sim.sent < timeout_) continue;
        FailCurrent(r,
                    Status::Timeout(
                        "no " + std::string(sim.phase == Phase::kPush ? "pushAck" : "pullReply") +
                        " from shard 0 (" + map_.shards.at(0).endpoint + ") within " +
                        std::to_string(args_.timeout_ms) + " ms (worker " + std::to_string(r) +
                        ", request " + std::to_string(sim.request) + ")"));
      }
    }
  }

 private:
  // Every message queued on the connection, handled in order.
  void Drain(uint32_t r) {
    Sim& sim = sims_[r];
    draining_ = r;
    struct Done {
      uint32_t* draining;
      ~Done() { *draining = UINT32_MAX; }
    } done{&draining_};
    for (;;) {
      int events = 0;
      try {
        events = sim.socket.get(zmq::sockopt::events);
      } catch (const zmq::error_t& e) {
        if (e.num() == EINTR) continue;
        if (sim.phase != Phase::kIdle) {
          FailCurrent(r, Status::IOError(std::string("ZMQ_EVENTS: ") + e.what()));
          Recheck(r);  // what FailCurrent sent is not followed by a look here
        }
        return;
      }
      if ((events & ZMQ_POLLIN) == 0) return;
      auto frames = wire::ReceiveMultipart(sim.socket, 0, limits_);
      if (!frames.ok()) {
        if (frames.status().code() == StatusCode::kTimeout) return;
        if (sim.phase != Phase::kIdle) {
          FailCurrent(r, frames.status().WithContext("receiving"));
          Recheck(r);
        }
        return;
      }
      OnMessage(r, *frames);
    }
  }

  // Drain(r) again before the next wait, unless idle (nothing to await).
  void Recheck(uint32_t r) {
    if (sims_[r].phase != Phase::kIdle) recheck_.push_back(r);
  }

  void StartIteration(uint32_t r) {
    Sim& sim = sims_[r];
    const bool more = timing_ ? !stop_->load(std::memory_order_relaxed) : sim.warmup_left > 0;
    if (sim.gave_up || !more) {
      sim.phase = Phase::kIdle;
      return;
    }
    Send(r, wire::Kind::kPush);
  }

  // Sends the worker's push (of batch step) or pull (of batch step + 1).
  void Send(uint32_t r, wire::Kind kind) {
    Sim& sim = sims_[r];
    WorkerStats& w = stats_[r];
    const bool push = kind == wire::Kind::kPush;
    sim.phase = push ? Phase::kPush : Phase::kPull;
    sim.request = sim.next_request++;
    sim.timed = timing_;
    sim.reply_rows = 0;
    sim.reply_ok = true;
    ++(push ? w.pushes_sent : w.pulls_sent);
    wire::OutHeader header;
    header.kind = kind;
    header.step = push ? sim.step : sim.step + 1;
    header.worker_rank = r;
    header.request_id = sim.request;
    header.shard = 0;
    header.num_workers = static_cast<uint32_t>(sims_.size());
    header.job = map_.job;
    header.epoch = map_.epoch;
    const size_t batch = Index(r, push ? sim.step : sim.step + 1);
    auto frames = wire::EncodeCopy(header, push ? pushes_[batch] : pulls_[batch]);
    sim.sent = Clock::now();
    // A send inside Drain(r) is followed by its next look at the events.
    if (draining_ != r) recheck_.push_back(r);
    if (Status s = wire::SendMultipart(sim.socket, frames); !s.ok()) FailCurrent(r, s);
  }

  size_t Index(uint32_t r, uint64_t step) const {
    return static_cast<size_t>(&PickBatch(args_, pool_, r, step) - pool_.data());
  }

  void OnMessage(uint32_t r, const std::vector<zmq::message_t>& frames) {
    Sim& sim = sims_[r];
    auto m = wire::Decode(frames, shapes_, limits_);
    if (!m.ok()) return FailCurrent(r, m.status().WithContext("a reply from shard 0"));
    if (m->kind == wire::Kind::kError && m->request_id == 0) {
      return FailCurrent(r, m->error.WithContext("shard 0 could not read a message"));
    }
    // A late reply to a request given up on (timed out) answers nothing.
    if (sim.phase == Phase::kIdle || m->request_id != sim.request) return;
    if (m->kind == wire::Kind::kError) return FailCurrent(r, m->error.WithContext("shard 0"));
    const wire::Kind expected =
        sim.phase == Phase::kPush ? wire::Kind::kPushAck : wire::Kind::kPullReply;
    if (m->kind != expected) {
      return FailCurrent(
          r, Status::Corruption(std::string("shard 0 answered ") + wire::KindName(m->kind) +
                                ", expected " + wire::KindName(expected)));
    }
    if (sim.phase == Phase::kPush) return Done(r);
    // The parts continue each other; every value is there and finite.
    if (m->part_row != sim.reply_rows) sim.reply_ok = false;
    for (const wire::Block& b : m->blocks) {
      const bool whole = !b.compressed() && b.values.size() == uint64_t{b.row_count} * b.width;
      sim.reply_ok =
          sim.reply_ok && whole &&
          std::all_of(b.values.begin(), b.values.end(), [](float x) { return std::isfinite(x); });
      sim.reply_rows += b.row_count;
    }
    if (m->more_parts) return;
    if (sim.reply_rows != args_.rows) sim.reply_ok = false;
    Done(r);
  }

  // The request out was answered: its latency, then the next step.
  void Done(uint32_t r) {
    Sim& sim = sims_[r];
    WorkerStats& w = stats_[r];
    const float us = std::chrono::duration<float, std::micro>(Clock::now() - sim.sent).count();
    if (sim.phase == Phase::kPush) {
      if (sim.timed) {
        ++w.timed_pushes;
        w.push_us.push_back(us);
      }
      return Send(r, wire::Kind::kPull);
    }
    if (!sim.reply_ok) ++w.bad_pulls;
    if (sim.timed) {
      ++w.timed_pulls;
      w.pull_us.push_back(us);
    }
    EndIteration(r);
  }

  // The request out failed: as PsClient's worker, a failed push is still
  // followed by its pull, and kMaxFailures end the worker.
  void FailCurrent(uint32_t r, const Status& s) {
    Sim& sim = sims_[r];
    WorkerStats& w = stats_[r];
    const bool push = sim.phase == Phase::kPush;
    RecordFailure(&w, s, push ? "push" : "pull");
    if (w.failures >= kMaxFailures) sim.gave_up = true;
    if (sim.phase == Phase::kIdle) return;
    if (push) return Send(r, wire::Kind::kPull);
    EndIteration(r);
  }

  void EndIteration(uint32_t r) {
    Sim& sim = sims_[r];
    ++sim.step;
    if (!timing_) --sim.warmup_left;
    sim.phase = Phase::kIdle;
    StartIteration(r);
  }

  const LoadArgs& args_;
  const std::vector<Batch>& pool_;
  const ClusterMap& map_;
  const std::vector<wire::TableShape>& shapes_;
  std::vector<WorkerStats>& stats_;
  const std::chrono::milliseconds timeout_;
  const wire::Limits limits_;
  std::vector<std::vector<wire::OutBlock>> pushes_, pulls_;  // by pool batch
  std::vector<Sim> sims_;
  const int epoll_;                 // the connections' ZMQ_FDs, data.u32 the rank
  std::vector<uint32_t> recheck_;   // sent on since their last drain
  uint32_t draining_ = UINT32_MAX;  // the connection Drain is reading
  bool timing_ = false;
  const std::atomic<bool>* stop_ = nullptr;
  Clock::time_point next_timeout_check_;
};

}  // namespace

void RunEventWorkers(const LoadArgs& args, const std::vector<Batch>& pool, const ClusterMap& map,
                     const std::vector<wire::TableShape>& shapes, uint32_t n,
                     zmq::context_t& context, Clock::time_point go_deadline, Control* control,
                     std::vector<WorkerStats>* stats) {
  EventDriver driver(args, pool, map, shapes, n, stats);
  driver.Connect(context);
  driver.Run(/*timed=*/false, nullptr);
  {
    std::unique_lock<std::mutex> lock(control->mu);
    control->ready = n;
    control->cv.notify_all();
    if (!control->cv.wait_until(lock, go_deadline, [&] { return control->go; })) {
      for (auto& w : *stats) RecordFailure(&w, Status::Timeout("no start signal"), "start");
      return;
    }
  }
  driver.Run(/*timed=*/true, &control->stop);
}

}  // namespace gridsync::bench::load
