// The coordinator engine (coordinator_engine.h): the KV store. Keys set
// and read by members (kvSet, kvGet), a kvGet deferred until its keys are
// set or the wait times out, and the bounds that keep the store from
// growing with what members write (rate rounds, metrics keys).
//
// Thread safety: see coordinator_engine.h (the io thread only).
#include <algorithm>
#include <charconv>
#include <iterator>
#include <optional>
#include <string_view>

#include "server/coordinator_engine.h"

namespace gridsync {
namespace coordinator_engine {

std::vector<std::string> CoordinatorImpl::MissingKeys(const std::vector<std::string>& keys) const {
  std::vector<std::string> missing;
  for (const auto& key : keys) {
    if (kv_.find(key) == kv_.end()) missing.push_back(key);
  }
  return missing;
}

std::vector<uint8_t> CoordinatorImpl::ValuesFrame(uint64_t request_id,
                                                  const std::vector<std::string>& keys) const {
  std::vector<std::string_view> values;
  values.reserve(keys.size());
  uint64_t bytes = 0;
  for (const auto& key : keys) {
    values.push_back(kv_.at(key));
    bytes += values.back().size();
  }
  if (bytes > options_.max_reply_bytes) {
    return wire::EncodeErrorReply(
        request_id, Status::InvalidArgument(fmt::format(
                        "kvGet: the {} keys asked for hold {} bytes of values; allowed: at most {} "
                        "bytes in one reply (ask for fewer keys at a time)",
                        keys.size(), bytes, options_.max_reply_bytes)));
  }
  return wire::EncodeValuesReply(request_id, values);
}

void CoordinatorImpl::KvPut(const std::string& key, std::string value) {
  auto [it, inserted] = kv_.try_emplace(key);
  if (inserted) kv_bytes_ += key.size();
  kv_bytes_ = kv_bytes_ - it->second.size() + value.size();
  it->second = std::move(value);
}

std::map<std::string, std::string>::iterator CoordinatorImpl::KvErase(
    std::map<std::string, std::string>::iterator it) {
  kv_bytes_ -= it->first.size() + it->second.size();
  if (stranger_keys_.erase(it->first) != 0) stranger_bytes_ -= it->first.size() + it->second.size();
  return kv_.erase(it);
}

void CoordinatorImpl::DropOldRateRounds(const std::string& key) {
  // The workers' adaptive split writes "rates/<step>/<rank>" every
  // adaptive_interval steps and never deletes (worker/sync/ps_session.cc).
  // A round is read by every worker before anyone writes the next, so a new
  // round's first key retires every round before the previous one (kept for
  // a worker whose read is still on its way); otherwise a long run would
  // fill the store's key bound.
  static constexpr std::string_view kPrefix = "rates/";
  if (!key.starts_with(kPrefix)) return;
  auto round_of = [](std::string_view k) -> std::optional<uint64_t> {
    k.remove_prefix(kPrefix.size());
    uint64_t round = 0;
    const auto [end, ec] = std::from_chars(k.data(), k.data() + k.size(), round);
    if (ec != std::errc() || end == k.data() + k.size() || *end != '/') return std::nullopt;
    return round;
  };
  const auto round = round_of(key);
  if (!round) return;
  std::optional<uint64_t> previous;  // the newest round before this one
  for (auto it = kv_.lower_bound(std::string(kPrefix));
       it != kv_.end() && it->first.starts_with(kPrefix); ++it) {
    const auto r = round_of(it->first);
    if (r && *r < *round && (!previous || *r > *previous)) previous = r;
  }
  if (!previous) return;
  for (auto it = kv_.lower_bound(std::string(kPrefix));
       it != kv_.end() && it->first.starts_with(kPrefix);) {
    const auto r = round_of(it->first);
    it = r && *r < *previous ? KvErase(it) : std::next(it);
  }
}

std::optional<Status> CoordinatorImpl::MetricsKeyProblem(const Connection& conn,
                                                         const std::string& key) {
  constexpr std::string_view kPrefix = "metrics/";
  if (key.compare(0, kPrefix.size(), kPrefix) != 0) return std::nullopt;
  if (conn.member) {
    const std::string own =
        fmt::format("metrics/{}/{}", RoleName(conn.member->role), conn.member->rank);
    if (key == own) return std::nullopt;
    return Status::InvalidArgument(fmt::format(
        "kvSet '{}': this connection is registered as {} {} and may publish only its own "
        "metrics address; allowed: '{}'",
        key.substr(0, 128), RoleName(conn.member->role), conn.member->rank, own));
  }
  return Status::InvalidArgument(fmt::format(
      "kvSet '{}': metrics/<role>/<rank> is written only by that member's own connection, once "
      "registered (the monitor scrapes what it names); allowed: register first, or a key outside "
      "metrics/",
      key.substr(0, 128)));
}

std::optional<Status> CoordinatorImpl::WorkersKeyProblem(const Connection& conn,
                                                         const std::string& key) {
  for (std::string_view prefix :
       {std::string_view("rates/"), std::string_view(kCollectiveStorePrefix)}) {
    if (!key.starts_with(prefix)) continue;
    if (RegisteredWorker(conn)) return std::nullopt;
    return Status::InvalidArgument(fmt::format(
        "kvSet '{}': keys under {} are the job's workers' own, written by registered workers "
        "only; this connection is {}; allowed: register as a worker first, or a key outside {}",
        key.substr(0, 128), prefix, Registration(conn), prefix));
  }
  return std::nullopt;
}

std::optional<Status> CoordinatorImpl::CannotJoinKeyProblem(const Connection& conn,
                                                            const std::string& key,
                                                            size_t value_bytes) const {
  const std::string_view prefix(kCannotJoinPrefix);
  if (!key.starts_with(prefix)) return std::nullopt;
  const auto ranks = [](uint32_t expected) {
    return expected == 0 ? std::string("none") : fmt::format("0..{}", expected - 1);
  };
  auto refuse = [&](std::string_view why) {
    return Status::InvalidArgument(
        fmt::format("kvSet '{}': {}; allowed: '{}<shard|worker>/<rank>' of a rank the cluster "
                    "expects (shards {}, workers {}), written by that member's own "
                    "connection or one that proved its role's key, at most {} bytes",
                    key.substr(0, 128), why, prefix, ranks(map_.expected_shards),
                    ranks(map_.expected_workers), kMaxCannotJoinBytes));
  };
  std::optional<Role> role;
  std::string_view rest = std::string_view(key).substr(prefix.size());
  for (Role r : {Role::kShard, Role::kWorker}) {
    const std::string head = std::string(RoleName(r)) + "/";
    if (rest.starts_with(head)) {
      role = r;
      rest.remove_prefix(head.size());
    }
  }
  uint32_t rank = 0;
  const auto [end, ec] = std::from_chars(rest.data(), rest.data() + rest.size(), rank);
  if (!role || rest.empty() || ec != std::errc() || end != rest.data() + rest.size()) {
    return refuse("not a role and a rank");
  }
  const uint32_t expected = *role == Role::kShard ? map_.expected_shards : map_.expected_workers;
  if (rank >= expected) return refuse("the cluster expects no such rank");
  // The one spelling the coordinator reads ("shard/01" would stay forever).
  if (key != CannotJoinKey(*role, rank)) return refuse("not the rank's own spelling");
  if (conn.member && (conn.member->role != *role || conn.member->rank != rank)) {
    return refuse(fmt::format("this connection is registered as {} {}", RoleName(conn.member->role),
                              conn.member->rank));
  }
  // A registered rank speaks for itself: another connection's word for it
  // would be a stale or forged reason beside a member that is there.
  if (!conn.member && Holder(*role, rank) != nullptr)
    return refuse(fmt::format("{} {} is registered", RoleName(*role), rank));
  if (!conn.member && conn.authenticated && *conn.authenticated != *role) {
    return refuse(fmt::format("this connection proved the {} key", RoleName(*conn.authenticated)));
  }
  if (value_bytes > kMaxCannotJoinBytes) return refuse("the value is too long");
  return std::nullopt;
}

void CoordinatorImpl::NoteCannotJoin(Role role, uint32_t rank, std::string why) {
  if (why.size() > kMaxCannotJoinBytes) why.resize(kMaxCannotJoinBytes);
  const std::string key = CannotJoinKey(role, rank);
  // The coordinator's own value: no longer within the strangers' share
  // (KvErase would take the new size off it, and wrap it).
  if (const auto old = kv_.find(key); old != kv_.end() && stranger_keys_.erase(key) != 0)
    stranger_bytes_ -= key.size() + old->second.size();
  KvPut(key, std::move(why));
}

void CoordinatorImpl::ClearCannotJoin(Role role, uint32_t rank) {
  if (auto it = kv_.find(CannotJoinKey(role, rank)); it != kv_.end()) KvErase(it);
}

void CoordinatorImpl::HandleKvSet(const ConnPtr& conn, uint64_t id, KvSetRequest req) {
  if (req.key.empty()) {
    Send(conn, wire::EncodeErrorReply(
                   id, Status::InvalidArgument("kvSet: empty key; allowed: a non-empty key")));
    return;
  }
  if (auto refused = MetricsKeyProblem(*conn, req.key)) {
    Send(conn, wire::EncodeErrorReply(id, *refused));
    return;
  }
  if (auto refused = WorkersKeyProblem(*conn, req.key)) {
    Send(conn, wire::EncodeErrorReply(id, *refused));
    return;
  }
  if (auto refused = CannotJoinKeyProblem(*conn, req.key, req.value.size())) {
    Send(conn, wire::EncodeErrorReply(id, *refused));
    return;
  }
  if (auto refused = CheckpointKeyProblem(*conn, req.key, req.value)) {
    Send(conn, wire::EncodeErrorReply(id, *refused));
    return;
  }
  DropOldRateRounds(req.key);
  const auto old = kv_.find(req.key);
  const bool fresh = old == kv_.end();
  const uint64_t after = kv_bytes_ + req.value.size() + (fresh ? req.key.size() : 0) -
                         (fresh ? 0 : old->second.size());
  if ((fresh && kv_.size() >= options_.max_store_keys) || after > options_.max_store_bytes) {
    Send(conn,
         wire::EncodeErrorReply(
             id, Status::InvalidArgument(fmt::format(
                     "kvSet '{}': the store holds {} keys, {} bytes; with this value it would "
                     "hold {} keys, {} bytes; allowed: at most {} keys and {} bytes",
                     req.key.substr(0, 128), kv_.size(), kv_bytes_, kv_.size() + (fresh ? 1 : 0),
                     after, options_.max_store_keys, options_.max_store_bytes))));
    return;
  }
  // A connection that never registered writes within its share, and the
  // key counts as its own until a member writes it.
  // A member's key it overwrites becomes its own too (an overwrite with a
  // large value would otherwise grow the store outside the share).
  const bool stranger = !conn->member;
  const bool strangers_key = stranger_keys_.count(req.key) != 0;
  if (stranger) {
    const uint64_t before = strangers_key ? req.key.size() + old->second.size() : 0;
    const uint64_t stranger_after = stranger_bytes_ - before + req.key.size() + req.value.size();
    const uint64_t stranger_keys = stranger_keys_.size() + (strangers_key ? 0 : 1);
    const uint64_t max_keys =
        std::min<uint64_t>(options_.max_unregistered_store_keys, options_.max_store_keys);
    const uint64_t max_bytes =
        std::min(options_.max_unregistered_store_bytes, options_.max_store_bytes);
    if (stranger_keys > max_keys || stranger_after > max_bytes) {
      Send(conn, wire::EncodeErrorReply(
                     id, Status::InvalidArgument(fmt::format(
                             "kvSet '{}': connections that did not register hold {} keys, {} "
                             "bytes of the store; with this value they would hold {} keys, {} "
                             "bytes; allowed: at most {} keys and {} bytes (the rest of the store "
                             "is the registered members'), or register first",
                             req.key.substr(0, 128), stranger_keys_.size(), stranger_bytes_,
                             stranger_keys, stranger_after, max_keys, max_bytes))));
      return;
    }
    stranger_bytes_ = stranger_after;
    stranger_keys_.insert(req.key);
  } else if (!stranger && strangers_key) {
    stranger_bytes_ -= req.key.size() + old->second.size();
    stranger_keys_.erase(req.key);
  }
  KvPut(req.key, std::move(req.value));
  ++counts_.kv_sets;
  Send(conn, wire::EncodeOkReply(id));
  WakeKvWaiters();
}

void CoordinatorImpl::HandleKvGet(const ConnPtr& conn, uint64_t id, KvGetRequest req) {
  ++counts_.kv_gets;
  // A member asks for a key per member at most (every rank's checksum, a
  // group's rendezvous). A 1 MiB request listed 131k empty keys, 4 MiB of
  // strings per waiter outside every budget, each scanned at every kvSet
  // (a review).
  const size_t max_keys =
      std::max<size_t>(4096, 2 * (size_t{map_.expected_workers} + size_t{map_.expected_shards}));
  if (req.keys.size() > max_keys) {
    Send(conn, wire::EncodeErrorReply(
                   id, Status::InvalidArgument(fmt::format(
                           "kvGet: {} keys in one request; allowed: at most {} (twice the "
                           "cluster's members, at least 4096)",
                           req.keys.size(), max_keys))));
    return;
  }
  auto missing = MissingKeys(req.keys);
  if (missing.empty()) {
    Send(conn, ValuesFrame(id, req.keys));
    return;
  }
  if (req.timeout_ms == 0) {
    Send(conn,
         wire::EncodeErrorReply(id, Status::NotFound(fmt::format(
                                        "kvGet: key{} {} not found (timeout 0 does not wait)",
                                        missing.size() == 1 ? "" : "s", QuoteJoin(missing)))));
    return;
  }
  auto w = Defer(conn, Waiter::Kind::kKv, id, req.timeout_ms);
  w->keys = std::move(req.keys);
  kv_waiters_.push_back(w);
  Arm(w);
}

}  // namespace coordinator_engine
}  // namespace gridsync
