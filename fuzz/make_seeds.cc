// Writes the seed corpus of the fuzz targets (fuzz/corpus/<target>/): real
// messages, payloads and configs in each target's input format, so fuzzing
// starts from inputs that pass the decoders. Run by hand when a format
// changes: build-fuzz/fuzz/make_seeds fuzz/corpus
#include <capnp/message.h>
#include <capnp/serialize.h>

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "common/wire/gridsync.capnp.h"
#include "common/wire/message.h"
#include "kernels/cpu/codec.h"

namespace {

namespace fs = std::filesystem;
using namespace gridsync;

void Write(const fs::path& dir, const std::string& name, const std::string& bytes) {
  fs::create_directories(dir);
  std::ofstream(dir / name, std::ios::binary) << bytes;
}

template <typename T>
void Put(std::string* out, T value) {
  out->append(reinterpret_cast<const char*>(&value), sizeof(T));
}

std::string WireInput(const std::vector<zmq::message_t>& frames) {
  std::string out;
  Put<uint8_t>(&out, static_cast<uint8_t>(frames.size()));
  for (const auto& f : frames) {
    Put<uint16_t>(&out, static_cast<uint16_t>(f.size()));
    out.append(static_cast<const char*>(f.data()), f.size());
  }
  return out;
}

UninitVector<float> Ramp(size_t n) {
  UninitVector<float> v(n);
  for (size_t i = 0; i < n; ++i) v[i] = 0.01f * static_cast<float>(i % 17) - 0.05f;
  return v;
}

}  // namespace

int main(int argc, char** argv) {
  const fs::path root = argc > 1 ? argv[1] : "fuzz/corpus";
  // Data plane: push (sparse + dense), compressed push, pull, init, stats.
  for (int codec = 0; codec < 8; ++codec) {
    wire::OutHeader h;
    h.kind = wire::Kind::kPush;
    h.request_id = 7;
    h.num_workers = 2;
    std::vector<wire::OutBlock> blocks(2);
    blocks[0].table = 1;
    blocks[0].width = 2;
    blocks[0].rows = {3, 4, 9, 100, 4000};
    blocks[0].row_count = 5;
    blocks[0].values = Ramp(10);
    blocks[1].table = 0;
    blocks[1].dense = true;
    blocks[1].row_count = 64;
    blocks[1].width = 2;
    blocks[1].values = Ramp(128);
    if (codec != 0) {
      CodecOptions o{static_cast<Codec>(codec), 0.25, 4, 16};
      blocks[1].codec = o;
      blocks[1].codec_seed = 99;
      blocks[1].payload.resize(EncodedSize(o, 128));
      cpu::Encode(o, blocks[1].values.data(), 128, 99, blocks[1].payload.data());
      blocks[1].values.clear();
      // The codec target's format: [u8 codec][f64 ratio][u8 bits][u32 block][u32 n][u64 seed]
      std::string in;
      Put<uint8_t>(&in, static_cast<uint8_t>(codec));
      Put<double>(&in, o.ratio);
      Put<uint8_t>(&in, static_cast<uint8_t>(o.bits));
      Put<uint32_t>(&in, o.block);
      Put<uint32_t>(&in, 128);
      Put<uint64_t>(&in, 99);
      in.append(reinterpret_cast<const char*>(blocks[1].payload.data()), blocks[1].payload.size());
      Write(root / "codec_decode_fuzz", "codec-" + std::string(CodecName(o.codec)), in);
    }
    Write(root / "wire_decode_fuzz", "push-codec-" + std::to_string(codec),
          WireInput(wire::Encode(h, std::move(blocks))));
  }
  for (wire::Kind kind : {wire::Kind::kPull, wire::Kind::kInit, wire::Kind::kPullReply}) {
    wire::OutHeader h;
    h.kind = kind;
    h.request_id = 8;
    std::vector<wire::OutBlock> blocks(1);
    blocks[0].table = 2;
    blocks[0].width = 2;
    blocks[0].rows = {1, 2, 700000 % (1u << 19), 500000};
    std::sort(blocks[0].rows.begin(), blocks[0].rows.end());
    blocks[0].row_count = 4;
    if (wire::KindCarriesValues(kind)) blocks[0].values = Ramp(8);
    Write(root / "wire_decode_fuzz", std::string("kind-") + wire::KindName(kind),
          WireInput(wire::Encode(h, std::move(blocks))));
  }
  {
    wire::OutHeader h;
    h.kind = wire::Kind::kStats;
    Write(root / "wire_decode_fuzz", "stats", WireInput(wire::Encode(h, {})));
    Write(root / "wire_decode_fuzz", "error",
          WireInput(wire::EncodeError(3, 1, Status::InvalidArgument("refused"))));
  }
  // Control plane: one of each request.
  for (int which = 0; which < 6; ++which) {
    capnp::MallocMessageBuilder builder;
    auto r = builder.initRoot<wire::schema::CoordRequest>();
    r.setRequestId(42 + which);
    switch (which) {
      case 0: {
        auto reg = r.initRegister();
        reg.setRole(wire::schema::Role::WORKER);
        reg.setRequestedRank(1);
        reg.setNode("a");
        reg.setEndpoint("tcp://10.0.0.1:29501");
        auto t = reg.initTables(2);
        t[0].setName("level0");
        t[0].setRows(4096);
        t[0].setWidth(2);
        t[1].setName("mlp0");
        t[1].setRows(64);
        t[1].setWidth(32);
        break;
      }
      case 1: {
        auto g = r.initGetMap();
        g.setWaitComplete(true);
        g.setTimeoutMs(1000);
        break;
      }
      case 2: {
        auto b = r.initBarrier();
        b.setName("init");
        b.setCount(2);
        b.setMember("worker-0");
        break;
      }
      case 3: {
        auto s = r.initKvSet();
        s.setKey("gloo/flat/0");
        s.setValue(kj::arrayPtr(reinterpret_cast<const kj::byte*>("addr"), 4));
        break;
      }
      case 4: {
        auto g = r.initKvGet();
        auto keys = g.initKeys(2);
        keys.set(0, "a");
        keys.set(1, "b");
        break;
      }
      default:
        r.setHeartbeat();
    }
    auto words = capnp::messageToFlatArray(builder);
    auto bytes = words.asBytes();
    Write(root / "coord_request_fuzz", "request-" + std::to_string(which),
          std::string(reinterpret_cast<const char*>(bytes.begin()), bytes.size()));
  }
  std::printf("seed corpus written under %s\n", root.c_str());
  return 0;
}
