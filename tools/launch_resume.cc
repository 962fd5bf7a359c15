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
#include <thread>
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
                         std::vector<DamagedPart>* damaged, const PartMacKeys& keys,
                         IntactMemo* memo) {
  NodeSteps out;
  out.has_parts = !parts.empty();
  if (parts.empty()) return out;
  // Newest first, as a single launcher walks them (the damaged steps
  // passed over go to `damaged`); only the newest few are read (every .bin
  // of a step is read for its checksum).
  // The coordinator's machine knows the folder's run (tools/launch_checks.h's
  // FolderRun): its list leaves out the steps of another run, and so does
  // the step every list holds.
  const std::string own = FolderRun(dir);
  for (uint64_t step = LatestCompleteStep(dir, parts);
       step > 0 && out.intact.size() < kMaxResumeSteps;
       step = LatestCompleteStep(dir, parts, step)) {
    step = NewestIntactCompleteStep(dir, parts, step, damaged, keys, memo);
    if (step == 0) break;
    if (OfAnotherRun(dir, step, parts.front(), own)) continue;
    out.intact.push_back(step);
  }
  return out;
}

namespace {

// One round of the exchange: this launcher's value under
// launch/resume/<round>/<node>, then every node's launcher at the barrier
// launch/resume/<round>, then every node's value, in layout order. The
// barrier is what makes the values this attempt's: each launcher writes
// its value before it arrives, so a value left by an earlier attempt (a
// coordinator outliving it, as under systemd) is overwritten by then; a
// key of a node whose launcher never came is never read. Waits in slices
// of at most a second (re-arriving at the barrier), so that `stop` ends
// them within one.
Status ExchangeRound(const Config& config, const std::string& round, const std::string& node,
                     const std::string& value, std::vector<std::string>* values,
                     const std::function<bool()>& stop) {
  const auto& d = config.distributed;
  const auto deadline = std::chrono::steady_clock::now() + d.timeout();
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
    const auto slice_end = std::chrono::steady_clock::now() + left();
    auto connected = CoordinatorClient::Connect(d.master_addr, static_cast<uint16_t>(d.master_port),
                                                left(), auth, Role::kObserver);
    if (connected.ok()) {
      client = std::move(connected).value();
      break;
    }
    // Not yet listening (its launcher is starting it) is worth another
    // try; anything else (a key the coordinator refuses) is not.
    const StatusCode code = connected.status().code();
    if (code != StatusCode::kIOError && code != StatusCode::kTimeout) return connected.status();
    if (stopped()) return Status::IOError("stopped");
    if (std::chrono::steady_clock::now() >= deadline) return connected.status();
    // A refusal that comes at once is not retried faster than a slice.
    while (std::chrono::steady_clock::now() < slice_end && !stopped())
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  const std::string prefix = std::string(kKeyPrefix) + round;
  GRIDSYNC_RETURN_IF_ERROR(client->Set(prefix + "/" + node, value));
  const auto& nodes = config.layout.nodes;
  Status met = Status::Timeout("not arrived yet");
  for (;;) {
    met = client->Barrier(prefix, static_cast<uint32_t>(nodes.size()), "launcher of node " + node,
                          left());
    if (met.ok() || stopped() || std::chrono::steady_clock::now() >= deadline) break;
    if (met.code() != StatusCode::kTimeout) return met;
  }
  if (!met.ok() && stopped()) return Status::IOError("stopped");
  if (!met.ok()) {
    std::string all;
    for (const auto& n : nodes) all += (all.empty() ? "" : ", ") + n.name;
    return Status::Timeout(fmt::format(
        "the launchers of the other nodes did not all come within {:.0f} s ({}); allowed: "
        "gridsync launch CONFIG --resume --node NAME on every machine of distributed.nodes ({})",
        d.timeout_s, met.message(), all));
  }
  std::vector<std::string> keys;
  for (const auto& n : nodes) keys.push_back(prefix + "/" + n.name);
  GRIDSYNC_ASSIGN_OR_RETURN(*values, client->Get(keys, std::chrono::milliseconds(0)));
  return Status::OK();
}

// A round whose values are decoded with `decode`, node by node.
template <typename T>
Status ExchangeDecoded(const Config& config, const char* round, const std::string& node,
                       const std::string& mine,
                       Result<T> (*decode)(std::string_view, const std::string&),
                       std::vector<T>* all, const std::function<bool()>& stop) {
  std::vector<std::string> values;
  GRIDSYNC_RETURN_IF_ERROR(ExchangeRound(config, round, node, mine, &values, stop));
  all->clear();
  for (size_t i = 0; i < values.size(); ++i) {
    GRIDSYNC_ASSIGN_OR_RETURN(T value, decode(values[i], config.layout.nodes[i].name));
    all->push_back(std::move(value));
  }
  return Status::OK();
}

}  // namespace

Status ExchangeResumeSteps(const Config& config, const std::string& node, const NodeSteps& mine,
                           std::vector<NodeSteps>* all, const std::function<bool()>& stop) {
  return ExchangeDecoded(config, "steps", node, EncodeNodeSteps(mine), &DecodeNodeSteps, all, stop);
}

Status ExchangeVerdicts(const Config& config, const std::string& node, const ResumeVerdict& mine,
                        std::vector<ResumeVerdict>* all, const std::function<bool()>& stop) {
  return ExchangeDecoded(config, "verdict", node, EncodeVerdict(mine), &DecodeVerdict, all, stop);
}

