// libFuzzer target: a live PS shard (server/ps_shard.h) against what a
// hostile peer sends it over a real socket. Issue 7's worst defect was one
// message that killed a shard; this drives the whole request path (decode,
// kind and role checks, job admission, ownership, codec payloads, bsp and
// async pushes, held and delta pulls) with messages built from the input.
//
// Each input picks one of five shards and sends it up to 8 messages: each a
// well-formed message of any kind, then possibly mutated in its Cap'n Proto
// header (one field set to an input value) or in its frames (cut, a byte
// flipped, dropped, doubled, garbage appended). The shards:
// 0. bsp, one worker, gradient pushes (each push applies alone);
// 1. async, two workers, update pushes, delta pulls;
// 2. bsp, two workers, update pushes: a step's pushes merged by row
//    (ShardStore::ApplyMerged, worker updates);
// 3. bsp, two workers, gradient pushes: the same merge into Adam;
// 4. as 3, but shard 0 of four cut by rows and columns (mp_dim both): it
//    owns column slices (one float wide for level0 and level1) of some of
//    level0's row blocks, so pushes name rows of other shards (and, once
//    a mutation moves a block's columns, their columns), and the merge
//    maps rows to local rows.
// Messages are built for the served shard's columns. On shards 2-4 the
// steps and pull versions follow the version the shard last reported, and
// the job and epoch the one it serves (unless the input asks for others),
// so that the two ranks' pushes of one step keep meeting however far a
// campaign has moved the shard; a push held for its partner either meets
// it in a later input or times out. Oracles, after every input:
// - the shard answers a stats request within 5 s (it still serves);
// - every reply it sent decodes (a shard never sends what a client cannot
//   read);
// - a good client's pull of rows it owns is answered with finite values.
// Input: [u8 shard][u8 messages][per message: u8 kind, u8 flags, u8 step,
// u8 min_version, u8 job, u8 workers, u8 blocks, per block: u8 table,
// u16 row bits, u8 codec, u8 values; u8 mutations, per mutation: u8 what,
// u32 arg]
#include <capnp/message.h>
#include <capnp/serialize.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <memory>
#include <vector>
#include <zmq.hpp>

#include "common/sharding.h"
#include "common/wire/gridsync.capnp.h"
#include "common/wire/message.h"
#include "fuzz/fuzz_input.h"
#include "kernels/cpu/codec.h"
#include "server/ps_shard.h"

