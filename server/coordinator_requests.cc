// The coordinator engine (coordinator_engine.h): requests. Registration
// and the cluster map, barriers, and the replies they (and the KV store's
// reads, coordinator_kv.cc) defer until members, peers or keys arrive or
// the wait times out.
//
// Thread safety: see coordinator_engine.h (the io thread only).
#include <optional>
#include <string_view>

#include "server/coordinator_engine.h"

namespace gridsync {
namespace coordinator_engine {

// ---- Requests ----

std::optional<std::string> CoordinatorImpl::TableMismatch(const RegisterInfo& info) const {
  const auto& mine = info.tables;
  const auto& cluster = map_.tables;
  const std::string owner = tables_owner_.value_or("?");
  const size_t n = std::max(mine.size(), cluster.size());
  for (size_t i = 0; i < n; ++i) {
    if (i >= mine.size()) {
      return fmt::format(
          "table '{}' ({}) of the cluster (defined by {}) is missing: this {} sent {} tables, the "
          "cluster has {}",
          cluster[i].name, TableSize(cluster[i]), owner, RoleName(info.role), mine.size(),
          cluster.size());
    }
    if (i >= cluster.size()) {
      return fmt::format(
          "table '{}' ({}) is not among the cluster's tables (defined by {}): this {} sent {} "
          "tables, "
          "the cluster has {}",
          mine[i].name, TableSize(mine[i]), owner, RoleName(info.role), mine.size(),
          cluster.size());
    }
    if (mine[i] == cluster[i]) continue;
    if (mine[i].name == cluster[i].name) {
      return fmt::format(
          "table '{}' is {} (rows x width) here but {} in the cluster map (defined by {})",
          mine[i].name, TableSize(mine[i]), TableSize(cluster[i]), owner);
    }
    return fmt::format(
        "table {} is '{}' ({}) here but '{}' ({}) in the cluster map (defined by {}); sizes are "
        "rows x "
        "width",
        i, mine[i].name, TableSize(mine[i]), cluster[i].name, TableSize(cluster[i]), owner);
  }
  return std::nullopt;
}

void CoordinatorImpl::HandleRegister(const ConnPtr& conn, uint64_t id, RegisterInfo info) {
  if (conn->member || conn->observer) {
    Send(conn, wire::EncodeErrorReply(
                   id, Status::InvalidArgument(fmt::format(
                           "this connection is already registered as {}; allowed: one "
                           "registration per connection",
                           conn->member ? DescribeMember(*conn->member) : "an observer"))));
    return;
  }
  if (info.role == Role::kObserver) {
    conn->observer = true;
    spdlog::info("observer joined (node '{}', pid {}, from {})", info.node, info.pid, conn->peer);
    Send(conn, wire::EncodeRegisteredReply(id, 0, map_));
    return;
  }
  const bool shard = info.role == Role::kShard;
  auto& members = shard ? map_.shards : map_.workers;
  const uint32_t expected = shard ? map_.expected_shards : map_.expected_workers;
  const char* role = RoleName(info.role);
  const char* key = shard ? "ps.shards" : "distributed.world_size";
  auto holder = [&](uint32_t rank) { return Holder(info.role, rank); };
  auto refuse = [&](std::string text, StatusCode code = StatusCode::kInvalidArgument) {
    ++counts_.registrations_refused;
    spdlog::warn("register refused ({} from node '{}', pid {}, {}): {}", role, info.node, info.pid,
                 conn->peer, text);
    // Named in the others' "cluster incomplete" while that rank is missing
    // (not for a rank a member holds: "already taken" says nothing of it).
    if (info.requested_rank >= 0 && static_cast<uint64_t>(info.requested_rank) < expected &&
        holder(static_cast<uint32_t>(info.requested_rank)) == nullptr) {
      NoteCannotJoin(info.role, static_cast<uint32_t>(info.requested_rank),
                     "its registration was refused: " + Status(code, text).ToString());
    }
    Send(conn, wire::EncodeErrorReply(id, Status(code, std::move(text))));
  };

  // A shard or worker restarted during training rejoins from the job's
  // newest complete checkpoint, and the whole job rolls back to that step (a
  // new epoch). One that starts afresh would silently lose training (a
  // shard at version 0) or wait for peers long past 'init' (a worker):
  // refused.
  const bool rejoining = info.rejoin_step > 0;
  if (rejoining && (!training_started_ || job_done_)) {
    refuse(fmt::format(
        "{} {} asked to rejoin job {} from step {}, but the job's training {}; "
        "allowed: rejoin step 0 (a fresh start){}",
        role, info.requested_rank, map_.job, info.rejoin_step,
        training_started_ ? "ended (its workers passed 'done')" : "has not started",
        training_started_ ? ", or restart the whole job (gridsync launch --resume)" : ""));
    return;
  }
  if (rejoining) {
    // The step must be one every part of the job published (the shards at
    // least): a claim of any other would roll the job to a state nobody
    // holds, or forward.
    if (auto bad = CheckRejoinStep(info.rejoin_step)) {
      refuse(fmt::format("{} {} asked to rejoin job {} from step {}: {}", role, info.requested_rank,
                         map_.job, info.rejoin_step, *bad));
      return;
    }
  }
  if (!rejoining && training_started_ && (shard || !job_done_)) {
    // A cluster without shards is gradient_sync nccl, whose workers do not
    // rejoin: only the whole job restarts. FailedPrecondition: the process
    // found no complete checkpoint, and restarting it at once finds none
    // either (gridsync launch stops on the exit code this becomes).
    refuse(
        fmt::format(
            "{} {} joined after training started (the workers passed 'init') with {}, not the "
            "job's; allowed: {}",
            role, info.requested_rank, shard ? "fresh parameters" : "a fresh start",
            map_.expected_shards == 0
                ? "restart the whole job from its newest complete checkpoint (gridsync launch "
                  "--resume, or --max-restarts: nccl workers do not rejoin a running job)"
                : fmt::format("a {} rejoining from the job's newest complete checkpoint "
                              "(checkpoint.every_steps: a restarted process finds it itself once "
                              "one exists), or restart the whole job (gridsync launch --resume)",
                              role)),
        StatusCode::kFailedPrecondition);
    return;
  }
  uint32_t rank = 0;
  if (info.requested_rank < -1) {
    refuse(fmt::format("{} requested rank {}; allowed: -1 (assign the next free rank) or 0..{}",
                       role, info.requested_rank, expected == 0 ? 0 : expected - 1));
    return;
  }
  if (info.requested_rank >= 0) {
    rank = static_cast<uint32_t>(info.requested_rank);
    if (rank >= expected) {
      refuse(expected == 0 ? fmt::format("{} rank {} refused: the cluster expects no {}s ({} = 0)",
                                         role, rank, role, key)
                           : fmt::format("{} rank {} is out of range; allowed: 0..{} ({} = {})",
                                         role, rank, expected - 1, key, expected));
      return;
    }
    if (const MemberInfo* taken = holder(rank)) {
      refuse(fmt::format("{} rank {} is already taken by {}; each rank registers once", role, rank,
                         DescribeMember(*taken)));
      return;
    }
  } else {
    bool found = false;
    for (uint32_t r = 0; r < expected; ++r) {
      if (!holder(r)) {
        rank = r;
        found = true;
        break;
      }
    }
    if (!found) {
      refuse(fmt::format("all {} {} ranks taken ({} = {})", expected, role, key, expected));
      return;
    }
  }
  if (tables_owner_) {
    if (auto mismatch = TableMismatch(info)) {
      refuse("table mismatch: " + *mismatch +
             "; every shard and worker must register the same tables (the same config)");
      return;
    }
  }
  // Settings a member must share with the cluster (all members) and with
  // its job (workers): each key that differs, with both values.
  if (shared_settings_owner_) {
    if (auto mismatch = SettingsMismatch(info.shared_settings, shared_settings_)) {
      refuse(
          fmt::format("settings differ from the cluster's (set by {}): {}; allowed: the values "
                      "of the config every shard and worker of the cluster runs",
                      *shared_settings_owner_, *mismatch));
      return;
    }
  }
  if (!shard && job_settings_owner_) {
    if (auto mismatch = SettingsMismatch(info.job_settings, job_settings_)) {
      refuse(
          fmt::format("settings differ from job {}'s (set by {}): {}; allowed: the values of "
                      "the config every worker of the job runs",
                      map_.job, *job_settings_owner_, *mismatch));
      return;
    }
  }

  MemberInfo member{info.role, rank, info.node, info.local_rank, info.endpoint, info.pid};
  auto pos = std::lower_bound(members.begin(), members.end(), rank,
                              [](const MemberInfo& m, uint32_t r) { return m.rank < r; });
  members.insert(pos, member);
  conn->member = member;
  ClearCannotJoin(info.role, rank);
  if (!tables_owner_) {
    map_.tables = info.tables;
    tables_owner_ = DescribeMember(member);
  }
  if (!shared_settings_owner_) {
    shared_settings_ = info.shared_settings;
    shared_settings_owner_ = DescribeMember(member);
  }
  if (!shard && !job_settings_owner_) {
    job_settings_ = info.job_settings;
    job_settings_owner_ = DescribeMember(member);
  }
  ++map_.generation;
  ++counts_.registrations;
  if (rejoining) {
    ++map_.epoch;
    map_.resume_step = info.rejoin_step;
    spdlog::warn(
        "{} rejoined job {} from its checkpoint of step {}: epoch {}; every process of the job "
        "rolls back to step {}",
        DescribeMember(member), map_.job, info.rejoin_step, map_.epoch, info.rejoin_step);
  }
  spdlog::info("{} joined from {}; cluster map generation {}: {}/{} shards, {}/{} workers",
               DescribeMember(member), conn->peer, map_.generation, map_.shards.size(),
               map_.expected_shards, map_.workers.size(), map_.expected_workers);

  Send(conn, wire::EncodeRegisteredReply(id, rank, map_));
  WakeMapWaiters();
}

bool CoordinatorImpl::JobHasCompleteStep() const {
  const std::string prefix = CheckpointKey(map_.job, "");
  std::set<uint64_t> published;
  for (auto it = kv_.lower_bound(prefix); it != kv_.end() && it->first.rfind(prefix, 0) == 0;
       ++it) {
    if (!IsPartEntry(it->first, it->second)) continue;
    auto held = ParseHeldSteps(it->second, it->first.substr(prefix.size()));
    if (held.ok()) published.insert(held->begin(), held->end());
  }
  for (uint64_t step : published) {
    if (!CheckRejoinStep(step)) return true;
  }
  return false;
}

std::optional<std::string> CoordinatorImpl::CheckRejoinStep(uint64_t step) const {
  const std::string prefix = CheckpointKey(map_.job, "");
  uint32_t shards = 0;
  for (auto it = kv_.lower_bound(prefix); it != kv_.end() && it->first.rfind(prefix, 0) == 0;
       ++it) {
    // Other keys under the prefix (a worker's restored-<S>/ checksums)
    // are no part's steps, as the state file leaves them out.
    if (!IsPartEntry(it->first, it->second)) continue;
    const std::string part = it->first.substr(prefix.size());
    auto held = ParseHeldSteps(it->second, part);
    if (!held.ok()) return held.status().message();
    if (std::find(held->begin(), held->end(), step) == held->end()) {
      return fmt::format(
          "part {} does not hold it (it published [{}]); allowed: a step every "
          "part of the job holds",
          part, it->second);
    }
    if (part.rfind("shard-", 0) == 0) ++shards;
  }
  if (shards < map_.expected_shards) {
    return fmt::format(
        "only {} of {} shards published it; allowed: a step every part of the job "
        "holds",
        shards, map_.expected_shards);
  }
  return std::nullopt;
}

const MemberInfo* CoordinatorImpl::Holder(Role role, uint32_t rank) const {
  for (const auto& m : role == Role::kShard ? map_.shards : map_.workers) {
    if (m.rank == rank) return &m;
  }
  return nullptr;
}

std::string CoordinatorImpl::IncompleteMessage(uint32_t waited_ms) const {
  auto missing = [this](Role role, uint32_t expected) {
    std::vector<uint32_t> ranks;
    for (uint32_t r = 0; r < expected; ++r) {
      if (Holder(role, r) == nullptr) ranks.push_back(r);
    }
    return ranks;
  };
  std::vector<std::string> parts;
  auto shards = missing(Role::kShard, map_.expected_shards);
  auto workers = missing(Role::kWorker, map_.expected_workers);
  if (!shards.empty()) parts.push_back("shards " + RankList(shards));
  if (!workers.empty()) parts.push_back("workers " + RankList(workers));
  std::vector<std::pair<Role, uint32_t>> absent;
  for (uint32_t rank : shards) absent.emplace_back(Role::kShard, rank);
  for (uint32_t rank : workers) absent.emplace_back(Role::kWorker, rank);
  return fmt::format("cluster incomplete after {}: missing {} (expecting {} shards, {} workers){}",
                     Seconds(waited_ms), Join(parts), map_.expected_shards, map_.expected_workers,
                     CannotJoinNotes(absent));
}

std::string CoordinatorImpl::CannotJoinNotes(
    const std::vector<std::pair<Role, uint32_t>>& absent) const {
  // A few, since each may be long (kMaxCannotJoinBytes).
  constexpr size_t kMaxReasons = 4;
  std::string notes;
  size_t named = 0;
  size_t more = 0;
  for (const auto& [role, rank] : absent) {
    auto it = kv_.find(CannotJoinKey(role, rank));
    if (it == kv_.end()) continue;
    if (named == kMaxReasons) {
      ++more;
      continue;
    }
    ++named;
    notes += fmt::format("; {} {} could not join: {}", RoleName(role), rank, it->second);
  }
  if (more > 0) notes += fmt::format("; and {} more could not join", more);
  return notes;
}

void CoordinatorImpl::HandleGetMap(const ConnPtr& conn, uint64_t id, const GetMapRequest& req) {
  if (!req.wait_complete || map_.complete()) {
    Send(conn, wire::EncodeMapReply(id, map_));
    return;
  }
  if (req.timeout_ms == 0) {
    Send(conn, wire::EncodeErrorReply(id, Status::Timeout(IncompleteMessage(0))));
    return;
  }
  auto w = Defer(conn, Waiter::Kind::kMap, id, req.timeout_ms);
  map_waiters_.push_back(w);
  Arm(w);
}

std::string CoordinatorImpl::BarrierTimeoutMessage(const Waiter& w) const {
  std::vector<std::string> arrived;
  std::set<std::string> arrived_set;
  std::set<Role> roles;
  uint32_t count = 0;
  auto it = barriers_.find(w.barrier);
  if (it != barriers_.end()) {
    count = it->second.count;
    for (const auto& other : it->second.waiters) {
      arrived.push_back(other->member);
      arrived_set.insert(other->member);
      if (other->member_role) roles.insert(*other->member_role);
      for (Role r : {Role::kShard, Role::kWorker}) {
        if (other->member.rfind(std::string(RoleName(r)) + "-", 0) == 0) roles.insert(r);
      }
    }
  }
  // Missing: the members of the roles present that have not arrived, named
  // <role>-<rank> like the map's members.
  std::vector<std::string> missing;
  std::vector<std::pair<Role, uint32_t>> absent;
  for (Role r : roles) {
    const uint32_t expected = r == Role::kShard ? map_.expected_shards : map_.expected_workers;
    std::set<uint32_t> ranks;
    for (uint32_t i = 0; i < expected; ++i) ranks.insert(i);
    for (const auto& m : r == Role::kShard ? map_.shards : map_.workers) ranks.insert(m.rank);
    for (uint32_t rank : ranks) {
      std::string name = MemberName(r, rank);
      if (arrived_set.count(name)) continue;
      missing.push_back(name);
      // Why it could not join, only where it is not registered (a member
      // that is merely slow has no such reason).
      if (Holder(r, rank) == nullptr) absent.emplace_back(r, rank);
    }
  }
  const size_t short_by = count > arrived.size() ? count - arrived.size() : 0;
  std::string missing_text =
      missing.empty() ? fmt::format("{} more member(s), not known to the cluster map", short_by)
                      : Join(missing);
  return fmt::format("barrier '{}' timed out after {}: {} of {} arrived ({}); missing: {}{}",
                     w.barrier, Seconds(w.timeout_ms), arrived.size(), count, Join(arrived),
                     missing_text, CannotJoinNotes(absent));
}

std::optional<Status> CoordinatorImpl::BarrierProblem(const BarrierRequest& req) const {
  // Names are echoed in errors and logs: at most their first 128 bytes.
  const std::string name = req.name.substr(0, 128);
  const uint32_t most = options_.max_barrier_name_bytes;
  if (req.name.empty()) {
    return Status::InvalidArgument("barrier: empty name; allowed: a non-empty name");
  }
  // A barrier's name and its members' are held while they wait (and were
  // kept forever: 1000 names of 1 MB took the coordinator past 1 GB).
  if (req.name.size() > most) {
    return Status::InvalidArgument(fmt::format(
        "barrier '{}...': name of {} bytes; allowed: 1 to {} bytes (max_barrier_name_bytes)", name,
        req.name.size(), most));
  }
  if (req.member.size() > most) {
    return Status::InvalidArgument(
        fmt::format("barrier '{}': member name of {} bytes; allowed: at most {} bytes "
                    "(max_barrier_name_bytes)",
                    name, req.member.size(), most));
  }
  if (req.count == 0) {
    return Status::InvalidArgument(
        fmt::format("barrier '{}': count 0; allowed: 1 or more participants", name));
  }
  if (barriers_.size() >= options_.max_barriers && !barriers_.contains(req.name)) {
    return Status::InvalidArgument(fmt::format(
        "barrier '{}': {} barriers already have members waiting; allowed: at most {} at once "
        "(max_barriers); wait at one of those, or once one completes",
        name, barriers_.size(), options_.max_barriers));
  }
  return std::nullopt;
}

void CoordinatorImpl::HandleBarrier(const ConnPtr& conn, uint64_t id, BarrierRequest req) {
  if (auto problem = BarrierProblem(req)) {
    Send(conn, wire::EncodeErrorReply(id, *problem));
    return;
  }
  // The job's own barriers start and end training (training_started_,
  // job_done_): a stranger that joined "init" under a name of its own
  // passed a worker through it alone and wedged the job (a hostile probe).
  if ((req.name == "init" || req.name == "done") && !RegisteredWorker(*conn)) {
    Send(conn, wire::EncodeErrorReply(
                   id, Status::InvalidArgument(fmt::format(
                           "barrier '{}' is the job's, for its registered workers; this "
                           "connection ({}) is {}; allowed: another barrier name, or register as "
                           "a worker first",
                           req.name, conn->peer, Registration(*conn)))));
    return;
  }
  // A worker waits at the job's barriers as itself: another name would
  // take the place of the worker it names (refused as "already waiting").
  if ((req.name == "init" || req.name == "done") && !req.member.empty() &&
      req.member != MemberName(conn->member->role, conn->member->rank)) {
    Send(conn, wire::EncodeErrorReply(
                   id, Status::InvalidArgument(fmt::format(
                           "barrier '{}': this connection is registered as {} and waits as "
                           "'{}'; allowed: its own name, '{}', or none",
                           req.name, MemberName(conn->member->role, conn->member->rank),
                           req.member.substr(0, 64),
                           MemberName(conn->member->role, conn->member->rank)))));
    return;
  }
  std::string member = req.member;
  if (member.empty()) {
    member = conn->member ? MemberName(conn->member->role, conn->member->rank)
                          : fmt::format("connection-{} ({})", conn->id, conn->peer);
  }
  if (auto it = barriers_.find(req.name); it != barriers_.end()) {
    const BarrierState& barrier = it->second;
    if (barrier.count != req.count) {
      Send(conn, wire::EncodeErrorReply(
                     id, Status::InvalidArgument(fmt::format(
                             "barrier '{}': this caller ({}) says {} participants but those "
                             "waiting ({}) said {}; allowed: the same count for everyone",
                             req.name, member, req.count, barrier.waiters.front()->member,
                             barrier.count))));
      return;
    }
    for (const auto& other : barrier.waiters) {
      if (other->member == member) {
        Send(conn, wire::EncodeErrorReply(
                       id, Status::InvalidArgument(
                               fmt::format("barrier '{}': member '{}' is already waiting; allowed: "
                                           "distinct member names",
                                           req.name, member))));
        return;
      }
    }
  }
  // Created here, with its first waiter; erased when its last goes
  // (below, or Detach()).
  auto it = barriers_.try_emplace(req.name).first;
  BarrierState& barrier = it->second;
  barrier.count = req.count;
  auto w = Defer(conn, Waiter::Kind::kBarrier, id, req.timeout_ms);
  w->barrier = req.name;
  w->member = member;
  if (conn->member) w->member_role = conn->member->role;
  barrier.waiters.push_back(w);
  if (barrier.waiters.size() >= barrier.count) {
    // The round is complete: its members are answered and the name is
    // forgotten, so the next arrival starts a new round (a completed barrier
    // never lets a later caller through).
    auto waiters = std::move(barrier.waiters);
    barriers_.erase(it);
    ++counts_.barriers_passed;
    spdlog::debug("barrier '{}' complete ({} members)", req.name, waiters.size());
    // The workers passed "init" (worker/sync/ps_session.h): the shards hold trained
    // state from here on, which a restarted shard would not have.
    if (req.name == "init") training_started_ = true;
    if (req.name == "done") job_done_ = true;
    for (const auto& waiter : waiters) Complete(waiter, wire::EncodeOkReply(waiter->request_id));
    return;
  }
  Arm(w);
}

// ---- Deferred replies ----

std::shared_ptr<Waiter> CoordinatorImpl::Defer(const ConnPtr& conn, Waiter::Kind kind, uint64_t id,
                                               uint32_t timeout_ms) {
  auto w = std::make_shared<Waiter>(io_, kind);
  w->conn = conn;
  w->request_id = id;
  w->timeout_ms = timeout_ms;
  conn->waiter = w;
  return w;
}

void CoordinatorImpl::Arm(const std::shared_ptr<Waiter>& w) {
  w->timer.expires_after(std::chrono::milliseconds(w->timeout_ms));
  w->timer.async_wait([this, w](ErrorCode ec) {
    Guard(w->conn.lock(), "timer", [&] {
      if (ec || w->done || shutting_down_) return;  // cancelled or already answered
      OnTimeout(w);
    });
  });
}

void CoordinatorImpl::OnTimeout(const std::shared_ptr<Waiter>& w) {
  Status status;
  switch (w->kind) {
    case Waiter::Kind::kMap:
      status = Status::Timeout(IncompleteMessage(w->timeout_ms));
      break;
    case Waiter::Kind::kBarrier:
      ++counts_.barrier_timeouts;
      status = Status::Timeout(BarrierTimeoutMessage(*w));  // before Complete() removes it
      break;
    case Waiter::Kind::kKv:
      status =
          Status::Timeout(fmt::format("kvGet timed out after {}; missing keys: {}",
                                      Seconds(w->timeout_ms), QuoteJoin(MissingKeys(w->keys))));
      break;
  }
  spdlog::debug("coordinator: {}", status.message());
  Complete(w, wire::EncodeErrorReply(w->request_id, status));
}

void CoordinatorImpl::Detach(const std::shared_ptr<Waiter>& w) {
  auto erase = [&](std::vector<std::shared_ptr<Waiter>>& list) {
    list.erase(std::remove(list.begin(), list.end(), w), list.end());
  };
  switch (w->kind) {
    case Waiter::Kind::kMap:
      erase(map_waiters_);
      break;
    case Waiter::Kind::kKv:
      erase(kv_waiters_);
      break;
    case Waiter::Kind::kBarrier: {
      // The last waiter gone (timed out, left): the barrier is forgotten.
      auto it = barriers_.find(w->barrier);
      if (it != barriers_.end()) {
        erase(it->second.waiters);
        if (it->second.waiters.empty()) barriers_.erase(it);
      }
      break;
    }
  }
}

void CoordinatorImpl::Complete(const std::shared_ptr<Waiter>& w, std::vector<uint8_t> frame) {
  if (w->done) return;
  w->done = true;
  w->timer.cancel();
  Detach(w);
  ConnPtr conn = w->conn.lock();
  if (!conn || conn->closed) return;
  if (conn->waiter == w) conn->waiter.reset();
  Send(conn, std::move(frame));
  // Handle requests queued behind this one on a fresh stack.
  asio::post(io_, [this, conn] { Guard(conn, "drain", [&] { Drain(conn); }); });
}

void CoordinatorImpl::WakeMapWaiters() {
  if (!map_.complete()) return;
  auto waiters = map_waiters_;
  for (const auto& w : waiters) Complete(w, wire::EncodeMapReply(w->request_id, map_));
}

void CoordinatorImpl::WakeKvWaiters() {
  auto waiters = kv_waiters_;
  for (const auto& w : waiters) {
    if (MissingKeys(w->keys).empty()) Complete(w, ValuesFrame(w->request_id, w->keys));
  }
}

}  // namespace coordinator_engine
}  // namespace gridsync
