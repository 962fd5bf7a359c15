// What a training run is asked to do beyond the config (TrainOptions,
// WorkerOptions) and what it reports (TrainReport): shared by every sync
// mode, so a field means the same thing in each.
//
// Thread safety: plain values.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "common/status.h"
#include "worker/collective/factory.h"
#include "worker/sync/step_observer.h"

namespace gridsync {

class Collective;
class HashGridModel;
struct RunSpec;
namespace cuda {
class DeviceTrainer;
}

struct TrainOptions {
  std::vector<uint64_t> eval_steps;  // also evaluate PSNR after these steps (not timed)
  // Also evaluate PSNR every this many steps (not timed; 0: never), for the
  // PSNR-against-time curve (TrainReport::psnr_curve).
  uint64_t eval_every = 0;
  bool write_png = true;  // task.output/reconstruction.png
  bool quiet = false;     // no progress log lines
  // Periodic step lines (training.log_every); off while a progress line is
  // drawn on the terminal instead.
  bool step_lines = true;
  // Told about every step (metrics, timeline, progress line); not owned.
  std::vector<StepObserver*> observers;
  // TrainReport::steady_*: the training time after this process's first
  // this many steps, whose first touches of the model's and the optimizer's
  // memory (and a device's lazy loading) a long run pays once (0: the
  // whole run).
  uint64_t timing_warmup_steps = 0;
};

// A worker process's place in a cluster and its run-time options. Standalone
// runs read only `train` and `dump_params`.
struct WorkerOptions {
  TrainOptions train;
  int rank = -1;  // -1: the coordinator assigns one
  std::string node = "localhost";
  uint32_t local_rank = 0;
  // Where this rank's collectives listen (Gloo) and which device it drives
  // (NCCL): set from the cluster layout by the worker binary.
  CollectiveEndpoint endpoint;
  // The worker that holds the final model (rank 0, or a standalone run)
  // writes its parameters (raw float32, tables in ModelTables order) here.
  std::string dump_params;
  // Resuming (gridsync launch --resume): the shards loaded the checkpoint of
  // this step; training continues from it and the shards are not
  // initialised again (ps only).
  uint64_t start_step = 0;
  // Where this worker serves its metrics (host:port; empty: nowhere): put
  // in the coordinator's store as "metrics/worker/<rank>" once registered.
  std::string metrics_address;
  // Test seam: sleep this long in every step, to make a slow worker.
  int throttle_ms = 0;
  // Test seam (hybrid): the intra-node group of this worker, given its
  // rank; the default builds one with the configured backend through the
  // coordinator's KV store.
  std::function<Result<Collective*>(int node, int local_rank, int node_size)> intra_group;
  // Test seam: the trainer this worker's model trains on, as if on a GPU
  // (tests pass the CPU twin, worker/host_trainer.h); unset: decided by
  // training.device.
  std::function<Result<std::unique_ptr<cuda::DeviceTrainer>>(const RunSpec&, const HashGridModel&)>
      make_trainer;
};

struct TrainReport {
  uint64_t steps = 0;        // run by this process (training.steps - start_step)
  uint64_t samples = 0;      // global samples over those steps (steps x batch_size), every mode
  uint64_t my_samples = 0;   // of which this worker computed
  double train_seconds = 0;  // the loop: sampling, compute, synchronisation (not evaluations)
  double samples_per_second = 0;  // global: samples / train_seconds
  // The same after TrainOptions::timing_warmup_steps (evaluations excluded
  // too): the steps timed, their seconds and global samples per second (0
  // when no step is left after them).
  uint64_t steady_steps = 0;
  double steady_seconds = 0;
  double steady_samples_per_second = 0;
  double final_loss = 0;  // mean squared error of this worker's share of the last step
  double psnr = 0;        // over the full image after the last step (the worker holding the model)
  std::map<uint64_t, double> psnr_at;  // step -> PSNR for TrainOptions::eval_steps/eval_every
  // The same evaluations with the training time they took to reach (the
  // loop's wall time so far, evaluations excluded).
  struct PsnrPoint {
    uint64_t step = 0;
    double seconds = 0;
    double psnr = 0;
  };
  std::vector<PsnrPoint> psnr_curve;
  uint64_t skipped_steps = 0;  // mixed precision: steps skipped for an overflow
  uint64_t rollbacks = 0;      // times the job went back to a checkpoint (a shard rejoined)
  float final_loss_scale = 1.0f;
  uint64_t n_params = 0;
  double grid_rows_per_step = 0;  // mean grid rows this worker's gradient touched per step
  std::string png_path;
  std::shared_ptr<HashGridModel> model;  // the trained model (final on rank 0)

  uint32_t rank = 0;
  double bytes_pushed_per_step = 0;  // ps/hybrid: pushed; nccl: all-reduced
  double bytes_pulled_per_step = 0;
  double comm_seconds = 0;  // blocked in synchronisation
  // ps/hybrid, for benchmarks: of comm_seconds, worker Adam and the codecs
  // with their error feedback.
  double worker_adam_seconds = 0;
  double codec_seconds = 0;
  // ps/hybrid: how stale the parameters a step read were, from the versions
  // the shards reported: bsp 0; ssp the steps of pushes they lacked; async
  // the other workers' pushes applied between the read and this step's push.
  uint64_t max_staleness = 0;
  double mean_staleness = 0;
  // ps/hybrid: one more push after the last step delivered what error
  // feedback still held (PsClient::FlushResiduals); the shards applied steps + 1.
  bool flushed_residuals = false;
  // Checkpoints this worker was to write (its own state: every worker under
  // nccl, ps/hybrid workers with Adam or error feedback) and could not: the
  // run trained, but the worker exits kCheckpointsNotWrittenExitCode.
  uint64_t checkpoint_failures = 0;
  std::vector<uint64_t> split_counts;  // samples per worker in the last step
  // Where the model trained: "CPU", or the device ("NVIDIA H200 (device 0)").
  std::string device = "CPU";
  // On a GPU: the bytes the encoding and Adam kernels moved (a lower bound),
  // the seconds they took, and the device's peak bandwidth
  // (DeviceTrainer::Traffic).
  double kernel_bytes = 0;
  double kernel_seconds = 0;
  double kernel_peak_bytes_per_second = 0;
  // kernel_seconds by stage (DeviceTrainer::Traffic).
  double kernel_forward_seconds = 0;
  double kernel_grid_backward_seconds = 0;
  double kernel_grid_adam_seconds = 0;
};

}  // namespace gridsync
