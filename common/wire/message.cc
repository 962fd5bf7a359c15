// Data-plane encoding, the protocol's names and the socket helpers. See
// message.h for the contract; the decode boundary is message_decode.cc.
//
// Checks that abort (GRIDSYNC_CHECK) guard only what the local caller hands
// to Encode(), where a mismatch is a bug in this process; nothing here reads
// received bytes except ReceiveMultipart's size limits, which return a
// Status.
#include "common/wire/message.h"

#include <capnp/message.h>
#include <capnp/serialize.h>
#include <kj/array.h>
#include <kj/exception.h>
#include <spdlog/fmt/fmt.h>

#include <algorithm>
#include <bit>
#include <cerrno>
#include <chrono>
#include <cmath>
#include <cstring>
#include <limits>
#include <memory>
#include <utility>

#include "common/check.h"
#include "common/wire/error_code.h"
#include "common/wire/gridsync.capnp.h"
#include "common/wire/row_ids.h"

namespace gridsync::wire {

static_assert(kProtocolVersion == schema::PROTOCOL_VERSION,
              "message.h and gridsync.capnp disagree on the protocol version");
static_assert(static_cast<uint16_t>(Kind::kPush) ==
              static_cast<uint16_t>(schema::MessageKind::PUSH));
static_assert(static_cast<uint16_t>(Kind::kPushAck) ==
              static_cast<uint16_t>(schema::MessageKind::PUSH_ACK));
static_assert(static_cast<uint16_t>(Kind::kPull) ==
              static_cast<uint16_t>(schema::MessageKind::PULL));
static_assert(static_cast<uint16_t>(Kind::kPullReply) ==
              static_cast<uint16_t>(schema::MessageKind::PULL_REPLY));
static_assert(static_cast<uint16_t>(Kind::kError) ==
              static_cast<uint16_t>(schema::MessageKind::ERROR));
static_assert(static_cast<uint16_t>(Kind::kStats) ==
              static_cast<uint16_t>(schema::MessageKind::STATS));
static_assert(static_cast<uint16_t>(Kind::kStatsReply) ==
              static_cast<uint16_t>(schema::MessageKind::STATS_REPLY));
static_assert(static_cast<uint16_t>(Kind::kInit) ==
              static_cast<uint16_t>(schema::MessageKind::INIT));
static_assert(static_cast<uint16_t>(RowEncoding::kRaw) ==
              static_cast<uint16_t>(schema::RowEncoding::RAW));
static_assert(static_cast<uint16_t>(RowEncoding::kDeltaVarint) ==
              static_cast<uint16_t>(schema::RowEncoding::DELTA_VARINT));

namespace {

// A refusal names what is wrong; a kilobyte-long list of reasons would not
// help the reader more, and an unbounded text could push the reply past the
// receiver's max_header_bytes and turn a clear refusal into a corrupt frame.
constexpr size_t kMaxErrorTextBytes = 16 * 1024;

// Hands `payload` to ZeroMQ without copying: the vector moves to the heap and
// ZeroMQ frees it (possibly on its I/O thread) once the frame is sent.
template <typename T, typename Alloc>
zmq::message_t FrameFromVector(std::vector<T, Alloc>&& payload,
                               const std::shared_ptr<UnsentBytes>& unsent = nullptr) {
  if (payload.empty()) return zmq::message_t();
  struct Holder {
    std::vector<T, Alloc> data;
    std::shared_ptr<UnsentBytes> unsent;
  };
  auto holder = std::make_unique<Holder>(Holder{std::move(payload), unsent});
  void* data = holder->data.data();
  const size_t bytes = holder->data.size() * sizeof(T);
  zmq::message_t frame(
      data, bytes,
      [](void*, void* hint) {
        auto* h = static_cast<Holder*>(hint);
        if (h->unsent != nullptr) h->unsent->Sub(h->data.size() * sizeof(T));
        delete h;
      },
      holder.get());
  holder.release();  // owned by the frame from here on
  if (unsent != nullptr) unsent->Add(bytes);
  return frame;
}

zmq::message_t FrameFromHeader(capnp::MallocMessageBuilder& builder) {
  auto holder = std::make_unique<kj::Array<capnp::word>>(capnp::messageToFlatArray(builder));
  auto bytes = holder->asBytes();
  zmq::message_t frame(
      bytes.begin(), bytes.size(),
      [](void*, void* hint) { delete static_cast<kj::Array<capnp::word>*>(hint); }, holder.get());
  holder.release();
  return frame;
}

void FillStats(const ShardStats& in, schema::ShardStats::Builder out) {
  out.setAppliedSteps(in.applied_steps);
  out.setPushes(in.pushes);
  out.setPulls(in.pulls);
  out.setErrors(in.errors);
  out.setRowsOwned(in.rows_owned);
  out.setBytesIn(in.bytes_in);
  out.setBytesOut(in.bytes_out);
}

}  // namespace

const char* RowEncodingName(RowEncoding e) {
  switch (e) {
    case RowEncoding::kRaw:
      return "raw";
    case RowEncoding::kDeltaVarint:
      return "deltaVarint";
  }
  return "unknown";
}

const char* PushValuesName(PushValues v) {
  return v == PushValues::kUpdates ? "updates" : "gradients";
}

const char* KindName(Kind kind) {
  switch (kind) {
    case Kind::kPush:
      return "push";
    case Kind::kPushAck:
      return "pushAck";
    case Kind::kPull:
      return "pull";
    case Kind::kPullReply:
      return "pullReply";
    case Kind::kError:
      return "error";
    case Kind::kStats:
      return "stats";
    case Kind::kStatsReply:
      return "statsReply";
    case Kind::kInit:
      return "init";
  }
  return "unknown";
}

KindLayout LayoutOf(Kind kind) {
  switch (kind) {
    case Kind::kPush:
    case Kind::kInit:
      return {.blocks = true, .row_ids = true, .values = true};
    case Kind::kPull:
      return {.blocks = true, .row_ids = true, .values = false};
    case Kind::kPullReply:
      return {.blocks = true, .row_ids = false, .values = true};
    case Kind::kPushAck:
    case Kind::kError:
    case Kind::kStats:
    case Kind::kStatsReply:
      break;
  }
  return {};
}

size_t RowIdFrameBytes(const std::vector<uint32_t>& rows) {
  const size_t raw = rows.size() * sizeof(uint32_t);
  const size_t varint = DeltaVarintBytes(rows);
  return varint < raw ? varint : raw;
}

void UnsentBytes::Add(uint64_t n) {
  bytes.fetch_add(n, std::memory_order_relaxed);
  if (total != nullptr) total->Add(n);
}

void UnsentBytes::Sub(uint64_t n) {
  bytes.fetch_sub(n, std::memory_order_relaxed);
  if (total != nullptr) total->Sub(n);
}

namespace {

// A payload frame: a block's own vector moved in (zero copy), a const
// one's copied, so that the caller keeps it.
template <typename T, typename Alloc>
zmq::message_t PayloadFrame(std::vector<T, Alloc>& data,
                            const std::shared_ptr<UnsentBytes>& unsent) {
  return FrameFromVector(std::move(data), unsent);
}
template <typename T, typename Alloc>
zmq::message_t PayloadFrame(const std::vector<T, Alloc>& data,
                            const std::shared_ptr<UnsentBytes>& unsent) {
  std::vector<T, Alloc> copy = data;
  return FrameFromVector(std::move(copy), unsent);
}

// Encode (Block = OutBlock: the vectors are moved into the frames) and
// EncodeCopy (Block = const OutBlock: they are copied).
template <typename Block>
std::vector<zmq::message_t> EncodeBlocks(const OutHeader& header, std::span<Block> blocks,
                                         const std::shared_ptr<UnsentBytes>& unsent) {
  capnp::MallocMessageBuilder builder;
  auto out = builder.initRoot<schema::Header>();
  out.setVersion(kProtocolVersion);
  out.setKind(static_cast<schema::MessageKind>(header.kind));
  out.setStep(header.step);
  out.setWorkerRank(header.worker_rank);
  out.setRequestId(header.request_id);
  out.setShard(header.shard);
  out.setMinVersion(header.min_version);
  out.setNumWorkers(header.num_workers);
  out.setPushValues(static_cast<schema::PushValues>(header.push_values));
  out.setWholeValues(header.whole_values);
  out.setSkipStep(header.skip_step);
  out.setEvaluation(header.evaluation);
  out.setJob(header.job);
  out.setEpoch(header.epoch);
  out.setPartRow(header.part_row);
  out.setMoreParts(header.more_parts);
  if (header.kind == Kind::kStatsReply) FillStats(header.stats, out.initStats());

  const KindLayout layout = LayoutOf(header.kind);
  const bool rows = layout.row_ids;
  const bool values = layout.values;
  // A sender's bug: the receiver refuses blocks on a kind that has none.
  if (!layout.blocks) GRIDSYNC_CHECK_EQ(blocks.size(), size_t{0});
  std::vector<zmq::message_t> frames;
  frames.reserve(1 + 2 * blocks.size());
  frames.emplace_back();  // the header, once the blocks are described

  auto list = out.initBlocks(static_cast<unsigned>(blocks.size()));
  for (size_t i = 0; i < blocks.size(); ++i) {
    Block& b = blocks[i];
    // A mismatch here is the sender's bug; sent anyway, the receiver would
    // refuse the whole message with no hint of which local code is wrong.
    if (rows && !b.dense) GRIDSYNC_CHECK_EQ(b.rows.size(), size_t{b.row_count});
    const bool compressed = b.codec.codec != Codec::kNone;
    if (values && !compressed) GRIDSYNC_CHECK_EQ(b.values.size(), size_t{b.row_count} * b.width);
    if (values && compressed) {
      GRIDSYNC_CHECK_EQ(b.payload.size(), EncodedSize(b.codec, size_t{b.row_count} * b.width));
    }
    auto block = list[static_cast<unsigned>(i)];
    block.setTable(b.table);
    block.setRowCount(b.row_count);
    block.setDense(b.dense);
    block.setRowBegin(b.dense ? b.row_begin : 0);
    block.setColBegin(b.col_begin);
    block.setWidth(b.width);
    block.setCodec(static_cast<schema::Codec>(static_cast<uint16_t>(b.codec.codec)));
    if (compressed) {
      block.setCodecRatio(b.codec.ratio);
      block.setCodecBits(static_cast<uint8_t>(b.codec.bits));
      block.setCodecBlock(b.codec.block);
      block.setCodecSeed(b.codec_seed);
    }
    if (rows && !b.dense) {
      // Pick the smaller layout; a tie goes raw (zero copy on both ends).
      UninitVector<uint8_t> varints;
      if (!b.raw_rows && EncodeDeltaVarintIfSmaller(b.rows, &varints)) {
        block.setRowEncoding(schema::RowEncoding::DELTA_VARINT);
        frames.push_back(FrameFromVector(std::move(varints)));
      } else {
        frames.push_back(PayloadFrame(b.rows, nullptr));
      }
    }
    if (values) {
      frames.push_back(compressed ? PayloadFrame(b.payload, unsent)
                                  : PayloadFrame(b.values, unsent));
    }
  }
  frames[0] = FrameFromHeader(builder);
  return frames;
}

}  // namespace

std::vector<zmq::message_t> Encode(const OutHeader& header, std::vector<OutBlock> blocks,
                                   std::shared_ptr<UnsentBytes> unsent) {
  return EncodeBlocks(header, std::span<OutBlock>(blocks), unsent);
}

std::vector<zmq::message_t> EncodeCopy(const OutHeader& header,
                                       const std::vector<OutBlock>& blocks) {
  return EncodeBlocks(header, std::span<const OutBlock>(blocks), nullptr);
}

std::vector<zmq::message_t> Counted(std::vector<zmq::message_t> frames,
                                    const std::shared_ptr<UnsentBytes>& unsent) {
  for (auto& frame : frames) {
    std::vector<uint8_t> bytes(frame.data<uint8_t>(), frame.data<uint8_t>() + frame.size());
    frame = FrameFromVector(std::move(bytes), unsent);
  }
  return frames;
}

std::vector<zmq::message_t> EncodeError(uint64_t request_id, uint32_t shard, const Status& error) {
  GRIDSYNC_CHECK(!error.ok());  // an OK status is not a refusal
  capnp::MallocMessageBuilder builder;
  auto out = builder.initRoot<schema::Header>();
  out.setVersion(kProtocolVersion);
  out.setKind(schema::MessageKind::ERROR);
  out.setRequestId(request_id);
  out.setShard(shard);
  auto info = out.initError();
  info.setCode(WireErrorCode(error.code()));
  const std::string& text = error.message();
  if (text.size() <= kMaxErrorTextBytes) {
    info.setText(text);
  } else {
    std::string cut = text.substr(0, kMaxErrorTextBytes) + " ... (truncated)";
    info.setText(cut);
  }
  std::vector<zmq::message_t> frames;
  frames.push_back(FrameFromHeader(builder));
  return frames;
}

uint64_t WireFrameBytes(uint64_t size, bool curve) {
  const uint64_t body = curve ? size + 33 : size;
  return body + (body > 255 ? 9 : 2);
}

Result<std::vector<zmq::message_t>> ReceiveMultipart(zmq::socket_t& socket, int timeout_ms,
                                                     const Limits& limits, int envelope_frames,
                                                     std::vector<zmq::message_t>* refused_envelope,
                                                     TakenBytes* taken) {
  GRIDSYNC_CHECK_GE(envelope_frames, 0);
  using Clock = std::chrono::steady_clock;
  const auto deadline = Clock::now() + std::chrono::milliseconds(std::max(timeout_ms, 0));
  std::vector<zmq::message_t> frames;
  try {
    zmq::message_t first;
    // A message already queued is taken without polling: zmq_poll makes a
    // poll(2) call even when the socket is readable, and a busy shard or a
    // client whose reply arrived first would pay one per message. A
    // readable socket can still come up empty (another thread sharing it,
    // or a spurious wakeup); then it waits again.
    auto take = [&] {
      return RetryOnEintr([&] { return socket.recv(first, zmq::recv_flags::dontwait); })
          .has_value();
    };
    while (!take()) {
      if (timeout_ms >= 0 && Clock::now() >= deadline) {
        return Status::Timeout(fmt::format("no message within {} ms", timeout_ms));
      }
      long wait = -1;
      if (timeout_ms >= 0) {
        wait = std::max<long>(
            0,
            std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now()).count());
      }
      zmq::pollitem_t item{socket.handle(), 0, ZMQ_POLLIN, 0};
      RetryOnEintr([&] { return zmq::poll(&item, 1, std::chrono::milliseconds(wait)); });
    }

    // The envelope (a ROUTER's routing id) never crossed the wire.
    if (taken != nullptr) {
      taken->fd = zmq_msg_get(first.handle(), ZMQ_SRCFD);
      taken->bytes = envelope_frames > 0 ? 0 : WireFrameBytes(first.size(), taken->curve);
    }
    const size_t allowed = static_cast<size_t>(envelope_frames) + limits.max_frames();
    size_t count = 1;
    bool more = first.more();
    frames.push_back(std::move(first));
    // ZeroMQ delivers a multipart message whole, so the remaining parts are
    // already here; reading them all, even past the limit, keeps the next
    // message on this socket starting at its own first frame.
    while (more) {
      zmq::message_t part;
      RetryOnEintr([&] { return socket.recv(part, zmq::recv_flags::none); });
      more = part.more();
      ++count;
      if (taken != nullptr && count > static_cast<size_t>(envelope_frames)) {
        taken->bytes += WireFrameBytes(part.size(), taken->curve);
        // A ROUTER's routing id frame may carry no descriptor; the frames
        // that crossed the wire do.
        if (taken->fd < 0) taken->fd = zmq_msg_get(part.handle(), ZMQ_SRCFD);
      }
      if (count <= allowed) frames.push_back(std::move(part));
    }
    if (count > allowed) {
      if (refused_envelope != nullptr) {
        for (int i = 0; i < envelope_frames && i < static_cast<int>(frames.size()); ++i) {
          refused_envelope->push_back(std::move(frames[static_cast<size_t>(i)]));
        }
      }
      return Status::InvalidArgument(
          fmt::format("{} frames; allowed: at most {} ({} envelope + {} message frames)", count,
                      allowed, envelope_frames, limits.max_frames()));
    }
  } catch (const zmq::error_t& e) {
    return Status::IOError(fmt::format("receiving a message: {} (errno {})", e.what(), e.num()));
  }
  return frames;
}

Status SendMultipart(zmq::socket_t& socket, std::vector<zmq::message_t>& frames) {
  if (frames.empty()) {
    return Status::InvalidArgument("sending a message of 0 frames; a message needs a header frame");
  }
  for (size_t i = 0; i < frames.size(); ++i) {
    const auto flags = i + 1 < frames.size() ? zmq::send_flags::sndmore : zmq::send_flags::none;
    try {
      auto sent = RetryOnEintr([&] { return socket.send(frames[i], flags); });
      if (!sent.has_value()) {
        return Status::IOError(fmt::format(
            "sending frame {} of {}: would block (EAGAIN: send timeout or high-water mark)", i,
            frames.size()));
      }
    } catch (const zmq::error_t& e) {
      return Status::IOError(fmt::format("sending frame {} of {}: {} (errno {})", i, frames.size(),
                                         e.what(), e.num()));
    }
  }
  frames.clear();
  return Status::OK();
}

}  // namespace gridsync::wire
