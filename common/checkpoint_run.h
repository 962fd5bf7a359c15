// Which run a job's checkpoint files belong to. Every part of a step is
// written by a different process (each shard, and each worker with state of
// its own), so nothing in one part's files ties it to the others': a step
// folder holding shard-0 of one run and shard-1 of another (copied in, or
// left by a run that shared the folder) resumed without a word, and the
// model went on from parameters no run ever had together (a hostile probe).
//
// Each manifest therefore names its run (WriteCheckpointPart's `run`, 32 hex
// digits). A job started afresh takes the run its first part
// (CheckpointParts' first: shard 0 under ps and hybrid) makes and publishes
// in the coordinator's store ("checkpoint-run/job-<job>"); every other part
// reads it there before its first checkpoint. A job resumed from a step
// (gridsync launch --resume) keeps the run of its files, once every part has
// published the run its files of that step name and they all agree; a part
// that rejoins a running job checks its files against the job's published
// run. Manifests written before runs were named carry none (""), which
// agrees only with another "".
//
// Thread safety: free functions; the Store is safe for concurrent use.
#pragma once

#include <chrono>
#include <cstdint>
#include <string>
#include <vector>

#include "common/status.h"
#include "common/store.h"

namespace gridsync {

// 32 lowercase hex digits from the system's random source.
std::string NewRunId();

// How long a part waits, at its first checkpoint of a fresh job, for the
// run shard 0 published when the job started.
inline constexpr std::chrono::milliseconds kRunWait{2000};

// `run` as messages show it: "none (an older gridsync)" for "", a value
// that is no run identity cut short.
std::string DescribeRun(const std::string& run);

// The store key of job `job`'s run (the coordinator keeps it with the job:
// server/coordinator_state.h).
std::string RunKey(uint64_t job);

// Whether `run` is one a manifest may carry: "" or up to 64 lowercase hex
// digits.
bool IsRunId(const std::string& run);

// Parts of one step and the runs their files name (runs[i]: parts[i]'s):
// empty when all are one run's; else the parts apart from the most common
// run (the first part's on a tie), "shard-1 (run ...), ...", with *common
// set to the parts of that run and *common_run to it (shown).
std::string RunsApart(const std::vector<std::string>& parts, const std::vector<std::string>& runs,
                      std::string* common, std::string* common_run);

// The run part `part` writes into job `job`'s checkpoints when the job
// started afresh: the first of `job_parts` makes it (and publishes it); the
// others wait up to `timeout` for it, and the error names the part that has
// not published one.
Result<std::string> FreshRun(Store& store, uint64_t job, const std::vector<std::string>& job_parts,
                             const std::string& part, std::chrono::milliseconds timeout);

// The first of a job's parts publishes its run as the job's (after a resume,
// and again with every publish, so that a restarted coordinator learns it).
Status PublishRun(Store& store, uint64_t job, const std::string& run);

// A job resumed from `step`: publishes the run `part`'s files of that step
// name (`run`), waits up to `timeout` for every other part's, and refuses
// (InvalidArgument naming the parts, both runs and the folder) when any
// part's files belong to another run than the first part's.
Status AgreeOnResumedRun(Store& store, uint64_t job, uint64_t step,
                         const std::vector<std::string>& job_parts, const std::string& part,
                         const std::string& run, const std::string& dir,
                         std::chrono::milliseconds timeout);

// A part that rejoined running job `job` from its files of `step` (run
// `run`): InvalidArgument when the job's published run differs; OK when the
// store holds none (a restarted coordinator forgot it until the first part
// publishes again).
Status CheckRejoinedRun(Store& store, uint64_t job, uint64_t step, const std::string& part,
                        const std::string& run, const std::string& dir);

}  // namespace gridsync
