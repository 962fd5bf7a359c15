// What the wire tests share (wire_test.cc, wire_rows_test.cc,
// wire_decode_test.cc): table shapes, frame builders, a raw header a hostile
// peer could send, and the refusal check.
#pragma once

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
inline std::vector<TableShape> Tables() { return {{1000, 4}, {64, 2}, {uint64_t{1} << 22, 2}}; }

inline UninitVector<float> Iota(size_t n, float start = 0.5f) {
  UninitVector<float> v(n);
  for (size_t i = 0; i < n; ++i) v[i] = start + static_cast<float>(i);
  return v;
}

inline zmq::message_t CopyFrame(const zmq::message_t& frame) {
  return zmq::message_t(frame.data(), frame.size());
}

inline std::vector<zmq::message_t> CopyFrames(const std::vector<zmq::message_t>& frames) {
  std::vector<zmq::message_t> out;
  for (const auto& f : frames) out.push_back(CopyFrame(f));
  return out;
}

inline zmq::message_t FrameOf(capnp::MallocMessageBuilder& builder) {
  auto words = capnp::messageToFlatArray(builder);
  auto bytes = words.asBytes();
  return zmq::message_t(bytes.begin(), bytes.size());
}

template <typename T, typename Alloc>
inline zmq::message_t FrameOf(const std::vector<T, Alloc>& v) {
  return zmq::message_t(v.data(), v.size() * sizeof(T));
}

// ValidPush's blocks: a sparse block (table 0) and a dense block (table 1).
// Its row ids {1, 5, 999} travel deltaVarint unless raw_rows.
inline std::vector<OutBlock> ValidPushBlocks(bool raw_rows = false) {
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
  return blocks;
}

// A push of step 7 with ValidPushBlocks(raw_rows).
inline std::vector<zmq::message_t> ValidPush(bool raw_rows = false) {
  OutHeader h;
  h.kind = Kind::kPush;
  h.step = 7;
  return Encode(h, ValidPushBlocks(raw_rows));
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
inline zmq::message_t RawHeader(schema::MessageKind kind, const std::vector<RawBlockSpec>& blocks,
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
inline void ExpectRefused(const Result<Message>& result, StatusCode code,
                          std::initializer_list<const char*> parts) {
  ASSERT_FALSE(result.ok()) << "expected a refusal mentioning " << *parts.begin();
  EXPECT_EQ(result.status().code(), code) << result.status().ToString();
  for (const char* part : parts) {
    EXPECT_HAS_SUBSTR(result.status().message(), part) << result.status().ToString();
  }
}

// A table as large as 32-bit row ids allow, for gaps past 2^28.
inline std::vector<TableShape> HugeTables() { return {{uint64_t{1} << 32, 1}}; }

inline std::vector<uint8_t> Bytes(const zmq::message_t& frame) {
  const auto* p = static_cast<const uint8_t*>(frame.data());
  return std::vector<uint8_t>(p, p + frame.size());
}

// A pull of one sparse block of table `table`.
inline std::vector<zmq::message_t> PullRows(std::vector<uint32_t> rows, uint32_t table = 2,
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

}  // namespace
}  // namespace gridsync::wire
