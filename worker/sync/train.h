// The entry points of training: each builds the model and the GradientSync
// of its mode and runs the one TrainLoop (train_loop.h).
//
//   TrainImage           standalone: one process, the whole batch, local Adam
//   TrainWorker          one worker of a cluster, in the config's
//                        gradient_sync mode (nccl, ps or hybrid); it joins
//                        through the coordinator at distributed.master_addr
//   TrainImageAllReduce  nccl mode over groups the caller built (in-process
//                        tests with LocalCollective)
//
// Each takes the run's RunSpec (spec/run_spec.h), resolved once by the
// caller; the Config overloads, for tests and benchmarks, resolve it and
// call the RunSpec ones.
//
// Thread safety: reentrant; one call per worker.
#pragma once

#include "common/status.h"
#include "spec/run_spec.h"
#include "worker/image_task.h"
#include "worker/sync/allreduce_sync.h"
#include "worker/sync/train_report.h"

namespace gridsync {

Result<TrainReport> TrainImage(const RunSpec& spec, const ImageTask& image,
                               const TrainOptions& options = {},
                               const std::string& dump_params = "");
Result<TrainReport> TrainImage(const Config& config, const ImageTask& image,
                               const TrainOptions& options = {},
                               const std::string& dump_params = "");

Result<TrainReport> TrainWorker(const RunSpec& spec, const ImageTask& image,
                                const WorkerOptions& options);
Result<TrainReport> TrainWorker(const Config& config, const ImageTask& image,
                                const WorkerOptions& options);

Result<TrainReport> TrainImageAllReduce(const Config& config, const ImageTask& image, int rank,
                                        const AllReduceGroups& groups,
                                        const WorkerOptions& options);

}  // namespace gridsync
