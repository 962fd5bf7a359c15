#include "worker/ps_trainer.h"

#include <spdlog/spdlog.h>
#include <unistd.h>

#include <array>
#include <chrono>
#include <filesystem>
#include <fstream>
#include <thread>

#include "common/coordinator_client.h"
#include "common/counter_rng.h"
#include "common/sharding.h"
#include "common/thread_pool.h"
#include "kernels/model_tables.h"
#include "worker/batch_split.h"
#include "worker/model.h"
#include "worker/ps_client.h"

namespace gridsync {
namespace {

using Clock = std::chrono::steady_clock;

// One step's slice of the global batch and the rows it reads.
struct PreparedStep {
  std::vector<float> positions;
  std::vector<float> targets;
  cpu::GridBatchLookup lookup;
  std::vector<TablePullRef> pulls;  // valid until the next step is prepared
};

}  // namespace

std::vector<float> FlattenParams(const HashGridModel& model) {
  std::vector<float> flat = model.grid_params();
  for (const auto& m : model.mlp_weights()) flat.insert(flat.end(), m.data(), m.data() + m.size());
  return flat;
}

Status WriteParams(const std::string& path, const HashGridModel& model) {
  const auto flat = FlattenParams(model);
  std::ofstream out(path, std::ios::binary);
  out.write(reinterpret_cast<const char*>(flat.data()),
            static_cast<std::streamsize>(flat.size() * 4));
  if (!out) return Status::IOError("cannot write " + path);
  return Status::OK();
}

Result<std::vector<float>> ReadParams(const std::string& path) {
  std::ifstream in(path, std::ios::binary | std::ios::ate);
  if (!in) return Status::IOError("cannot read " + path);
  const auto size = static_cast<size_t>(in.tellg());
  std::vector<float> flat(size / 4);
  in.seekg(0);
  in.read(reinterpret_cast<char*>(flat.data()), static_cast<std::streamsize>(flat.size() * 4));
  if (!in) return Status::IOError("cannot read " + path);
  return flat;
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

uint64_t FinalVersion(const PsConfig& ps, const TrainReport& report) {
  if (ps.consistency == Consistency::kAsync) return 0;
  return report.steps + (report.flushed_residuals ? 1 : 0);
}

Status PullAllParams(PsClient& ps, HashGridModel& model, uint64_t min_version) {
  const auto& layout = model.layout();
  const uint32_t levels = layout.n_levels();
  std::vector<TablePullRef> all;
  for (uint32_t l = 0; l < levels; ++l) {
    all.push_back({l, true, nullptr, 0,
                   model.grid_params().data() + layout.level(l).row_offset * layout.features()});
  }
  for (size_t i = 0; i < model.mlp_weights().size(); ++i) {
    all.push_back(
        {levels + static_cast<uint32_t>(i), true, nullptr, 0, model.mlp_weights()[i].data()});
  }
  GRIDSYNC_RETURN_IF_ERROR(ps.SendPull(min_version, all, /*whole=*/true));
  return ps.ReceivePull().status().WithContext("pulling the final parameters");
}

Result<PsSession> JoinPsCluster(const Config& config, HashGridModel& model,
                                const PsWorkerOptions& options) {
  const auto& d = config.distributed;
  const auto timeout = std::chrono::milliseconds(static_cast<int64_t>(d.timeout_s * 1000));
  const auto tables = ModelTables(model.layout(), model.mlp_shape());
  const uint32_t levels = model.layout().n_levels();
  const uint32_t workers = static_cast<uint32_t>(d.world_size);
  PsSession session;
  GRIDSYNC_ASSIGN_OR_RETURN(const wire::ControlAuth control_auth,
                            wire::ControlAuthFor(config, "worker"));
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
  if (options.rank >= 0 && !d.nodes.empty()) {
    info.node = d.ResolvedNodes()[static_cast<size_t>(d.NodeOf(options.rank))].name;
    info.local_rank = static_cast<uint32_t>(d.LocalRankOf(options.rank));
  }
  GRIDSYNC_ASSIGN_OR_RETURN(auto registration, session.coordinator->Register(info, timeout));
  session.rank = registration.rank;
  session.me = "worker-" + std::to_string(session.rank);
  GRIDSYNC_ASSIGN_OR_RETURN(session.map,
                            session.coordinator->GetMap(/*wait_complete=*/true, timeout));
  const auto dim = d.model_parallel ? d.mp_dim : ModelParallelDim::kRow;
  GRIDSYNC_ASSIGN_OR_RETURN(
      Partition partition,
      Partition::Make(session.map.tables, static_cast<uint32_t>(session.map.shards.size()), dim));
  session.partition = std::make_unique<Partition>(std::move(partition));
  GRIDSYNC_ASSIGN_OR_RETURN(const wire::CurveSettings curve,
                            wire::CurveSettingsFor(config, "worker"));
  GRIDSYNC_ASSIGN_OR_RETURN(
      session.ps, PsClient::Connect(session.map, *session.partition, session.rank, workers, timeout,
                                    wire::Limits{}, curve));
  GRIDSYNC_ASSIGN_OR_RETURN(const CodecOptions codec, CodecFromConfig(config.compression));
  session.ps->SetCompression(codec, config.compression.error_feedback,
                             static_cast<size_t>(config.compression.min_bytes),
                             Mix64(config.training.seed) ^ (uint64_t{session.rank} << 48));
  session.ps->SetDeltaPulls(config.compression.pull && codec.codec != Codec::kNone);
  if (config.OptimizerOnWorkers())
    session.ps->SetWorkerOptimizer(AdamHyperFromConfig(config.training));
  if (!options.train.quiet) {
    spdlog::info("{}: cluster of {} shards and {} workers (map generation {}), {} tables",
                 session.me, session.map.shards.size(), session.map.workers.size(),
                 session.map.generation, tables.size());
  }
  if (session.rank == 0 && options.start_step == 0) {
    // Every worker initialises the same model from the seed; rank 0 gives
    // the shards those values, so all start from the single-process state.
    std::vector<TableRowsRef> init;
    const uint32_t F = model.layout().features();
    for (uint32_t l = 0; l < levels; ++l) {
      init.push_back({l, true, nullptr, 0,
                      model.grid_params().data() + model.layout().level(l).row_offset * F});
    }
    for (size_t i = 0; i < model.mlp_weights().size(); ++i) {
      init.push_back(
          {levels + static_cast<uint32_t>(i), true, nullptr, 0, model.mlp_weights()[i].data()});
    }
    GRIDSYNC_RETURN_IF_ERROR(
        session.ps->Push(wire::Kind::kInit, 0, init).WithContext("initialising the shards"));
  }
  GRIDSYNC_RETURN_IF_ERROR(session.coordinator->Barrier("init", workers, session.me, timeout));
  // Per-step figures should not carry rank 0's one-off initial push.
  session.ps->ResetCounters();
  return session;
}

Result<TrainReport> TrainImagePs(const Config& config, const ImageTask& image,
                                 const PsWorkerOptions& options) {
  const auto& d = config.distributed;
  const auto& t = config.training;
  const auto timeout = std::chrono::milliseconds(static_cast<int64_t>(d.timeout_s * 1000));
  GRIDSYNC_ASSIGN_OR_RETURN(std::shared_ptr<HashGridModel> model,
                            HashGridModel::Create(config, 2, 3));
  const uint32_t levels = model->layout().n_levels();
  const uint32_t workers = static_cast<uint32_t>(d.world_size);

  GRIDSYNC_ASSIGN_OR_RETURN(PsSession session, JoinPsCluster(config, *model, options));
  auto& coordinator = session.coordinator;
  auto& ps = session.ps;
  const uint32_t rank = session.rank;
  const std::string me = session.me;
  auto grid_ref = [&](uint32_t level) {
    return model->grid_params().data() +
           model->layout().level(level).row_offset * model->layout().features();
  };

  ThreadPool pool(t.threads);
  const size_t batch = static_cast<size_t>(t.batch_size);
  // even or weighted (distributed.nodes[].weight); fixed for the run.
  const BatchSplit split(d, t.batch_size);
  const size_t slice = split.count(static_cast<int>(rank));
  const uint64_t slice_begin = split.begin(static_cast<int>(rank));
  const uint64_t accumulation = static_cast<uint64_t>(t.gradient_accumulation);
  ModelGradients grads(model->layout(), model->mlp_shape());
  std::unique_ptr<ModelGradients> partial;
  if (t.gradient_accumulation > 1)
    partial = std::make_unique<ModelGradients>(model->layout(), model->mlp_shape());
  cpu::GridRowSet row_set(model->layout());
  // Two buffers: under ssp the next step is prepared (and its pull sent)
  // before this step's compute, so the reply travels while we work.
  std::array<PreparedStep, 2> prepared_steps;
  for (auto& p : prepared_steps) {
    p.positions.resize(slice * 2);
    p.targets.resize(slice * 3);
  }
  // Only ssp allows reading parameters that lack this worker's own last
  // push; async gains nothing from it but a step of extra staleness.
  const bool prefetch = config.ps.consistency == Consistency::kSsp && config.ps.staleness > 0;

  auto min_version = [&](uint64_t step) { return MinVersionFor(config.ps, step); };
  auto prepare = [&](uint64_t step) -> Status {
    PreparedStep& prepared = prepared_steps[step % 2];
    image.SampleBatch(t.seed, step, slice_begin, slice, prepared.positions.data(),
                      prepared.targets.data());
    cpu::HashGridLookup(model->layout(), prepared.positions.data(), slice,
                        model->ActiveLevels(step), &prepared.lookup, &pool);
    row_set.Assign(prepared.lookup, &pool);
    std::vector<TablePullRef> pulls;
    for (uint32_t l = 0; l < levels; ++l) {
      const auto& rows = row_set.rows(l);
      if (rows.empty()) continue;
      pulls.push_back({l, false, rows.data(), rows.size(), grid_ref(l)});
    }
    for (size_t i = 0; i < model->mlp_weights().size(); ++i) {
      pulls.push_back(
          {levels + static_cast<uint32_t>(i), true, nullptr, 0, model->mlp_weights()[i].data()});
    }
    prepared.pulls = pulls;
    return ps->SendPull(min_version(step), pulls);
  };

  TrainReport report;
  report.rank = rank;
  report.n_params = model->n_params();
  double timed = 0;
  uint64_t grid_rows = 0;
  auto interval_start = Clock::now();
  std::vector<SparseRows> touched(levels);
  const auto loop_start = Clock::now();
  const uint64_t first_step = options.start_step;
  if (first_step >= static_cast<uint64_t>(t.steps)) {
    return Status::InvalidArgument("resuming at step " + std::to_string(first_step) +
                                   ", but training.steps is " + std::to_string(t.steps));
  }
  GRIDSYNC_RETURN_IF_ERROR(prepare(first_step));
  for (uint64_t step = first_step; step < static_cast<uint64_t>(t.steps); ++step) {
    GRIDSYNC_ASSIGN_OR_RETURN(const uint64_t version, ps->ReceivePull());
    ps->AddPendingUpdates(prepared_steps[step % 2].pulls);
    report.max_staleness =
        std::max<uint64_t>(report.max_staleness, step > version ? step - version : 0);
    const bool last = step + 1 == static_cast<uint64_t>(t.steps);
    // In bsp the next pull can only be answered after this step's push, so
    // it is sent after the push; in ssp right away.
    if (prefetch && !last) GRIDSYNC_RETURN_IF_ERROR(prepare(step + 1));
    const PreparedStep& prepared = prepared_steps[step % 2];
    const uint32_t active = model->ActiveLevels(step);
    double sse = 0;
    uint64_t offset = 0;
    for (uint64_t m = 0; m < accumulation; ++m) {
      const uint64_t part = slice / accumulation + (m < slice % accumulation ? 1 : 0);
      ModelGradients* target = partial ? partial.get() : &grads;
      sse += model->AccumulateGradients(prepared.positions.data() + offset * 2,
                                        prepared.targets.data() + offset * 3, part, batch, 1.0f,
                                        active, target, &pool);
      if (partial) grads.AddFrom(partial.get(), &pool);
      offset += part;
    }
    if (options.throttle_ms > 0)
      std::this_thread::sleep_for(std::chrono::milliseconds(options.throttle_ms));
    std::vector<TableRowsRef> push;
    for (uint32_t l = 0; l < levels; ++l) {
      touched[l].clear();
      grads.grid.Take(l, &touched[l]);
      grid_rows += touched[l].size();
      if (touched[l].size() == 0) continue;
      push.push_back(
          {l, false, touched[l].rows.data(), touched[l].size(), touched[l].values.data()});
    }
    for (size_t i = 0; i < grads.mlp.size(); ++i) {
      push.push_back({levels + static_cast<uint32_t>(i), true, nullptr, 0, grads.mlp[i].data()});
    }
    // A push carries each row's full width, so dense rows travel values-only
    // per shard; SplitAll re-packs them per owner.
    GRIDSYNC_RETURN_IF_ERROR(
        ps->Push(wire::Kind::kPush, step, push).WithContext(me + " step " + std::to_string(step)));
    for (auto& m : grads.mlp) m.setZero();
    report.final_loss = sse / static_cast<double>(slice * 3);
    if (!prefetch && !last) GRIDSYNC_RETURN_IF_ERROR(prepare(step + 1));
    const uint64_t done = step + 1;
    if (!options.train.quiet && t.log_every > 0 &&
        (done % static_cast<uint64_t>(t.log_every) == 0 ||
         done == static_cast<uint64_t>(t.steps))) {
      const double secs = std::chrono::duration<double>(Clock::now() - interval_start).count();
      spdlog::info(
          "{} step {:>6} loss {:.6f} | {:.0f} samples/s (this worker) | pushed {:.2f} MB/step, "
          "pulled {:.2f} MB/step, staleness <= {}",
          me, done, report.final_loss, t.log_every * static_cast<double>(slice) / secs,
          ps->counters().bytes_pushed / 1e6 / done, ps->counters().bytes_pulled / 1e6 / done,
          report.max_staleness);
      interval_start = Clock::now();
    }
  }
  // What error feedback still holds is delivered as one more step.
  GRIDSYNC_ASSIGN_OR_RETURN(
      report.flushed_residuals,
      ps->FlushResiduals(static_cast<uint64_t>(t.steps), min_version(t.steps)));
  timed = std::chrono::duration<double>(Clock::now() - loop_start).count();
  report.steps = static_cast<uint64_t>(t.steps) - first_step;  // run by this process
  report.samples = report.steps * slice;
  report.train_seconds = timed;
  report.samples_per_second = static_cast<double>(report.steps * batch) / timed;  // global rate
  report.grid_rows_per_step = static_cast<double>(grid_rows) / static_cast<double>(report.steps);
  report.bytes_pushed_per_step = static_cast<double>(ps->counters().bytes_pushed) / report.steps;
  report.bytes_pulled_per_step = static_cast<double>(ps->counters().bytes_pulled) / report.steps;
  report.comm_seconds = ps->counters().push_seconds + ps->counters().pull_wait_seconds;

  // Every push of every worker is acknowledged (and, but for bsp/ssp
  // aggregation, applied) before anyone reads the final parameters.
  GRIDSYNC_RETURN_IF_ERROR(coordinator->Barrier("done", workers, me, timeout));
  if (rank == 0) {
    // The final parameters: every row, once all workers' last pushes are in.
    GRIDSYNC_RETURN_IF_ERROR(PullAllParams(*ps, *model, FinalVersion(config.ps, report)));
    GRIDSYNC_RETURN_IF_ERROR(
        EvaluateAndSave(*model, image, config, options.train.write_png, &pool, &report));
    if (!options.dump_params.empty())
      GRIDSYNC_RETURN_IF_ERROR(WriteParams(options.dump_params, *model));
  }
  report.model = std::move(model);
  return report;
}

}  // namespace gridsync
