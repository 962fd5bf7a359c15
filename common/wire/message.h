// The data-plane messages between workers and PS shards, and the one decode
// boundary every received message passes through.
//
// A message is ZeroMQ multipart: frame 0 a Cap'n Proto Header (schema in
// gridsync.capnp), then raw payload frames per TableBlock. Encode() moves the
// payload vectors into the frames without copying them. Decode() checks
// everything a hostile or broken peer could get wrong (frame count, header
// size, Cap'n Proto traversal and nesting limits, protocol version, kinds,
// table ids, row encodings, row ranges and order, column ranges, frame
// lengths against the header, finite values) and returns a Status naming the
// problem and what is allowed; it never asserts or aborts on input.
//
// Row ids of a sparse block travel in one of two layouts (RowEncoding):
//   raw:         rowCount little-endian uint32 (4 bytes a row), zero copy;
//   deltaVarint: rowCount unsigned LEB128 varints (at most 5 bytes, 32 bits
//                each): rows[0], then rows[i] - rows[i-1] - 1 for i >= 1;
//                the frame holds exactly those varints.
// Encode() picks deltaVarint exactly when its size, the sum of
// VarintBytes(v) = 1 + [v >= 2^7] + [v >= 2^14] + [v >= 2^21] + [v >= 2^28]
// over the values above, is below 4 * rowCount (OutBlock::raw_rows forces
// raw). A hash-grid push has small gaps, so its row ids shrink from 32 to
// about 8 bits a row. Decode() expands deltaVarint into Message::owned.
//
// Thread safety: free functions, reentrant. A decoded Message refers into the
// frames it was decoded from (zero copy) and must not outlive them.
#pragma once

#include <atomic>
#include <cerrno>
#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <vector>
#include <zmq.hpp>

#include "common/codec_format.h"
#include "common/status.h"
#include "common/uninit_vector.h"

namespace gridsync::wire {

// gridsync.capnp's protocolVersion: a peer of another version is refused
// at the decode boundary, naming both.
inline constexpr uint16_t kProtocolVersion = 3;

enum class Kind : uint16_t {
  kPush = 0,
  kPushAck = 1,
  kPull = 2,
  kPullReply = 3,
  kError = 4,
  kStats = 5,
  kStatsReply = 6,
  kInit = 7,
};
const char* KindName(Kind kind);

// Explicit limits of the decode boundary, sized to real messages: a push of
// every row of the largest seed config (log2 T 22, 16 levels) fits.
struct Limits {
  uint64_t max_frame_bytes = uint64_t{1} << 30;  // also set as ZMQ_MAXMSGSIZE
  uint32_t max_blocks = 256;                     // table blocks per message
  uint32_t max_header_bytes = 64 * 1024;
  uint64_t traversal_limit_words = 64 * 1024 / 8 * 4;  // a few passes over a full header
  int nesting_limit = 8;
  // Push and init values: finite and at most this in magnitude. A gradient
  // of 1e15 squares to 1e30, still finite in Adam's v; 3e38 would not be.
  float max_abs_value = 1e15f;
  uint32_t max_frames() const { return 1 + 2 * max_blocks; }
};

// What the receiver knows about the tables, for range checks.
struct TableShape {
  uint64_t rows = 0;
  uint32_t width = 0;
};

// gridsync.capnp's RowEncoding: the layout of a sparse block's row-id frame.
enum class RowEncoding : uint16_t { kRaw = 0, kDeltaVarint = 1 };
// A 32-bit value takes at most 5 LEB128 bytes; the fifth holds bits 28..31.
inline constexpr size_t kMaxVarintBytes = 5;
const char* RowEncodingName(RowEncoding e);

// gridsync.capnp's PushValues.
enum class PushValues : uint16_t { kGradients = 0, kUpdates = 1 };
const char* PushValuesName(PushValues v);

struct ShardStats {
  uint64_t applied_steps = 0;
  uint64_t pushes = 0;
  uint64_t pulls = 0;
  uint64_t errors = 0;
  uint64_t rows_owned = 0;
  uint64_t bytes_in = 0;
  uint64_t bytes_out = 0;
};

// A block as decoded: spans into the received frames (or into Message-owned
// storage when a frame was not 4-byte aligned, or row ids came deltaVarint).
struct Block {
  uint32_t table = 0;
  uint32_t row_count = 0;
  bool dense = false;
  uint32_t row_begin = 0;  // dense only
  uint32_t col_begin = 0;
  uint32_t width = 0;
  std::span<const uint32_t> rows;                // empty when dense; always plain ascending ids
  RowEncoding row_encoding = RowEncoding::kRaw;  // how `rows` travelled
  std::span<const float> values;  // empty when the kind carries no values or is compressed
  // Compressed values (codec.codec != kNone): the receiver decodes payload
  // (the exact size is checked here; the contents by cpu::Decode).
  CodecOptions codec;
  uint64_t codec_seed = 0;
  std::span<const uint8_t> payload;

