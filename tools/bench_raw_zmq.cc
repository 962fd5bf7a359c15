// The raw ZeroMQ peer of gridsync-bench pushpull (bench_raw_zmq.h).
#include "tools/bench_raw_zmq.h"

#include <cerrno>
#include <iterator>
#include <string>
#include <zmq_addon.hpp>

#include "common/wire/message.h"

namespace gridsync::bench {
namespace {

using Clock = std::chrono::steady_clock;

double MicrosSince(Clock::time_point start) {
  return std::chrono::duration<double, std::micro>(Clock::now() - start).count();
}

// The send buffers outlive every message that refers to them (they are
// members declared before the context), so ZeroMQ need not free anything.
void NoFree(void*, void*) {}

}  // namespace

Result<std::unique_ptr<RawZmqPeer>> RawZmqPeer::Start(uint32_t max_rows, uint32_t width,
                                                      uint32_t stride,
                                                      std::chrono::seconds timeout) {
  std::unique_ptr<RawZmqPeer> peer(new RawZmqPeer(max_rows, width, stride, timeout));
  try {
    for (zmq::socket_t* s : {&peer->server_, &peer->client_}) {
      // As PsShard and PsClient set them: no high-water mark, no linger.
      s->set(zmq::sockopt::linger, 0);
      s->set(zmq::sockopt::sndhwm, 0);
      s->set(zmq::sockopt::rcvhwm, 0);
    }
    peer->server_.bind("tcp://127.0.0.1:0");
    peer->client_.connect(peer->server_.get(zmq::sockopt::last_endpoint));
  } catch (const zmq::error_t& e) {
    return Status::IOError(std::string("raw ZeroMQ peer: ") + e.what());
  }
  // Starting the thread orders the socket setup above before its use there.
  peer->thread_ = std::thread([p = peer.get()] { p->Serve(); });
  return peer;
}

RawZmqPeer::~RawZmqPeer() {
  stop_ = true;
  if (thread_.joinable()) thread_.join();
}

Result<std::vector<double>> RawZmqPeer::Time(uint32_t n, int warmup, int iters) {
  std::vector<double> us;
  us.reserve(static_cast<size_t>(iters));
  try {
    for (int it = 0; it < warmup + iters; ++it) {
      const auto start = Clock::now();
      Send(kPushTag, n, /*with_values=*/true);
      GRIDSYNC_RETURN_IF_ERROR(Expect({kHeaderBytes}));
      Send(kPullTag, n, /*with_values=*/false);
      GRIDSYNC_RETURN_IF_ERROR(Expect({kHeaderBytes, size_t{n} * width_ * sizeof(float)}));
      if (it >= warmup) us.push_back(MicrosSince(start));
    }
  } catch (const zmq::error_t& e) {
    return Status::IOError(std::string("raw ZeroMQ client: ") + e.what());
  }
  return us;
}

RawZmqPeer::RawZmqPeer(uint32_t max_rows, uint32_t width, uint32_t stride,
                       std::chrono::seconds timeout)
    : width_(width),
      timeout_(timeout),
      ids_(max_rows),
      values_(size_t{max_rows} * width),
      server_values_(values_.size()) {
  for (uint32_t i = 0; i < max_rows; ++i) ids_[i] = stride * i;
  for (size_t i = 0; i < values_.size(); ++i) values_[i] = server_values_[i] = 0.001f * i;
  push_header_[0] = kPushTag;
  pull_header_[0] = kPullTag;
}

void RawZmqPeer::Send(char tag, uint32_t n, bool with_values) {
  char* header = tag == kPushTag ? push_header_.data() : pull_header_.data();
  wire::RetryOnEintr([&] {
    return client_.send(zmq::message_t(header, kHeaderBytes, NoFree), zmq::send_flags::sndmore);
  });
  wire::RetryOnEintr([&] {
    return client_.send(zmq::message_t(ids_.data(), size_t{n} * sizeof(uint32_t), NoFree),
                        with_values ? zmq::send_flags::sndmore : zmq::send_flags::none);
  });
  if (with_values) {
    wire::RetryOnEintr([&] {
      return client_.send(
          zmq::message_t(values_.data(), size_t{n} * width_ * sizeof(float), NoFree),
          zmq::send_flags::none);
    });
  }
}

Status RawZmqPeer::Expect(const std::vector<size_t>& sizes) {
  zmq::pollitem_t item{client_.handle(), 0, ZMQ_POLLIN, 0};
  const int ready = wire::RetryOnEintr([&] {
    return zmq::poll(&item, 1, std::chrono::duration_cast<std::chrono::milliseconds>(timeout_));
  });
  if (ready == 0) {
    std::lock_guard<std::mutex> lock(mu_);
    return server_error_.ok() ? Status::Timeout("raw ZeroMQ peer: no reply") : server_error_;
  }
  frames_.clear();
  wire::RetryOnEintr([&] { return zmq::recv_multipart(client_, std::back_inserter(frames_)); });
  bool same = frames_.size() == sizes.size();
  for (size_t i = 0; same && i < sizes.size(); ++i) same = frames_[i].size() == sizes[i];
  if (!same) return Status::Internal("raw ZeroMQ peer: reply of an unexpected shape");
  return Status::OK();
}

void RawZmqPeer::Serve() {
  std::vector<zmq::message_t> frames;
  try {
    while (!stop_) {
      zmq::pollitem_t item{server_.handle(), 0, ZMQ_POLLIN, 0};
      // A short poll: the destructor's stop flag is seen within 50 ms.
      if (wire::RetryOnEintr([&] { return zmq::poll(&item, 1, std::chrono::milliseconds(50)); }) ==
          0) {
        continue;
      }
      frames.clear();
      wire::RetryOnEintr([&] { return zmq::recv_multipart(server_, std::back_inserter(frames)); });
      // [routing id, header, ids] plus values for a push.
      if (frames.size() < 3 || frames[1].size() != kHeaderBytes) {
        std::lock_guard<std::mutex> lock(mu_);
        server_error_ = Status::Internal("raw ZeroMQ peer: request of an unexpected shape");
        return;
      }
      const char tag = *frames[1].data<char>();
      wire::RetryOnEintr([&] { return server_.send(frames[0], zmq::send_flags::sndmore); });
      if (tag == kPushTag) {
        wire::RetryOnEintr([&] {
          return server_.send(zmq::message_t(ack_.data(), kHeaderBytes, NoFree),
                              zmq::send_flags::none);
        });
        continue;
      }
      const size_t n = frames[2].size() / sizeof(uint32_t);
      wire::RetryOnEintr([&] {
        return server_.send(zmq::message_t(ack_.data(), kHeaderBytes, NoFree),
                            zmq::send_flags::sndmore);
      });
      wire::RetryOnEintr([&] {
        return server_.send(
            zmq::message_t(server_values_.data(), n * width_ * sizeof(float), NoFree),
            zmq::send_flags::none);
      });
    }
  } catch (const zmq::error_t& e) {
    std::lock_guard<std::mutex> lock(mu_);
    server_error_ = Status::IOError(std::string("raw ZeroMQ echo thread: ") + e.what());
  }
}

}  // namespace gridsync::bench
