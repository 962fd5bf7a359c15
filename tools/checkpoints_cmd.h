// `gridsync checkpoints CONFIG [--node NAME]`: what checkpoint.dir holds for
// the parts of this machine, step by step, and the step `gridsync launch
// --resume` would start from, without starting or changing anything.
//
// Each part's files of each step are checked as the launcher checks them
// before a resume (CheckCheckpointPartIntact: manifest, size, checksum and,
// under CURVE where this machine holds the role's key, the MAC; only
// damage, Corruption, passes a step over), and its run is compared with
// the folder's (coordinator-state.json). Then, on one machine, the
// launcher's own choice runs (ChooseResumeStep, dry run: its lines, its
// exit code, the damaged files left where they are); with --node, this
// machine's offer to the other launchers (FindLocalSteps): exit 0 when it
// offers a step or holds no part that checkpoints, 3 when it offers none.
// Only the checkpoints are checked: the launcher's other refusals (the
// config, keys, hosts, memory) are check-config's.
//
// Thread safety: run once, from main.
#pragma once

#include <string>
#include <vector>

namespace gridsync {

struct CheckpointsOptions {
  std::string config_path;
  std::vector<std::string> overrides;  // --set key=value
  std::string node;                    // --node: this machine's node; "" every node
};

int RunCheckpoints(const CheckpointsOptions& options);

}  // namespace gridsync
