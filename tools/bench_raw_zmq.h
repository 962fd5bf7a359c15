// gridsync-bench pushpull's raw side: a DEALER client and a ROUTER echo
// thread, each with a ZeroMQ context of its own (as a worker and a shard
// have), moving the same payload in the same round trips as a
// PS push and pull, without decode, validation, apply and gather: the
// practical limit the bench compares gridsync against. Per iteration
// [64 B header, ids, values] -> 64 B ack, then [64 B header, ids] ->
// [64 B header, values].
//
// Thread safety: Start, Time and the destructor from one thread; the echo
// thread owns the server socket between Start and the destructor.
#pragma once

#include <array>
#include <atomic>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <mutex>
#include <thread>
#include <vector>
#include <zmq.hpp>

#include "common/status.h"

namespace gridsync::bench {

class RawZmqPeer {
 public:
  static constexpr size_t kHeaderBytes = 64;  // the stand-in for the Cap'n Proto header

  // Rows of `width` floats, ids every `stride`-th row, up to max_rows a
  // message; every wait gives up after `timeout`.
  static Result<std::unique_ptr<RawZmqPeer>> Start(uint32_t max_rows, uint32_t width,
                                                   uint32_t stride, std::chrono::seconds timeout);
  ~RawZmqPeer();

  // The timed loop on the raw side; returns each iteration's latency (us).
  Result<std::vector<double>> Time(uint32_t n, int warmup, int iters);

 private:
  static constexpr char kPushTag = 'P';
  static constexpr char kPullTag = 'Q';

  RawZmqPeer(uint32_t max_rows, uint32_t width, uint32_t stride, std::chrono::seconds timeout);
  void Send(char tag, uint32_t n, bool with_values);
  // Waits for one reply with frames of the given sizes. A mismatch is a bug
  // in the bench or a failed echo thread, reported rather than timed.
  Status Expect(const std::vector<size_t>& sizes);
  // The echo thread. No exception leaves it: a failure is recorded and ends
  // the thread, and the client's wait reports it.
  void Serve();

  const uint32_t width_;
  const std::chrono::seconds timeout_;
  // Buffers first: destroyed after the context, so after ZeroMQ is done.
  std::vector<uint32_t> ids_;
  std::vector<float> values_;
  std::vector<float> server_values_;
  std::array<char, kHeaderBytes> push_header_{};
  std::array<char, kHeaderBytes> pull_header_{};
  std::array<char, kHeaderBytes> ack_{};
  std::vector<zmq::message_t> frames_;  // the client's last reply
  // One context (and so one I/O thread) per side, as a shard and a worker
  // have in their own processes (PsShard and PsClient each own one). A
  // shared context would let one I/O thread carry both ends of the
  // connection: one thread wake-up fewer each way, which on this VM took
  // ~150 us off a small iteration that gridsync's topology cannot have.
  zmq::context_t server_context_{1};
  zmq::context_t client_context_{1};
  zmq::socket_t server_{server_context_, zmq::socket_type::router};
  zmq::socket_t client_{client_context_, zmq::socket_type::dealer};
  std::thread thread_;
  std::atomic<bool> stop_{false};
  std::mutex mu_;
  Status server_error_;  // guarded by mu_
};

}  // namespace gridsync::bench
