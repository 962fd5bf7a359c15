// The data plane's decode boundary (message.h): Decode, PeekRequestId, PeekHeader and
// CheckValueBounds, and the header and row-id parsing they share. Encoding
// and the socket helpers are in message.cc.
//
// Every check here returns a Status; nothing asserts on received bytes.
#include <capnp/message.h>
#include <capnp/serialize.h>
#include <kj/array.h>
#include <kj/exception.h>
#include <spdlog/fmt/fmt.h>

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstring>
#include <limits>
#include <optional>
#include <string>
#include <utility>

#include "common/wire/gridsync.capnp.h"
#include "common/wire/message.h"
#include "common/wire/row_ids.h"

namespace gridsync::wire {
namespace {

constexpr uint16_t kLastKind = static_cast<uint16_t>(Kind::kInit);
constexpr uint16_t kLastCodec = static_cast<uint16_t>(schema::Codec::RANDOMK);
constexpr uint16_t kLastRowEncoding = static_cast<uint16_t>(RowEncoding::kDeltaVarint);

// The header as read from the wire, before range checks. Copying it out of
// the Cap'n Proto reader keeps every lazy read (and every exception it may
// throw) inside one try block.
struct RawBlock {
  uint32_t table;
  uint32_t row_count;
  bool dense;
  uint32_t row_begin;
  uint32_t col_begin;
  uint32_t width;
  uint16_t codec;
  double codec_ratio;
  uint8_t codec_bits;
  uint32_t codec_block;
  uint64_t codec_seed;
  uint16_t row_encoding;
};

struct RawHeader {
  uint16_t kind = 0;
  uint64_t step = 0;
  uint32_t worker_rank = 0;
  uint64_t request_id = 0;
  uint32_t shard = 0;
  uint64_t min_version = 0;
  uint32_t num_workers = 0;
  uint16_t push_values = 0;
  bool whole_values = false;
  bool skip_step = false;
  bool evaluation = false;
  uint64_t job = 0;
  uint32_t epoch = 0;
  uint64_t part_row = 0;
  bool more_parts = false;
  bool kind_known = false;  // kind was read and is one of Kind's
  std::vector<RawBlock> blocks;
  uint32_t error_code = 0;
  std::string error_text;
  ShardStats stats;
};

std::string FrameName(size_t frame, const char* what, size_t block, uint32_t table) {
  return fmt::format("frame {} ({} of block {}, table {})", frame, what, block, table);
}

// Parses frame 0. Limits that need the reader (traversal, nesting) are Cap'n
// Proto's own; it reports them, like any malformed pointer, by throwing.
Status ParseHeader(const zmq::message_t& frame, const Limits& limits, RawHeader& out) {
  const size_t size = frame.size();
  if (size == 0) {
    return Status::Corruption(
        "frame 0 (header): empty; expected a Cap'n Proto Header message (a multiple of 8 bytes)");
  }
  if (size > limits.max_header_bytes) {
    return Status::InvalidArgument(
        fmt::format("frame 0 (header): {} bytes; allowed: at most {} (max_header_bytes)", size,
                    limits.max_header_bytes));
  }
  if (size % sizeof(capnp::word) != 0) {
    return Status::Corruption(
        fmt::format("frame 0 (header): {} bytes, not a multiple of 8; a flat Cap'n Proto "
                    "message is whole 8-byte words",
                    size));
  }
  // Cap'n Proto reads words in place; ZeroMQ gives no alignment promise for
  // small (inline) or shared-buffer frames.
  kj::ArrayPtr<const capnp::word> words(static_cast<const capnp::word*>(frame.data()),
                                        size / sizeof(capnp::word));
  kj::Array<capnp::word> aligned;
  if (reinterpret_cast<uintptr_t>(frame.data()) % alignof(capnp::word) != 0) {
    aligned = kj::heapArray<capnp::word>(size / sizeof(capnp::word));
    std::memcpy(aligned.begin(), frame.data(), size);
    words = aligned;
  }

  capnp::ReaderOptions options;
  options.traversalLimitInWords = limits.traversal_limit_words;
  options.nestingLimit = limits.nesting_limit;
  try {
    capnp::FlatArrayMessageReader reader(words, options);
    if (reader.getEnd() != words.end()) {
      return Status::Corruption(fmt::format(
          "frame 0 (header): {} trailing bytes after the Cap'n Proto message; expected the "
          "frame to hold exactly one message",
          (words.end() - reader.getEnd()) * sizeof(capnp::word)));
    }
    auto header = reader.getRoot<schema::Header>();
    const uint16_t version = header.getVersion();
    if (version != kProtocolVersion) {
      return Status::InvalidArgument(
          fmt::format("frame 0 (header): protocol version {}; allowed: version {}, the one "
                      "this build speaks (every worker and shard of a run must be the same "
                      "gridsync release)",
                      version, kProtocolVersion));
    }
    // First, so that a refusal of anything below can still name the request.
    out.request_id = header.getRequestId();
    // Cap'n Proto hands unknown enumerants through as their number.
    out.kind = static_cast<uint16_t>(header.getKind());
    if (out.kind > kLastKind) {
      return Status::InvalidArgument(
          fmt::format("frame 0 (header): message kind {} unknown; allowed: 0..{} (push .. init)",
                      out.kind, kLastKind));
    }
    out.kind_known = true;
    out.step = header.getStep();
    out.worker_rank = header.getWorkerRank();
    out.shard = header.getShard();
    out.min_version = header.getMinVersion();
    out.num_workers = header.getNumWorkers();
    out.push_values = static_cast<uint16_t>(header.getPushValues());
    out.whole_values = header.getWholeValues();
    out.skip_step = header.getSkipStep();
    out.evaluation = header.getEvaluation();
    out.job = header.getJob();
    out.epoch = header.getEpoch();
    out.part_row = header.getPartRow();
    out.more_parts = header.getMoreParts();
    if (out.push_values > static_cast<uint16_t>(PushValues::kUpdates)) {
      return Status::InvalidArgument(fmt::format(
          "frame 0 (header): pushValues {} unknown; allowed: 0 (gradients) or 1 (updates)",
          out.push_values));
    }

    auto blocks = header.getBlocks();
    if (blocks.size() > limits.max_blocks) {
      return Status::InvalidArgument(
          fmt::format("frame 0 (header): {} table blocks; allowed: at most {} (max_blocks)",
                      blocks.size(), limits.max_blocks));
    }
    out.blocks.reserve(blocks.size());
    for (auto b : blocks) {
      out.blocks.push_back(RawBlock{
          b.getTable(), b.getRowCount(), b.getDense(), b.getRowBegin(), b.getColBegin(),
          b.getWidth(), static_cast<uint16_t>(b.getCodec()), b.getCodecRatio(), b.getCodecBits(),
          b.getCodecBlock(), b.getCodecSeed(), static_cast<uint16_t>(b.getRowEncoding())});
    }
    if (out.kind == static_cast<uint16_t>(Kind::kError)) {
      auto error = header.getError();
      out.error_code = error.getCode();
      auto text = error.getText();
      out.error_text.assign(text.begin(), text.size());
    }
    if (out.kind == static_cast<uint16_t>(Kind::kStatsReply)) {
      auto s = header.getStats();
      out.stats = ShardStats{s.getAppliedSteps(), s.getPushes(),  s.getPulls(),   s.getErrors(),
                             s.getRowsOwned(),    s.getBytesIn(), s.getBytesOut()};
    }
  } catch (const kj::Exception& e) {
    return Status::Corruption(fmt::format(
        "frame 0 (header): not a valid Cap'n Proto Header ({}); limits: traversal {} words, "
        "nesting {}",
        e.getDescription().cStr(), limits.traversal_limit_words, limits.nesting_limit));
  }
  return Status::OK();
}

// Returns a 4-byte aligned view of `frame`, copying it into `message.owned`
// only when ZeroMQ left it unaligned (inline storage of small frames, or a
// frame carved out of a shared receive buffer).
const uint32_t* AlignedWords(const zmq::message_t& frame, Message& message) {
  if (frame.size() == 0) return nullptr;
  if (reinterpret_cast<uintptr_t>(frame.data()) % alignof(uint32_t) == 0) {
    return static_cast<const uint32_t*>(frame.data());
  }
  auto& copy = message.owned.emplace_back(frame.size() / sizeof(uint32_t));
  std::memcpy(copy.data(), frame.data(), frame.size());
  return copy.data();
}

}  // namespace

size_t FirstOutOfBounds(std::span<const float> values, float max_abs) {
  // Pushes carry up to hundreds of millions of floats and are almost always
  // fine: a branch-free pass vectorises, and only a bad push pays for the
  // second pass that finds the index. The pass compares magnitudes as
  // integers (sign bit cleared): for non-negative floats the bit patterns
  // order as the values do, and NaN's and infinity's exceed every finite
  // bound's, so one unsigned max decides (a float compare here does not
  // vectorise with GCC 12).
  if (max_abs >= 0.0f && std::isfinite(max_abs)) {
    uint32_t top = 0;
    for (float v : values) top = std::max(top, std::bit_cast<uint32_t>(v) & 0x7fffffffu);
    if (top <= std::bit_cast<uint32_t>(max_abs)) return values.size();
  } else {
    uint32_t bad = 0;
    for (float v : values) bad |= !(std::fabs(v) <= max_abs);
    if (bad == 0) return values.size();
  }
  for (size_t i = 0; i < values.size(); ++i) {
    if (!(std::fabs(values[i]) <= max_abs)) return i;
  }
  return values.size();
}

Status CheckValueBounds(std::span<const float> values, const Limits& limits,
                        std::string_view what) {
  const size_t bad = FirstOutOfBounds(values, limits.max_abs_value);
  if (bad == values.size()) return Status::OK();
  return Status::InvalidArgument(
      fmt::format("{}: decoded value {} at index {}; values must be finite and at most {:g} in "
                  "magnitude",
                  what, values[bad], bad, double{limits.max_abs_value}));
}

uint64_t PeekRequestId(const std::vector<zmq::message_t>& frames, const Limits& limits) {
  return PeekHeader(frames, limits).request_id;
}

PeekedHeader PeekHeader(const std::vector<zmq::message_t>& frames, const Limits& limits) {
  PeekedHeader peeked;
  if (frames.empty()) return peeked;
  RawHeader raw;
  // The status does not matter: the id is read as soon as the version is,
  // and the kind once it is known to be one.
  (void)ParseHeader(frames[0], limits, raw);
  peeked.request_id = raw.request_id;
  if (raw.kind_known) peeked.kind = static_cast<Kind>(raw.kind);
  return peeked;
}

Result<Message> Decode(const std::vector<zmq::message_t>& frames,
                       const std::vector<TableShape>& tables, const Limits& limits) {
  const size_t max_frames = limits.max_frames();
  if (frames.empty() || frames.size() > max_frames) {
    return Status::InvalidArgument(fmt::format(
        "{} frames; allowed: 1 to {} (a header, then at most 2 payload frames for each of at "
        "most {} blocks)",
        frames.size(), max_frames, limits.max_blocks));
  }
  Message message;
  for (size_t f = 0; f < frames.size(); ++f) {
    if (frames[f].size() > limits.max_frame_bytes) {
      return Status::InvalidArgument(
          fmt::format("frame {}: {} bytes; allowed: at most {} (max_frame_bytes)", f,
                      frames[f].size(), limits.max_frame_bytes));
    }
    message.bytes += frames[f].size();
  }

  RawHeader raw;
  GRIDSYNC_RETURN_IF_ERROR(ParseHeader(frames[0], limits, raw));
  message.kind = static_cast<Kind>(raw.kind);
  message.step = raw.step;
  message.worker_rank = raw.worker_rank;
  message.request_id = raw.request_id;
  message.shard = raw.shard;
  message.min_version = raw.min_version;
  message.num_workers = raw.num_workers;
  message.push_values = static_cast<PushValues>(raw.push_values);
  message.whole_values = raw.whole_values;
  message.skip_step = raw.skip_step;
  message.evaluation = raw.evaluation;
  message.job = raw.job;
  message.epoch = raw.epoch;
  message.part_row = raw.part_row;
  message.more_parts = raw.more_parts;
  const char* kind_name = KindName(message.kind);

  const KindLayout layout = LayoutOf(message.kind);
  const bool carries_rows = layout.row_ids;
  const bool carries_values = layout.values;
  if (!layout.blocks && !raw.blocks.empty()) {
    return Status::InvalidArgument(
        fmt::format("a {} lists {} table block(s); allowed: none (this kind carries no rows)",
                    kind_name, raw.blocks.size()));
  }
  if (raw.skip_step && (message.kind != Kind::kPush || !raw.blocks.empty())) {
    return Status::InvalidArgument(fmt::format(
        "a {} with skipStep set lists {} block(s); allowed: skipStep only on a push with no "
        "blocks (an overflowed step)",
        kind_name, raw.blocks.size()));
  }
  if (raw.evaluation && (message.kind != Kind::kPull || !raw.whole_values)) {
    return Status::InvalidArgument(fmt::format(
        "a {} with evaluation set{}; allowed: evaluation only on a pull of whole values", kind_name,
        raw.whole_values ? "" : " but not wholeValues"));
  }

  if ((raw.part_row != 0 || raw.more_parts) && message.kind != Kind::kPullReply) {
    return Status::InvalidArgument(fmt::format(
        "a {} with partRow {} and moreParts {}; allowed: parts only in a pullReply (other kinds: "
        "partRow 0, moreParts false)",
        kind_name, raw.part_row, raw.more_parts));
  }

  // Header-only checks first, so a wrong frame count is reported against a
  // header already known to make sense.
  std::vector<bool> seen(tables.size(), false);
  for (size_t i = 0; i < raw.blocks.size(); ++i) {
    const RawBlock& b = raw.blocks[i];
    if (b.table >= tables.size()) {
      return Status::InvalidArgument(
          tables.empty()
              ? fmt::format("block {}: table {} unknown; this receiver has no tables", i, b.table)
              : fmt::format("block {}: table {} unknown; allowed: 0..{}", i, b.table,
                            tables.size() - 1));
    }
    if (seen[b.table]) {
      return Status::InvalidArgument(fmt::format(
          "block {}: table {} appears twice; allowed: each table at most once per message", i,
          b.table));
    }
    seen[b.table] = true;
    const TableShape& shape = tables[b.table];
    if (b.codec > kLastCodec) {
      return Status::InvalidArgument(fmt::format(
          "block {} (table {}): codec {} unknown; allowed: 0..{} (none, fp16, bf16, int8, qsgd, "
          "onebit, topk, randomk)",
          i, b.table, b.codec, kLastCodec));
    }
    if (b.row_encoding > kLastRowEncoding) {
      return Status::InvalidArgument(fmt::format(
          "block {} (table {}): rowEncoding {} unknown; allowed: 0 (raw) or 1 (deltaVarint)", i,
          b.table, b.row_encoding));
    }
    if (b.row_encoding != static_cast<uint16_t>(RowEncoding::kRaw) && (b.dense || !carries_rows)) {
      return Status::InvalidArgument(fmt::format(
          "block {} (table {}): rowEncoding {} on a {}, which has no row-id frame; allowed: 0 "
          "(raw)",
          i, b.table, RowEncodingName(static_cast<RowEncoding>(b.row_encoding)),
          b.dense ? std::string("dense block") : fmt::format("{} block", kind_name)));
    }
    if (b.codec != 0) {
      CodecOptions options{static_cast<Codec>(b.codec), b.codec_ratio, b.codec_bits, b.codec_block};
      if (Status valid = ValidateCodecOptions(options); !valid.ok()) {
        return Status::InvalidArgument(
            fmt::format("block {} (table {}): {}", i, b.table, valid.message()));
      }
    }
    if (b.width == 0) {
      return Status::InvalidArgument(
          fmt::format("block {} (table {}): width 0; allowed: 1..{} (the table's width)", i,
                      b.table, shape.width));
    }
    if (uint64_t{b.col_begin} + b.width > shape.width) {
      return Status::InvalidArgument(fmt::format(
          "block {} (table {}): columns {}..{} (colBegin {} + width {}) beyond the table's "
          "width {}",
          i, b.table, b.col_begin, uint64_t{b.col_begin} + b.width - 1, b.col_begin, b.width,
          shape.width));
    }
    if (b.row_count > shape.rows) {
      return Status::InvalidArgument(
          fmt::format("block {} (table {}): rowCount {}; allowed: at most {} (the table's rows)", i,
                      b.table, b.row_count, shape.rows));
    }
    if (b.dense && uint64_t{b.row_begin} + b.row_count > shape.rows) {
      return Status::InvalidArgument(fmt::format(
          "block {} (table {}): dense rows {}..{} (rowBegin {} + rowCount {}) beyond the "
          "table's {} rows",
          i, b.table, b.row_begin, uint64_t{b.row_begin} + b.row_count - 1, b.row_begin,
          b.row_count, shape.rows));
    }
  }

  size_t expected_frames = 1;
  for (const RawBlock& b : raw.blocks) {
    expected_frames += (carries_rows && !b.dense ? 1 : 0) + (carries_values ? 1 : 0);
  }
  if (frames.size() != expected_frames) {
    const char* expected_layout = carries_rows && carries_values
                                      ? "per block [row ids unless dense] [values]"
                                  : carries_rows   ? "per block [row ids unless dense]"
                                  : carries_values ? "per block [values]"
                                                   : "nothing (this kind has no payload)";
    return Status::InvalidArgument(
        fmt::format("{} frames, expected {} for a {} with {} block(s): the header, then {} ({})",
                    frames.size(), expected_frames, kind_name, raw.blocks.size(), expected_layout,
                    frames.size() > expected_frames ? "extra frames" : "frames missing"));
  }

  // Pull replies too: a worker copies them into its model, and a shard's
  // parameters stay within what pushes may carry.
  const bool check_finite = message.kind == Kind::kPush || message.kind == Kind::kInit ||
                            message.kind == Kind::kPullReply;
  message.blocks.reserve(raw.blocks.size());
  size_t next = 1;
  for (size_t i = 0; i < raw.blocks.size(); ++i) {
    const RawBlock& b = raw.blocks[i];
    const TableShape& shape = tables[b.table];
    Block& block = message.blocks.emplace_back();
    block.table = b.table;
    block.row_count = b.row_count;
    block.dense = b.dense;
    block.row_begin = b.dense ? b.row_begin : 0;
    block.col_begin = b.col_begin;
    block.width = b.width;

    if (carries_rows && !b.dense) {
      const size_t f = next++;
      const zmq::message_t& frame = frames[f];
      block.row_encoding = static_cast<RowEncoding>(b.row_encoding);
      if (block.row_encoding == RowEncoding::kDeltaVarint) {
        UninitVector<uint32_t>& ids = message.owned.emplace_back();
        GRIDSYNC_RETURN_IF_ERROR(DecodeDeltaVarint(
            static_cast<const uint8_t*>(frame.data()), frame.size(), b.row_count,
            [&] { return FrameName(f, "row ids", i, b.table); }, &ids));
        block.rows = std::span<const uint32_t>(ids.data(), ids.size());
      } else {
        const uint64_t expected = uint64_t{b.row_count} * sizeof(uint32_t);
        if (frame.size() != expected) {
          return Status::InvalidArgument(fmt::format(
              "{}: {} bytes, expected {} ({} rows x 4-byte ids)",
              FrameName(f, "row ids", i, b.table), frame.size(), expected, b.row_count));
        }
        const uint32_t* ids = AlignedWords(frame, message);
        block.rows = std::span<const uint32_t>(ids, b.row_count);
      }
      // Delta decoding gives strictly ascending ids by construction, so
      // its last id bounds them all; raw ids get a branch-free pass. Only a
      // failing block pays for the pass below that names the first bad id.
      bool fine = true;
      if (block.row_encoding == RowEncoding::kDeltaVarint) {
        fine = block.rows.empty() || block.rows.back() < shape.rows;
      } else {
        uint32_t bad = 0;
        for (size_t r = 0; r < block.rows.size(); ++r) {
          bad |= static_cast<uint32_t>(block.rows[r] >= shape.rows);
          bad |= static_cast<uint32_t>(r > 0 && block.rows[r] <= block.rows[r - 1]);
        }
        fine = bad == 0;
      }
      for (size_t r = 0; !fine && r < block.rows.size(); ++r) {
        const uint32_t row = block.rows[r];
        if (row >= shape.rows) {
          return Status::InvalidArgument(
              fmt::format("{}: row {} at index {} out of range; allowed: 0..{} (table rows {})",
                          FrameName(f, "row ids", i, b.table), row, r, shape.rows - 1, shape.rows));
        }
        if (r > 0 && row <= block.rows[r - 1]) {
          return Status::InvalidArgument(fmt::format(
              "{}: row {} at index {} {} row {} at index {}; rows must be strictly ascending",
              FrameName(f, "row ids", i, b.table), row, r,
              row == block.rows[r - 1] ? "duplicates" : "follows", block.rows[r - 1], r - 1));
        }
      }
    }

    // The invariant every consumer relies on: a kind with row ids on the
    // wire yields blocks that name all their rows.
    if (carries_rows && !block.rows_named()) {
      return Status::Internal(fmt::format("block {} (table {}): {} row ids for rowCount {}", i,
                                          b.table, block.rows.size(), b.row_count));
    }

    if (carries_values && b.codec != 0) {
      const size_t f = next++;
      const zmq::message_t& frame = frames[f];
      block.codec =
          CodecOptions{static_cast<Codec>(b.codec), b.codec_ratio, b.codec_bits, b.codec_block};
      block.codec_seed = b.codec_seed;
      const uint64_t count = uint64_t{b.row_count} * b.width;
      if (count > kMaxCodecValues) {
        return Status::InvalidArgument(
            fmt::format("{}: {} values; allowed: at most {} per compressed block",
                        FrameName(f, "values", i, b.table), count, kMaxCodecValues));
      }
      if (Status size = CheckPayloadSize(block.codec, frame.size(), static_cast<size_t>(count));
          !size.ok()) {
        return Status::InvalidArgument(
            fmt::format("{}: {}", FrameName(f, "values", i, b.table), size.message()));
      }
      block.payload =
          std::span<const uint8_t>(static_cast<const uint8_t*>(frame.data()), frame.size());
    } else if (carries_values) {
      const size_t f = next++;
      const zmq::message_t& frame = frames[f];
      const uint64_t count = uint64_t{b.row_count} * b.width;
      if (frame.size() % sizeof(float) != 0 || frame.size() / sizeof(float) != count) {
        return Status::InvalidArgument(fmt::format(
            "{}: {} bytes, expected {} ({} rows x {} floats)", FrameName(f, "values", i, b.table),
            frame.size(), count * sizeof(float), b.row_count, b.width));
      }
      const uint32_t* words = AlignedWords(frame, message);
      block.values =
          std::span<const float>(reinterpret_cast<const float*>(words), static_cast<size_t>(count));
      if (check_finite) {
        const size_t bad = FirstOutOfBounds(block.values, limits.max_abs_value);
        if (bad != block.values.size()) {
          const float v = block.values[bad];
          return Status::InvalidArgument(fmt::format(
              "{}: value {} at index {} (row index {}, column {}); {} values must be finite "
              "and at most {:g} in magnitude ({})",
              FrameName(f, "values", i, b.table), v, bad, bad / b.width,
              b.col_begin + bad % b.width, kind_name, double{limits.max_abs_value},
              message.kind == Kind::kPullReply
                  ? "parameters a shard serves; it holds no other"
                  : "Adam squares gradients; larger values would overflow its state or the "
                    "parameters"));
        }
      }
    }
  }

  if (message.kind == Kind::kError) {
    StatusCode code = StatusCode::kInternal;
    if (IsWireStatusCode(raw.error_code)) {
      code = static_cast<StatusCode>(raw.error_code);
    }
    // An error reply must never read as OK, whatever code the peer sent.
    std::string text =
        raw.error_text.empty()
            ? fmt::format("peer sent an error with code {} and no text", raw.error_code)
            : std::move(raw.error_text);
    message.error = Status(code, std::move(text));
  }
  if (message.kind == Kind::kStatsReply) message.stats = raw.stats;
  return message;
}

}  // namespace gridsync::wire
