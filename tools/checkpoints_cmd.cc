#include "tools/checkpoints_cmd.h"

#include <algorithm>
#include <cstdio>
#include <set>
#include <string>
#include <vector>

#include "common/checkpoint_files.h"
#include "common/config.h"
#include "common/logging.h"
#include "spec/run_spec.h"
#include "tools/launch_checks.h"

namespace gridsync {
namespace {

// One part's files of one step.
struct PartVerdict {
  bool held = false;    // its manifest is there
  bool intact = false;  // and every check passed
  std::string run;      // the run its manifest names
  std::string why;      // why not intact
};

// Lines of text read from files (paths, a manifest's words): escaped, so a
// hostile file name cannot drive the operator's terminal.
void Say(const std::string& line) { std::printf("%s\n", EscapeControlBytes(line).c_str()); }

std::string Short(const std::string& run) { return run.empty() ? "unnamed" : run.substr(0, 12); }

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
  const std::vector<std::string> parts =
      CheckpointPartsOn(config->layout, *node, spec->sync.worker_state);
  std::string names;
  for (const auto& p : parts) names += (names.empty() ? "" : ", ") + p;
  const std::string own = FolderRun(dir);
  Say(dir + ": the folder's run " +
      (own.empty() ? "not named (by no coordinator-state.json here)" : own) +
      "; parts on this machine: " + (names.empty() ? "none" : names));
  if (config->checkpoint.every_steps <= 0)
    Say("note: checkpoint.every_steps is 0: this config writes no checkpoints");
  const PartMacKeys keys = LaunchMacKeys(*config);
  std::set<uint64_t, std::greater<>> steps;
  for (const auto& part : parts) {
    for (uint64_t s : HeldSteps(dir, part)) steps.insert(s);
  }
  uint64_t resume = 0;
  bool any_complete = false;  // a step with every part's manifest
  std::string resume_note;    // why gridsync launch --resume would refuse it
  int resume_exit = 0;        // ... and its exit code (CheckChosenResumeStep's)
  for (uint64_t step : steps) {
    std::vector<PartVerdict> verdicts(parts.size());
    bool all_intact = true, complete = true;
    for (size_t i = 0; i < parts.size(); ++i) {
      PartVerdict& v = verdicts[i];
      const auto held = HeldSteps(dir, parts[i]);
      v.held = std::binary_search(held.begin(), held.end(), step);
      if (v.held) {
        const Status intact =
            CheckCheckpointPartIntact(dir, step, parts[i], keys ? keys(parts[i]) : nullptr);
        v.intact = intact.ok();
        v.why = intact.ok() ? "" : intact.message();
        if (auto run = PartRun(dir, step, parts[i]); run.ok()) v.run = *run;
      }
      all_intact = all_intact && v.intact;
      complete = complete && v.held;
    }
    // The launcher takes the first part's run for the step's (OfAnotherRun)
    // and then refuses a step whose parts name different runs.
    any_complete = any_complete || complete;
    const std::string run = verdicts.empty() ? "" : verdicts.front().run;
    bool one_run = true;
    for (const auto& v : verdicts) one_run = one_run && v.run == run;
    const bool other_run = !own.empty() && !run.empty() && run != own;
    if (all_intact && !other_run) {
      Say("step " + std::to_string(step) + ": intact, run " + Short(run) +
          (one_run ? "" : ", but its parts name different runs (a resume refuses it)"));
      if (resume == 0) {
        resume = step;
        if (!one_run) {
          resume_note = ", but gridsync launch --resume refuses it: its parts mix runs";
          resume_exit = kCheckpointsHeldExitCode;
        } else if (const Status left = CheckStepsLeft(*config, step); !left.ok()) {
          resume_note = ", but gridsync launch --resume refuses it: " + left.message();
          resume_exit = kConfigErrorExitCode;
        }
      }
      continue;
    }
    Say("step " + std::to_string(step) + ": passed over by a resume");
    for (size_t i = 0; i < parts.size(); ++i) {
      const PartVerdict& v = verdicts[i];
      if (!v.held) {
        Say("  " + parts[i] + ": missing (no manifest)");
      } else if (!v.intact) {
        Say("  " + parts[i] + ": damaged: " + v.why);
      } else if (!own.empty() && !v.run.empty() && v.run != own) {
        Say("  " + parts[i] + ": intact, of another run (" + Short(v.run) + ", the folder's is " +
            Short(own) + ")");
      } else {
        Say("  " + parts[i] + ": intact");
      }
    }
  }
  if (steps.empty()) Say(DescribeHeldParts(dir));
  if (resume == 0) {
    // The launcher's codes: no complete step is a config that does not
    // match the folder (2), complete ones all damaged or another run's, 3.
    const int code = any_complete ? kCheckpointsHeldExitCode : kConfigErrorExitCode;
    Say("no step to resume from here: gridsync launch --resume refuses (exit " +
        std::to_string(code) + ")");
    return code;
  }
  if (!resume_note.empty()) {
    Say("resume: step " + std::to_string(resume) + " is the newest step intact here" + resume_note);
  } else {
    Say("resume: step " + std::to_string(resume) +
        (*node < 0 ? " (gridsync launch --resume starts from it)"
                   : " is this machine's newest intact step (the launchers of every node take "
                     "the newest step every machine holds intact)"));
  }
  return resume_exit;
}

}  // namespace gridsync
