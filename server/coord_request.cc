#include "server/coord_request.h"

#include <capnp/message.h>
#include <capnp/serialize.h>
#include <kj/exception.h>
#include <spdlog/fmt/fmt.h>

#include <exception>

#include "common/wire/gridsync.capnp.h"

namespace gridsync {
namespace {

namespace schema = wire::schema;

// CoordRequest is at most 4 levels deep (request, register, tables, name).
constexpr int kNestingLimit = 16;

std::string ToString(capnp::Text::Reader text) { return std::string(text.begin(), text.size()); }

constexpr const char* kAllowedRequests =
    "allowed: register, getMap, barrier, kvSet, kvGet, heartbeat, authHello, auth";

Result<Role> RoleFromWire(schema::Role role, const char* what) {
  switch (role) {
    case schema::Role::SHARD:
      return Role::kShard;
    case schema::Role::WORKER:
      return Role::kWorker;
    case schema::Role::OBSERVER:
      return Role::kObserver;
  }
  return Status::InvalidArgument(fmt::format(
      "{}: unknown role {}; allowed: shard, worker, observer", what, static_cast<unsigned>(role)));
}

}  // namespace

Result<Request> DecodeRequest(kj::ArrayPtr<const capnp::word> words, uint64_t* request_id) {
  *request_id = 0;
  try {
    capnp::ReaderOptions options;
    // Each word may be visited a few times (lists of structs); anything more
    // is a pointer-amplification attack, not a real request.
    options.traversalLimitInWords = 4 * words.size() + 64;
    options.nestingLimit = kNestingLimit;
    capnp::FlatArrayMessageReader reader(words, options);
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
        if (!root.hasRegister()) {
          return Status::InvalidArgument(
              std::string("request carries no body (empty union: register without a "
                          "RegisterRequest); ") +
              kAllowedRequests);
        }
        auto reg = root.getRegister();
        RegisterInfo info;
        GRIDSYNC_ASSIGN_OR_RETURN(info.role, RoleFromWire(reg.getRole(), "register"));
        info.requested_rank = reg.getRequestedRank();
        info.node = ToString(reg.getNode());
        info.local_rank = reg.getLocalRank();
        info.endpoint = ToString(reg.getEndpoint());
        info.pid = reg.getPid();
        for (auto table : reg.getTables()) {
          info.tables.push_back(
              TableInfo{ToString(table.getName()), table.getRows(), table.getWidth()});
        }
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
        request.body = BarrierRequest{ToString(barrier.getName()), barrier.getCount(),
                                      barrier.getTimeoutMs(), ToString(barrier.getMember())};
        break;
      }
      case schema::CoordRequest::KV_SET: {
        auto set = root.getKvSet();
        auto value = set.getValue();
        request.body =
            KvSetRequest{ToString(set.getKey()),
                         std::string(reinterpret_cast<const char*>(value.begin()), value.size())};
        break;
      }
      case schema::CoordRequest::KV_GET: {
        auto get = root.getKvGet();
        KvGetRequest kv;
        for (auto key : get.getKeys()) kv.keys.push_back(ToString(key));
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
        auto nonce = auth.getNonce();
        auto box = auth.getBox();
        a.nonce.assign(reinterpret_cast<const char*>(nonce.begin()), nonce.size());
        a.box.assign(reinterpret_cast<const char*>(box.begin()), box.size());
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

}  // namespace gridsync
