// A worker's membership of a PS cluster, shared by gradient_sync "ps"
// (ps_sync.h) and "hybrid" (hybrid_sync.h): joining (registration, the
// complete cluster map, a connected PS client, rank 0 initialising the
// shards), the parameter versions each consistency mode reads, and the end
// of a run (flush, "done" barrier, final pull).
//
// Thread safety: a PsSession is used by one worker thread.
#pragma once

#include <memory>
#include <optional>
#include <string>

#include "common/checkpoint_mac_key.h"
#include "common/checkpoint_registry.h"
#include "common/cluster_map.h"
#include "common/coordinator_client.h"
#include "common/sharding.h"
#include "common/status.h"
#include "spec/run_spec.h"
#include "worker/model.h"
#include "worker/ps_client.h"
#include "worker/sync/gradient_sync.h"
#include "worker/sync/train_report.h"

namespace gridsync {

struct PsSession {
  std::unique_ptr<CoordinatorClient> coordinator;
  uint32_t rank = 0;
  std::string me;  // "worker-3"
  ClusterMap map;
  std::unique_ptr<Partition> partition;  // the client refers to it
  std::unique_ptr<PsClient> ps;
  // > 0: this worker was restarted during training and rejoined the job
  // from the checkpoint of this step, where its training goes on.
  uint64_t rejoined_at = 0;
  // With state of its own (RunSpec::sync.worker_state) and checkpoints on:
  // the steps of this job it wrote, which it publishes for rejoins.
  std::unique_ptr<CheckpointLedger> ledger;
  // Under CURVE: authenticates its checkpoint files (common/checkpoint_mac_key.h).
  std::optional<CheckpointMacKey> checkpoint_key;
  const CheckpointMacKey* key() const { return KeyOrNull(checkpoint_key); }
};

// Registers with the coordinator (the model's tables and the settings of
// spec/cluster_settings.h, `image` by its pixels, checked), waits for
// the complete cluster map, connects to every shard; rank 0 gives the
// shards the model's seeded values (unless resuming); every worker then
// passes the "init" barrier. A worker restarted while its job trains (with
// checkpoints) rejoins it instead, from the newest complete checkpoint
// (PsSession::rejoined_at), and the job rolls back to that step.
Result<PsSession> JoinPsCluster(const RunSpec& spec, const ImageTask& image, HashGridModel& model,
                                const WorkerOptions& options);

// Whether every worker agrees on the batch split after a rollback or a
// rejoin: not when it was measured during the run (adaptive, or weighted
// without distributed.nodes: a restarted worker would start from another
// split), so those jobs fail rather than roll back.
bool SplitSurvivesRollback(const DistributedConfig& d);

// The parameter version a worker about to compute `step` must read:
// bsp: step (every push of the steps before); ssp: step - staleness;
// async: 0 (whatever is there).
uint64_t MinVersionFor(const PsConfig& ps, uint64_t step);

// Pulls every row of every table into the model (the final parameters, once
// the shards reached `min_version`), whole values, never deltas.
// evaluation: for a mid-run evaluation into a copy of the model (the shards
// leave this worker's replica alone).
Status PullAllParams(PsClient& ps, HashGridModel& model, uint64_t min_version,
                     bool evaluation = false);

// After the last step: delivers what error feedback still holds (one more
// step), waits at the "done" barrier for every worker's last push, and on
// rank 0 pulls the final parameters into the model.
Status FinishPsRun(const RunSpec& spec, PsSession& session, HashGridModel& model, uint64_t end_step,
                   TrainReport* report);

// Adaptive splitting through the coordinator's KV store: every worker's
// rate after step `done`, in rank order.
Result<std::vector<double>> GatherRatesByKv(const RunSpec& spec, PsSession& session, uint64_t done,
                                            double mine);

// What ps and hybrid share as GradientSyncs: the session, the end of the
// run, rates through the KV store, the liveness check, checkpoints of the
// workers' own state and following a rollback, and the report's
// communication and staleness figures.
class PsSessionSync : public GradientSync {
 public:
  Status Finish(uint64_t end_step, TrainReport* report) override;
  Result<std::vector<double>> GatherRates(uint64_t done, double mine) override;
  Status CheckPeers() override;
  // ps: the job rolled back (ps_sync.h); the session's half of it.
  // A whole pull of every table, at the version `done` needs, into a copy
  // of the model (an evaluation pull: training state is left alone).
  Result<HashGridModel*> Snapshot(uint64_t done) override;
  void FillReport(TrainReport* report) const override;
  SyncTimes times() const override;
  PsClient* ps_client() override { return session_.ps.get(); }

 protected:
  PsSessionSync(const RunSpec& spec, HashGridModel* model, PsSession session);
  void RecordStaleness(uint64_t steps) {
    staleness_max_ = std::max(staleness_max_, steps);
    staleness_sum_ += steps;
    ++staleness_samples_;
  }
  // Seconds blocked in synchronisation (the PS client's, or more).
  virtual double CommSeconds() const;

  // After `failure`: waits (up to the timeout) for the job's epoch to move
  // past this worker's, with every shard and worker in the map, and then
  // follows it: the PS client carries the new epoch, and this worker's own
  // state (error feedback, Adam on the worker) is the checkpoint's. Returns
  // the step the job went back to; `failure` when checkpoints are off, a
  // worker or the coordinator is gone, or nobody rejoined in time.
  Result<uint64_t> FollowRollback(const Status& failure);
  // After each checkpoint this worker wrote: the steps of this job it holds,
  // published (session_.ledger).
  void PublishCheckpoints();
  // After the push of `step`: with checkpoints on and the workers holding
  // state of their own, this worker's part of the checkpoint of step + 1
  // when it is due (the shards write theirs once the step is applied).
  Status CheckpointIfDue(uint64_t step);

  const RunSpec& spec_;
  const Config& config_;  // spec_.config
  HashGridModel* model_;
  PsSession session_;
  std::unique_ptr<HashGridModel> eval_model_;  // what Snapshot pulls into

 private:
  uint64_t staleness_sum_ = 0, staleness_max_ = 0, staleness_samples_ = 0;
  uint64_t checkpoint_failures_ = 0;  // writes that failed (TrainReport)
};

}  // namespace gridsync
