// Checks `gridsync launch` makes before it starts anything, for what only
// the launcher knows: which roles run on this machine (--node, --coordinator)
// and the extra arguments it hands every worker. A refusal here is exit 2
// with nothing started; each of these once failed a cluster that had
// already started (a hostile probe).
//
// Thread safety: free functions.
#pragma once

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "common/checkpoint_files.h"
#include "common/config.h"
#include "common/status.h"

namespace gridsync {

// The workers this launcher starts: on `node`, or on every node (-1).
int WorkersHere(const ClusterLayout& layout, int node);

// The node `name` (--node) names in `layout`'s config `config_path`: its
// index, or -1 for "" (every node, one machine). Refused, naming what is
// allowed: a name of no node, or "" where the nodes are on several
// machines. `command` begins the refusal ("gridsync launch").
Result<int> NodeOfOption(const ClusterLayout& layout, const std::string& name,
                         const std::string& config_path, const std::string& command);

// The checkpoint parts of `node` (-1: every node): its shards, and its
// workers when `workers_with_state` (the job's workers hold state of their
// own: RunSpec's sync.worker_state).
std::vector<std::string> CheckpointPartsOn(const ClusterLayout& layout, int node,
                                           bool workers_with_state);

// The keys of the roles this launcher starts (`node` -1: every node; the
// coordinator when `run_coordinator`), as each process loads them at its
// start (wire::CheckRoleKeys). A secret readable by others failed the
// worker after the others had started and its image had loaded.
Status CheckKeysOfRolesHere(const Config& config, int node, bool run_coordinator);

// `worker_args` go to every worker this launcher starts (on `node`, -1:
// every node), `rank0_args` to worker 0: neither may hold a flag the
// launcher gives the workers itself (--config, --set, --rank, --node,
// --start-step, --standalone, --check-only), and with two or more workers
// here a --metrics-port or --timeline in worker_args is one port or file
// for all of them, which only one can bind (the second exited 1 once the
// cluster ran) or write. InvalidArgument naming the flag and the ways that
// work.
Status CheckArgsSharedByWorkers(const Config& config, int node,
                                const std::vector<std::string>& worker_args,
                                const std::vector<std::string>& rank0_args);

// The workers whose command lines differ, as (rank, node): rank 0's and
// one other rank's, of those this launcher starts (on `node`, -1: every
// node). Each is run with --check-only before anything starts.
std::vector<std::pair<int, int>> WorkerLinesToCheck(const ClusterLayout& layout, int node);

// A resume from `resume_step` has steps left to train (training.steps
// above it): a run that had reached them started every process, the
// shards loaded the step, and the workers then exited 1.
Status CheckStepsLeft(const Config& config, uint64_t resume_step);

// The checks of the step a resume chose, over `parts` (those whose files
// this launcher sees): their manifests name one run (else exit 3), and the
// step leaves training to do (else exit 2); a refusal is printed on
// stderr. 0 when both pass.
int CheckChosenResumeStep(const Config& config, uint64_t step,
                          const std::vector<std::string>& parts);

// The run `dir`'s coordinator kept (its coordinator-state.json,
// server/coordinator_state.h): the folder's own run; "" when it keeps none
// or the file does not decode (the coordinator names that at its start).
std::string FolderRun(const std::string& dir);

// Whether part `part`'s files of `step` belong to another run than `own`
// (never when `own` is "", or the manifest cannot be read: the part's own
// checks name that), saying so on stdout: a step of another run copied
// into the folder, or left by a second run sharing it, is passed over by
// --resume, not adopted (adopted, the resumed parts removed the folder's
// own older steps as another run's: a hostile probe).
bool OfAnotherRun(const std::string& dir, uint64_t step, const std::string& part,
                  const std::string& own);

// The resolved config a run started with, kept in checkpoint.dir
// (launch-config.json) so that every later --resume can say what changed:
// written by a fresh launch that takes checkpoints (a failure is printed,
// not fatal: the run needs no record). ResumedConfigChanges lists the keys whose
// resolved values differ from the record ("training.seed 1337 -> 7"), empty
// when the folder keeps no record (an older gridsync, or units started by
// hand). A resume with other values is allowed (more steps, a lower rate),
// but not silently: manifests check the model's shape, not the rest.
void RecordLaunchConfig(const Config& config);
std::vector<std::string> ResumedConfigChanges(const Config& config);

// gridsync launch --resume with every part on this machine: the step to
// resume from into *step, or the exit code of a refusal, printed on stderr
// (0: none). The newest complete step of `job_parts` whose files are
// intact (each passed over named); refused where the step mixes runs, or
// leaves nothing to train. A step of another run than the folder's (its
// coordinator-state.json names it) is passed over. (Across machines:
// launch_resume.h.) `dry_run` (gridsync checkpoints): the same choice and
// the same lines, but the damaged files stay where they are. `memo`: as
// NewestIntactCompleteStep's (gridsync checkpoints checked the files already).
int ChooseResumeStep(const Config& config, const std::vector<std::string>& job_parts,
                     bool workers_hold_state, uint64_t* step, bool dry_run = false,
                     IntactMemo* memo = nullptr);

// The checkpoint MAC keys of the shards' and the workers' parts as far as
// this machine holds them (wire::CheckpointMacKeyFor), by part name, for
// the launcher's choice of a step: a role whose key is not here is not
// checked (its processes are elsewhere); one whose key file fails to load
// otherwise is named in a warning prefixed with `who` (the command that
// reads the checkpoints; null: no warning, one was given already), and
// its processes refuse to start.
PartMacKeys LaunchMacKeys(const Config& config, const char* who = "gridsync launch");

// The newest complete step of `parts` in `dir`, at most `step`, whose files
// all pass their checks short of the shape (CheckCheckpointPartIntact): a
// corrupted .bin would fail its process at start, and every restart the
// same way. Each newer step passed over is noted in `skipped` with its
// first failure, and that part's files of it are set aside (SetPartAside),
// kept for a look where the resumed processes remove the newer steps. 0
// when none is left. `keys` (LaunchMacKeys): under CURVE a
// part whose MAC differs is passed over too (forged or changed files).
// `set_aside` false: the files stay, and `skipped` says they would go.
// `memo`: as NewestIntactCompleteStep's.
uint64_t NewestIntactStep(const std::string& dir, const std::vector<std::string>& parts,
                          uint64_t step, std::vector<std::string>* skipped,
                          const PartMacKeys& keys = nullptr, bool set_aside = true,
                          IntactMemo* memo = nullptr);

// Sets `d`'s files aside (SetPartAside) and says so: "step N: why (set
// aside as <part>.bin.damaged)", or the error in the parentheses.
std::string SetDamagedPartAside(const std::string& dir, const DamagedPart& d);

}  // namespace gridsync
