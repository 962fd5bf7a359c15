// The wire's decode boundary: every class of malformed input refused with a
// Status that names it, and real sockets (inproc and TCP on 127.0.0.1).
#include "tests/wire_test_util.h"

namespace gridsync::wire {
namespace {

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
    if (!layout.blocks) {
      EXPECT_TRUE(m->blocks.empty()) << KindName(m->kind);
    }
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
                {"protocol version 2", "allowed: version 3", "same gridsync release"});
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

// Issue (review): a pull reply's NaN, inf or 3e38 went into the worker's
// model unchecked (the next push's refusal then blamed the worker's own
// gradients). A pull reply's values are bounded as a push's are.
TEST(WireDecodeTest, NaNAndHugeValuesInAPullReply) {
  for (const float bad :
       {std::numeric_limits<float>::quiet_NaN(), std::numeric_limits<float>::infinity(), 3e38f}) {
    std::vector<zmq::message_t> frames;
    frames.push_back(RawHeader(schema::MessageKind::PULL_REPLY, {{0, 3, true, 0, 0, 4}}));
    auto values = Iota(12);
    values[9] = bad;
    frames.push_back(FrameOf(values));
    ExpectRefused(Decode(frames, Tables(), Limits{}), StatusCode::kInvalidArgument,
                  {"frame 1 (values of block 0, table 0)", "at index 9", "row index 2, column 1",
                   "pullReply values must be finite", "parameters a shard serves"});
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
