// libFuzzer target: a live coordinator (server/coordinator.h) against what
// hostile peers send its control port. coord_request_fuzz covers the decode
// boundary alone; this drives the whole engine over real TCP: registration
// (any role, rank, node, tables, settings), maps, barriers (init and done
// among them), the key-value store (the workers' rates/ and collective/
// keys among them), heartbeats and the CURVE handshake's requests, from up
// to three connections at once, some requests cut short, their bytes
// flipped or their length prefix changed, and every connection dropped at
// the end of the input, whatever it waits for.
// Oracles, after every input:
// - a reply the coordinator sent decodes as a CoordReply;
// - a good member (worker 0, registered before any input) still reads the
//   map, still holds rank 0 under its own pid, and its heartbeat is
//   answered: no stranger took its rank or closed it.
// Input: [u8 connections][u8 requests][per request: u8 connection,
// u8 mutation, u16 mutation arg, u8 type, u8 a, u8 b, u16 c, u8 text
// length, text]
#include <capnp/message.h>
#include <capnp/serialize.h>

#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "common/coordinator_client.h"
#include "common/wire/gridsync.capnp.h"
#include "fuzz/fuzz_input.h"
#include "server/coordinator.h"
#include "tests/raw_coord_connection.h"

namespace gridsync {
namespace {

using namespace std::chrono_literals;
using testing::RawConnection;

[[noreturn]] void Fail(const char* what, const std::string& detail = "") {
  std::fprintf(stderr, "coordinator_session_fuzz: %s %s\n", what, detail.c_str());
  __builtin_trap();
}

const std::vector<TableInfo> kTables = {{"grid.level0", 4096, 2}, {"mlp.w0", 64, 32}};
constexpr uint32_t kGoodPid = 4242;

struct Harness {
  std::unique_ptr<Coordinator> coordinator;
  std::unique_ptr<CoordinatorClient> good;
};

RegisterInfo GoodWorker() {
  RegisterInfo info;
  info.role = Role::kWorker;
  info.requested_rank = 0;
  info.node = "node-a";
  info.pid = kGoodPid;
  info.tables = kTables;
  return info;
}

Harness& Get() {
  static Harness* h = [] {
    auto* made = new Harness;
    CoordinatorOptions options;
    options.expected_shards = 1;
    options.expected_workers = 2;
    options.read_timeout = 1000ms;
    options.max_connections = 64;
    auto started = Coordinator::Start(options);
    if (!started.ok()) Fail("the coordinator did not start:", started.status().ToString());
    made->coordinator = std::move(started).value();
    auto client = CoordinatorClient::Connect("127.0.0.1", made->coordinator->port(), 5000ms);
    if (!client.ok()) Fail("the good worker could not connect:", client.status().ToString());
    made->good = std::move(client).value();
    made->good->SetReplyTimeout(5000ms);
    auto joined = made->good->Register(GoodWorker(), 5000ms);
    if (!joined.ok()) Fail("the good worker could not register:", joined.status().ToString());
    return made;
  }();
  return *h;
}

// Texts the engine treats specially, and the input's own.
std::string PickText(uint8_t pick, const std::string& own) {
  static const char* kTexts[] = {
      "init",       "done",         "rates/1/0", "rates/1/1",         "collective/g/0",
      "launch/n/0", "ckpt/shard-0", "b",         "tcp://127.0.0.1:1", ""};
  constexpr size_t kCount = sizeof kTexts / sizeof kTexts[0];
  return pick % (kCount + 1) == kCount ? own : kTexts[pick % (kCount + 1)];
}

// One request frame (length prefix and body) built from the input.
std::string Build(fuzz::FuzzInput& in, uint64_t request_id) {
  const auto type = in.Take<uint8_t>();
  const auto a = in.Take<uint8_t>();
  const auto b = in.Take<uint8_t>();
  const auto c = in.Take<uint16_t>();
  const std::string own = in.Bytes(in.Take<uint8_t>() % 48);
  capnp::MallocMessageBuilder message;
  auto r = message.initRoot<wire::schema::CoordRequest>();
  r.setRequestId(request_id);
  switch (type % 9) {
    case 0: {
      auto reg = r.initRegister();
      reg.setRole(static_cast<wire::schema::Role>(a % 4));
      reg.setRequestedRank(static_cast<int8_t>(b) % 4);
      reg.setNode(PickText(c, own));
      reg.setLocalRank(c >> 8);
      reg.setEndpoint(PickText(c >> 4, own));
      reg.setPid(c);
      const size_t tables = (a >> 2) % 3 == 0 ? kTables.size() : (a >> 2) % 3 - 1;
      auto list = reg.initTables(static_cast<unsigned>(tables));
      for (size_t t = 0; t < tables; ++t) {
        list[t].setName(kTables[t].name);
        list[t].setRows(kTables[t].rows + ((a >> 4) & 1));
        list[t].setWidth(kTables[t].width);
      }
      reg.setRejoinStep((a >> 5) & 3);
      auto settings = reg.initSharedSettings((b >> 4) % 3);
      for (unsigned s = 0; s < settings.size(); ++s) {
        settings[s].setKey(s == 0 ? "training.steps" : own);
        settings[s].setValue(s == 0 ? std::to_string(c % 3) : own);
      }
      break;
    }
    case 1: {
      auto get = r.initGetMap();
      get.setWaitComplete(a & 1);
      get.setTimeoutMs(c % 300);
      break;
    }
    case 2: {
      auto barrier = r.initBarrier();
      barrier.setName(PickText(a, own));
      barrier.setCount(b % 4);
      barrier.setTimeoutMs(c % 300);
      barrier.setMember(PickText(b >> 2, own));
      break;
    }
    case 3: {
      auto set = r.initKvSet();
      set.setKey(PickText(a, own));
      set.setValue(capnp::Data::Reader(reinterpret_cast<const uint8_t*>(own.data()), own.size()));
      break;
    }
    case 4: {
      auto get = r.initKvGet();
      auto keys = get.initKeys(b % 4);
      for (unsigned k = 0; k < keys.size(); ++k) keys.set(k, PickText(a + k, own));
      get.setTimeoutMs(c % 300);
      break;
    }
    case 5:
      r.setHeartbeat();
      break;
    case 6:
      r.setAuthHello();
      break;
    case 7: {
      auto auth = r.initAuth();
      auth.setRole(static_cast<wire::schema::Role>(a % 4));
      const auto* bytes = reinterpret_cast<const uint8_t*>(own.data());
      auth.setNonce(capnp::Data::Reader(bytes, std::min<size_t>(own.size(), b % 30)));
      auth.setBox(capnp::Data::Reader(bytes, own.size()));
      break;
    }
    default:
      break;  // no union member set: an empty request
  }
  const auto flat = capnp::messageToFlatArray(message);
  const auto body = flat.asBytes();
  std::string frame(4, '\0');
  const auto length = static_cast<uint32_t>(body.size());
  std::memcpy(frame.data(), &length, 4);
  frame.append(reinterpret_cast<const char*>(body.begin()), body.size());
  return frame;
}

// Damages the frame as the input says: 0..3 leave it whole.
void Mutate(uint8_t mutation, uint16_t arg, std::string& frame) {
  switch (mutation % 8) {
    case 4:  // a byte flipped
      frame[arg % frame.size()] ^= static_cast<char>(1u << (mutation >> 5));
      break;
    case 5:  // cut short: the rest never comes
      frame.resize(arg % frame.size());
      break;
    case 6: {  // another length prefix
      const uint32_t length = arg % 2 ? arg * 8u : arg;
      std::memcpy(frame.data(), &length, 4);
      break;
    }
    case 7:  // sent twice
      frame += frame;
      break;
    default:
      break;
  }
}

void Check(Harness& h) {
  auto map = h.good->GetMap(false, 0ms);
  if (!map.ok()) Fail("the good worker could not read the map:", map.status().ToString());
  bool held = false;
  for (const auto& worker : map->workers)
    held = held || (worker.rank == 0 && worker.pid == kGoodPid);
  if (!held) Fail("the good worker no longer holds rank 0");
  if (auto beat = h.good->Heartbeat(); !beat.ok()) {
    Fail("the good worker's heartbeat failed:", beat.ToString());
  }
}

}  // namespace
}  // namespace gridsync

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace gridsync;
  Harness& h = Get();
  fuzz::FuzzInput in(data, size);
  std::vector<std::unique_ptr<RawConnection>> connections;
  const size_t n_connections = 1 + in.Take<uint8_t>() % 3;
  for (size_t i = 0; i < n_connections; ++i) {
    connections.push_back(std::make_unique<RawConnection>(h.coordinator->port()));
  }
  const size_t n = 1 + in.Take<uint8_t>() % 8;
  for (size_t i = 0; i < n && in.left() > 0; ++i) {
    RawConnection& connection = *connections[in.Take<uint8_t>() % connections.size()];
    const auto mutation = in.Take<uint8_t>();
    const auto arg = in.Take<uint16_t>();
    std::string frame = Build(in, 1 + i);
    Mutate(mutation, arg, frame);
    if (!frame.empty()) connection.Send(frame);
  }
  // What came back so far must decode; a request still waiting is dropped
  // with its connection.
  for (auto& connection : connections) {
    for (;;) {
      const RawConnection::Reply reply = connection->ReadReply(8ms);
      if (reply.eof || reply.timeout) break;
      if (!reply.decoded) Fail("the coordinator sent a reply that does not decode");
    }
  }
  connections.clear();
  Check(h);
  return 0;
}
