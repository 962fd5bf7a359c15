// libFuzzer target: the worker's side of a pull reply in parts
// (PsClient::ReceivePull, TakePullPart), against a fake shard that answers
// a real pull over a real socket with what the input says.
//
// Each input asks for rows of three tables (two sparse grid levels and a
// dense MLP table), then answers the pull: the request's rows cut into
// parts where the input says, each part then possibly damaged (its start
// row, its moreParts flag, a block's table, width or row count, a value
// made NaN, a part dropped or sent with another request id), and
// finally an Error for the request, so a client still waiting returns.
// Oracles: ReceivePull always returns; an undamaged answer is taken, and
// every requested value equals what was sent while every other one stays
// untouched; a client that took a damaged answer still wrote only
// requested rows.
// Between inputs, small pulls take what a damaged answer left queued.
// Input: [u8 rows bits x 12][u8 parts][per part: u8 cut (not for the last,
// which takes the rest), u8 damage (8..15 damage), u8 arg]
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <memory>
#include <vector>
#include <zmq.hpp>

#include "common/sharding.h"
#include "common/wire/message.h"
#include "fuzz/fuzz_input.h"
#include "tools/bench_shard_map.h"
#include "worker/ps_client.h"

namespace gridsync {
namespace {

// A broken oracle: says which before stopping, so a crash names its check.
[[noreturn]] void Fail(const char* what) {
  std::fprintf(stderr, "pull_reply_fuzz: %s\n", what);
  __builtin_trap();
}

const std::vector<TableInfo> kTables = {{"level0", 48, 2}, {"level1", 48, 4}, {"mlp", 6, 8}};
constexpr float kPoison = -7.0f;

struct Harness {
  zmq::context_t context{1};
  zmq::socket_t router{context, zmq::socket_type::router};
  std::unique_ptr<Partition> partition;
  std::unique_ptr<PsClient> client;
  std::vector<wire::TableShape> shapes;
};

Harness& Get() {
  static Harness* h = [] {
    auto* made = new Harness;
    made->router.set(zmq::sockopt::linger, 0);
    made->router.bind("tcp://127.0.0.1:*");
    made->partition =
        std::make_unique<Partition>(Partition::Make(kTables, 1, ModelParallelDim::kRow).value());
    const std::string endpoint = made->router.get(zmq::sockopt::last_endpoint);
    made->client = PsClient::Connect(bench::OneShardMap(endpoint, kTables, 1), *made->partition, 0,
                                     1, std::chrono::milliseconds(5000))
                       .value();
    for (const auto& t : kTables) made->shapes.push_back({t.rows, t.width});
    return made;
  }();
  return *h;
}

void Send(Harness& h, const zmq::message_t& identity, std::vector<zmq::message_t> frames) {
  zmq::message_t id;
  id.copy(const_cast<zmq::message_t&>(identity));
  frames.insert(frames.begin(), std::move(id));
  if (!wire::SendMultipart(h.router, frames).ok()) Fail("the fake shard could not send");
}

// What a damaged answer left in the client's socket (parts after the one
// it refused, the closing Error) is read by its next pull, and a part that
// does not decode fails that pull, as a broken shard should. Before the
// next input, small pulls answered whole take them until one succeeds.
void Resync(Harness& h) {
  std::vector<float> mlp(size_t{kTables[2].rows} * kTables[2].width);
  for (int attempt = 0; attempt < 32; ++attempt) {
    if (!h.client->SendPull(0, {{2, true, nullptr, 0, mlp.data()}}).ok()) Fail("resync: SendPull");
    auto frames = wire::ReceiveMultipart(h.router, 5000, wire::Limits{}, 1);
    if (!frames.ok()) Fail("resync: no pull at the fake shard");
    zmq::message_t identity = std::move((*frames)[0]);
    frames->erase(frames->begin());
    wire::OutHeader header;
    header.kind = wire::Kind::kPullReply;
    header.request_id = wire::PeekRequestId(*frames, wire::Limits{});
    wire::OutBlock b;
    b.table = 2;
    b.dense = true;
    b.width = kTables[2].width;
    b.row_count = static_cast<uint32_t>(kTables[2].rows);
    b.values.assign(mlp.size(), 0.0f);
    std::vector<wire::OutBlock> blocks;
    blocks.push_back(std::move(b));
    Send(h, identity, wire::Encode(header, std::move(blocks)));
    if (h.client->ReceivePull().ok()) return;
  }
  Fail("resync: the stale messages of one input never run out");
}

// The value the fake shard sends for column c of the i-th requested row of
// block b: distinct, so a misplaced one shows.
float SentValue(size_t b, uint64_t i, uint32_t c) {
  return static_cast<float>(b * 100000 + i * 10 + c);
}

}  // namespace
}  // namespace gridsync

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace gridsync;
  Harness& h = Get();
  fuzz::FuzzInput in(data, size);

  // The pull: rows of level0 and level1 by the input's bits, mlp whole.
  std::vector<std::vector<uint32_t>> rows(2);
  for (uint32_t t = 0; t < 2; ++t) {
    for (uint32_t byte = 0; byte < 6; ++byte) {
      const uint8_t bits = in.Take<uint8_t>();
      for (uint32_t k = 0; k < 8; ++k) {
        if ((bits >> k) & 1) rows[t].push_back(byte * 8 + k);
      }
    }
  }
  std::vector<std::vector<float>> dest;
  for (const auto& t : kTables) dest.emplace_back(t.rows * t.width, kPoison);
  std::vector<TablePullRef> refs;
  for (uint32_t t = 0; t < 2; ++t) {
    if (!rows[t].empty())
      refs.push_back({t, false, rows[t].data(), rows[t].size(), dest[t].data()});
  }
  refs.push_back({2, true, nullptr, 0, dest[2].data()});
  if (!h.client->SendPull(0, refs).ok()) Fail("SendPull");

  // The fake shard reads it.
  auto frames = wire::ReceiveMultipart(h.router, 5000, wire::Limits{}, 1);
  if (!frames.ok()) Fail("no pull at the fake shard");
  zmq::message_t identity = std::move((*frames)[0]);
  frames->erase(frames->begin());
  auto pull = wire::Decode(*frames, h.shapes, wire::Limits{});
  if (!pull.ok() || pull->kind != wire::Kind::kPull) Fail("the pull does not decode");
  const auto& asked = pull->blocks;
  uint64_t total = 0;
  for (const auto& b : asked) total += b.row_count;

  // The answer: parts cut where the input says, each maybe damaged.
  const size_t parts = 1 + in.Take<uint8_t>() % 8;
  bool damaged = false;
  uint64_t flat = 0;  // rows sent so far, over the request's blocks
  size_t block = 0;
  uint32_t row = 0;
  for (size_t p = 0; p < parts && (block < asked.size() || p == 0); ++p) {
    const bool last = p + 1 == parts;
    // Rows of this part: the input's share, all that is left in the last.
    uint64_t want = last ? total - flat : (in.Take<uint8_t>() % 64) + 1;
    const uint8_t damage = in.Take<uint8_t>() % 16;
    const uint8_t arg = in.Take<uint8_t>();
    wire::OutHeader header;
    header.kind = wire::Kind::kPullReply;
    header.request_id = pull->request_id;
    header.step = 1;
    header.part_row = flat;
    std::vector<wire::OutBlock> out;
    while (block < asked.size() && (want > 0 || asked[block].row_count == 0)) {
      const wire::Block& in_block = asked[block];
      const uint32_t take =
          static_cast<uint32_t>(std::min<uint64_t>(want, in_block.row_count - row));
      wire::OutBlock b;
      b.table = in_block.table;
      b.width = in_block.width;
      b.col_begin = in_block.col_begin;
      b.row_count = take;
      for (uint32_t i = 0; i < take; ++i) {
        for (uint32_t c = 0; c < b.width; ++c) b.values.push_back(SentValue(block, row + i, c));
      }
      out.push_back(std::move(b));
      want -= take;
      flat += take;
      row += take;
      if (row == in_block.row_count) {
        ++block;
        row = 0;
      }
      if (row != 0) break;  // cut inside a block: the part is full
    }
    header.more_parts = block < asked.size();
    // Damage (0..7 leave the part alone).
    if (damage >= 8) damaged = true;
    switch (damage) {
      case 8:
        header.part_row += 1 + arg % 4;
        break;
      case 9:
        header.more_parts = !header.more_parts;
        break;
      case 10:
        if (!out.empty()) out[arg % out.size()].table = (out[arg % out.size()].table + 1) % 3;
        break;
      case 11:
        if (!out.empty() && out.back().row_count > 0) {
          --out.back().row_count;
          out.back().values.resize(size_t{out.back().row_count} * out.back().width);
        }
        break;
      case 12:
        if (!out.empty()) {
          ++out.back().row_count;
          out.back().values.resize(size_t{out.back().row_count} * out.back().width, 1.0f);
        }
        break;
      case 13:
        if (!out.empty() && !out[0].values.empty())
          out[0].values[arg % out[0].values.size()] = std::nanf("");
        break;
      case 14:
        // Another request's: far from any id this client will use, or a
        // later input's pull would read it as its own.
        header.request_id += uint64_t{1} << 40;
        break;
      default:
        break;
    }
    // A block whose table moved must still fit that table's width.
    for (auto& b : out) {
      const uint32_t width = kTables[b.table].width;
      if (b.width != width) {
        b.width = width;
        b.values.resize(size_t{b.row_count} * width, 2.0f);
      }
    }
    if (damage == 15) continue;  // the part is dropped
    Send(h, identity, wire::Encode(header, std::move(out)));
  }
  if (block < asked.size()) damaged = true;  // the parts ran out early
  // Whatever came before, a client still waiting stops here.
  Send(h, identity,
       wire::EncodeError(pull->request_id, 0, Status::Unavailable("fuzz: end of answer")));

  const auto got = h.client->ReceivePull();
  if (!damaged && !got.ok()) {
    std::fprintf(stderr, "pull_reply_fuzz: %s\n", got.status().ToString().c_str());
    Fail("a valid answer refused");
  }
  // Requested rows hold what was sent (when taken) or are untouched; rows
  // nobody asked for are never written.
  for (uint32_t t = 0; t < 3; ++t) {
    const uint32_t width = kTables[t].width;
    std::vector<char> requested(kTables[t].rows, t == 2);
    if (t < 2) {
      for (uint32_t r : rows[t]) requested[r] = 1;
    }
    for (uint64_t r = 0; r < kTables[t].rows; ++r) {
      for (uint32_t c = 0; c < width; ++c) {
        const float v = dest[t][r * width + c];
        if (!requested[r] && v != kPoison) Fail("a row nobody asked for was written");
      }
    }
  }
  Resync(h);
  if (got.ok() && !damaged) {
    for (size_t b = 0; b < asked.size(); ++b) {
      const auto& a = asked[b];
      for (uint32_t i = 0; i < a.row_count; ++i) {
        const uint32_t r = a.dense ? a.row_begin + i : a.rows[i];
        for (uint32_t c = 0; c < a.width; ++c) {
          if (dest[a.table][size_t{r} * kTables[a.table].width + a.col_begin + c] !=
              SentValue(b, i, c))
            Fail("a requested value differs from what was sent");
        }
      }
    }
  }
  return 0;
}