namespace {

// Runs `exchange` on a thread of its own while the launcher streams its
// children's output; a child that exits meanwhile can only be the
// coordinator this launcher started (nothing else runs yet), and ends it.
// 0, or the exit code of what ended it, printed.
int WhileStreaming(std::vector<Child>& children, const char* what,
                   const std::function<Status(const std::function<bool()>&)>& exchange) {
  std::atomic<bool> child_gone{false};
  auto done = std::async(std::launch::async, [&] {
    return exchange([&] { return g_interrupted != 0 || child_gone.load(); });
  });
  while (done.wait_for(std::chrono::milliseconds(0)) != std::future_status::ready) {
    PumpOutput(children, 100);
    Reap(children);
    for (const Child& c : children) child_gone = child_gone || c.exited;
  }
  const Status status = done.get();
  if (g_interrupted)
    return InterruptedExit(" while agreeing on the step to resume from; nothing else was started");
  for (Child& c : children) {
    if (!c.exited) continue;
    Drain(c);
    std::fprintf(stderr,
                 "gridsync launch --resume: %s (pid %d) exited (%s) while %s; nothing else was "
                 "started\n",
                 c.name.c_str(), c.pid, Describe(c.status).c_str(), what);
    return 1;
  }
  if (!status.ok()) {
    std::fprintf(stderr, "gridsync launch --resume: %s: %s\n", what, status.ToString().c_str());
    return 1;
  }
  return 0;
}

}  // namespace

int ResumeAcrossNodes(const Config& config, const std::string& node,
                      const std::vector<std::string>& local_parts, std::vector<Child>& children,
                      uint64_t* step) {
  const std::string& dir = config.checkpoint.dir;
  std::vector<DamagedPart> damaged;
  NodeSteps mine = FindLocalSteps(dir, local_parts, &damaged, LaunchMacKeys(config));
  mine.damaged = !damaged.empty();
  std::vector<std::string> names;
  for (const auto& n : config.layout.nodes) names.push_back(n.name);
  std::string parts;
  for (const auto& p : local_parts) parts += (parts.empty() ? "" : ", ") + p;
  std::printf(
      "gridsync launch --resume: node %s: the steps its parts (%s) hold intact in %s: %s; "
      "asking the other nodes' launchers through the coordinator\n",
      node.c_str(), parts.empty() ? "none" : parts.c_str(), dir.c_str(),
      DescribeSteps(mine).c_str());
  for (const DamagedPart& d : damaged)
    std::printf("gridsync launch --resume: step %llu: %s\n",
                static_cast<unsigned long long>(d.step), d.why.c_str());
  std::fflush(stdout);
  std::vector<NodeSteps> all;
  if (const int failed = WhileStreaming(children, "exchanging the steps each node holds",
                                        [&](const std::function<bool()>& stop) {
                                          return ExchangeResumeSteps(config, node, mine, &all,
                                                                     stop);
                                        });
      failed != 0)
    return failed;
  const std::string steps = DescribeNodeSteps(names, all);
  // Every launcher computes the same from the same lists.
  ResumeVerdict verdict{NewestCommonStep(all), 0};
  if (verdict.step == 0) {
    const bool held = std::any_of(
        all.begin(), all.end(), [](const NodeSteps& n) { return !n.intact.empty() || n.damaged; });
    std::fprintf(stderr,
                 "gridsync launch --resume: no step every node holds complete and intact in its "
                 "checkpoint.dir (%s); allowed: a run with checkpoint.every_steps > 0 that "
                 "reached a checkpoint on every node, resumed with the shards and workers it ran "
                 "with; the folders are left as they are\n",
                 steps.c_str());
    verdict.refused = held ? kCheckpointsHeldExitCode : kConfigErrorExitCode;
  } else {
    // The checks only this machine can make (its parts' runs); the
    // others' verdicts come next.
    verdict.refused = CheckChosenResumeStep(config, verdict.step, local_parts);
  }
  // Second round: every machine starts, or none does, with one exit code.
  std::vector<ResumeVerdict> verdicts;
  if (const int failed = WhileStreaming(children, "exchanging each node's verdict",
                                        [&](const std::function<bool()>& stop) {
                                          return ExchangeVerdicts(config, node, verdict, &verdicts,
                                                                  stop);
                                        });
      failed != 0)
    return failed;
  for (size_t i = 0; i < verdicts.size(); ++i) {
    if (verdicts[i].step != verdict.step) {
      std::fprintf(stderr,
                   "gridsync launch --resume: node %s chose step %llu, node %s step %llu from the "
                   "same lists (%s): launchers of different builds?; nothing was started\n",
                   names[i].c_str(), static_cast<unsigned long long>(verdicts[i].step),
                   node.c_str(), static_cast<unsigned long long>(verdict.step), steps.c_str());
      return 1;
    }
    if (verdicts[i].refused != 0) {
      if (names[i] != node)
        std::fprintf(stderr,
                     "gridsync launch --resume: node %s's launcher refused step %llu (exit %d; "
                     "its output says why); nothing was started\n",
                     names[i].c_str(), static_cast<unsigned long long>(verdict.step),
                     verdicts[i].refused);
      return verdicts[i].refused;
    }
  }
  // This machine's damaged files of the steps passed over are set aside,
  // as a single launcher does: the resumed processes remove the steps after
  // the one they load, and would take them along.
  for (const DamagedPart& d : damaged) {
    if (d.step <= verdict.step) continue;
    std::printf("gridsync launch --resume: %s; passed over\n", SetDamagedPartAside(dir, d).c_str());
  }
  std::printf(
      "gridsync launch: resuming from the checkpoint of step %llu in %s, the newest step every "
      "node holds intact (%s)\n",
      static_cast<unsigned long long>(verdict.step), dir.c_str(), steps.c_str());
  *step = verdict.step;
  return 0;
}

}  // namespace gridsync::launch_detail
