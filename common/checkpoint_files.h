// The files of a job's checkpoints, for every process that holds training
// state: the shards (their partition: server/shard_checkpoint.h) and, when
// the workers hold state of their own (error-feedback residuals, Adam on
// the workers), each worker (worker/worker_checkpoint.h).
//
// Layout: <dir>/step-<s>/<part>.bin and <part>.json, the manifest (step,
// part, the caller's shape description, byte count, FNV-1a 64 checksum of
// the .bin, the run and, under CURVE, a MAC of all that and the .bin:
// common/checkpoint_mac_key.h; its format: common/checkpoint_manifest.h). Each file is written
// atomically (temporary file, fsync, rename, fsync of the folder), the manifest after the data, so
// a crash mid-write leaves a .tmp-<pid>-<random> file and no manifest: that step is incomplete
// for that part and the previous one stays in use (the part's temporary files go with its files
// of the step, RemovePart). A step is complete when every part the job writes has its
// manifest there (LatestCompleteStep). Each part keeps its two newest steps (of its current
// history: later ones go).
//
// Reading trusts no byte of the files: sizes are taken from the file system
// and checked (the manifest against kMaxManifestBytes, the .bin against the
// manifest and the caller's state size) before anything is read or
// allocated, every manifest field is checked for presence and type, and
// every refusal is a Status naming the file, the field and what is allowed
// (a checkpoint folder is input, never a reason to abort).
//
// Thread safety: free functions; distinct parts may be written concurrently
// (by different processes), one part by one writer at a time.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "common/checkpoint_mac_key.h"
#include "common/checkpoint_manifest.h"
#include "common/file_bytes.h"
#include "common/status.h"

namespace gridsync {

// FNV-1a 64 of `bytes`, continuing from `h` (the checksum of the .bin files,
// and of state compared across processes).
inline constexpr uint64_t kFnv1a64Start = 0xcbf29ce484222325ull;
uint64_t Fnv1a64(std::string_view bytes, uint64_t h = kFnv1a64Start);

// The most bytes a manifest holds: far above any model's shape (a pair of
// numbers per table), so that a forged or damaged one is refused by its size
// before it is read. WriteCheckpointPart refuses to write a larger one.
inline constexpr uint64_t kMaxManifestBytes = uint64_t{1} << 20;

// Writes `bytes` to `path` through a temporary file of its own (path +
// ".tmp-<pid>-" and 8 random letters, created new: never a file or link
// already there), fsync, rename and an fsync of the folder: afterwards the file is
// either its old version or whole, whatever crashes, and writers of one
// path at once each leave a whole file (the last rename's). A failed write
// removes its temporary file. The folder must exist. Thread-safe.
Status WriteFileAtomically(const std::string& path, std::string_view bytes);

// Writes `data` as part `part` of step `step` (with `shape`, checked when
// read back), then removes this part's files of every other step but the
// newest one before it and the steps in `keep` up to `step`, later steps
// included (another history's); a step folder goes once every part left it.
// `keep`: the steps the coordinator last acknowledged for this part while
// it cannot be told of newer ones, and the newest step every part holds
// (CheckpointLedger::MustKeep): they are what the job can roll back to, so
// they stay on disk. A failed write removes its temporary file (a full
// disk kept the partial one, and every later write failed too).
// `run`: the run the part belongs to (common/checkpoint_run.h), in the
// manifest.
// `key` (under CURVE: common/checkpoint_mac_key.h): the manifest also carries
// the part's MAC ("mac").
Status WriteCheckpointPart(const std::string& dir, uint64_t step, const std::string& part,
                           std::string_view data, const nlohmann::json& shape,
                           const std::vector<uint64_t>& keep = {}, const std::string& run = "",
                           const CheckpointMacKey* key = nullptr);

// Reads part `part` of step `step` after checking its manifest (NotFound
// listing the steps `dir` holds of `part` when it has no manifest): its size,
// its fields' presence and types (Corruption naming the field, what it is
// and what is allowed), step, part, `shape` (InvalidArgument when another
// model or partition wrote it), then the .bin's size against the manifest's
// `bytes` (Corruption naming both) and `state_bytes` (the size of the
// caller's state, when it knows it: InvalidArgument naming both), all before
// the .bin is read; then its checksum (Corruption, naming both checksums).
// `run` (unless null) receives the manifest's run: "" where it names none
// (written before runs were named); one that is not IsRunId is refused.
// `key` (under CURVE): last, the manifest's MAC must be there and match
// the fields and the .bin; Corruption otherwise (written without CURVE,
// stripped, changed, forged, or written with other keys: damage, set aside
// like a bad checksum). Without a key a MAC is not checked (a process
// without the role's secret cannot).
Result<std::string> ReadCheckpointPart(const std::string& dir, uint64_t step,
                                       const std::string& part, const nlohmann::json& shape,
                                       std::optional<uint64_t> state_bytes = std::nullopt,
                                       std::string* run = nullptr,
                                       const CheckpointMacKey* key = nullptr);

// ReadCheckpointPart's checks short of the shape, which only the part's own
// process knows (the manifest, the .bin's size and checksum): whether the
// files of a step are intact, for gridsync launch --resume to choose a step
// before anything starts. Reads the whole .bin.
// `key` (under CURVE, where this process holds the part's role key): the
// MAC is checked too, as ReadCheckpointPart checks it.
Status CheckCheckpointPartIntact(const std::string& dir, uint64_t step, const std::string& part,
                                 const CheckpointMacKey* key = nullptr);

// The verdicts of CheckCheckpointPartIntact by step and part, kept for one
// command that checks a folder's steps more than once (gridsync
// checkpoints lists the newest steps, then runs the launcher's choice of
// one): each .bin is read once, where the newest step's were read twice (a
// shard's part is its whole state, gigabytes). For one folder and one set
// of keys; not thread-safe.
class IntactMemo {
 public:
  Status Check(const std::string& dir, uint64_t step, const std::string& part,
               const CheckpointMacKey* key);

