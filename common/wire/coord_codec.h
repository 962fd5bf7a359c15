// The control plane's codec: the one place where the coordinator
// (server/coordinator.cc) and its client (common/coordinator_client.cc) turn
// plain C++ values into Cap'n Proto messages (common/wire/gridsync.capnp) and
// back, and into frames on the TCP stream. Both sides call these functions,
// so the two ends cannot drift apart on a field, a role number or the frame
// layout.
//
// Frame format: the body's length in bytes as 4 bytes little-endian, then the
// body, one flat Cap'n Proto message (messageToFlatArray: segment table, then
// segments), which is whole 8-byte words. A receiver reads the prefix,
// checks it (CheckFrameLength) before allocating anything, and reads the body
// into words.
//
// The request decode boundary is DecodeRequest(): every Cap'n Proto exception
// (bad segment table, pointer out of bounds, traversal or nesting limit)
// becomes a Corruption Status naming what is allowed, so the coordinator's
// handlers see validated values only. Fuzzed by fuzz/coord_request_fuzz.cc.
//
// Thread safety: free functions without state, reentrant. Builders and
// readers passed in belong to the caller, who must not share them between
// threads meanwhile. DecodeRequest never throws; the *ToWire and Encode*
// functions may throw kj::Exception where Cap'n Proto refuses to build
// (callers already guard message building for that).
#pragma once

#include <capnp/message.h>
#include <kj/common.h>

#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <variant>
#include <vector>

#include "common/cluster_map.h"
#include "common/status.h"
#include "common/wire/curve.h"
#include "common/wire/gridsync.capnp.h"

namespace gridsync::wire {

// ---- Frame format ----

inline constexpr size_t kFramePrefixBytes = 4;

// The frame of a built message: the length prefix, then the flat message.
std::vector<uint8_t> EncodeFrame(capnp::MessageBuilder& message);

// The body length a frame's prefix announces (not yet checked).
uint32_t DecodeFramePrefix(std::span<const uint8_t, kFramePrefixBytes> prefix);

// Which rule of the format a body length breaks. Each side words its own
// refusal (the coordinator names its max_message_bytes option and answers
// with an error reply; the client names the coordinator it talks to), so
// this says which rule, not what to tell whom. Checked in the order listed:
// a zero length is kEmpty, not kNotWords.
enum class FrameLengthCheck {
  kOk,
  kEmpty,     // 0 bytes: not even a segment table
  kTooLong,   // more than the receiver's max_bytes
  kNotWords,  // not a multiple of 8: a flat message is whole words
};
FrameLengthCheck CheckFrameLength(uint32_t length, uint32_t max_bytes);

// After the key proof (security.curve) frames are sealed
// (wire::ControlSession): a body may then be the tag's bytes longer, and it
// opens into the flat message's words. The error says why it did not open
// (or that no whole message was inside); the connection is then unusable.
uint32_t FrameLimit(uint32_t max_bytes, bool sealed);
Result<std::vector<capnp::word>> OpenSealedBody(ControlSession& session, const void* body,
                                                size_t length);

// Reader limits for a body of `words` words, the same for requests and
// replies: each word may be visited a few times (lists of structs); anything
// more is a pointer-amplification attack, not a real message.
capnp::ReaderOptions FrameReaderOptions(size_t words);

// ---- Text and bytes ----

// Views of std::string data for builders (copied when set) and copies out of
// readers (which point into the received frame).
capnp::Text::Reader AsText(std::string_view s);
capnp::Data::Reader AsData(std::string_view s);
std::string StringOf(capnp::Text::Reader text);
std::string StringOf(capnp::Data::Reader data);

// ---- Values both sides exchange ----

schema::Role RoleToWire(Role role);
// `what` names the message for the error ("register", "auth"), which lists
// the allowed roles.
Result<Role> RoleFromWire(schema::Role role, const char* what);

void TableToWire(const TableInfo& table, schema::TableInfo::Builder out);
TableInfo TableFromWire(schema::TableInfo::Reader table);

void MemberToWire(const MemberInfo& member, schema::Member::Builder out);
// A map lists shards and workers only: any other role is Corruption.
Result<MemberInfo> MemberFromWire(schema::Member::Reader member);

void MapToWire(const ClusterMap& map, schema::ClusterMap::Builder out);
Result<ClusterMap> MapFromWire(schema::ClusterMap::Reader map);

void RegisterToWire(const RegisterInfo& info, schema::RegisterRequest::Builder out);
Result<RegisterInfo> RegisterFromWire(schema::RegisterRequest::Reader reg);

// An error reply carries a StatusCode number and the message.
void StatusToWire(const Status& status, schema::ErrorInfo::Builder out);
// A code this build does not know becomes Internal, naming the number.
Status StatusFromWire(schema::ErrorInfo::Reader error);

// ---- Requests: the decode boundary ----

struct GetMapRequest {
  bool wait_complete = false;
  uint32_t timeout_ms = 0;
};
struct BarrierRequest {
  std::string name;
  uint32_t count = 0;
  uint32_t timeout_ms = 0;
  std::string member;
};
struct KvSetRequest {
  std::string key;
  std::string value;
};
struct KvGetRequest {
  std::vector<std::string> keys;
  uint32_t timeout_ms = 0;
};
struct HeartbeatRequest {};
struct AuthHelloRequest {};
struct AuthRequest {
  Role role = Role::kWorker;
  std::string nonce;
  std::string box;
};

struct Request {
  uint64_t id = 0;
  std::variant<RegisterInfo, GetMapRequest, BarrierRequest, KvSetRequest, KvGetRequest,
               HeartbeatRequest, AuthHelloRequest, AuthRequest>
      body;
};

// Decodes one frame body (whole 8-byte words). Never throws. `request_id` is
// set as soon as it can be read, so that even a refusal can echo it.
Result<Request> DecodeRequest(kj::ArrayPtr<const capnp::word> words, uint64_t* request_id);

// ---- Replies: encoded by the coordinator, as whole frames ----

std::vector<uint8_t> EncodeOkReply(uint64_t request_id);
std::vector<uint8_t> EncodeErrorReply(uint64_t request_id, const Status& status);
std::vector<uint8_t> EncodeRegisteredReply(uint64_t request_id, uint32_t rank,
                                           const ClusterMap& map);
std::vector<uint8_t> EncodeMapReply(uint64_t request_id, const ClusterMap& map);
// kvGet: the values in key order.
std::vector<uint8_t> EncodeValuesReply(uint64_t request_id,
                                       std::span<const std::string_view> values);
std::vector<uint8_t> EncodeChallengeReply(uint64_t request_id, std::string_view challenge);

// ---- Replies: decoded by the client ----
// (An error reply: StatusFromWire; a map: MapFromWire.)

std::vector<std::string> ValuesFromWire(capnp::List<capnp::Data>::Reader values);

}  // namespace gridsync::wire
