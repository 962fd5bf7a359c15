// The step a resume across machines starts from (launch_resume.h).
//
// Thread safety: see launch_resume.h.
#include "tools/launch_resume.h"

#include <spdlog/fmt/fmt.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <functional>
#include <future>
#include <memory>
#include <utility>

#include "common/coordinator_client.h"
#include "common/wire/curve.h"
#include "tools/launch_checks.h"
#include "tools/launch_finish.h"

namespace gridsync::launch_detail {
namespace {

constexpr std::string_view kKeyPrefix = "launch/resume/";

}  // namespace

NodeSteps FindLocalSteps(const std::string& dir, const std::vector<std::string>& parts,
                         std::vector<DamagedPart>* damaged) {
  NodeSteps out;
  out.has_parts = !parts.empty();
  if (parts.empty()) return out;
  // Newest first, as a single launcher walks them (the damaged steps
  // passed over go to `damaged`); only the newest few are read (every .bin
  // of a step is read for its checksum).
  for (uint64_t step = LatestCompleteStep(dir, parts);
       step > 0 && out.intact.size() < kMaxResumeSteps;
       step = LatestCompleteStep(dir, parts, step)) {
    step = NewestIntactCompleteStep(dir, parts, step, damaged);
    if (step == 0) break;
    out.intact.push_back(step);
  }
  return out;
}

Status ExchangeResumeSteps(const Config& config, const std::string& node, const NodeSteps& mine,
                           std::vector<NodeSteps>* all, const std::function<bool()>& stop) {
  const auto& d = config.distributed;
  const auto deadline = std::chrono::steady_clock::now() + d.timeout();
  // Every wait in slices of at most a second, so that `stop` (an
  // interrupt, the coordinator gone) ends it within one.
  constexpr auto kSlice = std::chrono::milliseconds(1000);
  const auto stopped = [&] { return stop && stop(); };
  const auto left = [&] {
    return std::clamp(std::chrono::duration_cast<std::chrono::milliseconds>(
                          deadline - std::chrono::steady_clock::now()),
                      std::chrono::milliseconds(1), std::chrono::milliseconds(kSlice));
  };
  GRIDSYNC_ASSIGN_OR_RETURN(const wire::ControlAuth auth, wire::ControlAuthFor(config, "observer"));
  std::unique_ptr<CoordinatorClient> client;
  for (;;) {
    auto connected = CoordinatorClient::Connect(d.master_addr, static_cast<uint16_t>(d.master_port),
                                                left(), auth, Role::kObserver);
    if (connected.ok()) {
      client = std::move(connected).value();
      break;
    }
    if (stopped()) return Status::IOError("stopped");
    if (std::chrono::steady_clock::now() >= deadline) return connected.status();
  }
  // Keyed by the coordinator's job: one that outlives a launch (run by
  // systemd, not by a launcher) still holds an earlier resume's lists,
  // which must not stand in for a launcher that has not answered yet. No
  // job starts before every launcher has read the lists (its processes
  // start after), so all of them see the same job here.
  GRIDSYNC_ASSIGN_OR_RETURN(const JobState job, client->CurrentJob());
  const std::string prefix = fmt::format("{}job-{}/", kKeyPrefix, job.job);
  GRIDSYNC_RETURN_IF_ERROR(client->Set(prefix + node, EncodeNodeSteps(mine)));
  std::vector<std::string> keys, names;
  for (const auto& n : config.layout.nodes) {
    keys.push_back(prefix + n.name);
    names.push_back(n.name);
  }
  Result<std::vector<std::string>> values = Status::Timeout("not asked yet");
  for (;;) {
    values = client->Get(keys, left());
    if (values.ok() || stopped() || std::chrono::steady_clock::now() >= deadline) break;
    // The slice ran out before every key was there: ask again.
    if (values.status().code() != StatusCode::kTimeout &&
        values.status().code() != StatusCode::kNotFound)
      return values.status();
  }
  if (!values.ok() && stopped()) return Status::IOError("stopped");
  if (!values.ok()) {
    // Which launchers are missing, by node (the keys not there now).
    std::string missing;
    for (size_t i = 0; i < keys.size(); ++i) {
      const auto probe = client->Get({keys[i]}, std::chrono::milliseconds(0));
      if (probe.status().code() == StatusCode::kNotFound)
        missing += (missing.empty() ? "" : ", ") + names[i];
    }
    return Status::Timeout(fmt::format(
        "the launchers of the other nodes did not say which steps they can resume from within "
        "{:.0f} s (missing: {}); allowed: gridsync launch CONFIG --resume --node NAME on every "
        "machine of distributed.nodes ({})",
        d.timeout_s, missing.empty() ? "none now" : missing, values.status().message()));
  }
  all->clear();
  for (size_t i = 0; i < values->size(); ++i) {
    GRIDSYNC_ASSIGN_OR_RETURN(NodeSteps steps, DecodeNodeSteps((*values)[i], names[i]));
    all->push_back(std::move(steps));
  }
  return Status::OK();
}

int ResumeAcrossNodes(const Config& config, const std::string& node,
                      const std::vector<std::string>& local_parts, std::vector<Child>& children,
                      uint64_t* step) {
  const std::string& dir = config.checkpoint.dir;
  std::vector<DamagedPart> damaged;
  const NodeSteps mine = FindLocalSteps(dir, local_parts, &damaged);
  std::vector<std::string> names;
  for (const auto& n : config.layout.nodes) names.push_back(n.name);
  std::string parts;
  for (const auto& p : local_parts) parts += (parts.empty() ? "" : ", ") + p;
  std::printf(
      "gridsync launch --resume: node %s: the steps its parts (%s) hold intact in %s: %s; "
      "asking the other nodes' launchers through the coordinator\n",
      node.c_str(), parts.empty() ? "none" : parts.c_str(), dir.c_str(),
      DescribeSteps(mine).c_str());
  std::fflush(stdout);
  std::vector<NodeSteps> all;
  // A child that exits meanwhile can only be the coordinator this
  // launcher started (nothing else runs yet): the exchange then ends.
  std::atomic<bool> child_gone{false};
  auto exchanged = std::async(std::launch::async, [&] {
    return ExchangeResumeSteps(config, node, mine, &all,
                               [&] { return g_interrupted != 0 || child_gone.load(); });
  });
  while (exchanged.wait_for(std::chrono::milliseconds(0)) != std::future_status::ready) {
    PumpOutput(children, 100);
    Reap(children);
    for (const Child& c : children) child_gone = child_gone || c.exited;
  }
  const Status status = exchanged.get();
  if (g_interrupted)
    return InterruptedExit(" while agreeing on the step to resume from; nothing else was started");
  for (Child& c : children) {
    if (!c.exited) continue;
    Drain(c);
    std::fprintf(stderr,
                 "gridsync launch --resume: %s (pid %d) exited (%s) before the launchers agreed "
                 "on a step; nothing else was started\n",
                 c.name.c_str(), c.pid, Describe(c.status).c_str());
    return 1;
  }
  if (!status.ok()) {
    std::fprintf(stderr, "gridsync launch --resume: %s\n", status.ToString().c_str());
    return 1;
  }
  const std::string steps = DescribeNodeSteps(names, all);
  const uint64_t agreed = NewestCommonStep(all);
  if (agreed == 0) {
    const bool any =
        std::any_of(all.begin(), all.end(), [](const NodeSteps& n) { return !n.intact.empty(); });
    for (const DamagedPart& d : damaged)
      std::fprintf(stderr, "gridsync launch --resume: step %llu: %s\n",
                   static_cast<unsigned long long>(d.step), d.why.c_str());
    std::fprintf(stderr,
                 "gridsync launch --resume: no step every node holds complete and intact in its "
                 "checkpoint.dir (%s); allowed: a run with checkpoint.every_steps > 0 that "
                 "reached a checkpoint on every node, resumed with the shards and workers it ran "
                 "with; the folders are left as they are\n",
                 steps.c_str());
    return any || !damaged.empty() ? kCheckpointsHeldExitCode : kConfigErrorExitCode;
  }
  // This machine's damaged files of the steps passed over are set aside,
  // as a single launcher does: the resumed processes remove the steps after
  // the one they load, and would take them along.
  for (const DamagedPart& d : damaged) {
    if (d.step <= agreed) continue;
    const Status aside = SetPartAside(dir, d.step, d.part);
    std::printf(
        "gridsync launch --resume: step %llu: %s (%s); passed over\n",
        static_cast<unsigned long long>(d.step), d.why.c_str(),
        aside.ok() ? ("set aside as " + d.part + ".bin.damaged").c_str() : aside.message().c_str());
  }
  if (const int refused = CheckChosenResumeStep(config, agreed, local_parts); refused != 0)
    return refused;
  std::printf(
      "gridsync launch: resuming from the checkpoint of step %llu in %s, the newest step every "
      "node holds intact (%s)\n",
      static_cast<unsigned long long>(agreed), dir.c_str(), steps.c_str());
  *step = agreed;
  return 0;
}

}  // namespace gridsync::launch_detail
