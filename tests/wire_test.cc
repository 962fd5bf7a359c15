// The data-plane wire: round trips of every kind, zero copy on both sides,
// every class of malformed input refused with a Status that names it, and
// real sockets (inproc and TCP on 127.0.0.1).
#include <capnp/message.h>
#include <capnp/serialize.h>
#include <gtest/gtest.h>

#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <optional>
#include <random>
#include <string>
#include <vector>

#include "common/wire/gridsync.capnp.h"
#include "common/wire/message.h"

namespace gridsync::wire {
namespace {

// gmock is not linked here; this says what EXPECT_THAT(text, HasSubstr(part)) would.
#define EXPECT_HAS_SUBSTR(text, part)                        \
  EXPECT_NE(std::string(text).find(part), std::string::npos) \
      << "expected \"" << (part) << "\" in \"" << (text) << "\""

// Table 0: a hashed level; 1: a small dense one; 2: big enough for 1M rows.
std::vector<TableShape> Tables() { return {{1000, 4}, {64, 2}, {uint64_t{1} << 22, 2}}; }

std::vector<float> Iota(size_t n, float start = 0.5f) {
  std::vector<float> v(n);
  for (size_t i = 0; i < n; ++i) v[i] = start + static_cast<float>(i);
  return v;
}

zmq::message_t CopyFrame(const zmq::message_t& frame) {
  return zmq::message_t(frame.data(), frame.size());
}

std::vector<zmq::message_t> CopyFrames(const std::vector<zmq::message_t>& frames) {
  std::vector<zmq::message_t> out;
  for (const auto& f : frames) out.push_back(CopyFrame(f));
  return out;
}

zmq::message_t FrameOf(capnp::MallocMessageBuilder& builder) {
  auto words = capnp::messageToFlatArray(builder);
  auto bytes = words.asBytes();
  return zmq::message_t(bytes.begin(), bytes.size());
}

template <typename T>
zmq::message_t FrameOf(const std::vector<T>& v) {
  return zmq::message_t(v.data(), v.size() * sizeof(T));
}

// A push with a sparse block (table 0) and a dense block (table 1). Its row
// ids {1, 5, 999} travel deltaVarint unless raw_rows.
std::vector<zmq::message_t> ValidPush(bool raw_rows = false) {
  OutHeader h;
  h.kind = Kind::kPush;
  h.step = 7;
  std::vector<OutBlock> blocks(2);
  blocks[0].table = 0;
  blocks[0].width = 4;
  blocks[0].row_count = 3;
  blocks[0].rows = {1, 5, 999};
  blocks[0].raw_rows = raw_rows;
  blocks[0].values = Iota(12);
  blocks[1].table = 1;
  blocks[1].dense = true;
  blocks[1].row_begin = 10;
  blocks[1].row_count = 20;
  blocks[1].col_begin = 1;
  blocks[1].width = 1;
  blocks[1].values = Iota(20, 100.0f);
  return Encode(h, std::move(blocks));
}

struct RawBlockSpec {
  uint32_t table = 0;
  uint32_t row_count = 0;
  bool dense = false;
  uint32_t row_begin = 0;
  uint32_t col_begin = 0;
  uint32_t width = 1;
  uint16_t row_encoding = 0;  // gridsync.capnp's RowEncoding, or any unknown number
};

// Builds a header with the generated API, bypassing Encode's own checks, so
// that tests can say anything a hostile peer could.
zmq::message_t RawHeader(schema::MessageKind kind, const std::vector<RawBlockSpec>& blocks,
                         uint16_t version = kProtocolVersion) {
  capnp::MallocMessageBuilder builder;
  auto h = builder.initRoot<schema::Header>();
  h.setVersion(version);
  h.setKind(kind);
  auto list = h.initBlocks(static_cast<unsigned>(blocks.size()));
  for (size_t i = 0; i < blocks.size(); ++i) {
    auto b = list[static_cast<unsigned>(i)];
    b.setTable(blocks[i].table);
    b.setRowCount(blocks[i].row_count);
    b.setDense(blocks[i].dense);
    b.setRowBegin(blocks[i].row_begin);
    b.setColBegin(blocks[i].col_begin);
    b.setWidth(blocks[i].width);
    b.setRowEncoding(static_cast<schema::RowEncoding>(blocks[i].row_encoding));
  }
  return FrameOf(builder);
}

// Asserts that decoding fails with `code` and a message containing every
// one of `parts`.
void ExpectRefused(const Result<Message>& result, StatusCode code,
                   std::initializer_list<const char*> parts) {
  ASSERT_FALSE(result.ok()) << "expected a refusal mentioning " << *parts.begin();
  EXPECT_EQ(result.status().code(), code) << result.status().ToString();
  for (const char* part : parts) {
    EXPECT_HAS_SUBSTR(result.status().message(), part) << result.status().ToString();
  }
}

// ---- Round trips ----

TEST(WireKindTest, NamesAndPayloadFrames) {
  EXPECT_STREQ(KindName(Kind::kPush), "push");
  EXPECT_STREQ(KindName(Kind::kPushAck), "pushAck");
  EXPECT_STREQ(KindName(Kind::kPull), "pull");
  EXPECT_STREQ(KindName(Kind::kPullReply), "pullReply");
  EXPECT_STREQ(KindName(Kind::kError), "error");
  EXPECT_STREQ(KindName(Kind::kStats), "stats");
  EXPECT_STREQ(KindName(Kind::kStatsReply), "statsReply");
  EXPECT_STREQ(KindName(Kind::kInit), "init");
  EXPECT_STREQ(KindName(static_cast<Kind>(99)), "unknown");
  const Kind all[] = {Kind::kPush,  Kind::kPushAck, Kind::kPull,       Kind::kPullReply,
                      Kind::kError, Kind::kStats,   Kind::kStatsReply, Kind::kInit};
  for (Kind k : all) {
    EXPECT_EQ(KindCarriesRows(k), k == Kind::kPush || k == Kind::kPull || k == Kind::kInit)
        << KindName(k);
    EXPECT_EQ(KindCarriesValues(k), k == Kind::kPush || k == Kind::kPullReply || k == Kind::kInit)
        << KindName(k);
  }
}

TEST(WireRoundTripTest, PushSparseAndDenseBlocks) {
  OutHeader h;
  h.kind = Kind::kPush;
  h.step = 123456789012345ull;
  h.worker_rank = 3;
  h.request_id = 99;
  h.shard = 2;
  h.min_version = 5;
  h.num_workers = 4;
  h.push_values = PushValues::kUpdates;
  auto frames = ValidPush();
  // Re-encode with every header field set.
  {
    std::vector<OutBlock> blocks(2);
    blocks[0].table = 0;
    blocks[0].width = 4;
    blocks[0].row_count = 3;
    blocks[0].rows = {1, 5, 999};
    blocks[0].values = Iota(12);
    blocks[1].table = 1;
    blocks[1].dense = true;
    blocks[1].row_begin = 10;
    blocks[1].row_count = 20;
    blocks[1].col_begin = 1;
    blocks[1].width = 1;
    blocks[1].values = Iota(20, 100.0f);
    frames = Encode(h, std::move(blocks));
  }
  ASSERT_EQ(frames.size(), 4u);  // header, rows + values, values (dense)
  uint64_t total = 0;
  for (const auto& f : frames) total += f.size();

  auto decoded = Decode(frames, Tables(), Limits{});
  ASSERT_TRUE(decoded.ok()) << decoded.status().ToString();
  const Message& m = *decoded;
  EXPECT_EQ(m.kind, Kind::kPush);
  EXPECT_EQ(m.step, 123456789012345ull);
  EXPECT_EQ(m.worker_rank, 3u);
  EXPECT_EQ(m.request_id, 99u);
  EXPECT_EQ(m.shard, 2u);
  EXPECT_EQ(m.min_version, 5u);
  EXPECT_EQ(m.num_workers, 4u);
  EXPECT_EQ(m.push_values, PushValues::kUpdates);
  EXPECT_TRUE(m.error.ok());
  EXPECT_EQ(m.bytes, total);
  ASSERT_EQ(m.blocks.size(), 2u);

  const Block& s = m.blocks[0];
  EXPECT_EQ(s.table, 0u);
  EXPECT_EQ(s.row_count, 3u);
  EXPECT_FALSE(s.dense);
  EXPECT_EQ(s.row_begin, 0u);
  EXPECT_EQ(s.col_begin, 0u);
  EXPECT_EQ(s.width, 4u);
  ASSERT_EQ(s.rows.size(), 3u);
  EXPECT_EQ(s.Row(0), 1u);
  EXPECT_EQ(s.Row(1), 5u);
  EXPECT_EQ(s.Row(2), 999u);
  ASSERT_EQ(s.values.size(), 12u);
  for (size_t i = 0; i < 12; ++i) EXPECT_EQ(s.values[i], 0.5f + i) << i;

  const Block& d = m.blocks[1];
  EXPECT_EQ(d.table, 1u);
  EXPECT_EQ(d.row_count, 20u);
  EXPECT_TRUE(d.dense);
  EXPECT_EQ(d.row_begin, 10u);
  EXPECT_EQ(d.col_begin, 1u);
  EXPECT_EQ(d.width, 1u);
  EXPECT_TRUE(d.rows.empty());
  EXPECT_EQ(d.Row(0), 10u);
  EXPECT_EQ(d.Row(19), 29u);
  ASSERT_EQ(d.values.size(), 20u);
  for (size_t i = 0; i < 20; ++i) EXPECT_EQ(d.values[i], 100.0f + i) << i;
}

TEST(WireRoundTripTest, PullSparseAndDense) {
  OutHeader h;
  h.kind = Kind::kPull;
  h.request_id = 11;
  h.worker_rank = 1;
  h.shard = 0;
  h.min_version = 42;
  std::vector<OutBlock> blocks(2);
  blocks[0].table = 2;
  blocks[0].width = 2;
  blocks[0].row_count = 4;
  blocks[0].rows = {0, 7, 8, (1u << 22) - 1};
  blocks[1].table = 0;
  blocks[1].dense = true;
  blocks[1].row_begin = 0;
  blocks[1].row_count = 1000;
  blocks[1].col_begin = 2;
  blocks[1].width = 2;
  auto frames = Encode(h, std::move(blocks));
  ASSERT_EQ(frames.size(), 2u);  // header + the sparse block's row ids

  auto m = Decode(frames, Tables(), Limits{});
  ASSERT_TRUE(m.ok()) << m.status().ToString();
  EXPECT_EQ(m->kind, Kind::kPull);
  EXPECT_EQ(m->request_id, 11u);
  EXPECT_EQ(m->worker_rank, 1u);
  EXPECT_EQ(m->min_version, 42u);
  ASSERT_EQ(m->blocks.size(), 2u);
  EXPECT_EQ(m->blocks[0].table, 2u);
  EXPECT_EQ(m->blocks[0].width, 2u);
  ASSERT_EQ(m->blocks[0].rows.size(), 4u);
  EXPECT_EQ(m->blocks[0].Row(3), (1u << 22) - 1);
  EXPECT_TRUE(m->blocks[0].values.empty());
  EXPECT_TRUE(m->blocks[1].dense);
  EXPECT_EQ(m->blocks[1].row_count, 1000u);
  EXPECT_EQ(m->blocks[1].col_begin, 2u);
  EXPECT_EQ(m->blocks[1].Row(999), 999u);
  EXPECT_TRUE(m->blocks[1].values.empty());
}

// An evaluation's pull (whole values, the worker's replica left alone)
// round-trips; the flag anywhere else is refused at the decode boundary.
TEST(WireRoundTripTest, EvaluationOnlyOnAWholePull) {
  // Decodes a header of `kind` with the flags; returns the status and the
  // decoded evaluation flag.
  auto pull = [](bool whole, bool evaluation, Kind kind) -> std::pair<Status, bool> {
    OutHeader h;
    h.kind = kind;
    h.whole_values = whole;
    h.evaluation = evaluation;
    std::vector<OutBlock> blocks;
    if (kind == Kind::kPull) {
      blocks.resize(1);
      blocks[0].table = 0;
      blocks[0].dense = true;
      blocks[0].row_count = 10;
      blocks[0].width = 2;
    }
    auto frames = Encode(h, std::move(blocks));
    auto m = Decode(frames, Tables(), Limits{});
    if (!m.ok()) return {m.status(), false};
    return {Status::OK(), m->evaluation && m->whole_values};
  };
  const auto ok = pull(true, true, Kind::kPull);
  ASSERT_TRUE(ok.first.ok()) << ok.first.ToString();
  EXPECT_TRUE(ok.second);
  EXPECT_FALSE(pull(true, false, Kind::kPull).second);
  for (const auto& bad : {pull(false, true, Kind::kPull), pull(true, true, Kind::kStats)}) {
    EXPECT_EQ(bad.first.code(), StatusCode::kInvalidArgument);
    EXPECT_NE(bad.first.message().find("evaluation only on a pull of whole values"),
              std::string::npos)
        << bad.first.ToString();
  }
}

TEST(WireRoundTripTest, PullReplyCarriesOnlyValues) {
  OutHeader h;
  h.kind = Kind::kPullReply;
  h.step = 17;  // appliedSteps
  h.request_id = 11;
  h.shard = 1;
  std::vector<OutBlock> blocks(1);
  blocks[0].table = 0;
  blocks[0].width = 4;
  blocks[0].row_count = 3;
  blocks[0].rows = {1, 2, 3};  // not sent: the puller knows which rows it asked for
  blocks[0].values = Iota(12, -3.0f);
  auto frames = Encode(h, std::move(blocks));
  ASSERT_EQ(frames.size(), 2u);

  auto m = Decode(frames, Tables(), Limits{});
  ASSERT_TRUE(m.ok()) << m.status().ToString();
  EXPECT_EQ(m->kind, Kind::kPullReply);
  EXPECT_EQ(m->step, 17u);
  EXPECT_EQ(m->request_id, 11u);
  EXPECT_EQ(m->shard, 1u);
  ASSERT_EQ(m->blocks.size(), 1u);
  EXPECT_EQ(m->blocks[0].row_count, 3u);
  EXPECT_TRUE(m->blocks[0].rows.empty());
  ASSERT_EQ(m->blocks[0].values.size(), 12u);
  EXPECT_EQ(m->blocks[0].values[0], -3.0f);
  EXPECT_EQ(m->blocks[0].values[11], 8.0f);
}

TEST(WireRoundTripTest, PullReplyDoesNotCheckFiniteness) {
  // Only gradients and initial values are checked: a diverged model's
  // parameters are still the shard's answer, and the worker decides.
  OutHeader h;
  h.kind = Kind::kPullReply;
  std::vector<OutBlock> blocks(1);
  blocks[0].table = 1;
  blocks[0].dense = true;
  blocks[0].row_count = 1;
  blocks[0].width = 2;
  blocks[0].values = {std::numeric_limits<float>::quiet_NaN(), 1.0f};
  const auto frames = Encode(h, std::move(blocks));
  auto m = Decode(frames, Tables(), Limits{});
  ASSERT_TRUE(m.ok()) << m.status().ToString();
  EXPECT_TRUE(std::isnan(m->blocks[0].values[0]));
}

TEST(WireRoundTripTest, InitSparseAndDense) {
  OutHeader h;
  h.kind = Kind::kInit;
  h.worker_rank = 0;
  h.shard = 3;
  std::vector<OutBlock> blocks(2);
  blocks[0].table = 1;
  blocks[0].dense = true;
  blocks[0].row_count = 64;
  blocks[0].width = 2;
  blocks[0].values = Iota(128);
  blocks[1].table = 0;
  blocks[1].row_count = 2;
  blocks[1].rows = {3, 4};
  blocks[1].col_begin = 3;
  blocks[1].width = 1;
  blocks[1].values = {1e-3f, -1e-3f};
  auto frames = Encode(h, std::move(blocks));
  ASSERT_EQ(frames.size(), 4u);

  auto m = Decode(frames, Tables(), Limits{});
  ASSERT_TRUE(m.ok()) << m.status().ToString();
  EXPECT_EQ(m->kind, Kind::kInit);
  EXPECT_EQ(m->shard, 3u);
  ASSERT_EQ(m->blocks.size(), 2u);
  EXPECT_TRUE(m->blocks[0].dense);
  EXPECT_EQ(m->blocks[0].values.size(), 128u);
  EXPECT_EQ(m->blocks[0].values[127], 127.5f);
  EXPECT_EQ(m->blocks[1].col_begin, 3u);
  EXPECT_EQ(m->blocks[1].Row(1), 4u);
  EXPECT_EQ(m->blocks[1].values[1], -1e-3f);
}

TEST(WireRoundTripTest, PushAckAndStats) {
  for (Kind kind : {Kind::kPushAck, Kind::kStats}) {
    OutHeader h;
    h.kind = kind;
    h.step = 8;
    h.request_id = 1234;
    h.shard = 5;
    h.worker_rank = 6;
    auto frames = Encode(h, {});
    ASSERT_EQ(frames.size(), 1u);
    auto m = Decode(frames, Tables(), Limits{});
    ASSERT_TRUE(m.ok()) << m.status().ToString();
    EXPECT_EQ(m->kind, kind);
    EXPECT_EQ(m->step, 8u);
    EXPECT_EQ(m->request_id, 1234u);
    EXPECT_EQ(m->shard, 5u);
    EXPECT_EQ(m->worker_rank, 6u);
    EXPECT_TRUE(m->blocks.empty());
    EXPECT_TRUE(m->error.ok());
    EXPECT_EQ(m->stats.pushes, 0u);
    EXPECT_EQ(m->bytes, frames[0].size());
  }
}

TEST(WireRoundTripTest, StatsReply) {
  OutHeader h;
  h.kind = Kind::kStatsReply;
  h.request_id = 77;
  h.shard = 1;
  h.stats = ShardStats{1, 2, 3, 4, 5, 6, uint64_t{1} << 40};
  const auto frames = Encode(h, {});
  auto m = Decode(frames, Tables(), Limits{});
  ASSERT_TRUE(m.ok()) << m.status().ToString();
  EXPECT_EQ(m->kind, Kind::kStatsReply);
  EXPECT_EQ(m->request_id, 77u);
  EXPECT_EQ(m->shard, 1u);
  EXPECT_EQ(m->stats.applied_steps, 1u);
  EXPECT_EQ(m->stats.pushes, 2u);
  EXPECT_EQ(m->stats.pulls, 3u);
  EXPECT_EQ(m->stats.errors, 4u);
  EXPECT_EQ(m->stats.rows_owned, 5u);
  EXPECT_EQ(m->stats.bytes_in, 6u);
  EXPECT_EQ(m->stats.bytes_out, uint64_t{1} << 40);
}

TEST(WireRoundTripTest, Error) {
  auto frames = EncodeError(31, 2, Status::NotFound("table 9 unknown; allowed: 0..2"));
  ASSERT_EQ(frames.size(), 1u);
  auto m = Decode(frames, Tables(), Limits{});
  ASSERT_TRUE(m.ok()) << m.status().ToString();
  EXPECT_EQ(m->kind, Kind::kError);
  EXPECT_EQ(m->request_id, 31u);
  EXPECT_EQ(m->shard, 2u);
  EXPECT_EQ(m->error.code(), StatusCode::kNotFound);
  EXPECT_EQ(m->error.message(), "table 9 unknown; allowed: 0..2");
  EXPECT_TRUE(m->blocks.empty());
}

TEST(WireRoundTripTest, ErrorWithUnknownOrOkCodeBecomesInternal) {
  for (uint32_t code : {0u, 8u, 1000u}) {
    capnp::MallocMessageBuilder builder;
    auto h = builder.initRoot<schema::Header>();
    h.setVersion(kProtocolVersion);
    h.setKind(schema::MessageKind::ERROR);
    h.initError().setCode(code);
    h.getError().setText("boom");
    std::vector<zmq::message_t> frames;
    frames.push_back(FrameOf(builder));
    auto m = Decode(frames, Tables(), Limits{});
    ASSERT_TRUE(m.ok()) << m.status().ToString();
    EXPECT_FALSE(m->error.ok()) << "code " << code;
    EXPECT_EQ(m->error.code(), StatusCode::kInternal) << "code " << code;
    EXPECT_EQ(m->error.message(), "boom");
  }
}

TEST(WireRoundTripTest, HugeErrorTextIsTruncatedToStayDecodable) {
  auto frames = EncodeError(1, 0, Status::InvalidArgument(std::string(200000, 'x')));
  ASSERT_EQ(frames.size(), 1u);
  EXPECT_LE(frames[0].size(), Limits{}.max_header_bytes);
  auto m = Decode(frames, Tables(), Limits{});
  ASSERT_TRUE(m.ok()) << m.status().ToString();
  EXPECT_EQ(m->error.code(), StatusCode::kInvalidArgument);
  EXPECT_HAS_SUBSTR(m->error.message(), "(truncated)");
}

// ---- Zero copy ----

TEST(WireZeroCopyTest, EncodeMovesPayloadIntoFrames) {
  std::vector<uint32_t> rows(5000);
  for (uint32_t i = 0; i < rows.size(); ++i) rows[i] = 2 * i;
  std::vector<float> values = Iota(rows.size() * 2);
  const void* rows_data = rows.data();
  const void* values_data = values.data();

  OutHeader h;
  std::vector<OutBlock> blocks(1);
  blocks[0].table = 2;
  blocks[0].width = 2;
  blocks[0].row_count = static_cast<uint32_t>(rows.size());
  blocks[0].rows = std::move(rows);
  blocks[0].raw_rows = true;  // gaps of 2 would otherwise travel deltaVarint
  blocks[0].values = std::move(values);
  auto frames = Encode(h, std::move(blocks));
  ASSERT_EQ(frames.size(), 3u);
  EXPECT_EQ(frames[1].data(), rows_data);
  EXPECT_EQ(frames[2].data(), values_data);
  EXPECT_EQ(frames[1].size(), 5000u * 4);
  EXPECT_EQ(frames[2].size(), 10000u * 4);
}

TEST(WireZeroCopyTest, DecodeSpansPointIntoFrames) {
  OutHeader h;
  std::vector<OutBlock> blocks(1);
  blocks[0].table = 2;
  blocks[0].width = 2;
  blocks[0].row_count = 100000;
  blocks[0].rows.resize(100000);
  for (uint32_t i = 0; i < 100000; ++i) blocks[0].rows[i] = 40 * i + 1;
  blocks[0].raw_rows = true;  // only raw row ids can be zero copy
  blocks[0].values = Iota(200000);
  auto frames = Encode(h, std::move(blocks));
  auto m = Decode(frames, Tables(), Limits{});
  ASSERT_TRUE(m.ok()) << m.status().ToString();
  EXPECT_EQ(static_cast<const void*>(m->blocks[0].rows.data()), frames[1].data());
  EXPECT_EQ(static_cast<const void*>(m->blocks[0].values.data()), frames[2].data());
  EXPECT_TRUE(m->owned.empty());
}

TEST(WireZeroCopyTest, UnalignedFramesAreCopiedAndStillDecode) {
  auto good = ValidPush();
  // Place each frame at an odd address inside one buffer; frames made with a
  // null free function refer to the buffer without copying.
  std::vector<unsigned char> buffer(good[0].size() + good[1].size() + good[2].size() +
                                    good[3].size() + 64);
  std::vector<zmq::message_t> frames;
  size_t offset = 4;  // 4- but not 8-aligned for the header
  for (size_t i = 0; i < good.size(); ++i) {
    unsigned char* at = buffer.data() + offset;
    std::memcpy(at, good[i].data(), good[i].size());
    frames.emplace_back(at, good[i].size(), nullptr, nullptr);
    offset += good[i].size() + (i == 0 ? 1 : 0);  // payload frames misaligned by 1
  }
  ASSERT_NE(reinterpret_cast<uintptr_t>(frames[0].data()) % 8, 0u);
  ASSERT_NE(reinterpret_cast<uintptr_t>(frames[1].data()) % 4, 0u);

  auto m = Decode(frames, Tables(), Limits{});
  ASSERT_TRUE(m.ok()) << m.status().ToString();
  EXPECT_EQ(m->owned.size(), 3u);
  for (const Block& b : m->blocks) {
    EXPECT_EQ(reinterpret_cast<uintptr_t>(b.values.data()) % alignof(float), 0u);
    EXPECT_EQ(reinterpret_cast<uintptr_t>(b.rows.data()) % alignof(uint32_t), 0u);
  }
  EXPECT_EQ(m->blocks[0].Row(2), 999u);
  EXPECT_EQ(m->blocks[0].values[11], 11.5f);
  EXPECT_EQ(m->blocks[1].values[19], 119.0f);
}

// ---- Row encodings ----

// A table as large as 32-bit row ids allow, for gaps past 2^28.
std::vector<TableShape> HugeTables() { return {{uint64_t{1} << 32, 1}}; }

std::vector<uint8_t> Bytes(const zmq::message_t& frame) {
  const auto* p = static_cast<const uint8_t*>(frame.data());
  return std::vector<uint8_t>(p, p + frame.size());
}

// A pull of one sparse block of table `table`.
std::vector<zmq::message_t> PullRows(std::vector<uint32_t> rows, uint32_t table = 2,
                                     bool raw_rows = false) {
  OutHeader h;
  h.kind = Kind::kPull;
  std::vector<OutBlock> blocks(1);
  blocks[0].table = table;
  blocks[0].width = 1;
  blocks[0].row_count = static_cast<uint32_t>(rows.size());
  blocks[0].rows = std::move(rows);
  blocks[0].raw_rows = raw_rows;
  return Encode(h, std::move(blocks));
}

TEST(WireRowEncodingTest, SmallGapsTravelDeltaVarintInEveryKindWithRows) {
  const std::vector<uint32_t> rows = {0, 1, 2, 130, 1000000};
  // 0, gaps-1 0 and 0, 127 (one byte each); 999869 = 0x3d 0x03 0x3d in
  // 7-bit groups, low first (three bytes): 7 bytes instead of 20.
  const std::vector<uint8_t> expected = {0x00, 0x00, 0x00, 0x7f, 0xbd, 0x83, 0x3d};
  for (Kind kind : {Kind::kPush, Kind::kPull, Kind::kInit}) {
    OutHeader h;
    h.kind = kind;
    std::vector<OutBlock> blocks(1);
    blocks[0].table = 2;
    blocks[0].width = 2;
    blocks[0].row_count = 5;
    blocks[0].rows = rows;
    if (KindCarriesValues(kind)) blocks[0].values = Iota(10);
    const auto frames = Encode(h, std::move(blocks));
    ASSERT_EQ(frames.size(), KindCarriesValues(kind) ? 3u : 2u) << KindName(kind);
    EXPECT_EQ(Bytes(frames[1]), expected) << KindName(kind);

    auto m = Decode(frames, Tables(), Limits{});
    ASSERT_TRUE(m.ok()) << KindName(kind) << ": " << m.status().ToString();
    const Block& b = m->blocks[0];
    EXPECT_EQ(b.row_encoding, RowEncoding::kDeltaVarint);
    EXPECT_EQ(std::vector<uint32_t>(b.rows.begin(), b.rows.end()), rows) << KindName(kind);
    EXPECT_EQ(b.Row(4), 1000000u);
    // Decoded ids live in the message, not in the frame.
    ASSERT_EQ(m->owned.size(), 1u);
    EXPECT_EQ(static_cast<const void*>(b.rows.data()), m->owned[0].data());
    // Message::bytes counts what travelled: 7 bytes of row ids.
    EXPECT_EQ(m->bytes, frames[0].size() + expected.size() + (KindCarriesValues(kind) ? 40u : 0u));
    if (KindCarriesValues(kind)) {
      EXPECT_EQ(b.values[9], 9.5f);
    }
  }
}

TEST(WireRowEncodingTest, SizeRuleAtEveryVarintLengthBoundary) {
  // Values (first row, then gap - 1) at both sides of each 7-bit boundary:
  // 1 + 2 + 2 + 3 + 3 + 4 + 4 + 5 bytes = 24, below raw's 32.
  const std::vector<uint32_t> values = {
      127, 128, (1u << 14) - 1, 1u << 14, (1u << 21) - 1, 1u << 21, (1u << 28) - 1, 1u << 28};
  std::vector<uint32_t> rows;
  uint64_t row = 0;
  for (size_t i = 0; i < values.size(); ++i) {
    row = i == 0 ? values[0] : row + 1 + values[i];
    rows.push_back(static_cast<uint32_t>(row));
  }
  ASSERT_LT(row, uint64_t{1} << 32);
  const auto frames = PullRows(rows, 0);
  ASSERT_EQ(frames.size(), 2u);
  EXPECT_EQ(frames[1].size(), 24u);
  const auto bytes = Bytes(frames[1]);
  // The 2-byte form of 128 is 0x80 0x01; the 5-byte form of 2^28 ends 0x01.
  EXPECT_EQ(bytes[0], 0x7f);
  EXPECT_EQ(bytes[1], 0x80);
  EXPECT_EQ(bytes[2], 0x01);
  EXPECT_EQ(bytes[23], 0x01);
  auto m = Decode(frames, HugeTables(), Limits{});
  ASSERT_TRUE(m.ok()) << m.status().ToString();
  EXPECT_EQ(m->blocks[0].row_encoding, RowEncoding::kDeltaVarint);
  EXPECT_EQ(std::vector<uint32_t>(m->blocks[0].rows.begin(), m->blocks[0].rows.end()), rows);
}

TEST(WireRowEncodingTest, RowIdFrameBytesIsTheSmallerLayout) {
  EXPECT_EQ(RowIdFrameBytes({}), 0u);
  EXPECT_EQ(RowIdFrameBytes({0, 1, 2, 130, 1000000}), 7u);
  EXPECT_EQ(RowIdFrameBytes({0, 0xFFFFFFF0u}), 6u);           // 1 + 5 < 8
  EXPECT_EQ(RowIdFrameBytes({0x10000000u, 0x20000000u}), 8u);  // 5 + 5 > 8: raw
}

TEST(WireRowEncodingTest, HugeGapsAndTiesTravelRaw) {
  // Every value needs 5 bytes: 20 bytes against raw's 16.
  const std::vector<uint32_t> huge = {300000000, 600000000, 900000000, 4000000000u};
  // Every value needs 4 bytes: a tie, which goes raw (zero copy).
  const std::vector<uint32_t> tie = {1u << 21, (1u << 22) + 1, (1u << 22) + 2 + (1u << 21)};
  for (const auto& rows : {huge, tie}) {
    auto frames = PullRows(rows, 0);
    ASSERT_EQ(frames.size(), 2u);
    EXPECT_EQ(frames[1].size(), 4 * rows.size());
    std::vector<uint32_t> sent(rows.size());
    std::memcpy(sent.data(), frames[1].data(), frames[1].size());
    EXPECT_EQ(sent, rows);
    auto m = Decode(frames, HugeTables(), Limits{});
    ASSERT_TRUE(m.ok()) << m.status().ToString();
    const Block& b = m->blocks[0];
    EXPECT_EQ(b.row_encoding, RowEncoding::kRaw);
    EXPECT_EQ(std::vector<uint32_t>(b.rows.begin(), b.rows.end()), rows);
    EXPECT_EQ(static_cast<const void*>(b.rows.data()), frames[1].data());
  }
}

TEST(WireRowEncodingTest, SingleAndEmptyBlocks) {
  struct Case {
    uint32_t row;
    size_t frame_bytes;
    RowEncoding encoding;
  };
  for (const Case& c :
       {Case{0, 1, RowEncoding::kDeltaVarint}, Case{5, 1, RowEncoding::kDeltaVarint},
        Case{127, 1, RowEncoding::kDeltaVarint}, Case{128, 2, RowEncoding::kDeltaVarint},
        Case{(1u << 21) - 1, 3, RowEncoding::kDeltaVarint},
        Case{1u << 21, 4, RowEncoding::kRaw},        // tie
        Case{0xffffffffu, 4, RowEncoding::kRaw}}) {  // 5 > 4
    auto frames = PullRows({c.row}, 0);
    ASSERT_EQ(frames.size(), 2u);
    EXPECT_EQ(frames[1].size(), c.frame_bytes) << "row " << c.row;
    auto m = Decode(frames, HugeTables(), Limits{});
    ASSERT_TRUE(m.ok()) << m.status().ToString();
    EXPECT_EQ(m->blocks[0].row_encoding, c.encoding) << "row " << c.row;
    ASSERT_EQ(m->blocks[0].rows.size(), 1u);
    EXPECT_EQ(m->blocks[0].Row(0), c.row);
  }
  // No rows: nothing to gain, an empty raw frame.
  auto empty = PullRows({}, 0);
  ASSERT_EQ(empty.size(), 2u);
  EXPECT_EQ(empty[1].size(), 0u);
  auto m = Decode(empty, HugeTables(), Limits{});
  ASSERT_TRUE(m.ok()) << m.status().ToString();
  EXPECT_EQ(m->blocks[0].row_encoding, RowEncoding::kRaw);
  EXPECT_TRUE(m->blocks[0].rows.empty());
  // An empty deltaVarint frame is exactly zero varints.
  std::vector<zmq::message_t> frames;
  frames.push_back(RawHeader(schema::MessageKind::PULL, {{0, 0, false, 0, 0, 1, 1}}));
  frames.emplace_back();
  auto zero = Decode(frames, Tables(), Limits{});
  ASSERT_TRUE(zero.ok()) << zero.status().ToString();
  EXPECT_TRUE(zero->blocks[0].rows.empty());
}

TEST(WireRowEncodingTest, RawRowsForcesRaw) {
  auto frames = PullRows({0, 1, 2, 130, 1000000}, 2, /*raw_rows=*/true);
  EXPECT_EQ(frames[1].size(), 20u);
  auto m = Decode(frames, Tables(), Limits{});
  ASSERT_TRUE(m.ok()) << m.status().ToString();
  EXPECT_EQ(m->blocks[0].row_encoding, RowEncoding::kRaw);
  EXPECT_EQ(m->blocks[0].Row(4), 1000000u);
}

TEST(WireRowEncodingTest, UnorderedRowsGoRawSoTheReceiverNamesTheMistake) {
  auto frames = PullRows({5, 3, 9}, 0);
  EXPECT_EQ(frames[1].size(), 12u);
  ExpectRefused(Decode(frames, Tables(), Limits{}), StatusCode::kInvalidArgument,
                {"row 3 at index 1 follows row 5", "strictly ascending"});
}

TEST(WireRowEncodingTest, PullReplyAndDenseBlocksCarryNoRowEncoding) {
  OutHeader h;
  h.kind = Kind::kPullReply;
  std::vector<OutBlock> blocks(2);
  blocks[0].table = 0;
  blocks[0].width = 1;
  blocks[0].row_count = 3;
  blocks[0].rows = {1, 2, 3};
  blocks[0].values = Iota(3);
  blocks[1].table = 1;
  blocks[1].dense = true;
  blocks[1].row_count = 2;
  blocks[1].width = 1;
  blocks[1].values = Iota(2);
  const auto frames = Encode(h, std::move(blocks));
  auto m = Decode(frames, Tables(), Limits{});
  ASSERT_TRUE(m.ok()) << m.status().ToString();
  for (const Block& b : m->blocks) EXPECT_EQ(b.row_encoding, RowEncoding::kRaw);
}

// ---- Malformed input ----

TEST(WireDecodeTest, RandomBytesAsHeader) {
  std::mt19937_64 rng(20240611);
  int refused = 0;
  for (int trial = 0; trial < 500; ++trial) {
    const size_t size = 1 + rng() % 512;
    std::vector<unsigned char> bytes(size);
    for (auto& b : bytes) b = static_cast<unsigned char>(rng());
    std::vector<zmq::message_t> frames;
    frames.emplace_back(bytes.data(), bytes.size());
    auto m = Decode(frames, Tables(), Limits{});
    ASSERT_FALSE(m.ok()) << "trial " << trial;
    EXPECT_TRUE(m.status().code() == StatusCode::kCorruption ||
                m.status().code() == StatusCode::kInvalidArgument)
        << m.status().ToString();
    EXPECT_HAS_SUBSTR(m.status().message(), "header") << m.status().ToString();
    ++refused;
  }
  EXPECT_EQ(refused, 500);
}

TEST(WireDecodeTest, BitFlipsInAValidHeaderNeverCrash) {
  const auto good = ValidPush();
  int refused = 0;
  for (size_t byte = 0; byte < good[0].size(); ++byte) {
    for (int bit = 0; bit < 8; bit += 3) {
      auto frames = CopyFrames(good);
      static_cast<unsigned char*>(frames[0].data())[byte] ^= static_cast<unsigned char>(1 << bit);
      auto m = Decode(frames, Tables(), Limits{});
      if (!m.ok()) {
        ++refused;
        EXPECT_FALSE(m.status().message().empty());
      }
    }
  }
  EXPECT_GT(refused, 0);
}

// The class of the 144-byte shard crash: a kind that carries no blocks must
// not declare any, whatever else the header says.
TEST(WireDecodeTest, KindsWithoutBlocksRefuseAnyBlock) {
  for (schema::MessageKind kind : {schema::MessageKind::PUSH_ACK, schema::MessageKind::ERROR,
                                   schema::MessageKind::STATS, schema::MessageKind::STATS_REPLY}) {
    EXPECT_FALSE(LayoutOf(static_cast<Kind>(kind)).blocks);
    for (bool dense : {false, true}) {
      RawBlockSpec block;
      block.row_count = 1;
      block.dense = dense;
      std::vector<zmq::message_t> frames;
      frames.push_back(RawHeader(kind, {block}));
      ExpectRefused(Decode(frames, Tables(), Limits{}), StatusCode::kInvalidArgument,
                    {KindName(static_cast<Kind>(kind)), "1 table block(s)", "allowed: none"});
    }
  }
}

// Validation and use agree: whatever header a fuzzer makes up, a message that
// decodes has blocks only where its kind allows them, and every block of a
// kind with row ids names all its rows (so Block::Row never reads past them).
TEST(WireDecodeTest, EveryDecodedBlockNamesItsRowsWhereItsKindCarriesThem) {
  std::mt19937 rng(20261130);
  int decoded = 0;
  for (int round = 0; round < 4000; ++round) {
    auto frames = round % 2 ? ValidPush() : ValidPush(/*raw_rows=*/true);
    auto* bytes = static_cast<unsigned char*>(frames[0].data());
    const int flips = 1 + static_cast<int>(rng() % 3);
    for (int f = 0; f < flips; ++f) {
      bytes[rng() % frames[0].size()] ^= static_cast<unsigned char>(1u << (rng() % 8));
    }
    // Sometimes drop payload frames, so kinds with fewer frames can match.
    const size_t drop = rng() % 4;
    for (size_t d = 0; d < drop && frames.size() > 1; ++d) frames.pop_back();
    auto m = Decode(frames, Tables(), Limits{});
    if (!m.ok()) continue;
    ++decoded;
    const KindLayout layout = LayoutOf(m->kind);
    if (!layout.blocks) EXPECT_TRUE(m->blocks.empty()) << KindName(m->kind);
    for (const Block& b : m->blocks) {
      if (layout.row_ids) {
        ASSERT_TRUE(b.rows_named()) << KindName(m->kind);
        for (size_t i = 0; i < b.row_count; ++i) EXPECT_LT(b.Row(i), Tables()[b.table].rows);
      }
    }
  }
  EXPECT_GT(decoded, 0);
}

TEST(WireDecodeTest, TruncatedHeader) {
  auto frames = ValidPush();
  const size_t size = frames[0].size();
  frames[0] = zmq::message_t(frames[0].data(), size - 8);
  ExpectRefused(Decode(frames, Tables(), Limits{}), StatusCode::kCorruption,
                {"frame 0 (header)", "not a valid Cap'n Proto Header"});

  auto odd = ValidPush();
  odd[0] = zmq::message_t(odd[0].data(), size - 3);
  ExpectRefused(Decode(odd, Tables(), Limits{}), StatusCode::kCorruption,
                {"frame 0 (header)", "not a multiple of 8"});

  auto empty = ValidPush();
  empty[0] = zmq::message_t();
  ExpectRefused(Decode(empty, Tables(), Limits{}), StatusCode::kCorruption,
                {"frame 0 (header)", "empty"});
}

TEST(WireDecodeTest, TrailingBytesAfterHeader) {
  auto frames = ValidPush();
  std::vector<unsigned char> bytes(frames[0].size() + 8, 0);
  std::memcpy(bytes.data(), frames[0].data(), frames[0].size());
  frames[0] = zmq::message_t(bytes.data(), bytes.size());
  ExpectRefused(Decode(frames, Tables(), Limits{}), StatusCode::kCorruption,
                {"frame 0 (header)", "8 trailing bytes"});
}

TEST(WireDecodeTest, EmptyFrameList) {
  std::vector<zmq::message_t> frames;
  ExpectRefused(Decode(frames, Tables(), Limits{}), StatusCode::kInvalidArgument,
                {"0 frames", "allowed: 1 to 513"});
}

TEST(WireDecodeTest, TooManyFrames) {
  Limits limits;
  limits.max_blocks = 2;  // at most 5 frames
  auto frames = ValidPush();
  frames.emplace_back(8);
  frames.emplace_back(8);
  ExpectRefused(Decode(frames, Tables(), limits), StatusCode::kInvalidArgument,
                {"6 frames", "allowed: 1 to 5"});
}

TEST(WireDecodeTest, FrameLargerThanMaxFrameBytes) {
  Limits limits;
  limits.max_frame_bytes = 512;
  auto frames = ValidPush();
  frames[2] = zmq::message_t(1000);
  ExpectRefused(Decode(frames, Tables(), limits), StatusCode::kInvalidArgument,
                {"frame 2: 1000 bytes", "allowed: at most 512 (max_frame_bytes)"});
}

TEST(WireDecodeTest, WrongVersion) {
  std::vector<zmq::message_t> frames;
  frames.push_back(RawHeader(schema::MessageKind::PUSH_ACK, {}, 2));
  ExpectRefused(Decode(frames, Tables(), Limits{}), StatusCode::kInvalidArgument,
                {"protocol version 2", "speaks version 1"});
}

TEST(WireDecodeTest, UnknownKindNumber) {
  std::vector<zmq::message_t> frames;
  frames.push_back(RawHeader(static_cast<schema::MessageKind>(42), {}));
  ExpectRefused(Decode(frames, Tables(), Limits{}), StatusCode::kInvalidArgument,
                {"kind 42 unknown", "allowed: 0..7"});
}

TEST(WireDecodeTest, UnknownPushValues) {
  capnp::MallocMessageBuilder builder;
  auto h = builder.initRoot<schema::Header>();
  h.setVersion(kProtocolVersion);
  h.setKind(schema::MessageKind::PUSH);
  h.setPushValues(static_cast<schema::PushValues>(5));
  std::vector<zmq::message_t> frames;
  frames.push_back(FrameOf(builder));
  ExpectRefused(Decode(frames, Tables(), Limits{}), StatusCode::kInvalidArgument,
                {"pushValues 5 unknown", "allowed: 0 (gradients) or 1 (updates)"});
}

TEST(WireDecodeTest, UnknownCodec) {
  capnp::MallocMessageBuilder builder;
  auto h = builder.initRoot<schema::Header>();
  h.setVersion(kProtocolVersion);
  h.setKind(schema::MessageKind::PULL);
  auto b = h.initBlocks(1)[0];
  b.setTable(1);
  b.setDense(true);
  b.setRowCount(1);
  b.setWidth(1);
  b.setCodec(static_cast<schema::Codec>(9));
  std::vector<zmq::message_t> frames;
  frames.push_back(FrameOf(builder));
  ExpectRefused(Decode(frames, Tables(), Limits{}), StatusCode::kInvalidArgument,
                {"codec 9 unknown", "allowed: 0..7"});
  // A known codec with options out of range (int8 with 0 values per scale).
  b.setCodec(static_cast<schema::Codec>(3));
  frames.clear();
  frames.push_back(FrameOf(builder));
  ExpectRefused(Decode(frames, Tables(), Limits{}), StatusCode::kInvalidArgument,
                {"codec int8", "block 0"});
}

TEST(WireDecodeTest, UnknownTable) {
  std::vector<zmq::message_t> frames;
  frames.push_back(RawHeader(schema::MessageKind::PULL, {{7, 1, true, 0, 0, 1}}));
  ExpectRefused(Decode(frames, Tables(), Limits{}), StatusCode::kInvalidArgument,
                {"block 0: table 7 unknown", "allowed: 0..2"});
  ExpectRefused(Decode(frames, {}, Limits{}), StatusCode::kInvalidArgument,
                {"table 7 unknown", "no tables"});
}

TEST(WireDecodeTest, RowOutOfRange) {
  std::vector<zmq::message_t> frames;
  frames.push_back(RawHeader(schema::MessageKind::PULL, {{0, 2, false, 0, 0, 4}}));
  frames.push_back(FrameOf(std::vector<uint32_t>{1, 1000}));
  ExpectRefused(Decode(frames, Tables(), Limits{}), StatusCode::kInvalidArgument,
                {"frame 1 (row ids of block 0, table 0)", "row 1000 at index 1 out of range",
                 "allowed: 0..999"});
}

TEST(WireDecodeTest, RowsNotAscendingOrDuplicated) {
  std::vector<zmq::message_t> frames;
  frames.push_back(RawHeader(schema::MessageKind::PULL, {{0, 3, false, 0, 0, 4}}));
  frames.push_back(FrameOf(std::vector<uint32_t>{2, 9, 4}));
  ExpectRefused(Decode(frames, Tables(), Limits{}), StatusCode::kInvalidArgument,
                {"row 4 at index 2 follows row 9", "strictly ascending"});

  frames[1] = FrameOf(std::vector<uint32_t>{2, 9, 9});
  ExpectRefused(Decode(frames, Tables(), Limits{}), StatusCode::kInvalidArgument,
                {"row 9 at index 2 duplicates row 9", "strictly ascending"});
}

TEST(WireDecodeTest, ColumnsBeyondTableWidth) {
  std::vector<zmq::message_t> frames;
  frames.push_back(RawHeader(schema::MessageKind::PULL, {{0, 1, true, 0, 2, 3}}));
  ExpectRefused(Decode(frames, Tables(), Limits{}), StatusCode::kInvalidArgument,
                {"block 0 (table 0)", "colBegin 2 + width 3", "table's width 4"});
}

TEST(WireDecodeTest, ZeroWidth) {
  std::vector<zmq::message_t> frames;
  frames.push_back(RawHeader(schema::MessageKind::PULL, {{1, 1, true, 0, 0, 0}}));
  ExpectRefused(Decode(frames, Tables(), Limits{}), StatusCode::kInvalidArgument,
                {"width 0", "allowed: 1..2"});
}

TEST(WireDecodeTest, RowCountBeyondTableRows) {
  std::vector<zmq::message_t> frames;
  frames.push_back(RawHeader(schema::MessageKind::PULL, {{1, 65, false, 0, 0, 1}}));
  frames.emplace_back(65 * 4);
  ExpectRefused(Decode(frames, Tables(), Limits{}), StatusCode::kInvalidArgument,
                {"rowCount 65", "at most 64"});

  std::vector<zmq::message_t> dense;
  dense.push_back(RawHeader(schema::MessageKind::PULL, {{1, 10, true, 60, 0, 1}}));
  ExpectRefused(Decode(dense, Tables(), Limits{}), StatusCode::kInvalidArgument,
                {"dense rows 60..69", "table's 64 rows"});
}

TEST(WireDecodeTest, RowsFrameLengthMismatch) {
  auto frames = ValidPush(/*raw_rows=*/true);
  frames[1] = FrameOf(std::vector<uint32_t>{1, 5});
  ExpectRefused(Decode(frames, Tables(), Limits{}), StatusCode::kInvalidArgument,
                {"frame 1 (row ids of block 0, table 0): 8 bytes, expected 12"});
}

TEST(WireDecodeTest, ValuesLengthMismatch) {
  auto frames = ValidPush();
  frames[2] = FrameOf(Iota(11));
  ExpectRefused(
      Decode(frames, Tables(), Limits{}), StatusCode::kInvalidArgument,
      {"frame 2 (values of block 0, table 0): 44 bytes, expected 48 (3 rows x 4 floats)"});
  frames = ValidPush();
  frames[3] = zmq::message_t(frames[3].data(), 79);  // not even whole floats
  ExpectRefused(Decode(frames, Tables(), Limits{}), StatusCode::kInvalidArgument,
                {"frame 3 (values of block 1, table 1): 79 bytes, expected 80"});
}

TEST(WireDecodeTest, MissingFrame) {
  auto frames = ValidPush();
  frames.pop_back();
  ExpectRefused(Decode(frames, Tables(), Limits{}), StatusCode::kInvalidArgument,
                {"3 frames, expected 4 for a push with 2 block(s)", "frames missing"});
}

TEST(WireDecodeTest, ExtraFrame) {
  auto frames = ValidPush();
  frames.emplace_back(16);
  ExpectRefused(Decode(frames, Tables(), Limits{}), StatusCode::kInvalidArgument,
                {"5 frames, expected 4", "extra frames"});

  // Kinds without payload take no frame after the header.
  std::vector<zmq::message_t> ack;
  ack.push_back(RawHeader(schema::MessageKind::PUSH_ACK, {}));
  ack.emplace_back(4);
  ExpectRefused(Decode(ack, Tables(), Limits{}), StatusCode::kInvalidArgument,
                {"2 frames, expected 1 for a pushAck"});
}

TEST(WireDecodeTest, NaNAndInfInPushOrInit) {
  const float nan = std::numeric_limits<float>::quiet_NaN();
  const float inf = std::numeric_limits<float>::infinity();
  struct Case {
    schema::MessageKind kind;
    float bad;
    const char* printed;
    const char* kind_name;
  };
  for (const Case& c : {Case{schema::MessageKind::PUSH, nan, "value nan", "push"},
                        Case{schema::MessageKind::PUSH, inf, "value inf", "push"},
                        Case{schema::MessageKind::INIT, -inf, "value -inf", "init"}}) {
    std::vector<zmq::message_t> frames;
    frames.push_back(RawHeader(c.kind, {{0, 3, false, 0, 0, 4}}));
    frames.push_back(FrameOf(std::vector<uint32_t>{1, 5, 999}));
    auto values = Iota(12);
    values[6] = c.bad;
    frames.push_back(FrameOf(values));
    ExpectRefused(Decode(frames, Tables(), Limits{}), StatusCode::kInvalidArgument,
                  {"frame 2 (values of block 0, table 0)", c.printed, "at index 6",
                   "row index 1, column 2", c.kind_name, "must be finite"});
  }
}

TEST(WireDecodeTest, TooManyBlocks) {
  Limits limits;
  limits.max_blocks = 2;
  std::vector<zmq::message_t> frames;
  frames.push_back(
      RawHeader(schema::MessageKind::PULL,
                {{0, 1, true, 0, 0, 1}, {1, 1, true, 0, 0, 1}, {2, 1, true, 0, 0, 1}}));
  ExpectRefused(Decode(frames, Tables(), limits), StatusCode::kInvalidArgument,
                {"3 table blocks", "at most 2 (max_blocks)"});
}

TEST(WireDecodeTest, DuplicateTable) {
  std::vector<zmq::message_t> frames;
  frames.push_back(
      RawHeader(schema::MessageKind::PULL, {{0, 1, true, 0, 0, 1}, {0, 1, true, 5, 1, 1}}));
  ExpectRefused(Decode(frames, Tables(), Limits{}), StatusCode::kInvalidArgument,
                {"block 1: table 0 appears twice", "at most once"});
}

TEST(WireDecodeTest, HeaderLargerThanMaxHeaderBytes) {
  Limits limits;
  limits.max_header_bytes = 64;
  auto frames = ValidPush();
  ASSERT_GT(frames[0].size(), 64u);
  ExpectRefused(Decode(frames, Tables(), limits), StatusCode::kInvalidArgument,
                {"frame 0 (header)", "allowed: at most 64 (max_header_bytes)"});
}

TEST(WireDecodeTest, TraversalLimitStopsHugeText) {
  auto frames = EncodeError(1, 0, Status::Internal(std::string(4000, 'y')));
  Limits limits;
  limits.traversal_limit_words = 64;
  ExpectRefused(Decode(frames, Tables(), limits), StatusCode::kCorruption,
                {"frame 0 (header)", "traversal limit", "traversal 64 words"});
  // The same bytes pass with the default limits.
  EXPECT_TRUE(Decode(frames, Tables(), Limits{}).ok());
}

TEST(WireDecodeTest, TraversalLimitStopsManyBlocks) {
  std::vector<RawBlockSpec> blocks(200, RawBlockSpec{0, 1, true, 0, 0, 1});
  std::vector<zmq::message_t> frames;
  frames.push_back(RawHeader(schema::MessageKind::PUSH_ACK, blocks));
  Limits limits;
  limits.traversal_limit_words = 100;
  ExpectRefused(Decode(frames, Tables(), limits), StatusCode::kCorruption,
                {"frame 0 (header)", "traversal limit"});
}

TEST(WireDecodeTest, NestingLimitIsHonoured) {
  auto frames = ValidPush();
  Limits limits;
  limits.nesting_limit = 1;  // the blocks are one level below the root
  ExpectRefused(Decode(frames, Tables(), limits), StatusCode::kCorruption,
                {"frame 0 (header)", "nesting 1"});
}

// ---- Malformed deltaVarint row ids ----

// A pull (or push, with values) of table 0 (1000 rows) whose row-id frame
// is `bytes`, declared deltaVarint with `row_count` rows.
std::vector<zmq::message_t> DeltaRows(uint32_t row_count, const std::vector<uint8_t>& bytes,
                                      schema::MessageKind kind = schema::MessageKind::PULL) {
  std::vector<zmq::message_t> frames;
  frames.push_back(RawHeader(kind, {{0, row_count, false, 0, 0, 1, 1}}));
  frames.push_back(bytes.empty() ? zmq::message_t() : FrameOf(bytes));
  if (kind == schema::MessageKind::PUSH) frames.push_back(FrameOf(Iota(row_count)));
  return frames;
}

TEST(WireRowEncodingDecodeTest, VarintLongerThanFiveBytes) {
  const auto frames = DeltaRows(2, {0x01, 0x80, 0x80, 0x80, 0x80, 0x80, 0x00});
  ExpectRefused(Decode(frames, Tables(), Limits{}), StatusCode::kCorruption,
                {"frame 1 (row ids of block 0, table 0)", "deltaVarint",
                 "varint 1 at byte 1 longer than 5 bytes", "allowed: at most 5 bytes (32 bits)"});
}

TEST(WireRowEncodingDecodeTest, VarintOverflowing32Bits) {
  const auto frames = DeltaRows(1, {0xff, 0xff, 0xff, 0xff, 0x1f});
  ExpectRefused(Decode(frames, Tables(), Limits{}), StatusCode::kCorruption,
                {"frame 1 (row ids of block 0, table 0)", "varint 0 at byte 0 overflows 32 bits",
                 "fifth byte 0x1f", "at most 0x0f"});
  // The largest 32-bit varint is well formed; the table's range refuses it.
  const auto max = DeltaRows(1, {0xff, 0xff, 0xff, 0xff, 0x0f});
  ExpectRefused(Decode(max, Tables(), Limits{}), StatusCode::kInvalidArgument,
                {"row 4294967295 at index 0 out of range", "allowed: 0..999"});
}

TEST(WireRowEncodingDecodeTest, TruncatedVarint) {
  const auto frames = DeltaRows(2, {0x01, 0x85});
  ExpectRefused(Decode(frames, Tables(), Limits{}), StatusCode::kCorruption,
                {"frame 1 (row ids of block 0, table 0)", "varint 1 at byte 1 truncated",
                 "continuation bit"});
}

TEST(WireRowEncodingDecodeTest, TrailingBytes) {
  const auto frames = DeltaRows(2, {0x01, 0x02, 0x03, 0x04});
  ExpectRefused(Decode(frames, Tables(), Limits{}), StatusCode::kCorruption,
                {"frame 1 (row ids of block 0, table 0)", "2 trailing bytes after rowCount 2",
                 "exactly rowCount varints and nothing else"});
}

TEST(WireRowEncodingDecodeTest, FewerVarintsThanRowCount) {
  // Enough bytes for 3, but the second varint takes two of them.
  const auto frames = DeltaRows(3, {0x01, 0x85, 0x01});
  ExpectRefused(Decode(frames, Tables(), Limits{}), StatusCode::kCorruption,
                {"frame 1 (row ids of block 0, table 0)", "fewer varints than rowCount",
                 "ends after 2 of 3"});
  // Fewer bytes than rows: refused before anything is allocated.
  const auto short_frame = DeltaRows(3, {0x01, 0x02});
  ExpectRefused(Decode(short_frame, Tables(), Limits{}), StatusCode::kCorruption,
                {"2 bytes hold fewer varints than rowCount 3", "1 to 5 bytes per row id"});
  const auto none = DeltaRows(1, {});
  ExpectRefused(Decode(none, Tables(), Limits{}), StatusCode::kCorruption,
                {"0 bytes hold fewer varints than rowCount 1"});
}

TEST(WireRowEncodingDecodeTest, RowOutOfRange) {
  // 5, then gap - 1 = 999 (0xe7 0x07): row 1005 of a 1000-row table.
  const auto frames = DeltaRows(2, {0x05, 0xe7, 0x07}, schema::MessageKind::PUSH);
  ExpectRefused(Decode(frames, Tables(), Limits{}), StatusCode::kInvalidArgument,
                {"frame 1 (row ids of block 0, table 0)", "row 1005 at index 1 out of range",
                 "allowed: 0..999"});
  // 5, then 993 (0xe1 0x07): the last row, which decodes.
  const auto last = DeltaRows(2, {0x05, 0xe1, 0x07}, schema::MessageKind::PUSH);
  auto m = Decode(last, Tables(), Limits{});
  ASSERT_TRUE(m.ok()) << m.status().ToString();
  EXPECT_EQ(m->blocks[0].Row(0), 5u);
  EXPECT_EQ(m->blocks[0].Row(1), 999u);
  EXPECT_EQ(m->blocks[0].values[1], 1.5f);
}

TEST(WireRowEncodingDecodeTest, GapOverflowing32Bits) {
  // 5, then gap - 1 = 2^32 - 1: 5 + 1 + 4294967295 does not fit 32 bits.
  const auto frames = DeltaRows(2, {0x05, 0xff, 0xff, 0xff, 0xff, 0x0f});
  ExpectRefused(
      Decode(frames, HugeTables(), Limits{}), StatusCode::kInvalidArgument,
      {"frame 1 (row ids of block 0, table 0)", "row at index 1 overflows 32 bits",
       "row 5 + 1 + varint 4294967295 = 4294967301", "allowed: row ids up to 4294967295"});
}

TEST(WireRowEncodingDecodeTest, UnknownRowEncoding) {
  std::vector<zmq::message_t> frames;
  frames.push_back(RawHeader(schema::MessageKind::PULL, {{0, 1, false, 0, 0, 1, 7}}));
  frames.push_back(FrameOf(std::vector<uint32_t>{3}));
  ExpectRefused(
      Decode(frames, Tables(), Limits{}), StatusCode::kInvalidArgument,
      {"block 0 (table 0): rowEncoding 7 unknown", "allowed: 0 (raw) or 1 (deltaVarint)"});
}

TEST(WireRowEncodingDecodeTest, DeltaVarintWithoutARowFrame) {
  std::vector<zmq::message_t> dense;
  dense.push_back(RawHeader(schema::MessageKind::PULL, {{1, 4, true, 0, 0, 1, 1}}));
  ExpectRefused(Decode(dense, Tables(), Limits{}), StatusCode::kInvalidArgument,
                {"block 0 (table 1): rowEncoding deltaVarint on a dense block", "no row-id frame",
                 "allowed: 0 (raw)"});

  std::vector<zmq::message_t> reply;
  reply.push_back(RawHeader(schema::MessageKind::PULL_REPLY, {{0, 1, false, 0, 0, 1, 1}}));
  reply.push_back(FrameOf(Iota(1)));
  ExpectRefused(Decode(reply, Tables(), Limits{}), StatusCode::kInvalidArgument,
                {"rowEncoding deltaVarint on a pullReply block", "allowed: 0 (raw)"});
}

// What the format says, written independently of message.cc: the rows, or
// nothing when the frame must be refused.
std::optional<std::vector<uint32_t>> ReferenceDeltaVarint(const std::vector<uint8_t>& bytes,
                                                          uint32_t row_count, uint64_t table_rows) {
  std::vector<uint32_t> rows;
  size_t pos = 0;
  uint64_t row = 0;
  for (uint32_t r = 0; r < row_count; ++r) {
    uint64_t value = 0;
    int length = 0;
    for (;;) {
      if (pos == bytes.size() || length == 5) return std::nullopt;
      const uint8_t byte = bytes[pos++];
      value |= uint64_t{byte & 0x7fu} << (7 * length);
      ++length;
      if ((byte & 0x80) == 0) break;
    }
    if (value > 0xffffffffu) return std::nullopt;
    row = r == 0 ? value : row + 1 + value;
    if (row >= table_rows) return std::nullopt;  // also catches > 2^32 - 1 here
    rows.push_back(static_cast<uint32_t>(row));
  }
  if (pos != bytes.size()) return std::nullopt;
  return rows;
}

TEST(WireRowEncodingDecodeTest, RandomRowFramesNeverCrash) {
  std::mt19937_64 rng(20240612);
  int accepted = 0;
  int refused = 0;
  for (int trial = 0; trial < 4000; ++trial) {
    uint32_t row_count = 1 + static_cast<uint32_t>(rng() % 12);
    std::vector<uint8_t> bytes;
    if (trial % 2 == 0) {
      // Random bytes, mostly small so that some of them decode.
      const size_t size = rng() % (3 * row_count + 2);
      for (size_t i = 0; i < size; ++i) {
        const uint8_t b = static_cast<uint8_t>(rng());
        bytes.push_back(rng() % 4 == 0 ? b : static_cast<uint8_t>(b & 0x3f));
      }
    } else {
      // A valid encoding of random rows, then a few random edits.
      std::vector<uint32_t> rows;
      uint32_t row = static_cast<uint32_t>(rng() % 50);
      for (uint32_t r = 0; r < row_count && row < 1000; ++r) {
        rows.push_back(row);
        row += 1 + static_cast<uint32_t>(rng() % 200);
      }
      row_count = static_cast<uint32_t>(rows.size());
      const auto frames = PullRows(rows, 0, false);
      bytes = Bytes(frames[1]);
      if (bytes.size() == 4 * rows.size()) continue;  // went raw; not this test's subject
      const int edits = static_cast<int>(rng() % 3);
      for (int e = 0; e < edits; ++e) {
        switch (rng() % 3) {
          case 0:
            if (!bytes.empty()) bytes[rng() % bytes.size()] = static_cast<uint8_t>(rng());
            break;
          case 1:
            bytes.push_back(static_cast<uint8_t>(rng()));
            break;
          case 2:
            if (!bytes.empty()) bytes.pop_back();
            break;
        }
      }
    }
    const auto frames = DeltaRows(row_count, bytes);
    auto m = Decode(frames, Tables(), Limits{});
    const auto expected = ReferenceDeltaVarint(bytes, row_count, Tables()[0].rows);
    ASSERT_EQ(m.ok(), expected.has_value())
        << "trial " << trial << ": " << (m.ok() ? "decoded" : m.status().ToString());
    if (!m.ok()) {
      ++refused;
      EXPECT_HAS_SUBSTR(m.status().message(), "frame 1 (row ids of block 0, table 0)");
      continue;
    }
    ++accepted;
    const Block& b = m->blocks[0];
    ASSERT_EQ(b.rows.size(), row_count);
    EXPECT_EQ(std::vector<uint32_t>(b.rows.begin(), b.rows.end()), *expected) << "trial " << trial;
    for (size_t r = 0; r < b.rows.size(); ++r) {
      EXPECT_LT(b.rows[r], 1000u);
      if (r > 0) {
        EXPECT_GT(b.rows[r], b.rows[r - 1]);
      }
    }
  }
  // Both outcomes are exercised, or the test proves little.
  EXPECT_GT(accepted, 200);
  EXPECT_GT(refused, 200);
}

// ---- Encode's contract with its caller ----

TEST(WireEncodeDeathTest, RowCountMismatchIsABug) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  OutHeader h;
  std::vector<OutBlock> blocks(1);
  blocks[0].width = 1;
  blocks[0].row_count = 3;
  blocks[0].rows = {1, 2};
  blocks[0].values = {1, 2, 3};
  EXPECT_DEATH(Encode(h, std::move(blocks)), "rows.size");
}

// ---- Real sockets ----

class WireSocketTest : public ::testing::Test {
 protected:
  zmq::context_t context_{1};
};

TEST_F(WireSocketTest, MillionRowPushOverInproc) {
  zmq::socket_t server(context_, zmq::socket_type::pair);
  zmq::socket_t client(context_, zmq::socket_type::pair);
  server.bind("inproc://wire-test-push");
  client.connect("inproc://wire-test-push");

  constexpr uint32_t kRows = 1000000;
  OutHeader h;
  h.step = 3;
  h.num_workers = 2;
  std::vector<OutBlock> blocks(1);
  blocks[0].table = 2;
  blocks[0].width = 2;
  blocks[0].row_count = kRows;
  blocks[0].rows.resize(kRows);
  for (uint32_t i = 0; i < kRows; ++i) blocks[0].rows[i] = 4 * i + 3;
  blocks[0].values = Iota(2 * kRows);
  const void* values_data = blocks[0].values.data();
  auto frames = Encode(h, std::move(blocks));
  ASSERT_TRUE(SendMultipart(client, frames).ok());
  EXPECT_TRUE(frames.empty());

  auto received = ReceiveMultipart(server, 5000, Limits{});
  ASSERT_TRUE(received.ok()) << received.status().ToString();
  ASSERT_EQ(received->size(), 3u);
  auto m = Decode(*received, Tables(), Limits{});
  ASSERT_TRUE(m.ok()) << m.status().ToString();
  EXPECT_EQ(m->step, 3u);
  EXPECT_EQ(m->num_workers, 2u);
  // Gaps of 4 travel deltaVarint, one byte a row, next to 8 bytes of values.
  EXPECT_EQ((*received)[1].size(), size_t{kRows});
  EXPECT_EQ(m->bytes, 9u * kRows + (*received)[0].size());
  const Block& b = m->blocks[0];
  EXPECT_EQ(b.row_encoding, RowEncoding::kDeltaVarint);
  ASSERT_EQ(b.rows.size(), kRows);
  ASSERT_EQ(b.values.size(), 2u * kRows);
  EXPECT_EQ(b.Row(kRows - 1), 4 * (kRows - 1) + 3);
  EXPECT_EQ(b.values[2 * kRows - 1], 0.5f + (2 * kRows - 1));
  // inproc hands the sender's buffer itself to the receiver.
  EXPECT_EQ(static_cast<const void*>(b.values.data()), values_data);
}

TEST_F(WireSocketTest, PushAndErrorReplyOverTcpRouter) {
  zmq::socket_t router(context_, zmq::socket_type::router);
  zmq::socket_t dealer(context_, zmq::socket_type::dealer);
  router.set(zmq::sockopt::maxmsgsize, static_cast<int64_t>(Limits{}.max_frame_bytes));
  router.set(zmq::sockopt::linger, 0);
  dealer.set(zmq::sockopt::linger, 0);
  router.bind("tcp://127.0.0.1:*");
  dealer.connect(router.get(zmq::sockopt::last_endpoint));

  constexpr uint32_t kRows = 1000000;
  OutHeader h;
  h.request_id = 5;
  std::vector<OutBlock> blocks(2);
  blocks[0].table = 2;
  blocks[0].width = 1;
  blocks[0].col_begin = 1;
  blocks[0].row_count = kRows;
  blocks[0].rows.resize(kRows);
  for (uint32_t i = 0; i < kRows; ++i) blocks[0].rows[i] = 3 * i;
  blocks[0].values = Iota(kRows);
  blocks[1].table = 1;
  blocks[1].dense = true;
  blocks[1].row_count = 1;
  blocks[1].width = 1;
  blocks[1].values = {2.0f};  // a 4-byte frame: ZeroMQ keeps it inline, unaligned or not
  auto frames = Encode(h, std::move(blocks));
  ASSERT_TRUE(SendMultipart(dealer, frames).ok());

  auto received = ReceiveMultipart(router, 10000, Limits{}, /*envelope_frames=*/1);
  ASSERT_TRUE(received.ok()) << received.status().ToString();
  ASSERT_EQ(received->size(), 5u);  // routing id + 4
  std::vector<zmq::message_t> message;
  for (size_t i = 1; i < received->size(); ++i) message.push_back(std::move((*received)[i]));
  auto m = Decode(message, Tables(), Limits{});
  ASSERT_TRUE(m.ok()) << m.status().ToString();
  EXPECT_EQ(m->request_id, 5u);
  EXPECT_EQ(m->blocks[0].Row(kRows - 1), 3 * (kRows - 1));
  EXPECT_EQ(m->blocks[0].values[kRows - 1], 0.5f + (kRows - 1));
  EXPECT_EQ(m->blocks[1].values[0], 2.0f);

  // The reply goes back through the routing id.
  std::vector<zmq::message_t> reply;
  reply.push_back(std::move((*received)[0]));
  for (auto& f : EncodeError(5, 0, Status::Unsupported("codec topk")))
    reply.push_back(std::move(f));
  ASSERT_TRUE(SendMultipart(router, reply).ok());
  auto back = ReceiveMultipart(dealer, 10000, Limits{});
  ASSERT_TRUE(back.ok()) << back.status().ToString();
  auto e = Decode(*back, Tables(), Limits{});
  ASSERT_TRUE(e.ok()) << e.status().ToString();
  EXPECT_EQ(e->kind, Kind::kError);
  EXPECT_EQ(e->request_id, 5u);
  EXPECT_EQ(e->error.code(), StatusCode::kUnsupported);
  EXPECT_EQ(e->error.message(), "codec topk");
}

TEST_F(WireSocketTest, ReceiveTimesOut) {
  zmq::socket_t server(context_, zmq::socket_type::pair);
  server.bind("inproc://wire-test-timeout");
  const auto start = std::chrono::steady_clock::now();
  auto received = ReceiveMultipart(server, 50, Limits{});
  const auto elapsed = std::chrono::steady_clock::now() - start;
  ASSERT_FALSE(received.ok());
  EXPECT_EQ(received.status().code(), StatusCode::kTimeout);
  EXPECT_HAS_SUBSTR(received.status().message(), "50 ms");
  EXPECT_GE(elapsed, std::chrono::milliseconds(45));
  EXPECT_LT(elapsed, std::chrono::seconds(5));

  auto immediate = ReceiveMultipart(server, 0, Limits{});
  ASSERT_FALSE(immediate.ok());
  EXPECT_EQ(immediate.status().code(), StatusCode::kTimeout);
}

TEST_F(WireSocketTest, OverLimitMessageIsDrainedAndTheNextOneDecodes) {
  zmq::socket_t server(context_, zmq::socket_type::pair);
  zmq::socket_t client(context_, zmq::socket_type::pair);
  server.bind("inproc://wire-test-limit");
  client.connect("inproc://wire-test-limit");
  Limits limits;
  limits.max_blocks = 1;  // at most 3 frames

  std::vector<zmq::message_t> flood;
  for (int i = 0; i < 10; ++i) flood.emplace_back(8);
  ASSERT_TRUE(SendMultipart(client, flood).ok());
  OutHeader h;
  h.kind = Kind::kPull;
  h.request_id = 2;
  std::vector<OutBlock> blocks(1);
  blocks[0].table = 0;
  blocks[0].width = 4;
  blocks[0].row_count = 2;
  blocks[0].rows = {10, 20};
  auto good = Encode(h, std::move(blocks));
  ASSERT_TRUE(SendMultipart(client, good).ok());

  auto refused = ReceiveMultipart(server, 5000, limits);
  ASSERT_FALSE(refused.ok());
  EXPECT_EQ(refused.status().code(), StatusCode::kInvalidArgument);
  EXPECT_HAS_SUBSTR(refused.status().message(), "10 frames; allowed: at most 3");

  auto next = ReceiveMultipart(server, 5000, limits);
  ASSERT_TRUE(next.ok()) << next.status().ToString();
  auto m = Decode(*next, Tables(), limits);
  ASSERT_TRUE(m.ok()) << m.status().ToString();
  EXPECT_EQ(m->request_id, 2u);
  EXPECT_EQ(m->blocks[0].Row(1), 20u);
}

TEST_F(WireSocketTest, SendErrors) {
  zmq::socket_t router(context_, zmq::socket_type::router);
  router.set(zmq::sockopt::router_mandatory, 1);
  router.bind("inproc://wire-test-send");
  std::vector<zmq::message_t> none;
  Status empty = SendMultipart(router, none);
  EXPECT_EQ(empty.code(), StatusCode::kInvalidArgument);
  EXPECT_HAS_SUBSTR(empty.message(), "0 frames");

  // No peer has this routing id: ROUTER_MANDATORY turns that into an error.
  std::vector<zmq::message_t> frames;
  frames.emplace_back("nobody", 6);
  for (auto& f : EncodeError(1, 0, Status::Internal("x"))) frames.push_back(std::move(f));
  Status unreachable = SendMultipart(router, frames);
  EXPECT_EQ(unreachable.code(), StatusCode::kIOError);
  EXPECT_HAS_SUBSTR(unreachable.message(), "sending frame 0 of 2");
}

}  // namespace
// Issue: a finite 3e38 push made Adam's v infinite. Pushes and init values
// are bounded in magnitude at the decode boundary, and so are values a
// receiver decodes from a codec's payload.
TEST(WireDecodeTest, HugeFiniteValuesAreRefused) {
  for (float huge : {3e38f, -1e16f}) {
    OutHeader h;
    h.kind = Kind::kPush;
    std::vector<OutBlock> blocks(1);
    blocks[0].table = 1;
    blocks[0].dense = true;
    blocks[0].row_count = 2;
    blocks[0].width = 2;
    blocks[0].values = {0.5f, huge, 0.25f, 0.125f};
    auto frames = Encode(h, std::move(blocks));
    ExpectRefused(Decode(frames, Tables(), Limits{}), StatusCode::kInvalidArgument,
                  {"index 1", "at most 1e+15"});
  }
  const std::vector<float> fine = {1e15f, -1e15f, 0.0f};
  EXPECT_TRUE(CheckValueBounds(fine, Limits{}, "payload").ok());
  const std::vector<float> bad = {1.0f, 2e15f};
  const Status refused = CheckValueBounds(bad, Limits{}, "payload");
  EXPECT_FALSE(refused.ok());
  EXPECT_HAS_SUBSTR(refused.message(), "index 1");
}

}  // namespace gridsync::wire
