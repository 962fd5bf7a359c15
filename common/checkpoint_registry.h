// Which checkpoint steps each part of a job holds, published in the
// coordinator's key-value store (the Store seam), so that a shard restarted
// during training, on whatever machine, finds the newest step every part
// holds and rejoins the job from it (no shared filesystem is assumed).
//
// Keys: "checkpoint/job-<job>/<part>" -> the part's steps on disk, ascending,
// comma-separated ("100,150"). Each process publishes its own part after
// every checkpoint it writes and after a rollback (which removes its steps
// past the one the job went back to: they belong to an abandoned history).
//
// Thread safety: free functions; the Store is safe for concurrent use.
#pragma once

#include <chrono>
#include <cstdint>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "common/checkpoint_files.h"  // HeldSteps, RemoveStepsAfter
#include "common/status.h"
#include "common/store.h"

namespace gridsync {

std::string CheckpointKey(uint64_t job, const std::string& part);

// The steps one part wrote (or loaded) in the job it serves: what it
// publishes, so that files another job or run left in the same folder are
// never offered for a rejoin. Steps whose files are gone (kept: the two
// newest) drop out when published.
class CheckpointLedger {
 public:
  CheckpointLedger(std::string dir, std::string part)
      : dir_(std::move(dir)), part_(std::move(part)) {}
  const std::string& part() const { return part_; }
  // This part wrote (or loaded) `step` in the current job.
  void Wrote(uint64_t step);
  // The job went back to `step`, which this part loaded: later steps are
  // forgotten, here and on disk (RemoveStepsAfter).
  void RolledBack(uint64_t step);
  // ... from files that name run `run`: refused (InvalidArgument naming the
  // manifest under `dir`, and `who`, "shard" or "worker") when the part
  // serves another run, since another run's files were put in place of its
  // own; else RolledBack(step) with that run.
  Status RolledBackTo(uint64_t step, std::string run, const char* who);
  // A new job: nothing of this one counts.
  void Reset() {
    steps_.clear();
    common_ = 0;
    run_.clear();
    run_known_ = false;
  }
  // The run this part's checkpoints belong to (common/checkpoint_run.h):
  // the one its loaded files name (a resume, a rejoin, a rollback)...
  void SetRun(std::string run) {
    run_ = std::move(run);
    run_known_ = true;
  }
  bool run_known() const { return run_known_; }
  const std::string& run() const { return run_; }
  // ... or, before the first checkpoint of a job started afresh, the one
  // its first part makes (FreshRun; up to `timeout` for it). Without a
  // store (one process, in-process tests) the files name none.
  Result<std::string> RunForWriting(Store* store, uint64_t job, std::chrono::milliseconds timeout);
  // The parts a step of the job needs (CheckpointParts): with them,
  // Publish also learns the newest step every part holds.
  void SetJobParts(std::vector<std::string> parts) { job_parts_ = std::move(parts); }
  const std::vector<std::string>& job_parts() const { return job_parts_; }
  // Publishes the steps still on disk for job `job`, then reads the newest
  // step every one of the job's parts published.
  Status Publish(Store& store, uint64_t job);
  // Reads again the newest step every part holds, as Publish does after
  // publishing, unless the last Publish failed (the coordinator is down or
  // stalled: no second wait on it). Before a write: a part that published
  // its step before the others had written theirs learned an older common
  // step, and kept it from its disk while the others' newer one was
  // complete (a hostile probe: two shards on a disk for two steps missed
  // every checkpoint after the second).
  // Unanswered, it counts as a failed Publish (MustKeep keeps what the
  // coordinator last acknowledged) and says so in the log: a failure
  // changes what is kept, never the run.
  void RefreshCommon(Store& store, uint64_t job);
  // What the writer must leave on disk (WriteCheckpointPart's `keep`; the
  // two newest steps are kept anyway):
  //  - the newest step every part held at the last Publish or
  //    RefreshCommon: when another
  //    part's writes fail (its disk is full), this part's newer steps are
  //    not complete, and pruning the older ones left no complete step at
  //    all (a hostile probe: shard 1's writes failed from step 150, shard 0
  //    removed its 50 and 100 as it wrote 250 and 300, and the restarted
  //    shard 1 and `--resume` found nothing to start from);
  //  - while the last Publish failed (the coordinator is down), every step
  //    it last acknowledged, since the job rolls back to one of them.
  std::vector<uint64_t> MustKeep() const;

