// Training with gradient_sync "ps": this worker takes its slice of every
// global batch, pulls the parameter rows the slice reads (known from the
// lookup before the forward pass), computes gradients and pushes the touched
// rows to the PS shards, which run Adam. Under bsp and async the pull for
// step s+1 is sent right after the push of step s (the shards aggregate
// while this worker prepares the next batch); under ssp it is sent before
// step s is computed, so the transfer overlaps the whole compute.
//
// With bsp and no compression the parameters equal those of one process
// training with gradient_accumulation = world_size on the same global
// batches, bit for bit: worker w's slice is micro-batch w, and the shards sum
// the pushes in worker-rank order, as the local trainer sums micro-batches.
//
// Thread safety: reentrant; one call per worker.
#pragma once

#include <string>

#include "common/config.h"
#include "common/status.h"
#include "worker/image_task.h"
#include "common/coordinator_client.h"
#include "common/sharding.h"
#include "worker/model.h"
#include "worker/ps_client.h"
#include "worker/trainer.h"

namespace gridsync {

struct PsWorkerOptions {
  int rank = -1;              // -1: the coordinator assigns one
  std::string node = "localhost";
  uint32_t local_rank = 0;
  TrainOptions train;
  // Rank 0: after the last step, pull every parameter and write them (raw
  // float32, tables in order) to this file; empty: do not.
  std::string dump_params;
  // Resuming (gridsync launch --resume): the shards loaded the checkpoint of
  // this step; training continues from it and the shards are not
  // initialised again.
  uint64_t start_step = 0;
  // Test seam: sleep this long in every step, to make a slow worker.
  int throttle_ms = 0;
};

Result<TrainReport> TrainImagePs(const Config& config, const ImageTask& image,
                                 const PsWorkerOptions& options);

// A worker's membership of a PS cluster: registered with the coordinator
// (its model's tables checked), the complete cluster map, the partition and
// a connected PS client; rank 0 has initialised the shards with the model's
// seeded values and every worker has passed the "init" barrier.
struct PsSession {
  std::unique_ptr<CoordinatorClient> coordinator;
  uint32_t rank = 0;
  std::string me;  // "worker-3"
  ClusterMap map;
  std::unique_ptr<Partition> partition;  // the client refers to it
  std::unique_ptr<PsClient> ps;
};
// The parameter version a worker about to compute `step` must read:
// bsp: step (every push of the steps before); ssp: step - staleness;
// async: 0 (whatever is there).
uint64_t MinVersionFor(const PsConfig& ps, uint64_t step);

// The version holding every push of a finished run: its steps, plus the
// flush of error feedback's residuals when there was one; 0 under async.
uint64_t FinalVersion(const PsConfig& ps, const TrainReport& report);

// Pulls every row of every table into the model (the final parameters, once
// the shards reached `min_version`).
Status PullAllParams(PsClient& ps, HashGridModel& model, uint64_t min_version);

Result<PsSession> JoinPsCluster(const Config& config, HashGridModel& model, const PsWorkerOptions& options);

// Writes / reads a model's parameters as raw float32, tables in ModelTables order.
Status WriteParams(const std::string& path, const HashGridModel& model);
Result<std::vector<float>> ReadParams(const std::string& path);
std::vector<float> FlattenParams(const HashGridModel& model);

}  // namespace gridsync
