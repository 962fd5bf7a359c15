// libFuzzer target: the data plane's decode boundary (wire::Decode), then
// everything a shard does with a decoded message before touching state:
// reading every named row, decoding compressed payloads and bounding their
// values. Input: [u8 frame count] then per frame [u16 length][bytes].
#include <cstdint>
#include <vector>
#include <zmq.hpp>

#include "common/wire/message.h"
#include "fuzz/fuzz_input.h"
#include "kernels/cpu/codec.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace gridsync;
  fuzz::FuzzInput in(data, size);
  const wire::Limits limits;
  const size_t frames_wanted = in.Take<uint8_t>() % (limits.max_frames() + 2);
  std::vector<zmq::message_t> frames;
  for (size_t f = 0; f < frames_wanted && in.left() > 0; ++f) {
    const std::string bytes = in.Bytes(in.Take<uint16_t>());
    frames.emplace_back(bytes.data(), bytes.size());
  }
  // Shapes like a small hash grid: levels of different sizes, an MLP table.
  const std::vector<wire::TableShape> tables = {{64, 2}, {4096, 2}, {1u << 19, 2}, {64, 64}};
  auto decoded = wire::Decode(frames, tables, limits);
  (void)wire::PeekRequestId(frames, limits);
  if (!decoded.ok()) return 0;
  const wire::KindLayout layout = wire::LayoutOf(decoded->kind);
  uint64_t sum = 0;
  for (const wire::Block& block : decoded->blocks) {
    if (layout.row_ids && !block.rows_named()) __builtin_trap();  // the invariant shards rely on
    if (block.rows_named()) {
      for (size_t i = 0; i < block.row_count; ++i) sum += block.Row(i);
    }
    if (block.compressed()) {
      const size_t n = size_t{block.row_count} * block.width;
      if (n > (size_t{1} << 24)) continue;  // bounded by the shape; keep runs fast
      std::vector<float> values(n);
      if (cpu::Decode(block.codec, block.payload.data(), block.payload.size(), n, block.codec_seed,
                      values.data())
              .ok()) {
        (void)wire::CheckValueBounds(values, limits, "payload");
      }
    }
  }
  return static_cast<int>(sum & 0);
}
