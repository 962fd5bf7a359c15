// A fake shard for PsClient tests: a ROUTER on 127.0.0.1 that hands the
// test each request and sends what the test writes, so the client meets
// replies no real shard sends, and the test sees the exact frames a client
// sent.
//
// Thread safety: one thread uses a FakeShard.
#pragma once

#include <gtest/gtest.h>

#include <string>
#include <utility>
#include <vector>
#include <zmq.hpp>

#include "common/status.h"
#include "common/wire/message.h"

namespace gridsync {

// A fake shard: a ROUTER that answers the client's pull with what the test
// writes, so the client meets parts no real shard sends.
class FakeShard {
 public:
  FakeShard() : router_(context_, zmq::socket_type::router) {
    router_.set(zmq::sockopt::linger, 0);
    router_.set(zmq::sockopt::maxmsgsize, static_cast<int64_t>(wire::Limits{}.max_frame_bytes));
    router_.bind("tcp://127.0.0.1:*");
  }
  std::string endpoint() { return router_.get(zmq::sockopt::last_endpoint); }

  // The next request: its sender's identity and request id.
  Result<uint64_t> Receive() {
    GRIDSYNC_RETURN_IF_ERROR(ReceiveFrames());
    return wire::PeekRequestId(frames_, wire::Limits{});
  }
  // The next request's frames, its routing id taken off (frames() after).
  Status ReceiveFrames() {
    GRIDSYNC_ASSIGN_OR_RETURN(frames_, wire::ReceiveMultipart(router_, 5000, wire::Limits{}, 1));
    identity_ = std::move(frames_[0]);
    frames_.erase(frames_.begin());
    return Status::OK();
  }
  const std::vector<zmq::message_t>& frames() const { return frames_; }

  // A pullReply part: one block of table 0, `rows` rows of width 2.
  void SendPart(uint64_t request_id, uint64_t part_row, bool more, uint32_t rows,
                uint32_t table = 0) {
    wire::OutHeader h;
    h.kind = wire::Kind::kPullReply;
    h.request_id = request_id;
    h.step = 1;
    h.part_row = part_row;
    h.more_parts = more;
    wire::OutBlock b;
    b.table = table;
    b.width = 2;
    b.row_count = rows;
    b.values.assign(size_t{rows} * 2, 0.5f);
    std::vector<wire::OutBlock> blocks;
    blocks.push_back(std::move(b));
    SendFrames(wire::Encode(h, std::move(blocks)));
  }
  void SendAck(uint64_t request_id) {
    wire::OutHeader h;
    h.kind = wire::Kind::kPushAck;
    h.request_id = request_id;
    SendFrames(wire::Encode(h, {}));
  }
  void SendFrames(std::vector<zmq::message_t> frames) {
    zmq::message_t identity;
    identity.copy(identity_);
    frames.insert(frames.begin(), std::move(identity));
    EXPECT_TRUE(wire::SendMultipart(router_, frames).ok());
  }

 private:
  zmq::context_t context_{1};
  zmq::socket_t router_;
  zmq::message_t identity_;
  std::vector<zmq::message_t> frames_;
};

}  // namespace gridsync
