#include "common/checkpoint_registry.h"

#include <spdlog/spdlog.h>

#include <algorithm>
#include <charconv>
#include <set>

#include "common/checkpoint_files.h"
#include "common/checkpoint_run.h"

namespace gridsync {
namespace {

// A published list of steps, as ParseHeldSteps reads it ("100,150").
std::string HeldStepsText(const std::vector<uint64_t>& steps) {
  std::string list;
  for (uint64_t step : steps) {
    if (!list.empty()) list += ',';
    list += std::to_string(step);
  }
  return list;
}

}  // namespace

std::string CheckpointKey(uint64_t job, const std::string& part) {
  return "checkpoint/job-" + std::to_string(job) + "/" + part;
}

void CheckpointLedger::Wrote(uint64_t step) {
  if (std::find(steps_.begin(), steps_.end(), step) == steps_.end()) steps_.push_back(step);
  std::sort(steps_.begin(), steps_.end());
}

void CheckpointLedger::RolledBack(uint64_t step) {
  std::erase_if(steps_, [step](uint64_t s) { return s > step; });
  std::erase_if(published_, [step](uint64_t s) { return s > step; });
  common_ = std::min(common_, step);
  RemoveStepsAfter(dir_, part_, step);
  // The older steps it still holds too (a restarted process knew none):
  // where another part's files of `step` turn out damaged, the job goes back
  // to one of these, which every part must be seen to hold.
  for (uint64_t held : HeldSteps(dir_, part_)) {
    if (held < step) Wrote(held);
  }
  Wrote(step);
}

Status CheckpointLedger::RolledBackTo(uint64_t step, std::string run, const char* who) {
  if (run_known_ && run != run_) {
    return Status::CheckpointsHeld(
        dir_ + "/step-" + std::to_string(step) + "/" + part_ + ".json names run " +
        DescribeRun(run) + ", but this " + who + " serves run " + DescribeRun(run_) +
        " (another run's files were put in its place); allowed: the files this run wrote");
  }
  SetRun(std::move(run));
  RolledBack(step);
  return Status::OK();
}

Status CheckpointLedger::Publish(Store& store, uint64_t job) {
  const auto on_disk = HeldSteps(dir_, part_);
  std::vector<uint64_t> listed;
  for (uint64_t step : steps_) {
    if (std::find(on_disk.begin(), on_disk.end(), step) != on_disk.end()) listed.push_back(step);
  }
  Status set = store.Set(CheckpointKey(job, part_), HeldStepsText(listed));
  publish_failed_ = !set.ok();
  if (!set.ok()) return set;
  published_ = std::move(listed);
  // The first part keeps the job's run in the store (a restarted
  // coordinator's is empty), for the parts that have not read it yet.
  if (run_known_ && !run_.empty() && !job_parts_.empty() && job_parts_.front() == part_) {
    GRIDSYNC_RETURN_IF_ERROR(PublishRun(store, job, run_));
  }
  if (!job_parts_.empty()) {
    // Unanswered: the last answer stands (a step every part held then is
    // still one they hold, since each keeps it in turn).
    // 0 (a part's list not in the store yet: a restarted coordinator's is
    // empty) is no answer either; only a rollback lowers it.
    if (auto common = NewestCommonStep(store, job, job_parts_); common.ok() && *common > 0)
      common_ = *common;
  }
  return set;
}

void CheckpointLedger::RefreshCommon(Store& store, uint64_t job) {
  if (publish_failed_ || job_parts_.empty()) return;
  auto common = NewestCommonStep(store, job, job_parts_);
  if (!common.ok()) {
    // Unanswered: the coordinator may be gone, so what it last acknowledged
    // stays on disk, as after a failed Publish.
    publish_failed_ = true;
    spdlog::warn(
        "{}: the newest step every part holds is unknown ({}); the steps the coordinator last "
        "acknowledged stay on disk",
        part_, common.status().ToString());
    return;
  }
  if (*common > common_) common_ = *common;  // as in Publish: only a rollback lowers it
}

Result<std::string> CheckpointLedger::RunForWriting(Store* store, uint64_t job,
                                                    std::chrono::milliseconds timeout) {
  if (run_known_) return run_;
  if (store == nullptr) return std::string();
  GRIDSYNC_ASSIGN_OR_RETURN(std::string run, FreshRun(*store, job, job_parts_, part_, timeout));
  SetRun(std::move(run));
  return run_;
}

std::vector<uint64_t> CheckpointLedger::MustKeep() const {
  std::vector<uint64_t> keep = publish_failed_ ? published_ : std::vector<uint64_t>{};
  if (common_ > 0) keep.push_back(common_);
  return keep;
}

Result<std::vector<uint64_t>> ParseHeldSteps(std::string_view text, const std::string& part) {
  // Any client may write under the prefix: the text is echoed cut short,
  // and a trailing comma (an empty last step) is refused like an empty one.
  auto refuse = [&] {
    const std::string shown =
        text.size() > 64 ? std::string(text.substr(0, 64)) + "..." : std::string(text);
    return Status::Corruption("checkpoint steps of part " + part + ": '" + shown +
                              "' is not a comma-separated list of steps; allowed: steps of 1 or "
                              "more in decimal, e.g. \"100,150\"");
  };
  if (!text.empty() && text.back() == ',') return refuse();
  std::vector<uint64_t> steps;
  size_t at = 0;
  while (at < text.size()) {
    size_t comma = text.find(',', at);
    if (comma == std::string_view::npos) comma = text.size();
    uint64_t step = 0;
    const auto [used, err] = std::from_chars(text.data() + at, text.data() + comma, step);
    if (err != std::errc() || used != text.data() + comma || step == 0) return refuse();
    steps.push_back(step);
    at = comma + 1;
  }
  return steps;
}

Result<bool> CoordinatorKnowsCheckpoints(Store& store, uint64_t job, const std::string& part) {
  if (job >= 2) return true;
  auto listed = store.Get({CheckpointKey(job, part)}, std::chrono::milliseconds(0));
  if (listed.ok()) return !(*listed)[0].empty();
  if (listed.status().code() == StatusCode::kNotFound) return false;
  return listed.status();
}

Status CheckFreshStartAgainst(Store& store, uint64_t job, const std::string& dir,
                              const std::string& part, const std::vector<std::string>& job_parts,
                              uint64_t run_steps) {
  if (HeldSteps(dir, part).empty()) return Status::OK();
  GRIDSYNC_ASSIGN_OR_RETURN(const bool known, CoordinatorKnowsCheckpoints(store, job, part));
  if (known) return Status::OK();
  return CheckFreshStart(dir, {part}, job_parts, run_steps)
      .WithContext(part + ": the coordinator knows no job of these checkpoints");
}

Result<uint64_t> NewestCommonStep(Store& store, uint64_t job, const std::vector<std::string>& parts,
                                  uint64_t below) {
  std::vector<std::string> keys;
  for (const auto& part : parts) keys.push_back(CheckpointKey(job, part));
  auto values = store.Get(keys, std::chrono::milliseconds(0));
  if (!values.ok()) {
    if (values.status().code() == StatusCode::kNotFound) return uint64_t{0};
    return values.status();
  }
  std::set<uint64_t> common;
  for (size_t i = 0; i < parts.size(); ++i) {
    GRIDSYNC_ASSIGN_OR_RETURN(const std::vector<uint64_t> held,
                              ParseHeldSteps((*values)[i], parts[i]));
    std::set<uint64_t> mine;
    for (uint64_t step : held) {
      if (step < below) mine.insert(step);
    }
    if (i == 0) {
      common = std::move(mine);
      continue;
    }
    std::set<uint64_t> both;
    std::set_intersection(common.begin(), common.end(), mine.begin(), mine.end(),
                          std::inserter(both, both.end()));
    common = std::move(both);
  }
  return common.empty() ? uint64_t{0} : *common.rbegin();
}

std::vector<std::string> CheckpointParts(uint32_t shards, uint32_t workers_with_state) {
  std::vector<std::string> parts;
  for (uint32_t s = 0; s < shards; ++s) parts.push_back("shard-" + std::to_string(s));
  for (uint32_t w = 0; w < workers_with_state; ++w) parts.push_back("worker-" + std::to_string(w));
  return parts;
}

Status SetAsideDamagedPart(Store& store, uint64_t job, const std::string& dir, uint64_t step,
                           const std::string& part) {
  GRIDSYNC_RETURN_IF_ERROR(SetPartAside(dir, step, part));
  auto values = store.Get({CheckpointKey(job, part)}, std::chrono::milliseconds(0));
  if (!values.ok()) {
    // Nothing published: nothing to take back.
    return values.status().code() == StatusCode::kNotFound ? Status::OK() : values.status();
  }
  GRIDSYNC_ASSIGN_OR_RETURN(std::vector<uint64_t> held, ParseHeldSteps(values->front(), part));
  std::erase(held, step);
  return store.Set(CheckpointKey(job, part), HeldStepsText(held));
}

Result<uint64_t> RejoinStep(Store& store, uint64_t job, const std::vector<std::string>& parts,
                            const std::string& dir, const std::string& own_part, uint64_t below) {
  GRIDSYNC_ASSIGN_OR_RETURN(const uint64_t step, NewestCommonStep(store, job, parts, below));
  if (step == 0 || own_part.empty()) return step;
  const auto held = HeldSteps(dir, own_part);
  if (std::find(held.begin(), held.end(), step) != held.end()) return step;
  std::string mine;
  for (uint64_t s : held) mine += (mine.empty() ? "" : ", ") + std::to_string(s);
  return Status::NotFound(own_part + " cannot rejoin job " + std::to_string(job) +
                          ": the job's newest complete checkpoint is step " + std::to_string(step) +
                          ", but " + dir + " holds its steps [" + mine +
                          "]; allowed: restart it where its checkpoint.dir is");
}

}  // namespace gridsync