  // True when the block names every row it covers: dense, or sparse with its
  // row ids on the wire. Decode guarantees it for push, pull and init; only
  // a pullReply's sparse blocks leave it false (their rows are the request's).
  bool rows_named() const { return dense || rows.size() == row_count; }
  // The i-th row; only for blocks whose rows_named(). Decode establishes it
  // for every kind with row ids and ShardStore::CheckOwnership refuses
  // anything else, so this hot accessor carries no check of its own.
  uint32_t Row(size_t i) const { return dense ? row_begin + static_cast<uint32_t>(i) : rows[i]; }
  bool compressed() const { return codec.codec != Codec::kNone; }
};

struct Message {
  Kind kind = Kind::kPush;
  uint64_t step = 0;
  uint32_t worker_rank = 0;
  uint64_t request_id = 0;
  uint32_t shard = 0;
  uint64_t min_version = 0;
  uint32_t num_workers = 0;
  PushValues push_values = PushValues::kGradients;
  bool whole_values = false;  // kPull: no deltas (gridsync.capnp's wholeValues)
  bool skip_step = false;     // kPush: an overflowed step (gridsync.capnp's skipStep)
  bool evaluation = false;    // kPull with whole_values: replicas untouched
  uint64_t job = 0;           // the sender's job (cluster map), 0: none
  uint32_t epoch = 0;         // the sender's epoch of the job (cluster map)
  // kPullReply in parts (gridsync.capnp's partRow, moreParts): the part's
  // first row over the request's blocks, and whether more parts follow.
  // Decode refuses them set on any other kind; the receiver checks that
  // the parts continue each other (PsClient::ReceivePull).
  uint64_t part_row = 0;
  bool more_parts = false;
  std::vector<Block> blocks;
  Status error;        // kind == kError: the refusal, code and text
  ShardStats stats;    // kind == kStatsReply
  uint64_t bytes = 0;  // total bytes of all frames

