// The data-plane wire: round trips of every kind and zero copy on both
// sides. Row-id encodings: wire_rows_test.cc; malformed input and real
// sockets: wire_decode_test.cc.
#include "common/wire/coord_codec.h"
#include "tests/wire_test_util.h"

namespace gridsync::wire {
namespace {

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
  // ValidPush's blocks with every header field set.
  auto frames = Encode(h, ValidPushBlocks());
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

// EncodeCopy writes the same frames as Encode and leaves the blocks whole:
// raw and deltaVarint row ids, values and a dense block.
TEST(WireRoundTripTest, EncodeCopyKeepsTheBlocks) {
  OutHeader h;
  h.kind = Kind::kPush;
  h.request_id = 7;
  std::vector<OutBlock> blocks = ValidPushBlocks();
  OutBlock raw = blocks[0];
  raw.raw_rows = true;
  raw.table = 0;
  blocks.push_back(raw);
  const std::vector<OutBlock> before = blocks;
  const auto copied = EncodeCopy(h, blocks);
  const auto moved = Encode(h, before);
  ASSERT_EQ(copied.size(), moved.size());
  for (size_t i = 0; i < copied.size(); ++i) {
    EXPECT_EQ(copied[i].to_string_view(), moved[i].to_string_view()) << "frame " << i;
  }
  ASSERT_EQ(blocks.size(), before.size());
  for (size_t i = 0; i < blocks.size(); ++i) {
    EXPECT_EQ(blocks[i].rows, before[i].rows) << i;
    EXPECT_EQ(blocks[i].values, before[i].values) << i;
  }
  // A pull's rows as deltaVarint: the request decodes to the kept rows.
  OutHeader pull;
  pull.kind = Kind::kPull;
  pull.request_id = 8;
  std::vector<OutBlock> asked(1);
  asked[0].table = 0;
  asked[0].width = 4;
  asked[0].rows = {2, 3, 4, 40, 41, 900};
  asked[0].row_count = 6;
  const auto frames = EncodeCopy(pull, asked);
  ASSERT_EQ(asked[0].rows.size(), 6u);
  auto decoded = Decode(frames, Tables(), Limits{});
  ASSERT_TRUE(decoded.ok()) << decoded.status().ToString();
  ASSERT_EQ(decoded->blocks.size(), 1u);
  for (uint32_t i = 0; i < 6; ++i) EXPECT_EQ(decoded->blocks[0].Row(i), asked[0].rows[i]) << i;
}

// A pull reply's part fields round-trip; on any other kind they are
// refused at the decode boundary.
TEST(WireRoundTripTest, PartsOnlyInAPullReply) {
  auto decode = [](Kind kind, uint64_t part_row, bool more) -> Result<Message> {
    OutHeader h;
    h.kind = kind;
    h.part_row = part_row;
    h.more_parts = more;
    static std::vector<zmq::message_t> frames;  // the decoded spans point into them
    frames = Encode(h, {});
    return Decode(frames, Tables(), Limits{});
  };
  auto ok = decode(Kind::kPullReply, 12345678901ull, true);
  ASSERT_TRUE(ok.ok()) << ok.status().ToString();
  EXPECT_EQ(ok->part_row, 12345678901ull);
  EXPECT_TRUE(ok->more_parts);
  for (Kind kind : {Kind::kPush, Kind::kPull, Kind::kPushAck, Kind::kStats, Kind::kInit}) {
    for (const auto& [row, more] : {std::pair<uint64_t, bool>{1, false}, {0, true}}) {
      auto bad = decode(kind, row, more);
      ASSERT_FALSE(bad.ok()) << KindName(kind);
      EXPECT_EQ(bad.status().code(), StatusCode::kInvalidArgument);
      EXPECT_NE(bad.status().message().find("allowed: parts only in a pullReply"),
                std::string::npos)
          << bad.status().ToString();
    }
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

TEST(WireRoundTripTest, PullReplyValuesAreBoundedAsPushesAre) {
  // A shard's parameters only ever take finite, bounded pushes, so a
  // non-finite value in a reply is damage or a peer that is no shard: the
  // worker would copy it into its model, and its next push be refused as
  // if its own gradients were wrong. Refused here, naming the reply.
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
  ASSERT_FALSE(m.ok());
  EXPECT_NE(m.status().message().find("pullReply values must be finite"), std::string::npos)
      << m.status().ToString();
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
  for (uint32_t code : {0u, 8u, 11u, 1000u}) {
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

// The local code goes as the wire code that says what the requester met
// (not Internal, which a decoder makes of an unknown code), text intact;
// another run's checkpoints go as they are (a worker exits 3 on them).
TEST(WireRoundTripTest, LocalErrorCodesGoAsTheirWireCodes) {
  const std::pair<StatusCode, StatusCode> cases[] = {
      {StatusCode::kCheckpointsHeld, StatusCode::kCheckpointsHeld},
      {StatusCode::kUnavailable, StatusCode::kIOError}};
  for (const auto& [local, wire] : cases) {
    auto frames = EncodeError(1, 0, Status(local, "shard 0 cannot roll back to step 4"));
    auto m = Decode(frames, Tables(), Limits{});
    ASSERT_TRUE(m.ok()) << m.status().ToString();
    EXPECT_EQ(m->error.code(), wire) << m->error.ToString();
    EXPECT_EQ(m->error.message(), "shard 0 cannot roll back to step 4");
  }
}

// The control plane's error replies map them the same way.
TEST(WireRoundTripTest, LocalErrorCodesGoAsTheirWireCodesToTheCoordinatorsPeers) {
  capnp::MallocMessageBuilder builder;
  auto info = builder.initRoot<schema::ErrorInfo>();
  StatusToWire(Status::CheckpointsHeld("step 4 is another run's"), info);
  const Status back = StatusFromWire(info.asReader());
  EXPECT_EQ(back.code(), StatusCode::kCheckpointsHeld) << back.ToString();
  EXPECT_EQ(back.message(), "step 4 is another run's");
}

TEST(WireRoundTripTest, ErrorCodesAPeerMaySendSurvive) {
  for (StatusCode code : {StatusCode::kInvalidArgument, StatusCode::kTimeout, StatusCode::kInternal,
                          StatusCode::kFailedPrecondition}) {
    auto frames = EncodeError(1, 0, Status(code, "why"));
    auto m = Decode(frames, Tables(), Limits{});
    ASSERT_TRUE(m.ok()) << m.status().ToString();
    EXPECT_EQ(m->error.code(), code) << m->error.ToString();
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
  UninitVector<float> values = Iota(rows.size() * 2);
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

}  // namespace
}  // namespace gridsync::wire
