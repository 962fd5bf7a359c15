#include "worker/sync/train.h"

#include <spdlog/fmt/fmt.h>
#include <spdlog/spdlog.h>
#include <unistd.h>

#include <algorithm>

#include "common/coordinator_client.h"
#include "common/thread_pool.h"
#include "common/wire/curve.h"
#include "kernels/cuda/device_trainer.h"
#include "spec/cluster_settings.h"
#include "worker/collective/factory.h"
#include "worker/collective/nccl_collective.h"
#include "worker/sync/device_allreduce_sync.h"
#include "worker/sync/device_staged_sync.h"
#include "worker/sync/device_sync.h"
#include "worker/sync/hybrid_sync.h"
#include "worker/sync/local_sync.h"
#include "worker/sync/ps_sync.h"
#include "worker/sync/train_loop.h"

namespace gridsync {
namespace {

Result<std::shared_ptr<HashGridModel>> MakeModel(const RunSpec& spec) {
  GRIDSYNC_ASSIGN_OR_RETURN(std::unique_ptr<HashGridModel> model,
                            HashGridModel::Create(spec.model));
  return std::shared_ptr<HashGridModel>(std::move(model));
}

// The collective backend every rank of an all-reduce job uses, agreed
// through the store: distributed.collective when it names one; for auto,
// NCCL only if every rank has its model on its own GPU (a trainer with
// device buffers, no more workers on its node than devices) and NCCL loads
// there, else Gloo. One rank's vote for Gloo makes it Gloo for all, so
// hosts that differ never mix backends.
// A worker restarted into a running job (`rejoining`) takes the outcome its
// peers agreed at their start rather than voting again: a vote of its own
// could differ (its GPU gone) while they keep the backend they formed.
// The outcome is logged with its reason (`quiet` aside): a user who set
// nccl and reads "gloo" learns why (the workers share a GPU, say).
Result<std::string> AgreeOnCollective(const RunSpec& spec, const cuda::DeviceTrainer* trainer,
                                      int node_workers, int rank, Store* store, bool quiet,
                                      bool rejoining = false) {
  const auto log = [&](const std::string& kind, const std::string& why) {
    if (!quiet) spdlog::info("collective backend {} ({})", kind, why);
    return kind;
  };
  if (spec.sync.collective != "auto") {
    // RunSpec resolves auto to gloo where the model trains on the CPU.
    const bool resolved = spec.config.distributed.collective == CollectiveKind::kAuto;
    return log(spec.sync.collective, resolved ? "distributed.collective auto: training.device cpu"
                                              : "distributed.collective");
  }
  // Under kCollectiveStorePrefix: the coordinator drops the votes with the
  // job's last worker, so the next job votes afresh.
  const std::string votes_prefix = "backend/";
  const std::string agreed_key = votes_prefix + "agreed";
  if (rejoining) {
    // The outcome is gone only when every worker left the job (the
    // coordinator drops the votes with the last one) or the coordinator
    // restarted (its store is not kept): then every worker of the job is
    // starting over here, and they vote again. Waiting for it instead lost
    // the run (a hostile probe: hybrid with collective auto, both workers
    // killed, or the coordinator: "missing keys: 'collective/backend/agreed'"
    // until the restarts ran out).
    auto agreed = store->Get({agreed_key}, std::chrono::milliseconds(0));
    if (agreed.ok()) return log((*agreed)[0], "agreed by the job's workers at their start");
    // Absent: NotFound from the coordinator's store at timeout 0, Timeout
    // from the in-memory one.
    const StatusCode code = agreed.status().code();
    if (code != StatusCode::kNotFound && code != StatusCode::kTimeout) return agreed.status();
  }
  const auto last = cuda::DeviceForLocalRank(node_workers - 1);
  const bool own_gpu = last.ok() && *last == node_workers - 1;  // a device per local rank
  const bool on_device = trainer != nullptr && trainer->gradients_on_device();
  // NCCL is loaded (dlopen) only where it could serve.
  std::string nccl_missing;
  const bool nccl = on_device && own_gpu && NcclAvailable(&nccl_missing);
  // Why this rank voted as it did, for the log line.
  std::string why = "every rank has its model on a GPU of its own";
  if (!on_device) {
    why = "rank " + std::to_string(rank) + "'s gradients are on the CPU";
  } else if (!own_gpu) {
    why = std::to_string(node_workers) + " workers on this node and " +
          (last.ok() ? "fewer GPUs" : "no GPU") + ": NCCL needs a GPU per rank";
  } else if (!nccl) {
    why = "NCCL does not load here: " + nccl_missing;
  }
  GRIDSYNC_RETURN_IF_ERROR(store->Set(votes_prefix + std::to_string(rank), nccl ? "nccl" : "gloo"));
  std::vector<std::string> keys;
  for (int r = 0; r < spec.config.distributed.world_size; ++r)
    keys.push_back(votes_prefix + std::to_string(r));
  auto votes = store->Get(keys, spec.sync.timeout);
  if (!votes.ok() && votes.status().code() == StatusCode::kTimeout) {
    // Name the ranks, not the keys.
    std::string missing;
    for (int r = 0; r < spec.config.distributed.world_size; ++r) {
      if (!store->Get({keys[static_cast<size_t>(r)]}, std::chrono::milliseconds(0)).ok())
        missing += (missing.empty() ? "" : ", ") + std::to_string(r);
    }
    return Status::Timeout("rank " + std::to_string(rank) +
                           ": the vote on the collective backend (distributed.collective auto) "
                           "waited " +
                           fmt::format("{:.1f}", spec.sync.timeout.count() / 1000.0) +
                           " s; no vote from ranks [" + missing + "]");
  }
  if (!votes.ok()) return votes.status();
  std::string kind = "nccl";
  std::string gloo_ranks;
  for (size_t r = 0; r < votes->size(); ++r) {
    if ((*votes)[r] == "nccl") continue;
    kind = "gloo";
    gloo_ranks += (gloo_ranks.empty() ? "" : ", ") + std::to_string(r);
  }
  // The same value from every rank: whoever writes last writes it again.
  GRIDSYNC_RETURN_IF_ERROR(store->Set(agreed_key, kind));
  if (kind == "gloo" && nccl) why = "ranks [" + gloo_ranks + "] voted gloo";
  return log(kind, "distributed.collective auto: " + why);
}

// The nccl mode's sync: on the host, or with the model on a GPU (the
// device path where it serves the configuration, else the host sync with
// its compute staged to the device).
// `trainer`: the model's GPU trainer, or null on the CPU (PickTrainer).
Result<std::unique_ptr<GradientSync>> MakeAllReduceSync(
    const RunSpec& spec, HashGridModel* model, int rank,
    std::unique_ptr<cuda::DeviceTrainer> trainer, const AllReduceGroups& groups,
    CoordinatorClient* coordinator, const BatchSource* source, const SplitSchedule* split,
    ThreadPool* pool, uint64_t start_step) {
  if (trainer && DeviceAllReduceSync::Serves(spec)) {
    // Config::CheckRunnable refuses checkpoints with the model on a GPU.
    if (start_step > 0 || spec.config.checkpoint.every_steps > 0) {
      return Status::Unsupported(
          "checkpoints under gradient_sync nccl with the model on a GPU; allowed: "
          "training.device=cpu");
    }
    return std::unique_ptr<GradientSync>(std::make_unique<DeviceAllReduceSync>(
        spec, model, rank, groups.flat, coordinator, source, split, std::move(trainer)));
  }
  GRIDSYNC_ASSIGN_OR_RETURN(std::unique_ptr<GradientSync> host,
                            AllReduceSync::Create(spec, model, rank, groups, coordinator, source,
                                                  split, pool, start_step));
  if (!trainer) return host;
  GRIDSYNC_ASSIGN_OR_RETURN(auto staged, DeviceStagedSync::Create(spec, model, std::move(host),
                                                                  std::move(trainer), pool));
  return std::unique_ptr<GradientSync>(std::move(staged));
}

// A cluster's all-reduce worker: registers with the coordinator, then
// builds the flat (and, for hierarchical, intra- and inter-node) groups
// through the coordinator's KV store with the configured backend.
Result<TrainReport> TrainAllReduceWorker(const RunSpec& spec, const ImageTask& image,
                                         const WorkerOptions& options) {
  const Config& config = spec.config;
  const auto& d = config.distributed;
  const auto timeout = spec.sync.timeout;
  GRIDSYNC_ASSIGN_OR_RETURN(const wire::ControlAuth control_auth,
                            wire::ControlAuthFor(config, "worker"));
  GRIDSYNC_ASSIGN_OR_RETURN(
      auto coordinator,
      CoordinatorClient::Connect(d.master_addr, static_cast<uint16_t>(d.master_port), timeout,
                                 control_auth, Role::kWorker));
  const auto nodes = d.ResolvedNodes();
  RegisterInfo info;
  info.role = Role::kWorker;
  info.requested_rank = options.rank;
  info.pid = static_cast<uint32_t>(getpid());
  info.tables = spec.model.tables;
  info.shared_settings = SharedSettings(spec);
  info.job_settings = JobSettings(spec, image.Digest());
  info.node = options.node;
  if (options.rank >= 0) {
    info.node = nodes[static_cast<size_t>(d.NodeOf(options.rank))].name;
    info.local_rank = static_cast<uint32_t>(d.LocalRankOf(options.rank));
  }
  GRIDSYNC_ASSIGN_OR_RETURN(auto registration, coordinator->Register(info, timeout));
  const int rank = static_cast<int>(registration.rank);
  if (!options.metrics_address.empty()) {
    GRIDSYNC_RETURN_IF_ERROR(
        coordinator->Set("metrics/worker/" + std::to_string(rank), options.metrics_address));
  }
  GRIDSYNC_RETURN_IF_ERROR(coordinator->GetMap(/*wait_complete=*/true, timeout).status());
  CoordinatorStore store(coordinator.get(), kCollectiveStorePrefix);
  // NCCL drives the device the model trains on: local rank modulo the
  // devices this process sees.
  const int local_rank = d.LocalRankOf(rank);
  CollectiveEndpoint endpoint = options.endpoint;
  if (const auto device = cuda::DeviceForLocalRank(local_rank); device.ok())
    endpoint.cuda_device = *device;
  // Under CURVE, Gloo's messages are sealed under the workers' key
  // (worker/collective/collective_seal.h): Gloo's TCP pairs neither encrypt
  // nor authenticate. A node's own group too: nothing checks that a node's
  // workers share a machine (two hosts started as one node would send its
  // gradients across the network).
  GRIDSYNC_ASSIGN_OR_RETURN(const auto worker_secret, wire::OwnCurveSecretFor(config, "worker"));
  if (worker_secret) {
    GRIDSYNC_ASSIGN_OR_RETURN(CollectiveSeal seal, CollectiveSeal::FromCurveSecret(*worker_secret));
    endpoint.seal = std::make_shared<const CollectiveSeal>(std::move(seal));
  }
  GRIDSYNC_ASSIGN_OR_RETURN(auto model, MakeModel(spec));
  GRIDSYNC_ASSIGN_OR_RETURN(auto trainer,
                            PickTrainer(spec, *model, local_rank, options, options.train.quiet));
  GRIDSYNC_ASSIGN_OR_RETURN(
      const std::string kind,
      AgreeOnCollective(spec, trainer.get(), nodes[static_cast<size_t>(d.NodeOf(rank))].workers,
                        rank, &store, options.train.quiet));
  if (endpoint.seal && !options.train.quiet) {
    if (kind == "gloo") {
      spdlog::info(
          "the collective's messages are sealed (security.curve: XChaCha20-Poly1305 under a key "
          "derived from worker.key)");
    } else {
      spdlog::warn(
          "security.curve: NCCL cannot seal the collective's messages; they cross the "
          "network as NCCL sends them");
    }
  }
  GRIDSYNC_ASSIGN_OR_RETURN(
      auto flat, MakeCollective(kind, &store, rank, d.world_size, "flat", timeout, endpoint));
  AllReduceGroups groups;
  groups.flat = flat.get();
  std::unique_ptr<Collective> intra, inter;
  if (d.hierarchical) {
    const int node = d.NodeOf(rank);
    const int local = d.LocalRankOf(rank);
    GRIDSYNC_ASSIGN_OR_RETURN(
        intra, MakeCollective(kind, &store, local, nodes[static_cast<size_t>(node)].workers,
                              "intra-" + nodes[static_cast<size_t>(node)].name, timeout, endpoint));
    if (local < spec.sync.hierarchical_slices) {
      GRIDSYNC_ASSIGN_OR_RETURN(
          inter, MakeCollective(kind, &store, node, static_cast<int>(nodes.size()),
                                "inter-" + std::to_string(local), timeout, endpoint));
    }
    groups.intra = intra.get();
    groups.inter = inter.get();
  }
  ThreadPool pool(config.training.threads);
  const BatchSource source(image, config.training.seed, &pool);
  SplitSchedule split(BatchSplit(d, config.training.batch_size));
  GRIDSYNC_ASSIGN_OR_RETURN(
      auto sync, MakeAllReduceSync(spec, model.get(), rank, std::move(trainer), groups,
                                   coordinator.get(), &source, &split, &pool, options.start_step));
  // As under ps: past 'init' the coordinator refuses a fresh worker into
  // this job (a restarted one would train a fresh model beside its peers'
  // checkpoints), and ends the job once every worker left.
  GRIDSYNC_RETURN_IF_ERROR(coordinator->Barrier("init", static_cast<uint32_t>(d.world_size),
                                                "worker-" + std::to_string(rank), timeout));
  auto report = RunTrainLoop(spec, image, model, *sync, split, pool, options);
  // Every rank leaves together: a rank that closed its sockets while a peer
  // still sends its last bucket would fail that peer.
  if (report.ok()) {
    GRIDSYNC_RETURN_IF_ERROR(coordinator->Barrier("done", static_cast<uint32_t>(d.world_size),
                                                  "worker-" + std::to_string(rank), timeout));
  }
  return report;
}

Result<TrainReport> TrainPsWorker(const RunSpec& spec, const ImageTask& image,
                                  const WorkerOptions& options) {
  const Config& config = spec.config;
  GRIDSYNC_ASSIGN_OR_RETURN(auto model, MakeModel(spec));
  GRIDSYNC_ASSIGN_OR_RETURN(PsSession session, JoinPsCluster(spec, image, *model, options));
  const uint64_t rejoined_at = session.rejoined_at;
  ThreadPool pool(config.training.threads);
  // Worker-side Adam and the codecs run on the training threads too.
  session.ps->SetThreadPool(&pool);
  const BatchSource source(image, config.training.seed, &pool);
  SplitSchedule split(BatchSplit(config.distributed, config.training.batch_size));
  const int rank = static_cast<int>(session.rank);
  GRIDSYNC_ASSIGN_OR_RETURN(auto trainer,
                            PickTrainer(spec, *model, config.distributed.LocalRankOf(rank), options,
                                        options.train.quiet));
  std::unique_ptr<GradientSync> sync;
  if (config.distributed.gradient_sync == GradientSyncMode::kHybrid) {
    // The node's collective: with auto, NCCL only where every worker's
    // model is on a GPU of its own (the node's sum then runs on device
    // buffers; RunSpec leaves auto only where it can), as in nccl mode.
    std::string kind = spec.sync.collective;
    if (!options.intra_group) {
      CoordinatorStore store(session.coordinator.get(), kCollectiveStorePrefix);
      const auto nodes = config.distributed.ResolvedNodes();
      GRIDSYNC_ASSIGN_OR_RETURN(
          kind,
          AgreeOnCollective(spec, trainer.get(),
                            nodes[static_cast<size_t>(config.distributed.NodeOf(rank))].workers,
                            rank, &store, options.train.quiet,
                            /*rejoining=*/rejoined_at > 0));
    }
    GRIDSYNC_ASSIGN_OR_RETURN(sync, HybridSync::Create(spec, model.get(), std::move(session),
                                                       &source, &split, &pool, options, kind));
  } else {
    sync = std::make_unique<PsSync>(spec, model.get(), std::move(session), &source, &split, &pool,
                                    options);
  }
  if (trainer) {
    GRIDSYNC_ASSIGN_OR_RETURN(sync, DeviceStagedSync::Create(spec, model.get(), std::move(sync),
                                                             std::move(trainer), &pool));
  }
  if (rejoined_at > 0) {
    WorkerOptions rejoined = options;
    rejoined.start_step = rejoined_at;
    return RunTrainLoop(spec, image, model, *sync, split, pool, rejoined);
  }
  return RunTrainLoop(spec, image, model, *sync, split, pool, options);
}

}  // namespace

Result<TrainReport> TrainImage(const RunSpec& spec, const ImageTask& image,
                               const TrainOptions& options, const std::string& dump_params) {
  const Config& config = spec.config;
  GRIDSYNC_ASSIGN_OR_RETURN(auto model, MakeModel(spec));
  ThreadPool pool(config.training.threads);
  const BatchSource source(image, config.training.seed, &pool);
  DistributedConfig alone;
  alone.enable = false;
  alone.world_size = 1;
  SplitSchedule split(BatchSplit(alone, config.training.batch_size));
  WorkerOptions worker;
  worker.train = options;
  worker.dump_params = dump_params;
  GRIDSYNC_ASSIGN_OR_RETURN(auto trainer, PickTrainer(spec, *model, 0, worker, options.quiet));
  if (trainer) {
    DeviceSync sync(spec, model.get(), &source, std::move(trainer));
    return RunTrainLoop(spec, image, model, sync, split, pool, worker);
  }
  LocalSync sync(spec, model.get(), &source, &pool);
  return RunTrainLoop(spec, image, model, sync, split, pool, worker);
}

Result<TrainReport> TrainImage(const Config& config, const ImageTask& image,
                               const TrainOptions& options, const std::string& dump_params) {
  GRIDSYNC_ASSIGN_OR_RETURN(const RunSpec spec, RunSpec::Resolve(config));
  return TrainImage(spec, image, options, dump_params);
}

Result<TrainReport> TrainWorker(const Config& config, const ImageTask& image,
                                const WorkerOptions& options) {
  GRIDSYNC_ASSIGN_OR_RETURN(const RunSpec spec, RunSpec::Resolve(config));
  return TrainWorker(spec, image, options);
}

Result<TrainReport> TrainWorker(const RunSpec& spec, const ImageTask& image,
                                const WorkerOptions& options) {
  switch (spec.config.distributed.gradient_sync) {
    case GradientSyncMode::kPs:
    case GradientSyncMode::kHybrid:
      return TrainPsWorker(spec, image, options);
    case GradientSyncMode::kNccl:
      return TrainAllReduceWorker(spec, image, options);
  }
  return Status::Internal("unknown gradient_sync");
}

Result<TrainReport> TrainImageAllReduce(const Config& config, const ImageTask& image, int rank,
                                        const AllReduceGroups& groups,
                                        const WorkerOptions& options) {
  GRIDSYNC_ASSIGN_OR_RETURN(const RunSpec spec, RunSpec::Resolve(config));
  GRIDSYNC_ASSIGN_OR_RETURN(auto model, MakeModel(spec));
  ThreadPool pool(config.training.threads);
  const BatchSource source(image, config.training.seed, &pool);
  SplitSchedule split(BatchSplit(config.distributed, config.training.batch_size));
  GRIDSYNC_ASSIGN_OR_RETURN(auto trainer,
                            PickTrainer(spec, *model, config.distributed.LocalRankOf(rank), options,
                                        options.train.quiet));
  GRIDSYNC_ASSIGN_OR_RETURN(
      auto sync, MakeAllReduceSync(spec, model.get(), rank, std::move(trainer), groups, nullptr,
                                   &source, &split, &pool, options.start_step));
  return RunTrainLoop(spec, image, model, *sync, split, pool, options);
}

}  // namespace gridsync
