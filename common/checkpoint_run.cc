#include "common/checkpoint_run.h"

#include <spdlog/fmt/fmt.h>

#include <algorithm>
#include <random>

namespace gridsync {

// A store value is shown as it is only when it is a run (a hostile one
// could be anything, of any length).
std::string DescribeRun(const std::string& run) {
  if (run.empty()) return "none (an older gridsync)";
  if (IsRunId(run)) return run;
  return fmt::format("'{}' (not a run identity)", run.substr(0, 40));
}

std::string RunKey(uint64_t job) { return fmt::format("checkpoint-run/job-{}", job); }

std::string NewRunId() {
  std::random_device source;  // /dev/urandom on Linux
  std::string run;
  for (int i = 0; i < 4; ++i) run += fmt::format("{:08x}", static_cast<uint32_t>(source()));
  return run;
}

bool IsRunId(const std::string& run) {
  return run.size() <= 64 && run.find_first_not_of("0123456789abcdef") == std::string::npos;
}

std::string RunsApart(const std::vector<std::string>& parts, const std::vector<std::string>& runs,
                      std::string* common, std::string* common_run) {
  // The parts apart from the most common run (the first part's on a tie):
  // a foreign file is named, whichever part holds it.
  size_t most_at = 0, most = 0;
  for (size_t i = 0; i < runs.size(); ++i) {
    const auto n = static_cast<size_t>(std::count(runs.begin(), runs.end(), runs[i]));
    if (n > most) most = n, most_at = i;
  }
  std::string apart;
  common->clear();
  for (size_t i = 0; i < runs.size() && i < parts.size(); ++i) {
    if (runs[i] == runs[most_at]) {
      *common += (common->empty() ? "" : ", ") + parts[i];
    } else {
      apart +=
          fmt::format("{}{} (run {})", apart.empty() ? "" : ", ", parts[i], DescribeRun(runs[i]));
    }
  }
  *common_run = runs.empty() ? "" : DescribeRun(runs[most_at]);
  return apart;
}

Result<std::string> FreshRun(Store& store, uint64_t job, const std::vector<std::string>& job_parts,
                             const std::string& part, std::chrono::milliseconds timeout) {
  if (job_parts.empty() || job_parts.front() == part) {
    std::string run = NewRunId();
    GRIDSYNC_RETURN_IF_ERROR(PublishRun(store, job, run));
    return run;
  }
  auto got = store.Get({RunKey(job)}, timeout);
  if (!got.ok()) {
    return got.status().WithContext(
        fmt::format("{}: job {}'s run identity, which {} publishes for every part's checkpoints",
                    part, job, job_parts.front()));
  }
  if (!IsRunId((*got)[0])) {
    return Status::Corruption(fmt::format("{}: job {}'s run identity is '{}'; allowed: {}", part,
                                          job, (*got)[0].substr(0, 80),
                                          "up to 64 lowercase hex digits"));
  }
  return (*got)[0];
}

Status PublishRun(Store& store, uint64_t job, const std::string& run) {
  return store.Set(RunKey(job), run);
}

Status AgreeOnResumedRun(Store& store, uint64_t job, uint64_t step,
                         const std::vector<std::string>& job_parts, const std::string& part,
                         const std::string& run, const std::string& dir,
                         std::chrono::milliseconds timeout) {
  const std::string prefix = fmt::format("checkpoint-run/job-{}/resumed-{}/", job, step);
  GRIDSYNC_RETURN_IF_ERROR(store.Set(prefix + part, run));
  if (job_parts.empty()) return Status::OK();
  if (job_parts.front() == part) GRIDSYNC_RETURN_IF_ERROR(PublishRun(store, job, run));
  std::vector<std::string> keys;
  for (const auto& p : job_parts) keys.push_back(prefix + p);
  GRIDSYNC_ASSIGN_OR_RETURN(const auto runs, store.Get(keys, timeout));
  std::string with, common_run;
  const std::string apart = RunsApart(job_parts, runs, &with, &common_run);
  if (apart.empty()) return Status::OK();
  return Status::CheckpointsHeld(fmt::format(
      "{}: resuming at step {}, the files of {} in {}/step-{} belong to another run than those "
      "of {} (run {}): a step's parts must all be one run's (another run's files were copied "
      "in, or two runs shared the folder); allowed: every part's files of step {} as one run "
      "wrote them",
      part, step, apart, dir, step, with, common_run, step));
}

Status CheckRejoinedRun(Store& store, uint64_t job, uint64_t step, const std::string& part,
                        const std::string& run, const std::string& dir) {
  auto got = store.Get({RunKey(job)}, std::chrono::milliseconds(0));
  if (!got.ok()) {
    return got.status().code() == StatusCode::kNotFound ? Status::OK() : got.status();
  }
  if ((*got)[0] == run) return Status::OK();
  return Status::CheckpointsHeld(fmt::format(
      "{} cannot rejoin job {} from {}/step-{}: its files there belong to run {}, the job is run "
      "{} (another run's files were copied in, or two runs shared the folder); allowed: the "
      "files this run wrote",
      part, job, dir, step, DescribeRun(run), DescribeRun((*got)[0])));
}

}  // namespace gridsync
