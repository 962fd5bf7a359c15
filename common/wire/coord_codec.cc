#include "common/wire/coord_codec.h"

#include <capnp/serialize.h>
#include <kj/exception.h>
#include <spdlog/fmt/fmt.h>

#include <cstring>
#include <exception>

#include "common/wire/error_code.h"

namespace gridsync::wire {
namespace {

// CoordRequest is at most 4 levels deep (request, register, tables, name),
// CoordReply 4 too (reply, map, shards, node); this leaves room.
constexpr int kNestingLimit = 16;

constexpr const char* kAllowedRequests =
    "allowed: register, getMap, barrier, kvSet, kvGet, heartbeat, authHello, auth";

// Every reply starts the same way; the caller fills the union.
template <typename Fill>
std::vector<uint8_t> EncodeReply(uint64_t request_id, Fill&& fill) {
  capnp::MallocMessageBuilder message;
  auto reply = message.initRoot<schema::CoordReply>();
  reply.setRequestId(request_id);
  fill(reply);
  return EncodeFrame(message);
}

void TablesToWire(const std::vector<TableInfo>& tables,
                  capnp::List<schema::TableInfo>::Builder out) {
  for (size_t i = 0; i < tables.size(); ++i) TableToWire(tables[i], out[static_cast<unsigned>(i)]);
}

void SettingsToWire(const std::vector<Setting>& settings,
                    capnp::List<schema::Setting>::Builder out) {
  for (size_t i = 0; i < settings.size(); ++i) {
    out[static_cast<unsigned>(i)].setKey(AsText(settings[i].key));
    out[static_cast<unsigned>(i)].setValue(AsText(settings[i].value));
  }
}

// A registration's settings, bounded: the coordinator keeps the first
// registrant's for the cluster's life.
Result<std::vector<Setting>> SettingsFromWire(capnp::List<schema::Setting>::Reader in,
                                              const char* field) {
  if (in.size() > kMaxSettings) {
    return Status::InvalidArgument(fmt::format("register: {} has {} entries; allowed: at most {}",
                                               field, in.size(), kMaxSettings));
  }
  std::vector<Setting> out;
  out.reserve(in.size());
  for (auto s : in) {
    Setting setting{StringOf(s.getKey()), StringOf(s.getValue())};
    if (setting.key.empty() || setting.key.size() > kMaxSettingKeyBytes ||
        setting.value.size() > kMaxSettingValueBytes) {
      return Status::InvalidArgument(fmt::format(
          "register: {} has a key of {} bytes with a value of {}; allowed: keys of 1 to {} "
          "bytes, values of at most {}",
          field, setting.key.size(), setting.value.size(), kMaxSettingKeyBytes,
          kMaxSettingValueBytes));
    }
    out.push_back(std::move(setting));
  }
  return out;
}

void MembersToWire(const std::vector<MemberInfo>& members,
                   capnp::List<schema::Member>::Builder out) {
  for (size_t i = 0; i < members.size(); ++i) {
    MemberToWire(members[i], out[static_cast<unsigned>(i)]);
  }
}

}  // namespace

// ---- Frame format ----

std::vector<uint8_t> EncodeFrame(capnp::MessageBuilder& message) {
  kj::Array<capnp::word> words = capnp::messageToFlatArray(message);
  auto bytes = words.asBytes();
  const auto size = static_cast<uint32_t>(bytes.size());
  std::vector<uint8_t> frame(kFramePrefixBytes + bytes.size());
  frame[0] = static_cast<uint8_t>(size);
  frame[1] = static_cast<uint8_t>(size >> 8);
  frame[2] = static_cast<uint8_t>(size >> 16);
  frame[3] = static_cast<uint8_t>(size >> 24);
  std::memcpy(frame.data() + kFramePrefixBytes, bytes.begin(), bytes.size());
  return frame;
}

uint32_t DecodeFramePrefix(std::span<const uint8_t, kFramePrefixBytes> prefix) {
  return uint32_t{prefix[0]} | (uint32_t{prefix[1]} << 8) | (uint32_t{prefix[2]} << 16) |
         (uint32_t{prefix[3]} << 24);
}

FrameLengthCheck CheckFrameLength(uint32_t length, uint32_t max_bytes) {
  if (length == 0) return FrameLengthCheck::kEmpty;
  if (length > max_bytes) return FrameLengthCheck::kTooLong;
  if (length % 8 != 0) return FrameLengthCheck::kNotWords;
  return FrameLengthCheck::kOk;
}

uint32_t FrameLimit(uint32_t max_bytes, bool sealed) {
  return max_bytes + (sealed ? static_cast<uint32_t>(ControlSession::kOverhead) : 0u);
}

Result<std::vector<capnp::word>> OpenSealedBody(ControlSession& session, const void* body,
                                                size_t length) {
  GRIDSYNC_ASSIGN_OR_RETURN(std::vector<uint8_t> opened,
                            session.Open(static_cast<const uint8_t*>(body), length));
  if (opened.empty() || opened.size() % 8 != 0) {
    return Status::InvalidArgument(
        fmt::format("a sealed frame holds {} bytes; allowed: a flat message, whole 8-byte words",
                    opened.size()));
  }
  std::vector<capnp::word> words(opened.size() / 8);
  std::memcpy(words.data(), opened.data(), opened.size());
  return words;
}

capnp::ReaderOptions FrameReaderOptions(size_t words) {
  capnp::ReaderOptions options;
  options.traversalLimitInWords = 4 * words + 64;
  options.nestingLimit = kNestingLimit;
  return options;
}

// ---- Text and bytes ----

capnp::Text::Reader AsText(std::string_view s) { return capnp::Text::Reader(s.data(), s.size()); }

capnp::Data::Reader AsData(std::string_view s) {
  return capnp::Data::Reader(reinterpret_cast<const kj::byte*>(s.data()), s.size());
}

std::string StringOf(capnp::Text::Reader text) { return std::string(text.begin(), text.size()); }

std::string StringOf(capnp::Data::Reader data) {
  return std::string(reinterpret_cast<const char*>(data.begin()), data.size());
}

// ---- Values both sides exchange ----

schema::Role RoleToWire(Role role) {
  switch (role) {
    case Role::kShard:
      return schema::Role::SHARD;
    case Role::kWorker:
      return schema::Role::WORKER;
    case Role::kObserver:
      return schema::Role::OBSERVER;
  }
  return schema::Role::OBSERVER;
}

Result<Role> RoleFromWire(schema::Role role, const char* what) {
  switch (role) {
    case schema::Role::SHARD:
      return Role::kShard;
    case schema::Role::WORKER:
      return Role::kWorker;
    case schema::Role::OBSERVER:
      return Role::kObserver;
  }
  // Cap'n Proto hands unknown enumerants through as their number.
  return Status::InvalidArgument(fmt::format(
      "{}: unknown role {}; allowed: shard, worker, observer", what, static_cast<unsigned>(role)));
}

void TableToWire(const TableInfo& table, schema::TableInfo::Builder out) {
  out.setName(AsText(table.name));
  out.setRows(table.rows);
  out.setWidth(table.width);
}

TableInfo TableFromWire(schema::TableInfo::Reader table) {
  return TableInfo{StringOf(table.getName()), table.getRows(), table.getWidth()};
}

void MemberToWire(const MemberInfo& member, schema::Member::Builder out) {
  out.setRole(RoleToWire(member.role));
  out.setRank(member.rank);
  out.setNode(AsText(member.node));
  out.setLocalRank(member.local_rank);
  out.setEndpoint(AsText(member.endpoint));
  out.setPid(member.pid);
}

Result<MemberInfo> MemberFromWire(schema::Member::Reader member) {
  MemberInfo out;
  // Not RoleFromWire: an observer is a valid role but never a map member,
  // so a map naming one is corrupt rather than a bad request.
  switch (member.getRole()) {
    case schema::Role::SHARD:
      out.role = Role::kShard;
      break;
    case schema::Role::WORKER:
      out.role = Role::kWorker;
      break;
    default:
      return Status::Corruption(
          fmt::format("cluster map member with role {}; allowed: shard, worker",
                      static_cast<unsigned>(member.getRole())));
  }
  out.rank = member.getRank();
  out.node = StringOf(member.getNode());
  out.local_rank = member.getLocalRank();
  out.endpoint = StringOf(member.getEndpoint());
  out.pid = member.getPid();
  return out;
}

void MapToWire(const ClusterMap& map, schema::ClusterMap::Builder out) {
  out.setGeneration(map.generation);
  out.setJob(map.job);
  out.setEpoch(map.epoch);
  out.setResumeStep(map.resume_step);
  out.setExpectedShards(map.expected_shards);
  out.setExpectedWorkers(map.expected_workers);
  MembersToWire(map.shards, out.initShards(static_cast<unsigned>(map.shards.size())));
  MembersToWire(map.workers, out.initWorkers(static_cast<unsigned>(map.workers.size())));
  TablesToWire(map.tables, out.initTables(static_cast<unsigned>(map.tables.size())));
}

Result<ClusterMap> MapFromWire(schema::ClusterMap::Reader map) {
  ClusterMap out;
  out.generation = map.getGeneration();
  out.job = map.getJob();
  out.epoch = map.getEpoch();
  out.resume_step = map.getResumeStep();
  out.expected_shards = map.getExpectedShards();
  out.expected_workers = map.getExpectedWorkers();
  for (auto member : map.getShards()) {
    GRIDSYNC_ASSIGN_OR_RETURN(auto parsed, MemberFromWire(member));
    out.shards.push_back(std::move(parsed));
  }
  for (auto member : map.getWorkers()) {
    GRIDSYNC_ASSIGN_OR_RETURN(auto parsed, MemberFromWire(member));
    out.workers.push_back(std::move(parsed));
  }
  for (auto table : map.getTables()) out.tables.push_back(TableFromWire(table));
  return out;
}

void RegisterToWire(const RegisterInfo& info, schema::RegisterRequest::Builder out) {
  out.setRole(RoleToWire(info.role));
  out.setRequestedRank(info.requested_rank);
  out.setNode(AsText(info.node));
  out.setLocalRank(info.local_rank);
  out.setEndpoint(AsText(info.endpoint));
  out.setPid(info.pid);
  out.setRejoinStep(info.rejoin_step);
  TablesToWire(info.tables, out.initTables(static_cast<unsigned>(info.tables.size())));
  SettingsToWire(info.shared_settings,
                 out.initSharedSettings(static_cast<unsigned>(info.shared_settings.size())));
  SettingsToWire(info.job_settings,
                 out.initJobSettings(static_cast<unsigned>(info.job_settings.size())));
}

Result<RegisterInfo> RegisterFromWire(schema::RegisterRequest::Reader reg) {
  RegisterInfo info;
  GRIDSYNC_ASSIGN_OR_RETURN(info.role, RoleFromWire(reg.getRole(), "register"));
  info.requested_rank = reg.getRequestedRank();
  info.node = StringOf(reg.getNode());
  info.local_rank = reg.getLocalRank();
  info.endpoint = StringOf(reg.getEndpoint());
  info.pid = reg.getPid();
  info.rejoin_step = reg.getRejoinStep();
  for (auto table : reg.getTables()) info.tables.push_back(TableFromWire(table));
  GRIDSYNC_ASSIGN_OR_RETURN(info.shared_settings,
                            SettingsFromWire(reg.getSharedSettings(), "sharedSettings"));
  GRIDSYNC_ASSIGN_OR_RETURN(info.job_settings,
                            SettingsFromWire(reg.getJobSettings(), "jobSettings"));
  return info;
}

void StatusToWire(const Status& status, schema::ErrorInfo::Builder out) {
  out.setCode(WireErrorCode(status.code()));
  out.setText(AsText(status.message()));
}

Status StatusFromWire(schema::ErrorInfo::Reader error) {
  const uint32_t code = error.getCode();
  std::string text = StringOf(error.getText());
  // 0 is OK, which an error reply must not carry; an unknown code is from a
  // newer build.
  if (!IsWireStatusCode(code)) {
    return Status::Internal(
        fmt::format("coordinator sent error code {} (unknown): {}", code, text));
  }
  return Status(static_cast<StatusCode>(code), std::move(text));
}

// ---- Requests: the decode boundary ----

Result<Request> DecodeRequest(kj::ArrayPtr<const capnp::word> words, uint64_t* request_id) {
  *request_id = 0;
  try {
    capnp::FlatArrayMessageReader reader(words, FrameReaderOptions(words.size()));
    if (reader.getEnd() != words.end()) {
      return Status::Corruption(fmt::format(
          "frame holds {} bytes but the Cap'n Proto message in it ends after {}; allowed: exactly "
          "one flat CoordRequest per frame",
          words.size() * 8, (reader.getEnd() - words.begin()) * 8));
    }
    auto root = reader.getRoot<schema::CoordRequest>();
    *request_id = root.getRequestId();
    Request request;
    request.id = root.getRequestId();
    switch (root.which()) {
      case schema::CoordRequest::REGISTER: {
        // register is the union's default: a message that sets nothing
        // reads as a register without a body.
        if (!root.hasRegister()) {
          return Status::InvalidArgument(
              std::string("request carries no body (empty union: register without a "
                          "RegisterRequest); ") +
              kAllowedRequests);
        }
        GRIDSYNC_ASSIGN_OR_RETURN(auto info, RegisterFromWire(root.getRegister()));
        request.body = std::move(info);
        break;
      }
      case schema::CoordRequest::GET_MAP: {
        auto get = root.getGetMap();
        request.body = GetMapRequest{get.getWaitComplete(), get.getTimeoutMs()};
        break;
      }
      case schema::CoordRequest::BARRIER: {
        auto barrier = root.getBarrier();
        request.body = BarrierRequest{StringOf(barrier.getName()), barrier.getCount(),
                                      barrier.getTimeoutMs(), StringOf(barrier.getMember())};
        break;
      }
      case schema::CoordRequest::KV_SET: {
        auto set = root.getKvSet();
        // The value is read before the key (as it always was), so that a
        // message broken in both reports the same Cap'n Proto error.
        auto value = set.getValue();
        request.body = KvSetRequest{StringOf(set.getKey()), StringOf(value)};
        break;
      }
      case schema::CoordRequest::KV_GET: {
        auto get = root.getKvGet();
        KvGetRequest kv;
        for (auto key : get.getKeys()) kv.keys.push_back(StringOf(key));
        kv.timeout_ms = get.getTimeoutMs();
        request.body = std::move(kv);
        break;
      }
      case schema::CoordRequest::HEARTBEAT:
        request.body = HeartbeatRequest{};
        break;
      case schema::CoordRequest::AUTH_HELLO:
        request.body = AuthHelloRequest{};
        break;
      case schema::CoordRequest::AUTH: {
        auto auth = root.getAuth();
        AuthRequest a;
        GRIDSYNC_ASSIGN_OR_RETURN(a.role, RoleFromWire(auth.getRole(), "auth"));
        a.nonce = StringOf(auth.getNonce());
        a.box = StringOf(auth.getBox());
        request.body = std::move(a);
        break;
      }
      default:
        return Status::InvalidArgument(fmt::format(
            "unknown request kind {}; {}", static_cast<unsigned>(root.which()), kAllowedRequests));
    }
    return request;
  } catch (const kj::Exception& e) {
    return Status::Corruption(fmt::format(
        "request does not decode as a flat Cap'n Proto CoordRequest: {}; allowed: a message built "
        "from common/wire/gridsync.capnp",
        e.getDescription().cStr()));
  } catch (const std::exception& e) {
    return Status::Corruption(
        fmt::format("request does not decode as a CoordRequest: {}", e.what()));
  }
}

// ---- Replies: encoded by the coordinator ----

std::vector<uint8_t> EncodeOkReply(uint64_t request_id) {
  return EncodeReply(request_id, [](schema::CoordReply::Builder reply) { reply.setOk(); });
}

std::vector<uint8_t> EncodeErrorReply(uint64_t request_id, const Status& status) {
  return EncodeReply(request_id, [&](schema::CoordReply::Builder reply) {
    StatusToWire(status, reply.initError());
  });
}

std::vector<uint8_t> EncodeRegisteredReply(uint64_t request_id, uint32_t rank,
                                           const ClusterMap& map) {
  return EncodeReply(request_id, [&](schema::CoordReply::Builder reply) {
    auto registered = reply.initRegistered();
    registered.setRank(rank);
    MapToWire(map, registered.initMap());
  });
}

std::vector<uint8_t> EncodeMapReply(uint64_t request_id, const ClusterMap& map) {
  return EncodeReply(request_id,
                     [&](schema::CoordReply::Builder reply) { MapToWire(map, reply.initMap()); });
}

std::vector<uint8_t> EncodeValuesReply(uint64_t request_id,
                                       std::span<const std::string_view> values) {
  return EncodeReply(request_id, [&](schema::CoordReply::Builder reply) {
    auto list = reply.initValues(static_cast<unsigned>(values.size()));
    for (size_t i = 0; i < values.size(); ++i) {
      list.set(static_cast<unsigned>(i), AsData(values[i]));
    }
  });
}

std::vector<uint8_t> EncodeChallengeReply(uint64_t request_id, std::string_view challenge) {
  return EncodeReply(request_id, [&](schema::CoordReply::Builder reply) {
    reply.setChallenge(AsData(challenge));
  });
}

// ---- Replies: decoded by the client ----

std::vector<std::string> ValuesFromWire(capnp::List<capnp::Data>::Reader values) {
  std::vector<std::string> out;
  out.reserve(values.size());
  for (auto value : values) out.push_back(StringOf(value));
  return out;
}

}  // namespace gridsync::wire
