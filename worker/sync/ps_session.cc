#include "worker/sync/ps_session.h"

#include <spdlog/spdlog.h>
#include <unistd.h>

#include <algorithm>
#include <charconv>
#include <cmath>
#include <thread>

#include "common/checkpoint_registry.h"
#include "common/checkpoint_run.h"
#include "common/counter_rng.h"
#include "spec/cluster_settings.h"
#include "worker/sync/peer_watch.h"
#include "worker/worker_checkpoint.h"

namespace gridsync {
namespace {

// Every table of the model, whole: what rank 0 initialises the shards with
// and the final pull fetches.
template <typename Ref>
std::vector<Ref> WholeModel(HashGridModel& model) {
  const auto& layout = model.layout();
  const uint32_t levels = layout.n_levels();
  std::vector<Ref> all;
  for (uint32_t l = 0; l < levels; ++l) {
    all.push_back({l, true, nullptr, 0,
                   model.grid_params().data() + layout.level(l).row_offset * layout.features()});
  }
  for (size_t i = 0; i < model.mlp_weights().size(); ++i) {
    all.push_back(
        {levels + static_cast<uint32_t>(i), true, nullptr, 0, model.mlp_weights()[i].data()});
  }
  return all;
}

}  // namespace

bool SplitSurvivesRollback(const DistributedConfig& d) {
  if (d.batch_splitting == BatchSplitting::kAdaptive) return false;
  return d.batch_splitting != BatchSplitting::kWeighted || !d.nodes.empty();
}

uint64_t MinVersionFor(const PsConfig& ps, uint64_t step) {
  switch (ps.consistency) {
    case Consistency::kBsp:
      return step;
    case Consistency::kSsp:
      return step > static_cast<uint64_t>(ps.staleness) ? step - static_cast<uint64_t>(ps.staleness)
                                                        : 0;
    case Consistency::kAsync:
      return 0;
  }
  return step;
}

Status PullAllParams(PsClient& ps, HashGridModel& model, uint64_t min_version, bool evaluation) {
  GRIDSYNC_RETURN_IF_ERROR(ps.SendPull(min_version, WholeModel<TablePullRef>(model), /*whole=*/true,
                                       /*for_step=*/0, evaluation));
  GRIDSYNC_RETURN_IF_ERROR(ps.ReceivePull().status().WithContext(
      evaluation ? "pulling the parameters for an evaluation" : "pulling the final parameters"));
  model.RefreshWorkingCopyAll();
  return Status::OK();
}

Result<PsSession> JoinPsCluster(const RunSpec& spec, const ImageTask& image, HashGridModel& model,
                                const WorkerOptions& options) {
  const Config& config = spec.config;
  const auto& d = config.distributed;
  const auto timeout = spec.sync.timeout;
  const auto& tables = spec.model.tables;
  const uint32_t workers = static_cast<uint32_t>(d.world_size);
  PsSession session;
  GRIDSYNC_ASSIGN_OR_RETURN(const wire::ControlAuth control_auth,
                            wire::ControlAuthFor(config, "worker"));
  GRIDSYNC_ASSIGN_OR_RETURN(session.checkpoint_key, wire::CheckpointMacKeyFor(config, "worker"));
  GRIDSYNC_ASSIGN_OR_RETURN(
      session.coordinator,
      CoordinatorClient::Connect(d.master_addr, static_cast<uint16_t>(d.master_port), timeout,
                                 control_auth, Role::kWorker));
  RegisterInfo info;
  info.role = Role::kWorker;
  info.requested_rank = options.rank;
  info.node = options.node;
  info.local_rank = options.local_rank;
  info.pid = static_cast<uint32_t>(getpid());
  info.tables = tables;
  info.shared_settings = SharedSettings(spec);
  info.job_settings = JobSettings(spec, image.Digest());
  if (options.rank >= 0) {
    info.node = d.ResolvedNodes()[static_cast<size_t>(d.NodeOf(options.rank))].name;
    info.local_rank = static_cast<uint32_t>(d.LocalRankOf(options.rank));
  }
  // Restarted during training (the launcher's --max-restarts, a unit's
  // Restart=): rejoin from the job's newest complete checkpoint.
  if (options.start_step == 0 && config.checkpoint.every_steps > 0 && SplitSurvivesRollback(d)) {
    GRIDSYNC_ASSIGN_OR_RETURN(
        const ClusterMap now,
        session.coordinator->GetMap(/*wait_complete=*/false, std::chrono::milliseconds(0)));
    CoordinatorStore registry(session.coordinator.get());
    const auto parts = CheckpointParts(static_cast<uint32_t>(config.ps.shards),
                                       spec.sync.worker_state ? workers : 0);
    const std::string own = spec.sync.worker_state && options.rank >= 0
                                ? "worker-" + std::to_string(options.rank)
                                : std::string();
    GRIDSYNC_ASSIGN_OR_RETURN(info.rejoin_step,
                              RejoinStep(registry, now.job, parts, config.checkpoint.dir, own));
    // Its own files of that step may not load (a corrupted .bin: every
    // restart would fail the same way): it rejoins from an older step every
    // part still holds, and the job goes back there (as a shard does).
    while (!own.empty() && info.rejoin_step > 0) {
      const Status loads = CheckWorkerCheckpoint(spec, static_cast<uint32_t>(options.rank),
                                                 static_cast<uint32_t>(config.ps.shards),
                                                 info.rejoin_step, session.key());
      if (loads.code() != StatusCode::kCorruption) break;
      // Set aside and no longer published, so that no other process
      // rejoins the job at this step meanwhile.
      GRIDSYNC_RETURN_IF_ERROR(
          SetAsideDamagedPart(registry, now.job, config.checkpoint.dir, info.rejoin_step, own)
              .WithContext(loads.ToString() + "; setting its files aside"));
      auto older =
          RejoinStep(registry, now.job, parts, config.checkpoint.dir, own, info.rejoin_step);
      if (!older.ok() || *older == 0) {
        return Status::Corruption(
            loads.message() +
            "; its files are set aside (*.damaged), and no older step to rejoin from: " +
            (older.ok() ? std::string("every part holds none") : older.status().ToString()));
      }
      spdlog::warn(
          "worker-{}: {}; its files are set aside (*.damaged); rejoining from the older "
          "checkpoint of step {} instead",
          options.rank, loads.ToString(), *older);
      info.rejoin_step = *older;
    }
    session.rejoined_at = info.rejoin_step;
  }
  GRIDSYNC_ASSIGN_OR_RETURN(
      auto registration, session.rejoined_at > 0 ? session.coordinator->RegisterAgain(info, timeout)
                                                 : session.coordinator->Register(info, timeout));
  session.rank = registration.rank;
  session.me = "worker-" + std::to_string(session.rank);
  // Starting afresh (whatever the split, whoever chose the rank): its first
  // checkpoint must not delete the files of a run the coordinator does not
  // know (common/checkpoint_registry.h).
  if (spec.sync.worker_state && config.checkpoint.every_steps > 0 && options.start_step == 0 &&
      session.rejoined_at == 0) {
    CoordinatorStore registry(session.coordinator.get());
    const Status fresh =
        CheckFreshStartAgainst(registry, registration.map.job, config.checkpoint.dir, session.me,
                               CheckpointParts(static_cast<uint32_t>(config.ps.shards), workers),
                               static_cast<uint64_t>(config.training.steps));
    if (fresh.code() == StatusCode::kCheckpointsHeld) {
      ReportCannotJoin(*session.coordinator, Role::kWorker, session.rank, fresh);
    }
    GRIDSYNC_RETURN_IF_ERROR(fresh);
  }
  if (!options.metrics_address.empty()) {
    GRIDSYNC_RETURN_IF_ERROR(session.coordinator->Set(
        "metrics/worker/" + std::to_string(session.rank), options.metrics_address));
  }
  GRIDSYNC_ASSIGN_OR_RETURN(session.map,
                            session.coordinator->GetMap(/*wait_complete=*/true, timeout));
  GRIDSYNC_ASSIGN_OR_RETURN(
      Partition partition,
      Partition::Make(session.map.tables, static_cast<uint32_t>(session.map.shards.size()),
                      spec.sync.partition_dim));
  session.partition = std::make_unique<Partition>(std::move(partition));
  GRIDSYNC_ASSIGN_OR_RETURN(const wire::CurveSettings curve,
                            wire::CurveSettingsFor(config, "worker"));
  GRIDSYNC_ASSIGN_OR_RETURN(
      session.ps, PsClient::Connect(session.map, *session.partition, session.rank, workers, timeout,
                                    wire::Limits{}, curve));
  const CompressionSpec& compression = spec.compression;
  session.ps->SetCompression(compression.codec, compression.error_feedback, compression.min_bytes,
                             Mix64(config.training.seed) ^ (uint64_t{session.rank} << 48));
  session.ps->SetDeltaPulls(compression.delta_pulls);
  if (spec.sync.optimizer_on_workers) session.ps->SetWorkerOptimizer(spec.model.adam);
  if (spec.sync.worker_state && config.checkpoint.every_steps > 0) {
    session.ledger = std::make_unique<CheckpointLedger>(config.checkpoint.dir,
                                                        "worker-" + std::to_string(session.rank));
    session.ledger->SetJobParts(CheckpointParts(static_cast<uint32_t>(config.ps.shards), workers));
  }
  // A rejoin goes where the job's epoch went (another process may have
  // rejoined from another step a moment before).
  if (session.rejoined_at > 0) session.rejoined_at = session.map.resume_step;
  const uint64_t start = session.rejoined_at > 0 ? session.rejoined_at : options.start_step;
  if (start > 0 && spec.sync.worker_state) {
    // Resuming or rejoining: the residuals and Adam's state of the
    // checkpoint's step.
    std::string run;
    GRIDSYNC_RETURN_IF_ERROR(
        LoadWorkerCheckpoint(spec, session.rank, static_cast<uint32_t>(session.map.shards.size()),
                             start, session.ps.get(), &run, session.key())
            .WithContext(session.me + " resuming at step " + std::to_string(start)));
    if (session.ledger) {
      // Its files and the other parts' must be one run's (common/checkpoint_run.h).
      CoordinatorStore registry(session.coordinator.get());
      const CheckpointLedger& ledger = *session.ledger;
      GRIDSYNC_RETURN_IF_ERROR(session.rejoined_at > 0
                                   ? CheckRejoinedRun(registry, session.map.job, start,
                                                      ledger.part(), run, config.checkpoint.dir)
                                   : AgreeOnResumedRun(registry, session.map.job, start,
                                                       ledger.job_parts(), ledger.part(), run,
                                                       config.checkpoint.dir, timeout));
      session.ledger->SetRun(std::move(run));
      session.ledger->RolledBack(start);
      GRIDSYNC_RETURN_IF_ERROR(session.ledger->Publish(registry, session.map.job));
    }
  }
  if (session.rejoined_at > 0) {
    // The others passed 'init' long ago; the job rolls back to this step.
    spdlog::warn("{}: rejoined job {} from the checkpoint of step {} (epoch {})", session.me,
                 session.map.job, session.rejoined_at, session.map.epoch);
    session.ps->ResetCounters();
    return session;
  }
  if (!options.train.quiet) {
    spdlog::info("{}: cluster of {} shards and {} workers (map generation {}), {} tables",
                 session.me, session.map.shards.size(), session.map.workers.size(),
                 session.map.generation, tables.size());
  }
  if (session.rank == 0 && options.start_step == 0) {
    // Every worker initialises the same model from the seed; rank 0 gives
    // the shards those values, so all start from the single-process state.
    GRIDSYNC_RETURN_IF_ERROR(session.ps->Push(wire::Kind::kInit, 0, WholeModel<TableRowsRef>(model))
                                 .WithContext("initialising the shards"));
  }
  GRIDSYNC_RETURN_IF_ERROR(session.coordinator->Barrier("init", workers, session.me, timeout));
  // Per-step figures should not carry rank 0's one-off initial push.
  session.ps->ResetCounters();
  return session;
}

Status FinishPsRun(const RunSpec& spec, PsSession& session, HashGridModel& model, uint64_t end_step,
                   TrainReport* report) {
  const Config& config = spec.config;
  GRIDSYNC_ASSIGN_OR_RETURN(
      report->flushed_residuals,
      session.ps->FlushResiduals(end_step, MinVersionFor(config.ps, end_step)));
  // Every push of every worker is acknowledged before anyone reads the
  // final parameters; a shard serves a read only after applying what it
  // acknowledged before it (bsp/ssp also wait for the version asked).
  GRIDSYNC_RETURN_IF_ERROR(session.coordinator->Barrier(
      "done", static_cast<uint32_t>(config.distributed.world_size), session.me, spec.sync.timeout));
  if (session.rank != 0) return Status::OK();
  // The version holding every push: its steps plus the flush, when there
  // was one; whatever is there under async (all acknowledged by now).
  const uint64_t final_version = config.ps.consistency == Consistency::kAsync
                                     ? 0
                                     : end_step + (report->flushed_residuals ? 1 : 0);
  return PullAllParams(*session.ps, model, final_version);
}

Result<std::vector<double>> GatherRatesByKv(const RunSpec& spec, PsSession& session, uint64_t done,
                                            double mine) {
  const std::string prefix = "rates/" + std::to_string(done) + "/";
  GRIDSYNC_RETURN_IF_ERROR(session.coordinator->Set(prefix + std::to_string(session.rank),
                                                    fmt::format("{:.17g}", mine)));
  std::vector<std::string> keys;
  for (int r = 0; r < spec.config.distributed.world_size; ++r)
    keys.push_back(prefix + std::to_string(r));
  GRIDSYNC_ASSIGN_OR_RETURN(auto values, session.coordinator->Get(keys, spec.sync.timeout));
  std::vector<double> rates;
  for (size_t i = 0; i < values.size(); ++i) {
    double v = 0;
    const auto& s = values[i];
    const auto [end, ec] = std::from_chars(s.data(), s.data() + s.size(), v);
    if (ec != std::errc() || end != s.data() + s.size() || !(v >= 0) || !std::isfinite(v)) {
      return Status::Corruption("adaptive split: worker " + std::to_string(i) +
                                "'s rate is not a number: '" + s + "'");
    }
    rates.push_back(v);
  }
  return rates;
}

PsSessionSync::PsSessionSync(const RunSpec& spec, HashGridModel* model, PsSession session)
    : spec_(spec), config_(spec.config), model_(model), session_(std::move(session)) {
  rank_ = session_.rank;
  me_ = session_.me;
  {
    // A silent shard still listed by the coordinator, in the same epoch, is
    // alive behind a stalled network: the wait goes on once more
    // (PsClient::SetStallCheck).
    CoordinatorClient* coordinator = session_.coordinator.get();
    const PsClient* ps = session_.ps.get();
    session_.ps->SetStallCheck([coordinator, ps](uint32_t shard) {
      auto map = coordinator->GetMap(/*wait_complete=*/false, std::chrono::milliseconds(0));
      if (!map.ok() || map->epoch != ps->epoch()) return false;
      return std::any_of(map->shards.begin(), map->shards.end(),
                         [shard](const MemberInfo& m) { return m.rank == shard; });
    });
  }
  if (config_.checkpoint.every_steps > 0) {
    // A shard that died never answers what it was asked: a wait notices the
    // job rolling back (the shard restarted and rejoined) within a second.
    CoordinatorClient* coordinator = session_.coordinator.get();
    const PsClient* ps = session_.ps.get();
    session_.ps->SetWaitCheck([coordinator, ps]() -> Status {
      auto state = coordinator->CurrentJob();
      if (!state.ok() || state->epoch == ps->epoch()) return Status::OK();
      return Status::IOError("the job rolled back to step " + std::to_string(state->resume_step) +
                             " (epoch " + std::to_string(state->epoch) + ") during the wait");
    });
  }
}

Status PsSessionSync::CheckpointIfDue(uint64_t step) {
  const uint64_t every = static_cast<uint64_t>(config_.checkpoint.every_steps);
  if (!spec_.sync.worker_state || every == 0 || (step + 1) % every != 0) return Status::OK();
  // What the coordinator last acknowledged stays on disk (WriteCheckpointPart),
  // and the newest step every part holds now (RefreshCommon).
  if (session_.ledger) {
    CoordinatorStore registry(session_.coordinator.get());
    session_.ledger->RefreshCommon(registry, session_.map.job);
  }
  const std::vector<uint64_t> keep =
      session_.ledger ? session_.ledger->MustKeep() : std::vector<uint64_t>{};
  // A failed write is logged and training goes on, as on the shards: the
  // previous complete step stays (MustKeep), and a full disk never stops a run.
  Result<std::string> run = std::string();
  if (session_.ledger) {
    CoordinatorStore registry(session_.coordinator.get());
    run = session_.ledger->RunForWriting(&registry, session_.map.job,
                                         std::min(spec_.sync.timeout, kRunWait));
  }
  const Status written =
      run.ok()
          ? WriteWorkerCheckpoint(spec_, rank_, static_cast<uint32_t>(session_.map.shards.size()),
                                  step + 1, session_.ps.get(), keep, *run, session_.key())
          : run.status();
  if (!written.ok()) {
    spdlog::error("{}: checkpoint at step {} not written: {}", me_, step + 1, written.ToString());
    ++checkpoint_failures_;
    return Status::OK();
  }
  if (session_.ledger) session_.ledger->Wrote(step + 1);
  PublishCheckpoints();
  spdlog::info("{}: checkpoint at step {} written", me_, step + 1);
  return Status::OK();
}

Status PsSessionSync::Finish(uint64_t end_step, TrainReport* report) {
  return FinishPsRun(spec_, session_, *model_, end_step, report);
}

Result<std::vector<double>> PsSessionSync::GatherRates(uint64_t done, double mine) {
  return GatherRatesByKv(spec_, session_, done, mine);
}

Result<HashGridModel*> PsSessionSync::Snapshot(uint64_t done) {
  // A model of its own: the training model's rows stay as training left
  // them (with delta pulls and the pending-update view they are not the
  // shards' values, and must not become them). The whole pull overwrites
  // every parameter, so it is made once and never copied.
  if (!eval_model_) {
    GRIDSYNC_ASSIGN_OR_RETURN(eval_model_, HashGridModel::Create(spec_.model));
  }
  // An evaluation's traffic and waiting are not training's: the per-step
  // byte and communication figures leave them out.
  const PsCounters saved = session_.ps->counters();
  Status status = PullAllParams(*session_.ps, *eval_model_, MinVersionFor(config_.ps, done),
                                /*evaluation=*/true);
  session_.ps->RestoreCounters(saved);
  GRIDSYNC_RETURN_IF_ERROR(status);
  return eval_model_.get();
}

Status PsSessionSync::CheckPeers() {
  return CheckClusterPeers(*session_.coordinator, session_.ps->epoch());
}

Result<uint64_t> PsSessionSync::FollowRollback(const Status& failure) {
  if (config_.checkpoint.every_steps <= 0) return failure;
  if (!SplitSurvivesRollback(config_.distributed)) {
    return failure.WithContext(
        "no rollback with distributed.batch_splitting " +
        std::string(ToString(config_.distributed.batch_splitting)) +
        " measured during the run (a restarted worker would split the batch otherwise); allowed "
        "for live rejoin: even, or weighted by distributed.nodes");
  }
  const auto deadline = std::chrono::steady_clock::now() + spec_.sync.timeout;
  const uint32_t mine = session_.ps->epoch();
  ClusterMap map;
  for (;;) {
    auto current =
        session_.coordinator->GetMap(/*wait_complete=*/false, std::chrono::milliseconds(0));
    if (!current.ok()) {
      return Status::Unavailable(failure.message())
          .WithContext("the coordinator does not answer either (" + current.status().message() +
                       ")");
    }
    map = std::move(current).value();
    if (map.job != session_.map.job) {
      return failure.WithContext("the job ended (the coordinator runs job " +
                                 std::to_string(map.job) + ")");
    }
    // A restarted shard or worker rejoins, and the job's epoch moves.
    if (map.epoch > mine && map.complete()) break;
    if (std::chrono::steady_clock::now() >= deadline) {
      return failure.WithContext("no restarted process rejoined the job within " +
                                 std::to_string(spec_.sync.timeout.count() / 1000) + " s");
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  const uint64_t step = map.resume_step;
  spdlog::warn(
      "{}: {}; the job rolled back to step {} (epoch {}): a restarted process rejoined from its "
      "checkpoint, and this worker carries on from there",
      me_, failure.ToString(), step, map.epoch);
  session_.ps->FollowEpoch(map.epoch);
  if (spec_.sync.worker_state) {
    const uint32_t shards = static_cast<uint32_t>(session_.map.shards.size());
    std::string run;
    GRIDSYNC_RETURN_IF_ERROR(
        LoadWorkerCheckpoint(spec_, rank_, shards, step, session_.ps.get(), &run, session_.key())
            .WithContext(me_ + " rolling back to step " + std::to_string(step)));
    if (session_.ledger) {
      GRIDSYNC_RETURN_IF_ERROR(session_.ledger->RolledBackTo(step, std::move(run), "worker")
                                   .WithContext(me_ + " rolling back"));
    }
    PublishCheckpoints();
  }
  return step;
}

void PsSessionSync::PublishCheckpoints() {
  if (!session_.ledger) return;
  CoordinatorStore registry(session_.coordinator.get());
  const Status published = session_.ledger->Publish(registry, session_.map.job);
  if (!published.ok()) {
    spdlog::warn("{}: the checkpoint steps it holds were not published: {}", me_,
                 published.ToString());
  }
}

double PsSessionSync::CommSeconds() const {
  const auto& c = session_.ps->counters();
  return c.push_seconds + c.pull_wait_seconds;
}

SyncTimes PsSessionSync::times() const {
  const auto& c = session_.ps->counters();
  SyncTimes t;
  t.push_seconds = c.push_seconds;
  t.pull_wait_seconds = c.pull_wait_seconds;
  // Hybrid's communication includes its intra-node collective: the rest.
  t.allreduce_seconds = std::max(0.0, CommSeconds() - c.push_seconds - c.pull_wait_seconds);
  t.bytes_sent = static_cast<double>(c.bytes_pushed);
  t.bytes_received = static_cast<double>(c.bytes_pulled);
  return t;
}

void PsSessionSync::FillReport(TrainReport* report) const {
  const auto& c = session_.ps->counters();
  const double steps = static_cast<double>(std::max<uint64_t>(report->steps, 1));
  report->bytes_pushed_per_step = static_cast<double>(c.bytes_pushed) / steps;
  report->bytes_pulled_per_step = static_cast<double>(c.bytes_pulled) / steps;
  report->comm_seconds = CommSeconds();
  report->worker_adam_seconds = c.adam_seconds;
  report->codec_seconds = c.codec_seconds;
  report->checkpoint_failures = checkpoint_failures_;
  report->max_staleness = staleness_max_;
  report->mean_staleness = staleness_samples_ ? static_cast<double>(staleness_sum_) /
                                                    static_cast<double>(staleness_samples_)
                                              : 0.0;
}

}  // namespace gridsync