namespace gridsync {
namespace {

[[noreturn]] void Fail(const char* what, const std::string& detail = "") {
  std::fprintf(stderr, "shard_request_fuzz: %s %s\n", what, detail.c_str());
  __builtin_trap();
}

const std::vector<TableInfo> kTables = {{"level0", 64, 2}, {"level1", 64, 4}, {"mlp", 6, 8}};
// For the shard of four: level0 has four row blocks (two row groups).
const std::vector<TableInfo> kTablesOfFour = {
    {"level0", 4 * kRowBlock, 2}, {"level1", 64, 4}, {"mlp", 6, 8}};
constexpr uint64_t kStatsId = 0xFFFF0001u;
constexpr uint64_t kOracleId = 0xFFFF0002u;

struct Served {
  const Partition* partition = nullptr;
  const std::vector<wire::TableShape>* shapes = nullptr;
  uint32_t id = 0;  // ShardOptions::shard
  std::unique_ptr<PsShard> shard;
  uint32_t workers = 0;         // ShardOptions::workers
  bool relative_steps = false;  // steps, versions, job and epoch follow the shard's
  uint64_t version = 0;         // as the last stats reply reported it
  uint64_t job = 0;             // served (0: none yet), as serving_stats() said last
  uint32_t epoch = 0;
  zmq::socket_t socket;
};
constexpr int kShards = 5;

struct Harness {
  zmq::context_t context{1};
  std::unique_ptr<Partition> one, four;  // one shard by rows; four by rows and columns
  std::vector<wire::TableShape> shapes_one, shapes_four;
  Served served[kShards];
};

Harness& Get() {
  static Harness* h = [] {
    auto* made = new Harness;
    made->one =
        std::make_unique<Partition>(Partition::Make(kTables, 1, ModelParallelDim::kRow).value());
    made->four = std::make_unique<Partition>(
        Partition::Make(kTablesOfFour, 4, ModelParallelDim::kBoth).value());
    for (const auto& t : kTables) made->shapes_one.push_back({t.rows, t.width});
    for (const auto& t : kTablesOfFour) made->shapes_four.push_back({t.rows, t.width});
    for (int i = 0; i < kShards; ++i) {
      ShardOptions options;
      options.threads = 1;
      options.timeout = std::chrono::milliseconds(1500);
      options.workers = i == 0 ? 1 : 2;
      options.consistency = i == 1 ? Consistency::kAsync : Consistency::kBsp;
      options.apply_updates = i == 1 || i == 2;
      const bool of_four = i == 4;
      if (i == 1) options.pull_codec.codec = Codec::kOnebit;
      options.pull_min_bytes = 16;
      options.reply_part_bytes = 96;  // replies in parts, even for these small tables
      Served& s = made->served[i];
      s.partition = of_four ? made->four.get() : made->one.get();
      s.shapes = of_four ? &made->shapes_four : &made->shapes_one;
      s.id = options.shard;
      auto shard = PsShard::Start(*s.partition, options);
      if (!shard.ok()) Fail("the shard did not start:", shard.status().ToString());
      s.shard = std::move(shard).value();
      s.workers = options.workers;
      s.relative_steps = i >= 2;
      s.socket = zmq::socket_t(made->context, zmq::socket_type::dealer);
      s.socket.set(zmq::sockopt::linger, 0);
      s.socket.connect(s.shard->endpoint());
    }
    return made;
  }();
  return *h;
}

// A well-formed message of the input's choosing (its fields may still be
// wrong for the shard: the job, the step, the worker count, the codec).
std::vector<zmq::message_t> Build(fuzz::FuzzInput& in, const Served& served, uint64_t request_id) {
  wire::OutHeader h;
  h.kind = static_cast<wire::Kind>(in.Take<uint8_t>() % 8);
  const auto flags = in.Take<uint8_t>();
  const auto step = in.Take<uint8_t>();
  const auto min_version = in.Take<uint8_t>();
  if (served.relative_steps) {
    // The current step or the next; the current version, the next (held
    // until its step is applied) or the one after (refused), or, with bit
    // 2, one behind.
    const uint64_t base = served.version;
    h.step = base + step % 2;
    h.min_version = (min_version & 4) && base > 0 ? base - 1 : base + min_version % 3;
  } else {
    h.step = step % 16;
    h.min_version = min_version % 16;
  }
  // The job served, but one in four times (and always before any) one of
  // 0..2, whatever is served.
  const auto job = in.Take<uint8_t>();
  h.job = served.relative_steps && served.job != 0 && job % 4 != 3 ? served.job : job % 3;
  const auto workers = in.Take<uint8_t>();
  h.num_workers = workers % 4;
  h.worker_rank = (workers >> 2) % 3;
  h.request_id = request_id;
  h.shard = (flags & 1) ? 1 : 0;
  h.whole_values = flags & 2;
  h.evaluation = flags & 4;
  h.skip_step = flags & 8;
  h.push_values = (flags & 16) ? wire::PushValues::kUpdates : wire::PushValues::kGradients;
  // With bit 5, an epoch past the one served (a claim of the future).
  h.epoch = (served.relative_steps ? served.epoch : 0) + ((flags >> 5) & 1);
  const wire::KindLayout layout = wire::LayoutOf(h.kind);
  std::vector<wire::OutBlock> blocks;
  const size_t n_blocks = layout.blocks ? in.Take<uint8_t>() % 4 : 0;
  for (size_t i = 0; i < n_blocks; ++i) {
    wire::OutBlock b;
    b.table = in.Take<uint8_t>() % served.partition->n_tables();
    const TableInfo& table = served.partition->table(b.table);
    // The served shard's columns (all of them on a shard of one).
    b.col_begin =
        served.partition->ColBegin(b.table, served.partition->ColumnGroupOf(served.id, b.table));
    b.width = served.partition->ColWidth(b.table);
    auto bits = in.Take<uint16_t>();
    b.dense = !layout.row_ids || (bits & 1) != 0 || table.rows < 16;
    if (b.dense) {
      b.row_begin = bits % table.rows;
      b.row_count = 1 + (bits >> 8) % (table.rows - b.row_begin);
    } else {
      const uint32_t stride = table.rows / 16;
      for (uint32_t r = 0; r < 16; ++r)
        if (bits & (1u << r)) b.rows.push_back(r * stride + (bits >> 12) % stride);
      b.row_count = static_cast<uint32_t>(b.rows.size());
    }
    const auto codec = in.Take<uint8_t>();
    const auto style = in.Take<uint8_t>();
    if (layout.values) {
      b.values.resize(size_t{b.row_count} * b.width);
      for (size_t v = 0; v < b.values.size(); ++v)
        b.values[v] = 0.01f * static_cast<float>((v * 7 + style) % 13) - 0.06f;
      if (!b.values.empty() && style % 8 == 1) b.values[style % b.values.size()] = std::nanf("");
      if (!b.values.empty() && style % 8 == 2) b.values[0] = INFINITY;
      if (!b.values.empty() && style % 8 == 3) b.values[0] = 3e38f;
      b.codec.codec = static_cast<Codec>(codec % 8);
      if (b.codec.codec != Codec::kNone && !b.values.empty()) {
        b.codec.ratio = 0.25 + 0.25 * ((codec >> 3) % 4);
        b.codec.bits = 1 + (codec >> 5);
        b.codec.block = 1 + (codec >> 3);
        b.codec_seed = style;
        b.payload.resize(EncodedSize(b.codec, b.values.size()));
        cpu::Encode(b.codec, b.values.data(), b.values.size(), b.codec_seed, b.payload.data());
        b.values.clear();
      } else {
        b.codec = CodecOptions{};
      }
    }
    blocks.push_back(std::move(b));
  }
  return wire::Encode(h, std::move(blocks));
}

// Sets one field of the header in `copy` (or of one of its blocks) to
// `arg`, and makes it frame 0. Throws what Cap'n Proto throws on a header
// an earlier mutation broke.
void SetField(kj::Array<capnp::word>& copy, uint8_t what, uint32_t arg,
              std::vector<zmq::message_t>& frames) {
  capnp::FlatArrayMessageReader reader(copy);
  capnp::MallocMessageBuilder builder;
  builder.setRoot(reader.getRoot<wire::schema::Header>());
  auto h = builder.getRoot<wire::schema::Header>();
  const uint32_t field = what % 20;
  if (field < 9) {
    switch (field) {
      case 0:
        h.setKind(static_cast<wire::schema::MessageKind>(arg % 10));
        break;
      case 1:
        h.setStep(arg);
        break;
      case 2:
        h.setMinVersion(arg);
        break;
      case 3:
        h.setNumWorkers(arg);
        break;
      case 4:
        h.setWorkerRank(arg);
        break;
      case 5:
        h.setJob(arg);
        break;
      case 6:
        h.setPartRow(arg);
        break;
      case 7:
        h.setPushValues(static_cast<wire::schema::PushValues>(arg % 3));
        break;
      default:
        h.setMoreParts(arg & 1);
        break;
    }
  } else if (h.getBlocks().size() > 0) {
    auto b = h.getBlocks()[arg % h.getBlocks().size()];
    const uint32_t value = arg >> 4;
    switch (field) {
      case 9:
        b.setTable(value % 5);
        break;
      case 10:
        b.setRowCount(value);
        break;
      case 11:
        b.setDense(!b.getDense());
        break;
      case 12:
        b.setRowBegin(value);
        break;
      case 13:
        b.setColBegin(value % 9);
        break;
      case 14:
        b.setWidth(value % 10);
        break;
      case 15:
        b.setCodec(static_cast<wire::schema::Codec>(value % 10));
        break;
      case 16:
        b.setCodecRatio(static_cast<double>(value % 1200) / 1000.0);
        break;
      case 17:
        b.setCodecBits(static_cast<uint8_t>(value));
        break;
      case 18:
        b.setCodecBlock(value % 600);
        break;
      default:
        b.setRowEncoding(static_cast<wire::schema::RowEncoding>(value % 3));
        break;
    }
  }
  const auto flat = capnp::messageToFlatArray(builder);
  frames[0] = zmq::message_t(flat.asBytes().begin(), flat.asBytes().size());
}

// Sets one field of frame 0's header (or of one of its blocks) to `arg`.
void MutateHeader(std::vector<zmq::message_t>& frames, uint8_t what, uint32_t arg) {
  const size_t words = frames[0].size() / sizeof(capnp::word);
  if (words == 0 || frames[0].size() % sizeof(capnp::word) != 0) return;
  kj::Array<capnp::word> copy = kj::heapArray<capnp::word>(words);
  std::memcpy(copy.begin(), frames[0].data(), words * sizeof(capnp::word));
  // An earlier mutation may have broken the header: then it stays broken.
  try {
    SetField(copy, what, arg, frames);
  } catch (const kj::Exception&) {
  }
}

void Mutate(fuzz::FuzzInput& in, std::vector<zmq::message_t>& frames) {
  const size_t n = in.Take<uint8_t>() % 4;
  for (size_t i = 0; i < n && !frames.empty(); ++i) {
    const auto what = in.Take<uint8_t>();
    const auto arg = in.Take<uint32_t>();
    const size_t f = arg % frames.size();
    switch (what % 6) {
      case 0:
        MutateHeader(frames, what >> 3, arg);
        break;
      case 1:  // cut a frame
        frames[f] = zmq::message_t(frames[f].data(), (arg >> 8) % (frames[f].size() + 1));
        break;
      case 2:  // flip a byte
        if (frames[f].size() > 0) {
          static_cast<uint8_t*>(frames[f].data())[(arg >> 8) % frames[f].size()] ^=
              static_cast<uint8_t>(1u << (what >> 5));
        }
        break;
      case 3:
        frames.erase(frames.begin() + static_cast<long>(f));
        break;
      case 4: {
        zmq::message_t copy;
        copy.copy(frames[f]);
        frames.push_back(std::move(copy));
        break;
      }
      default: {
        const std::string garbage = in.Bytes((arg >> 8) % 64);
        frames.emplace_back(garbage.data(), garbage.size());
        break;
      }
    }
  }
}

// Reads replies until the (last part of the) one to `request_id` and
// returns its kind; every reply must decode, and every value it carries
// must be finite.
// `step`, when given, gets the reply's header step.
wire::Kind AwaitReply(Served& s, uint64_t request_id, std::string* error,
                      uint64_t* step = nullptr) {
  zmq::socket_t& socket = s.socket;
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(5);
  while (std::chrono::steady_clock::now() < deadline) {
    auto frames = wire::ReceiveMultipart(socket, 200, wire::Limits{});
    if (!frames.ok()) {
      if (frames.status().code() == StatusCode::kTimeout) continue;
      Fail("a reply could not be received:", frames.status().ToString());
    }
    auto message = wire::Decode(*frames, *s.shapes, wire::Limits{});
    if (!message.ok()) {
      Fail("the shard sent a reply that does not decode:", message.status().ToString());
    }
    for (const auto& block : message->blocks) {
      for (float v : block.values)
        if (!std::isfinite(v)) Fail("the shard sent a value that is not finite");
    }
    if (message->request_id != request_id || message->more_parts) continue;
    *error = message->error.ToString();
    if (step != nullptr) *step = message->step;
    return message->kind;
  }
  Fail("the shard did not answer within 5 s");
}

void Check(Harness& h, int which) {
  Served& s = h.served[which];
  std::string error;
  wire::OutHeader stats;
  stats.kind = wire::Kind::kStats;
  stats.request_id = kStatsId;
  auto frames = wire::Encode(stats, {});
  if (!wire::SendMultipart(s.socket, frames).ok()) Fail("the stats request could not be sent");
  if (AwaitReply(s, kStatsId, &error, &s.version) != wire::Kind::kStatsReply) {
    Fail("the stats request was refused:", error);
  }
  // A good client of the shard's job: the first rows of level 0's first
  // block the shard owns (all 64 on a shard of one), in its columns, whole.
  const Partition& partition = *s.partition;
  const uint32_t group = partition.ColumnGroupOf(s.id, 0);
  const uint32_t rows = static_cast<uint32_t>(partition.table(0).rows);
  uint32_t first = 0;
  while (first < rows && partition.Owner(0, first, group) != s.id) first += kRowBlock;
  if (first >= rows) Fail("the oracle's shard owns no row of level 0");
  const ServingStats serving = s.shard->serving_stats();
  s.job = serving.job;
  s.epoch = serving.epoch;
  wire::OutHeader pull;
  pull.kind = wire::Kind::kPull;
  pull.request_id = kOracleId;
  pull.job = serving.job;
  pull.epoch = serving.epoch;
  pull.num_workers = s.workers;
  pull.whole_values = true;
  wire::OutBlock b;
  b.table = 0;
  b.col_begin = partition.ColBegin(0, group);
  b.width = partition.ColWidth(0);
  b.dense = true;
  b.row_begin = first;
  // 64 rows: in parts of 96 bytes, a whole block of 4096 was 170 replies.
  b.row_count = std::min(rows - first, 64u);
  std::vector<wire::OutBlock> blocks;
  blocks.push_back(std::move(b));
  auto pull_frames = wire::Encode(pull, std::move(blocks));
  if (!wire::SendMultipart(s.socket, pull_frames).ok()) Fail("the good pull could not be sent");
  if (AwaitReply(s, kOracleId, &error) != wire::Kind::kPullReply) {
    Fail("a good client's pull was refused:", error);
  }
}

}  // namespace
}  // namespace gridsync

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace gridsync;
  Harness& h = Get();
  fuzz::FuzzInput in(data, size);
  const int which = in.Take<uint8_t>() % kShards;
  Served& s = h.served[which];
  const size_t n = 1 + in.Take<uint8_t>() % 8;
  for (size_t i = 0; i < n && in.left() > 0; ++i) {
    auto frames = Build(in, s, 1 + i);
    Mutate(in, frames);
    if (frames.empty()) continue;
    if (!wire::SendMultipart(s.socket, frames).ok()) Fail("a message could not be sent");
  }
  Check(h, which);
  return 0;
}
