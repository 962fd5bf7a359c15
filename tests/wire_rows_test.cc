// The wire's row ids: the smaller of raw and deltaVarint in every kind that
// carries rows, each malformed deltaVarint frame refused naming it, and
// Encode's contract with its caller.
#include <algorithm>
#include <random>

#include "common/wire/row_ids.h"
#include "tests/wire_test_util.h"

namespace gridsync::wire {
namespace {

// ---- Row encodings ----
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

// The decoder takes eight one-byte varints at a time where it can: runs of
// every length around 8, long gaps inside and at the ends of runs, and rows
// up to the table's end must come back exactly.
TEST(WireRowEncodingTest, RunsOfOneByteGapsRoundTrip) {
  std::mt19937 rng(7);
  const uint32_t table_rows = uint32_t{1} << 22;  // Tables()[2]
  for (uint32_t count = 1; count <= 70; ++count) {
    for (int trial = 0; trial < 4; ++trial) {
      std::vector<uint32_t> rows;
      uint32_t row = rng() % 300;
      for (uint32_t i = 0; i < count; ++i) {
        rows.push_back(row);
        // Mostly one-byte gaps; now and then one of two or three bytes.
        const uint32_t pick = rng() % 16;
        row += 1 + (pick == 0 ? 128 + rng() % 20000 : pick == 1 ? 127 : rng() % 128);
      }
      // The last trial ends on the table's last row.
      if (trial == 3) {
        const uint32_t shift = table_rows - 1 - rows.back();
        for (uint32_t& r : rows) r += shift;
      }
      std::vector<OutBlock> blocks(1);
      blocks[0].table = 2;
      blocks[0].width = 2;
      blocks[0].row_count = count;
      blocks[0].rows = rows;
      blocks[0].values = Iota(2 * count);
      OutHeader h;
      h.kind = Kind::kPush;
      const auto frames = Encode(h, std::move(blocks));
      auto m = Decode(frames, Tables(), Limits{});
      ASSERT_TRUE(m.ok()) << "count " << count << ": " << m.status().ToString();
      if (count > 1) {
        EXPECT_EQ(m->blocks[0].row_encoding, RowEncoding::kDeltaVarint);
      }
      EXPECT_EQ(std::vector<uint32_t>(m->blocks[0].rows.begin(), m->blocks[0].rows.end()), rows)
          << "count " << count << " trial " << trial;
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
  EXPECT_EQ(RowIdFrameBytes({0, 0xFFFFFFF0u}), 6u);            // 1 + 5 < 8
  EXPECT_EQ(RowIdFrameBytes({0x10000000u, 0x20000000u}), 8u);  // 5 + 5 > 8: raw
}

// The sizing pass (32-bit sums over chunks, vectorised) against a
// one-varint-at-a-time count, over gaps of every varint length, and a tie
// anywhere makes the rows not ascending.
TEST(WireRowEncodingTest, DeltaVarintBytesCountsEveryVarint) {
  std::mt19937 rng(11);
  for (int trial = 0; trial < 20; ++trial) {
    std::vector<uint32_t> rows;
    uint64_t row = rng() % 300;
    size_t want = 0;
    auto varint = [](uint64_t v) {
      return v < (1u << 7) ? 1 : v < (1u << 14) ? 2 : v < (1u << 21) ? 3 : v < (1u << 28) ? 4 : 5;
    };
    while (rows.size() < 5000 && row <= 0xFFFFFFFFu) {
      want += rows.empty() ? varint(row) : varint(row - rows.back() - 1);
      rows.push_back(static_cast<uint32_t>(row));
      const int length = static_cast<int>(rng() % 40);  // mostly one byte, sometimes more
      const uint64_t gap = length < 30   ? rng() % 128
                           : length < 36 ? rng() % (1u << 14)
                           : length < 39 ? rng() % (1u << 21)
                                         : rng() % (1u << 26);
      row += 1 + gap;
    }
    ASSERT_EQ(DeltaVarintBytes(rows), want) << "trial " << trial;
    UninitVector<uint8_t> frame;
    ASSERT_EQ(EncodeDeltaVarintIfSmaller(rows, &frame), want < 4 * rows.size());
    ASSERT_EQ(frame.size(), want);
    UninitVector<uint32_t> back;
    ASSERT_TRUE(DecodeDeltaVarint(
                    frame.data(), frame.size(), static_cast<uint32_t>(rows.size()),
                    [] { return std::string("frame"); }, &back)
                    .ok());
    ASSERT_TRUE(std::equal(back.begin(), back.end(), rows.begin(), rows.end()))
        << "trial " << trial;
    std::vector<uint32_t> tie = rows;
    tie[tie.size() / 2 + trial] = tie[tie.size() / 2 + trial - 1];
    EXPECT_EQ(DeltaVarintBytes(tie), kNotAscending);
    EXPECT_FALSE(EncodeDeltaVarintIfSmaller(tie, &frame));
  }
}

// The one-pass encoder against the sizing pass at every position of the
// eight-row steps and the tail: gaps of one byte (the vector path), a wide
// gap anywhere, a tie, a descent and a wrap past 2^32 - 1 within a one-byte
// gap, which only the order check catches.
TEST(WireRowEncodingTest, EncodeDeltaVarintIfSmallerAtEveryPosition) {
  for (size_t n = 1; n <= 27; ++n) {
    for (size_t at = 0; at < n; ++at) {
      for (int kind = 0; kind < 5; ++kind) {
        std::vector<uint32_t> rows(n);
        for (size_t i = 0; i < n; ++i) rows[i] = static_cast<uint32_t>(1000 + 3 * i);
        if (kind == 1) {
          for (size_t i = at; i < n; ++i) rows[i] += 70000;  // a 3-byte gap
        } else if (kind == 2 && at > 0) {
          rows[at] = rows[at - 1];  // a tie
        } else if (kind == 3 && at > 0) {
          rows[at] = rows[at - 1] - 1;  // a descent
        } else if (kind == 4) {
          // The rows end at 2^32 - 1, and the next wraps to 0 + a small gap.
          for (size_t i = 0; i < n; ++i) {
            rows[i] = static_cast<uint32_t>(0xFFFFFFFFull - 2 * (at - std::min(at, i))) +
                      (i > at ? static_cast<uint32_t>(2 * (i - at)) : 0u);
          }
        }
        const size_t bytes = DeltaVarintBytes(rows);
        const bool smaller = bytes != kNotAscending && bytes < 4 * n;
        UninitVector<uint8_t> frame;
        ASSERT_EQ(EncodeDeltaVarintIfSmaller(rows, &frame), smaller)
            << "n " << n << " at " << at << " kind " << kind;
        if (!smaller) continue;
        ASSERT_EQ(frame.size(), bytes) << "n " << n << " at " << at << " kind " << kind;
        UninitVector<uint32_t> back;
        ASSERT_TRUE(DecodeDeltaVarint(
                        frame.data(), frame.size(), static_cast<uint32_t>(n),
                        [] { return std::string("frame"); }, &back)
                        .ok());
        ASSERT_TRUE(std::equal(back.begin(), back.end(), rows.begin(), rows.end()))
            << "n " << n << " at " << at << " kind " << kind;
      }
    }
  }
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

TEST(WireRowEncodingDecodeTest, HandWrittenRunOfOneByteGaps) {
  // 3, then gaps 1..9 (varints 0..8) and one of 128 (varint 127, 0x7f):
  // eleven one-byte varints, eight of which the decoder takes at once.
  const auto frames =
      DeltaRows(11, {0x03, 0x00, 0x01, 0x02, 0x03, 0x04, 0x05, 0x06, 0x07, 0x08, 0x7f});
  auto m = Decode(frames, Tables(), Limits{});
  ASSERT_TRUE(m.ok()) << m.status().ToString();
  const std::vector<uint32_t> expected = {3, 4, 6, 9, 13, 18, 24, 31, 39, 48, 176};
  EXPECT_EQ(std::vector<uint32_t>(m->blocks[0].rows.begin(), m->blocks[0].rows.end()), expected);
}

TEST(WireRowEncodingDecodeTest, MalformedAfterARunOfOneByteGaps) {
  // A two-byte varint early leaves 9 varints for 10 rows.
  const auto short_frames = DeltaRows(10, {0x00, 0x80, 0x01, 0, 0, 0, 0, 0, 0, 0});
  ExpectRefused(Decode(short_frames, Tables(), Limits{}), StatusCode::kCorruption,
                {"fewer varints than rowCount", "ends after 9 of 10"});
  // Eight one-byte varints taken at once, then a two-byte one, then one
  // more, and the frame ends a varint short.
  const auto after_run = DeltaRows(12, {0, 0, 0, 0, 0, 0, 0, 0, 0, 0x80, 0x01, 0});
  ExpectRefused(Decode(after_run, Tables(), Limits{}), StatusCode::kCorruption,
                {"fewer varints than rowCount", "ends after 11 of 12"});
  // Nine one-byte varints and a trailing byte.
  const auto trailing = DeltaRows(9, {0, 0, 0, 0, 0, 0, 0, 0, 0, 0});
  ExpectRefused(Decode(trailing, Tables(), Limits{}), StatusCode::kCorruption,
                {"1 trailing bytes after rowCount 9 varints"});
  // A varint truncated right after a run of eight.
  const auto truncated = DeltaRows(10, {0, 0, 0, 0, 0, 0, 0, 0, 0, 0x80});
  ExpectRefused(Decode(truncated, Tables(), Limits{}), StatusCode::kCorruption,
                {"varint 9 at byte 9 truncated"});
}

TEST(WireRowEncodingDecodeTest, OverflowInsideARunOfOneByteGaps) {
  // 2^32 - 5 (five bytes), then gaps of 1: rows 2^32 - 4 .. 2^32 - 1 fit,
  // the fifth after the first does not. Nine one-byte varints would be
  // taken eight at a time; the overflow must still be named where it is.
  std::vector<uint8_t> bytes = {0xfb, 0xff, 0xff, 0xff, 0x0f};
  bytes.resize(bytes.size() + 9, 0x00);
  const auto frames = DeltaRows(10, bytes);
  ExpectRefused(Decode(frames, HugeTables(), Limits{}), StatusCode::kInvalidArgument,
                {"row at index 5 overflows 32 bits", "row 4294967295 + 1 + varint 0 = 4294967296"});
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

}  // namespace
}  // namespace gridsync::wire