  // Backing store for frames that had to be copied for alignment, and for
  // row ids expanded from deltaVarint. Moving a Message keeps spans valid.
  std::vector<UninitVector<uint32_t>> owned;
};

// A block to send. Payload vectors are moved into the frames (zero copy).
struct OutBlock {
  uint32_t table = 0;
  bool dense = false;
  uint32_t row_begin = 0;
  uint32_t col_begin = 0;
  uint32_t width = 0;
  uint32_t row_count = 0;      // must equal rows.size() unless dense
  std::vector<uint32_t> rows;  // sparse only; strictly ascending
  // Send rows raw (zero copy) even where deltaVarint would be smaller: for
  // tests and benchmarks. By default Encode picks the smaller layout.
  bool raw_rows = false;
  // row_count * width, for kinds that carry values. Uninitialised on
  // resize: every sender writes them whole (a reply's gather, a push's
  // update), and zero-filling first was a second pass over the message.
  UninitVector<float> values;
  // With a codec, `payload` (EncodedSize bytes) travels instead of values.
  CodecOptions codec;
  uint64_t codec_seed = 0;
  std::vector<uint8_t> payload;
};

struct OutHeader {
  Kind kind = Kind::kPush;
  uint64_t step = 0;
  uint32_t worker_rank = 0;
  uint64_t request_id = 0;
  uint32_t shard = 0;
  uint64_t min_version = 0;
  uint32_t num_workers = 0;
  PushValues push_values = PushValues::kGradients;  // kPush
  bool whole_values = false;                        // kPull
  bool skip_step = false;                           // kPush: mixed precision overflow
  bool evaluation = false;                          // kPull: whole, replicas untouched
  uint64_t job = 0;                                 // the sender's job (cluster map)
  uint32_t epoch = 0;                               // ... and its epoch (rollbacks)
  uint64_t part_row = 0;                            // kPullReply: see Message
  bool more_parts = false;                          // kPullReply: see Message
  ShardStats stats;                                 // kStatsReply
};

// What a kind's header may describe and which payload frames follow it: the
// one table Encode, Decode and every receiver read, so what is validated and
// what is used cannot disagree. A kind without blocks (pushAck, error, stats,
// statsReply) is refused if its header lists any; a kind whose rows are not
// on the wire (pullReply: they are the request's) decodes sparse blocks with
// no row ids, and Block::rows_named() says so.
struct KindLayout {
  bool blocks = false;   // the header may list table blocks
  bool row_ids = false;  // a row-id frame per sparse block
  bool values = false;   // a values frame per block
};
KindLayout LayoutOf(Kind kind);
inline bool KindCarriesRows(Kind kind) { return LayoutOf(kind).row_ids; }
inline bool KindCarriesValues(Kind kind) { return LayoutOf(kind).values; }

// Payload bytes handed to ZeroMQ in frames and not yet released by it
// (written to the socket, or dropped with it): what a peer that does not
// read its replies makes the sender hold. Counted into `total` as well,
// when set (one counter per peer, one for them all). The frames share
// ownership, so a counter lives as long as the frames it counts.
struct UnsentBytes {
  std::atomic<uint64_t> bytes{0};
  std::shared_ptr<UnsentBytes> total;
  void Add(uint64_t n);
  void Sub(uint64_t n);
};

// Calls fn() again while it throws EINTR: a signal landing in a ZeroMQ call
// (a profiler's, a supervisor's, a fuzzer's timer) is not a failure. Any
// other zmq::error_t is the caller's; a call with a timeout should recompute
// it on the next try (this retries with the same arguments).
template <typename Fn>
auto RetryOnEintr(Fn&& fn) {
  for (;;) {
    try {
      return fn();
    } catch (const zmq::error_t& e) {
      if (e.num() != EINTR) throw;
    }
  }
}

// `unsent` (optional) counts the payload frames until ZeroMQ releases them.
std::vector<zmq::message_t> Encode(const OutHeader& header, std::vector<OutBlock> blocks,
                                   std::shared_ptr<UnsentBytes> unsent = nullptr);
// The same frames, the blocks left as they are: what must travel as the
// caller's own bytes (raw row ids, values, payloads) is copied, deltaVarint
// row ids are written from them. For a request whose blocks the sender
// keeps (a pull remembers what it asked), so that the common case, rows
// sent as deltaVarint, copies no row at all.
std::vector<zmq::message_t> EncodeCopy(const OutHeader& header,
                                       const std::vector<OutBlock>& blocks);

// The index of the first of `values` that is not finite or exceeds max_abs
// in magnitude; values.size() when there is none. Vectorised: only a span
// with a bad value pays for the second pass that finds it.
size_t FirstOutOfBounds(std::span<const float> values, float max_abs);

// The bound Decode applies to push and init values (finite, at most
// limits.max_abs_value in magnitude), for values a receiver decoded from a
// codec's payload itself. `what` prefixes the message.
Status CheckValueBounds(std::span<const float> values, const Limits& limits, std::string_view what);

// Bytes of the row-id frame Encode writes for these rows (strictly
// ascending): the smaller of raw and deltaVarint.
size_t RowIdFrameBytes(const std::vector<uint32_t>& rows);
std::vector<zmq::message_t> EncodeError(uint64_t request_id, uint32_t shard, const Status& error);

// `frames` as frames whose bytes `unsent` counts until ZeroMQ releases them
// (copies: for small replies, an error or an ack, that Encode did not count).
std::vector<zmq::message_t> Counted(std::vector<zmq::message_t> frames,
                                    const std::shared_ptr<UnsentBytes>& unsent);

// The request id of a message Decode refused, when its header got as far as
// a readable version (0 otherwise; senders never use 0), so the refusal can
// name the request it answers.
uint64_t PeekRequestId(const std::vector<zmq::message_t>& frames, const Limits& limits);
// The same, with the message's kind when its header got as far as a known
// kind (nullopt otherwise), from one parse: so that a receiver can refuse a
// kind it does not take by its kind, not by what Decode found wrong with it
// as that kind (a pullReply sent to a shard fails Decode as a reply).
struct PeekedHeader {
  uint64_t request_id = 0;
  std::optional<Kind> kind;
};
PeekedHeader PeekHeader(const std::vector<zmq::message_t>& frames, const Limits& limits);

// The decode boundary. `tables` gives the valid table ids and their shapes;
// rows must be strictly ascending and < rows of the table, col_begin + width
// <= the table's width, values finite (for pushes and init).
Result<Message> Decode(const std::vector<zmq::message_t>& frames,
                       const std::vector<TableShape>& tables, const Limits& limits);
// The decoded spans point into `frames`: decoding a temporary would leave
// them dangling as soon as the statement ends.
Result<Message> Decode(std::vector<zmq::message_t>&& frames, const std::vector<TableShape>& tables,
                       const Limits& limits) = delete;

// Receives one multipart message with a timeout (ms, -1 = forever). Returns
// kTimeout when nothing arrived, and refuses (after draining it) a message
// with more than envelope_frames + limits.max_frames() frames. A ROUTER
// socket passes envelope_frames = 1 for the peer's routing id, which stays
// the first returned frame. When a message is refused for its frame count,
// its envelope is moved to *refused_envelope (if given), so a ROUTER can
// still address the Error reply to the sender.
//
// *taken (if given) says which connection the message came from (its
// descriptor, ZMQ_SRCFD) and how many bytes it took off the wire (its
// frames past the envelope with their ZMTP framing, refused ones too), for
// wire::ConnectionCap's count of what each connection holds unread.
struct TakenBytes {
  bool curve = false;  // in: the socket runs CURVE (each frame boxed)
  int fd = -1;
  uint64_t bytes = 0;
};
// A frame of `size` bytes on the wire: ZMTP 3.0 framing (a flags byte and
// a length of 1 byte, or of 8 past 255), under CURVE around its MESSAGE
// box ("\x07MESSAGE", an 8-byte nonce, a flags byte, a 16-byte MAC).
// Exact: what is taken must never exceed what was received, or a peer
// could bank credit for an unfinished message.
uint64_t WireFrameBytes(uint64_t size, bool curve);
Result<std::vector<zmq::message_t>> ReceiveMultipart(
    zmq::socket_t& socket, int timeout_ms, const Limits& limits, int envelope_frames = 0,
    std::vector<zmq::message_t>* refused_envelope = nullptr, TakenBytes* taken = nullptr);
// Sends all frames; ZeroMQ owns them afterwards.
Status SendMultipart(zmq::socket_t& socket, std::vector<zmq::message_t>& frames);

}  // namespace gridsync::wire