 private:
  const std::string dir_;
  const std::string part_;
  std::vector<uint64_t> steps_;      // ascending
  std::vector<uint64_t> published_;  // the last list acknowledged, ascending
  bool publish_failed_ = false;      // the last Publish was refused or unanswered
  std::vector<std::string> job_parts_;
  uint64_t common_ = 0;  // the newest step every part held at the last Publish or RefreshCommon
  std::string run_;
  bool run_known_ = false;
};

// Parses a published list ("100,150"; empty: no step); Corruption naming
// the part and the text (cut short) when it is not one.
Result<std::vector<uint64_t>> ParseHeldSteps(std::string_view text, const std::string& part);

// The newest step every one of `parts` published for job `job` below
// `below` (every step by default); 0 when a part published nothing (or no
// such step is common). Does not wait.
Result<uint64_t> NewestCommonStep(Store& store, uint64_t job, const std::vector<std::string>& parts,
                                  uint64_t below = UINT64_MAX);

// The parts a job's checkpoint step needs: every shard, and every worker
// when the workers hold training state (RunSpec::sync.worker_state).
std::vector<std::string> CheckpointParts(uint32_t shards, uint32_t workers_with_state);

// Whether a process that is neither resuming nor rejoining job `job` may
// start afresh over the checkpoints `part` holds in its folder: yes when the
// coordinator knows them, because it served an earlier job (job >= 2: the
// files are that job's, which the next one replaces, as long-running shards
// always did) or its store lists the part's steps for this job (the files
// are this job's: the process restarted before a step every part holds; the
// coordinator refuses its registration and a later retry rejoins). No when
// it knows neither: it started after them (it lost its state file,
// server/coordinator_state.h, or was started with --fresh, and forgot the run
// they belong to), and a fresh start would delete that run's checkpoints.
Result<bool> CoordinatorKnowsCheckpoints(Store& store, uint64_t job, const std::string& part);

// What a process starting job `job` afresh runs: OK when `part` holds no
// checkpoint in `dir` or the coordinator knows them; else CheckFreshStart's
// refusal (common/checkpoint_files.h; `job_parts`: CheckpointParts of the
// job), prefixed with who refuses. One window is not covered: a part killed
// between writing its first checkpoint of job 1 and publishing it holds
// files the coordinator does not know, and is refused like a stranger's.
Status CheckFreshStartAgainst(Store& store, uint64_t job, const std::string& dir,
                              const std::string& part, const std::vector<std::string>& job_parts,
                              uint64_t run_steps = 0);

// A part's files of step `step` failed their checks (Corruption) as its
// process came to rejoin job `job`, or to roll back: they are set aside
// (SetPartAside) and the part's published steps lose `step`, so that no
// process rejoins the job there (two restarted at once chose different
// steps, and the coordinator accepted the damaged one).
Status SetAsideDamagedPart(Store& store, uint64_t job, const std::string& dir, uint64_t step,
                           const std::string& part);

// The step a process restarted during job `job` rejoins it from: the newest
// step every part holds, which its own part (`own_part`, unless empty: a
// process with nothing on disk) must hold in `dir`; 0 when there is none.
// NotFound, naming the folder and what it holds, when only the own files
// are missing.
// `below`: a step under which to look, when the own files of a newer one
// did not load (a corrupted .bin): the job then goes back further, to a step
// every part still holds (each keeps its two newest).
Result<uint64_t> RejoinStep(Store& store, uint64_t job, const std::vector<std::string>& parts,
                            const std::string& dir, const std::string& own_part,
                            uint64_t below = UINT64_MAX);

}  // namespace gridsync