 private:
  std::map<std::pair<uint64_t, std::string>, Status> checked_;
};

// The key to check a part's MAC with (null: none), by the part's name
// ("shard-0", "worker-3"), as gridsync launch holds them (LaunchMacKeys).
using PartMacKeys = std::function<const CheckpointMacKey*(const std::string& part)>;

// The newest complete step of `parts` in `dir`, at most `step`, whose files
// all pass CheckCheckpointPartIntact; 0 when none is left. Only damage
// (Corruption: a checksum, a size, a manifest whose .bin is gone) passes a
// step over; each one passed over is added to `damaged` (when given) with
// its first damaged part and why. Reads every part's .bin of each step it
// checks.
struct DamagedPart {
  uint64_t step = 0;
  std::string part;
  std::string why;
};
// `keys` (when given): each part's MAC is checked with its key, and a MAC
// that differs is damage like a bad checksum (forged files are passed over
// for the newest authentic step). `memo` (when given): each part's files
// are checked once through it.
uint64_t NewestIntactCompleteStep(const std::string& dir, const std::vector<std::string>& parts,
                                  uint64_t step, std::vector<DamagedPart>* damaged = nullptr,
                                  const PartMacKeys& keys = nullptr, IntactMemo* memo = nullptr);

// Sets part `part`'s files of step `step` aside, renamed <part>.json.damaged
// and <part>.bin.damaged (the manifest first): kept for a look, no longer a
// step the part holds. For files that fail their checks (Corruption), which
// every restart would otherwise load and fail on again.
Status SetPartAside(const std::string& dir, uint64_t step, const std::string& part);

// The steps whose folder in `dir` holds part `part`'s manifest, ascending.
std::vector<uint64_t> HeldSteps(const std::string& dir, const std::string& part);

// Removes part `part`'s files of every step after `step` (a rollback).
void RemoveStepsAfter(const std::string& dir, const std::string& part, uint64_t step);

// What `dir` holds, for a refusal that found no step to resume from: that
// it is missing or no folder (a FIFO, a device), or its newest steps with
// the parts whose manifest each holds ("step 20 (shard-0, shard-1)"), so
// that a changed ps.shards or world size shows against the parts written.
std::string DescribeHeldParts(const std::string& dir);

// The newest step below `below` whose folder holds a manifest of every one
// of `parts`; 0 when there is none.
uint64_t LatestCompleteStep(const std::string& dir, const std::vector<std::string>& parts,
                            uint64_t below = UINT64_MAX);

// Whether the manifests of `parts` in step `step`'s folder (those there)
// all name one run (common/checkpoint_run.h): InvalidArgument naming the
// parts apart otherwise, or a manifest that cannot be read. gridsync launch
// --resume asks it before anything starts; every part checks again.
Status CheckStepIsOneRun(const std::string& dir, uint64_t step,
                         const std::vector<std::string>& parts);

// Part `part`'s manifest of step `step` (its checks: ReadManifest); the
// manifest's refusal when it cannot be read.
Result<checkpoint_manifest::Manifest> ReadPartManifest(const std::string& dir, uint64_t step,
                                                       const std::string& part);

// The run part `part`'s manifest of step `step` names ("" for one written
// before runs were named); the manifest's refusal when it cannot be read.
Result<std::string> PartRun(const std::string& dir, uint64_t step, const std::string& part);

// Whether `parts` may start a job afresh in `dir`: a fresh job's first
// checkpoint removes each part's later steps and all but the newest earlier
// one (WriteCheckpointPart),
// so a run that was not resumed would lose the checkpoints another run left
// there (a restart without --resume, a shard restarted by systemd after its
// coordinator restarted and forgot the job). InvalidArgument naming the
// folder, the parts' steps and the ways on when any part holds a step; OK
// otherwise. `job_parts` (every part of the job, CheckpointParts) decide
// which step a resume would start from, as `gridsync launch --resume` does.
// `run_steps` (training.steps; 0: unknown): a step that reaches it is a
// finished run, which a resume would refuse ("resuming at step 20, but
// training.steps is 20"), so the refusal says so instead of advising one.
Status CheckFreshStart(const std::string& dir, const std::vector<std::string>& parts,
                       const std::vector<std::string>& job_parts, uint64_t run_steps = 0);

}  // namespace gridsync
