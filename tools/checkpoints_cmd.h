// `gridsync checkpoints CONFIG [--node NAME]`: what checkpoint.dir holds for
// the parts of this machine, step by step, and the step `gridsync launch
// --resume` would start from, without starting or changing anything.
//
// Each part's files of each step are checked as the launcher checks them
// before a resume (CheckCheckpointPartIntact: manifest, size, checksum and,
// under CURVE where this machine holds the role's key, the MAC), and its run
// is compared with the folder's (coordinator-state.json). Where the launcher
// sets damaged files aside, this only names them: an operator can look
// before anything moves. Exit 0 when a step to resume from is here; else
// the launcher's exit code for the same refusal: 3 (kCheckpointsHeldExitCode)
// when every complete step is damaged or another run's, or the newest intact
// one mixes runs; 2 when no step is complete, the newest intact one leaves
// no step to train, or the config is refused.
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
