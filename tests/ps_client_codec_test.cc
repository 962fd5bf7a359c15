// A PsClient's compressed pushes, read off the wire by a fake shard: with
// error feedback, the payload of every block is the codec's encoding of the
// block's gradient plus its rows' residuals, encoded whole, and the client
// keeps what that encoding did not deliver, as a reference ErrorFeedback
// does here step after step (the residuals are stored after the send, while
// the shards decode: a one-pass add, encode and store before it measured
// slower).
#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <memory>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "common/sharding.h"
#include "common/wire/message.h"
#include "kernels/cpu/codec.h"
#include "kernels/cpu/error_feedback.h"
#include "tests/fake_shard.h"
#include "tools/bench_shard_map.h"
#include "worker/ps_client.h"

namespace gridsync {
namespace {

// Two grid levels of widths 2 and 3, large enough that a step's rows make
// blocks of many chunks.
const std::vector<TableInfo> kTables = {{"level0", 60000, 2}, {"level1", 30000, 3}};

struct StepRows {
  std::vector<std::vector<uint32_t>> rows;  // by table, ascending
  std::vector<std::vector<float>> values;
};

StepRows RowsOfStep(std::mt19937_64* rng) {
  StepRows s;
  std::normal_distribution<float> normal(0.0f, 0.01f);
  for (const TableInfo& t : kTables) {
    std::vector<uint32_t> rows;
    for (int i = 0; i < 5000; ++i) rows.push_back(static_cast<uint32_t>((*rng)() % t.rows));
    std::sort(rows.begin(), rows.end());
    rows.erase(std::unique(rows.begin(), rows.end()), rows.end());
    std::vector<float> values(rows.size() * t.width);
    for (float& v : values) v = normal(*rng);
    s.rows.push_back(std::move(rows));
    s.values.push_back(std::move(values));
  }
  return s;
}

void ExpectPushesAreWholeEncodings(CodecOptions codec) {
  SCOPED_TRACE(std::string(CodecName(codec.codec)) + " block " + std::to_string(codec.block));
  auto partition = Partition::Make(kTables, 1, ModelParallelDim::kRow);
  ASSERT_TRUE(partition.ok()) << partition.status().ToString();
  FakeShard fake;
  auto client = PsClient::Connect(bench::OneShardMap(fake.endpoint(), kTables, 1), *partition, 0, 1,
                                  std::chrono::milliseconds(10000));
  ASSERT_TRUE(client.ok()) << client.status().ToString();
  (*client)->SetCompression(codec, /*error_feedback=*/true, /*min_bytes=*/0, /*seed=*/77);
  std::vector<wire::TableShape> shapes;
  for (const TableInfo& t : kTables) shapes.push_back({t.rows, t.width});
  cpu::ErrorFeedback reference;
  std::mt19937_64 rng(3);
  for (uint64_t step = 0; step < 4; ++step) {
    StepRows s = RowsOfStep(&rng);
    std::vector<TableRowsRef> push;
    for (uint32_t t = 0; t < kTables.size(); ++t)
      push.push_back({t, false, s.rows[t].data(), s.rows[t].size(), s.values[t].data()});
    // The fake reads the push and checks it while the client waits for the
    // ack; the reference runs there too, as the push's bytes arrive.
    std::thread shard([&] {
      ASSERT_TRUE(fake.ReceiveFrames().ok());
      auto m = wire::Decode(fake.frames(), shapes, wire::Limits{});
      ASSERT_TRUE(m.ok()) << m.status().ToString();
      ASSERT_EQ(m->blocks.size(), kTables.size());
      for (const wire::Block& b : m->blocks) {
        const uint32_t t = b.table;
        const size_t n = s.values[t].size();
        ASSERT_EQ(b.codec.codec, codec.codec);
        ASSERT_EQ(b.row_count, s.rows[t].size());
        std::vector<float> corrected = s.values[t];
        const uint64_t key = uint64_t{t} << 32;  // (table, col_begin 0)
        reference.AddResidual(key, s.rows[t].data(), s.rows[t].size(), kTables[t].width,
                              corrected.data());
        std::vector<uint8_t> want(EncodedSize(codec, n));
        cpu::Encode(codec, corrected.data(), n, b.codec_seed, want.data());
        ASSERT_EQ(std::vector<uint8_t>(b.payload.begin(), b.payload.end()), want)
            << "step " << step << " table " << t;
        std::vector<float> decoded(n);
        ASSERT_TRUE(
            cpu::Decode(codec, want.data(), want.size(), n, b.codec_seed, decoded.data()).ok());
        reference.StoreResidual(key, s.rows[t].data(), s.rows[t].size(), kTables[t].width,
                                corrected.data(), decoded.data());
      }
      fake.SendAck(m->request_id);
    });
    const Status pushed = (*client)->Push(wire::Kind::kPush, step, push);
    shard.join();
    ASSERT_TRUE(pushed.ok()) << pushed.ToString();
  }
  std::string want, got;
  reference.AppendState(&want);
  (*client)->error_feedback().AppendState(&got);
  EXPECT_GT(reference.Entries(), 0u);
  EXPECT_TRUE(want == got) << "the client's residuals differ from the reference's";
}

TEST(PsClientCodecTest, PushesCarryTheWholeBlocksEncodingAndKeepItsResiduals) {
  for (Codec c : {Codec::kFp16, Codec::kBf16, Codec::kInt8, Codec::kOnebit, Codec::kQsgd}) {
    CodecOptions codec;
    codec.codec = c;
    ExpectPushesAreWholeEncodings(codec);
  }
  // int8 blocks that rows of width 2 and 3 do not fill evenly.
  CodecOptions odd;
  odd.codec = Codec::kInt8;
  odd.block = 7;
  ExpectPushesAreWholeEncodings(odd);
}

}  // namespace
}  // namespace gridsync
