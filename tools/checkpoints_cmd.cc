#include "tools/checkpoints_cmd.h"

#include <algorithm>
#include <cstdio>
#include <set>
#include <string>
#include <vector>

#include "common/checkpoint_files.h"
#include "common/config.h"
#include "common/logging.h"
#include "server/coordinator_state.h"
#include "spec/run_spec.h"
#include "tools/launch_checks.h"
#include "tools/launch_resume.h"
#include "tools/resume_steps.h"

namespace gridsync {
namespace {

// Lines of text read from files (paths, a manifest's words): escaped, so a
// hostile file name cannot drive the operator's terminal.
void Say(const std::string& line) { std::printf("%s\n", EscapeControlBytes(line).c_str()); }

std::string Short(const std::string& run) { return run.empty() ? "unnamed" : run.substr(0, 12); }

// The folder's run, as the launcher takes it (FolderRun), saying why none
// is taken from a coordinator-state.json that is there.
std::string DescribeFolderRun(const std::string& dir, const std::string& own) {
  if (!own.empty()) return own;
  const std::string path = dir + "/coordinator-state.json";
  const auto state = LoadCoordinatorState(path);
  if (!state.ok()) return "none taken (" + state.status().message() + ")";
  if (!state->has_value()) return "not named (no coordinator-state.json)";
  return "not named (coordinator-state.json names none: its job ended or never started)";
}

// What part `part`'s files of `step` are, one line: as the launcher's
// checks find them (CheckCheckpointPartIntact: only Corruption is damage
// that passes the step over; any other failure leaves the step to the part,
// which names it at its start).
std::string DescribePart(const std::string& dir, uint64_t step, const std::string& part,
                         const std::vector<uint64_t>& held, const CheckpointMacKey* key,
                         const std::string& own, IntactMemo* memo, bool* intact_of_own_run) {
  *intact_of_own_run = false;
  if (!std::binary_search(held.begin(), held.end(), step)) return "missing (no manifest)";
  const Status intact = memo->Check(dir, step, part, key);
  if (intact.code() == StatusCode::kCorruption) return "damaged: " + intact.message();
  if (!intact.ok())
    return "unreadable (the launcher keeps the step; the part names this at its start): " +
           intact.message();
  const auto run = PartRun(dir, step, part);
  if (run.ok() && !own.empty() && *run != own)
    return "intact, of another run (" + Short(*run) + ", the folder's is " + Short(own) + ")";
  *intact_of_own_run = true;
  return "intact, run " + (run.ok() ? Short(*run) : "unreadable");
}

}  // namespace

int RunCheckpoints(const CheckpointsOptions& options) {
  auto config = Config::LoadFile(options.config_path, options.overrides);
  if (!config.ok()) {
    std::fprintf(stderr, "%s\n", config.status().message().c_str());
    return kConfigErrorExitCode;
  }
  // The parts as gridsync launch counts them (a resume's question).
  const auto spec = RunSpec::Resolve(*config);
  if (!spec.ok()) {
    std::fprintf(stderr, "%s: %s\n", options.config_path.c_str(), spec.status().message().c_str());
    return kConfigErrorExitCode;
  }
  const auto node =
      NodeOfOption(config->layout, options.node, options.config_path, "gridsync checkpoints");
  if (!node.ok()) {
    std::fprintf(stderr, "%s\n", node.status().message().c_str());
    return kConfigErrorExitCode;
  }
  const std::string& dir = config->checkpoint.dir;
  const bool worker_state = spec->sync.worker_state;
  const std::vector<std::string> parts = CheckpointPartsOn(config->layout, *node, worker_state);
  std::string names;
  for (const auto& p : parts) names += (names.empty() ? "" : ", ") + p;
  const std::string own = FolderRun(dir);
  Say(dir + ": the folder's run " + DescribeFolderRun(dir, own) +
      "; parts on this machine: " + (names.empty() ? "none" : names));
  if (config->checkpoint.every_steps <= 0)
    Say("note: checkpoint.every_steps is 0: this config writes no checkpoints");
  const PartMacKeys keys = LaunchMacKeys(*config, "gridsync checkpoints");
  // Each part's files of a step are read once: the listing and the
  // launcher's choice below check the same newest steps.
  IntactMemo memo;
  // Each part's steps read once (a folder of many steps is listed once
  // per part, not once per step and part).
  std::vector<std::vector<uint64_t>> held(parts.size());
  std::set<uint64_t, std::greater<>> steps;
  for (size_t i = 0; i < parts.size(); ++i) {
    held[i] = HeldSteps(dir, parts[i]);
    steps.insert(held[i].begin(), held[i].end());
  }
  // The newest steps, as many as a launcher offers across machines: every
  // .bin of a listed step is read.
  size_t listed = 0;
  for (uint64_t step : steps) {
    if (listed++ == launch_detail::kMaxResumeSteps) {
      Say("(" + std::to_string(steps.size() - launch_detail::kMaxResumeSteps) +
          " older steps not listed)");
      break;
    }
    std::vector<std::string> lines(parts.size());
    bool all_good = true;
    for (size_t i = 0; i < parts.size(); ++i) {
      bool good = false;
      lines[i] = DescribePart(dir, step, parts[i], held[i], keys ? keys(parts[i]) : nullptr, own,
                              &memo, &good);
      all_good = all_good && good;
    }
    if (all_good && !lines.empty() &&
        std::all_of(lines.begin(), lines.end(),
                    [&](const std::string& l) { return l == lines[0]; })) {
      Say("step " + std::to_string(step) + ": " + lines[0] + " (every part)");
      continue;
    }
    Say("step " + std::to_string(step) + ":");
    for (size_t i = 0; i < parts.size(); ++i) Say("  " + parts[i] + ": " + lines[i]);
  }
  if (steps.empty()) Say(DescribeHeldParts(dir));
  std::fflush(stdout);
  if (*node < 0) {
    // The launcher's own choice, with its own lines, moving nothing.
    uint64_t step = 0;
    const int code = ChooseResumeStep(*config, parts, worker_state, &step, /*dry_run=*/true, &memo);
    std::fflush(stdout);
    std::fflush(stderr);
    if (code != 0) Say("gridsync launch --resume would refuse (exit " + std::to_string(code) + ")");
    return code;
  }
  // Across machines each launcher offers its machine's list (FindLocalSteps)
  // and all resume from the newest step every list holds.
  if (parts.empty()) {
    Say("no part here checkpoints: any step the other machines agree on serves this one");
    return 0;
  }
  std::vector<DamagedPart> damaged;
  const launch_detail::NodeSteps mine =
      launch_detail::FindLocalSteps(dir, parts, &damaged, keys, &memo);
  std::fflush(stdout);
  for (const DamagedPart& d : damaged)
    Say("step " + std::to_string(d.step) + ": " + d.part + " damaged: passed over (" + d.why + ")");
  std::string offered;
  for (uint64_t s : mine.intact) offered += (offered.empty() ? "" : ", ") + std::to_string(s);
  if (mine.intact.empty()) {
    Say("this machine offers no step: gridsync launch --resume --node " + options.node +
        " is refused with every other machine's");
    return kCheckpointsHeldExitCode;
  }
  Say("this machine offers steps " + offered +
      " (gridsync launch --resume --node on every machine starts from the newest step every "
      "machine offers)");
  return 0;
}

}  // namespace gridsync
