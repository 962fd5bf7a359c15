// The coordinator engine (coordinator_engine.h): who may write the keys the
// parts keep their checkpoints by (common/checkpoint_registry.h,
// common/checkpoint_run.h), and what they may hold.
//
// Each of those keys belongs to one part of the cluster: the steps a part
// holds ("checkpoint/job-<J>/<part>"), the checksum of its restored
// parameters ("checkpoint/job-<J>/restored-<S>/<part>"), the run its files
// name at a resume ("checkpoint-run/job-<J>/resumed-<S>/<part>"), and the
// job's run identity ("checkpoint-run/job-<J>"), which the first part
// (shard 0, or worker 0 without shards) publishes. Anyone else's write was a
// way to end a run: a stranger's "checkpoint/job-<J>/junk" made every step
// incomplete (no rejoin, and the job's checkpoints dropped once its workers
// left), and a forged run identity made a rejoining shard exit for good
// (a review of the control plane).
//
// Thread safety: see coordinator_engine.h (the io thread only).
#include <charconv>
#include <optional>
#include <string_view>

#include "common/checkpoint_run.h"
#include "server/coordinator_engine.h"

namespace gridsync {
namespace coordinator_engine {
namespace {

constexpr std::string_view kRegistryPrefix = "checkpoint/";
constexpr std::string_view kRunPrefix = "checkpoint-run/";

// Takes "<word><decimal>" off the front of `rest`; false when it is not there.
bool TakeNumbered(std::string_view* rest, std::string_view word, uint64_t* number) {
  if (!rest->starts_with(word)) return false;
  rest->remove_prefix(word.size());
  const auto [end, ec] = std::from_chars(rest->data(), rest->data() + rest->size(), *number);
  if (ec != std::errc() || end == rest->data()) return false;
  rest->remove_prefix(static_cast<size_t>(end - rest->data()));
  return true;
}

}  // namespace

std::optional<Status> CoordinatorImpl::CheckpointKeyProblem(const Connection& conn,
                                                            const std::string& key,
                                                            const std::string& value) const {
  const bool registry = key.starts_with(kRegistryPrefix);
  if (!registry && !key.starts_with(kRunPrefix)) return std::nullopt;
  const std::string first_part = map_.expected_shards > 0 ? "shard-0" : "worker-0";
  const auto refuse = [&](const std::string& why) {
    return Status::InvalidArgument(fmt::format(
        "kvSet '{}': {}; allowed: a checkpoint key of one of the cluster's parts (shards {}, "
        "workers {}) written by that part's own connection or, before it registered, by one "
        "that proved that role's key: '{}job-<J>/<part>' (its steps, e.g. \"100,150\"), "
        "'{}job-<J>/restored-<S>/<part>', '{}job-<J>/resumed-<S>/<part>' and '{}job-<J>' "
        "(by {}; a run identity)",
        key.substr(0, 128), why, map_.expected_shards, map_.expected_workers, kRegistryPrefix,
        kRegistryPrefix, kRunPrefix, kRunPrefix, first_part));
  };
  std::string_view rest(key);
  rest.remove_prefix(registry ? kRegistryPrefix.size() : kRunPrefix.size());
  uint64_t job = 0, step = 0;
  if (!TakeNumbered(&rest, "job-", &job)) return refuse("not a job's key");
  // Which part's key it is, and what its value must be.
  std::string_view part;
  enum class Value { kSteps, kHex } kind = Value::kHex;
  if (rest.empty() && !registry) {
    part = first_part;  // the run identity
  } else if (!rest.starts_with('/')) {
    return refuse("not a job's key");
  } else {
    rest.remove_prefix(1);
    const std::string_view nested = registry ? "restored-" : "resumed-";
    if (TakeNumbered(&rest, nested, &step)) {
      if (!rest.starts_with('/')) return refuse("not a step's key");
      rest.remove_prefix(1);
    } else if (registry) {
      kind = Value::kSteps;
    } else {
      return refuse("not a job's key");
    }
    part = rest;
  }
  if (!IsClusterPart(part, map_.expected_shards, map_.expected_workers))
    return refuse("it names no part of the cluster");
  const Role role = part.starts_with("shard-") ? Role::kShard : Role::kWorker;
  uint32_t rank = 0;
  part.remove_prefix(role == Role::kShard ? 6 : 7);
  std::from_chars(part.data(), part.data() + part.size(), rank);  // checked by IsClusterPart
  if (conn.member && (conn.member->role != role || conn.member->rank != rank)) {
    return refuse(fmt::format("it is {} {}'s, and this connection is registered as {} {}",
                              RoleName(role), rank, RoleName(conn.member->role),
                              conn.member->rank));
  }
  if (!conn.member && conn.authenticated && *conn.authenticated != role) {
    return refuse(fmt::format("it is {} {}'s, and this connection proved the {} key",
                              RoleName(role), rank, RoleName(*conn.authenticated)));
  }
  if (kind == Value::kSteps) {
    if (auto problem =
            CheckpointEntryProblem(job, map_.expected_shards, map_.expected_workers, key, value)) {
      return refuse("the entry " + *problem);
    }
  } else if (!IsRunId(value)) {
    return refuse(
        fmt::format("its value '{}' is not hexadecimal (at most 64 digits)", value.substr(0, 80)));
  }
  return std::nullopt;
}

}  // namespace coordinator_engine
}  // namespace gridsync
