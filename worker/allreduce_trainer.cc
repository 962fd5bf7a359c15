#include "worker/allreduce_trainer.h"

#include <spdlog/spdlog.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <filesystem>
#include <thread>

#include "common/coordinator_client.h"
#include "common/thread_pool.h"
#include "kernels/cpu/adam.h"
#include "kernels/model_tables.h"
#include "worker/batch_split.h"
#include "worker/collective/buckets.h"
#include "worker/collective/factory.h"
#include "worker/model.h"

namespace gridsync {
namespace {

using Clock = std::chrono::steady_clock;

double Since(Clock::time_point t) {
  return std::chrono::duration<double>(Clock::now() - t).count();
}

// Slice boundaries of n elements cut into `slices` near-equal parts, as
// counts for `size` ranks (ranks >= slices get none).
std::vector<size_t> SliceCounts(size_t n, int slices, int size) {
  std::vector<size_t> counts(static_cast<size_t>(size), 0);
  for (int s = 0; s < slices; ++s) {
    counts[static_cast<size_t>(s)] = n / slices + (static_cast<size_t>(s) < n % slices ? 1 : 0);
  }
  return counts;
}

}  // namespace

Status HierarchicalAllReduce(Collective& intra, Collective* inter, int slices, float* data,
                             size_t n) {
  const auto counts = SliceCounts(n, slices, intra.size());
  const size_t mine = counts[static_cast<size_t>(intra.rank())];
  std::vector<float> slice(mine);
  GRIDSYNC_RETURN_IF_ERROR(intra.ReduceScatterSum(data, slice.data(), counts));
  if (mine > 0) {
    if (inter == nullptr)
      return Status::Internal("hierarchical all-reduce: a slice owner has no inter-node group");
    GRIDSYNC_RETURN_IF_ERROR(inter->AllReduceSum(slice.data(), mine));
  }
  return intra.AllGatherV(slice.data(), counts, data);
}

Result<TrainReport> TrainImageAllReduce(const Config& config, const ImageTask& image, int rank,
                                        const AllReduceGroups& groups,
                                        const AllReduceWorkerOptions& options) {
  const auto& d = config.distributed;
  const auto& t = config.training;
  if (groups.flat == nullptr)
    return Status::InvalidArgument("all-reduce training needs the flat group");
  const bool hierarchical = d.hierarchical && groups.intra != nullptr;
  GRIDSYNC_ASSIGN_OR_RETURN(std::shared_ptr<HashGridModel> model,
                            HashGridModel::Create(config, 2, 3));
  ThreadPool pool(t.threads);
  const auto& layout = model->layout();
  const uint32_t levels = layout.n_levels();
  const uint32_t F = layout.features();
  const AdamHyper hyper = AdamHyperFromConfig(t);
  std::vector<cpu::AdamTable> grid_state(levels);
  for (uint32_t l = 0; l < levels; ++l) grid_state[l].Resize(layout.level(l).rows, F);
  const auto& shape = model->mlp_shape();
  std::vector<cpu::AdamTable> mlp_state(static_cast<size_t>(shape.n_matrices()));
  for (int i = 0; i < shape.n_matrices(); ++i)
    mlp_state[static_cast<size_t>(i)].Resize(shape.cols(i), shape.rows(i));

  ModelGradients grads(layout, shape);
  std::unique_ptr<ModelGradients> partial;
  if (t.gradient_accumulation > 1) partial = std::make_unique<ModelGradients>(layout, shape);
  std::vector<std::span<float>> tensors = {grads.grid.dense_span()};
  for (auto& m : grads.mlp) tensors.emplace_back(m.data(), static_cast<size_t>(m.size()));
  size_t total = 0;
  for (const auto& span : tensors) total += span.size();
  std::vector<float> packed;  // hierarchical works on one contiguous buffer
  if (hierarchical) packed.resize(total);
  int slices = 0;
  if (hierarchical) {
    slices = d.ResolvedNodes().front().workers;
    for (const auto& node : d.ResolvedNodes()) slices = std::min(slices, node.workers);
  }
  BucketOptions buckets;
  buckets.bucket_bytes = static_cast<size_t>(d.bucket_mb * 1024 * 1024);

  BatchSplit split(d, t.batch_size);
  const size_t batch = static_cast<size_t>(t.batch_size);
  std::vector<float> positions, targets;
  std::vector<std::vector<uint32_t>> nonzero(levels);
  TrainReport report;
  report.rank = static_cast<uint32_t>(rank);
  report.n_params = model->n_params();
  double compute_in_interval = 0;
  uint64_t samples_in_interval = 0;
  double comm = 0;
  const auto loop_start = Clock::now();
  for (uint64_t step = 0; step < static_cast<uint64_t>(t.steps); ++step) {
    const auto compute_start = Clock::now();
    const uint64_t begin = split.begin(rank);
    const uint64_t count = split.count(rank);
    positions.resize(count * 2);
    targets.resize(count * 3);
    image.SampleBatch(t.seed, step, begin, count, positions.data(), targets.data());
    const uint32_t active = model->ActiveLevels(step);
    double sse = 0;
    const uint64_t k = static_cast<uint64_t>(t.gradient_accumulation);
    uint64_t done_samples = 0;
    for (uint64_t m = 0; m < k; ++m) {
      const uint64_t part = count / k + (m < count % k ? 1 : 0);
      ModelGradients* target = partial ? partial.get() : &grads;
      sse += model->AccumulateGradients(positions.data() + done_samples * 2,
                                        targets.data() + done_samples * 3, part, batch, 1.0f,
                                        active, target, &pool);
      if (partial) grads.AddFrom(partial.get(), &pool);
      done_samples += part;
    }
    if (options.throttle_ms > 0)
      std::this_thread::sleep_for(std::chrono::milliseconds(options.throttle_ms));
    compute_in_interval += Since(compute_start);
    samples_in_interval += count;

    const auto comm_start = Clock::now();
    if (hierarchical) {
      size_t at = 0;
      for (const auto& span : tensors) {
        std::copy(span.begin(), span.end(), packed.begin() + static_cast<std::ptrdiff_t>(at));
        at += span.size();
      }
      // Bucket by bucket, so the scratch of each phase stays bounded.
      const size_t chunk = std::max<size_t>(1, buckets.bucket_bytes / sizeof(float));
      for (size_t off = 0; off < total; off += chunk) {
        GRIDSYNC_RETURN_IF_ERROR(HierarchicalAllReduce(*groups.intra, groups.inter, slices,
                                                       packed.data() + off,
                                                       std::min(chunk, total - off))
                                     .WithContext("step " + std::to_string(step)));
      }
      at = 0;
      for (auto& span : tensors) {
        std::copy(packed.begin() + static_cast<std::ptrdiff_t>(at),
                  packed.begin() + static_cast<std::ptrdiff_t>(at + span.size()), span.begin());
        at += span.size();
      }
    } else {
      GRIDSYNC_RETURN_IF_ERROR(BucketedAllReduceSum(*groups.flat, tensors, step, buckets));
    }
    comm += Since(comm_start);

    // Every worker holds the same summed gradient and takes the same step.
    float* grid = model->grid_params().data();
    float* grad = grads.grid.mutable_dense();
    pool.ParallelFor(levels, [&](size_t l) {
      const auto& level = layout.level(static_cast<uint32_t>(l));
      float* g = grad + level.row_offset * F;
      auto& rows = nonzero[l];
      rows.clear();
      for (uint32_t r = 0; r < level.rows; ++r) {
        if (RowHasGradient(g + size_t{r} * F, F)) rows.push_back(r);
      }
      cpu::AdamUpdateIndexed(hyper, rows.data(), rows.size(), g, grid + level.row_offset * F,
                             &grid_state[l]);
    });
    grads.grid.ForgetTouched();
    auto& weights = model->mlp_weights();
    for (size_t i = 0; i < weights.size(); ++i) {
      cpu::AdamUpdateDense(hyper, grads.mlp[i].data(), static_cast<uint64_t>(weights[i].cols()),
                           1.0f, weights[i].data(), &mlp_state[i]);
      grads.mlp[i].setZero();
    }
    report.final_loss = sse / static_cast<double>(count * 3);  // this worker's share

    const uint64_t done = step + 1;
    if (d.batch_splitting == BatchSplitting::kAdaptive &&
        done % static_cast<uint64_t>(d.adaptive_interval) == 0 &&
        done < static_cast<uint64_t>(t.steps)) {
      // Samples per second of compute (not communication) on every rank.
      const float rate =
          static_cast<float>(samples_in_interval / std::max(compute_in_interval, 1e-9));
      std::vector<float> rates(static_cast<size_t>(groups.flat->size()));
      GRIDSYNC_RETURN_IF_ERROR(groups.flat->AllGather(&rate, 1, rates.data()));
      const bool changed = split.Rebalance(std::vector<double>(rates.begin(), rates.end()));
      if (changed && !options.train.quiet && rank == 0) {
        std::string shares;
        for (uint64_t c : split.counts())
          shares += (shares.empty() ? "" : ", ") + std::to_string(c);
        spdlog::info("step {}: adaptive split re-balanced to [{}] samples", done, shares);
      }
      compute_in_interval = 0;
      samples_in_interval = 0;
    }
    if (!options.train.quiet && t.log_every > 0 && done % static_cast<uint64_t>(t.log_every) == 0) {
      spdlog::info(
          "worker-{} step {:>6} loss {:.6f} ({} samples this step) | {:.2f} s in all-reduce so far",
          rank, done, report.final_loss, count, comm);
    }
  }
  report.steps = static_cast<uint64_t>(t.steps);
  report.samples = report.steps * batch;
  report.train_seconds = Since(loop_start);
  report.samples_per_second = static_cast<double>(report.samples) / report.train_seconds;
  report.comm_seconds = comm;
  report.split_counts = split.counts();
  const size_t bytes_per_step = total * sizeof(float);
  report.bytes_pushed_per_step = static_cast<double>(bytes_per_step);  // all-reduced per step
  report.bytes_pulled_per_step = 0;
  if (rank == 0) {
    GRIDSYNC_RETURN_IF_ERROR(
        EvaluateAndSave(*model, image, config, options.train.write_png, &pool, &report));
  }
  report.model = std::move(model);
  return report;
}

Result<TrainReport> TrainImageAllReduceWorker(const Config& config, const ImageTask& image,
                                              int rank, const AllReduceWorkerOptions& options) {
  const auto& d = config.distributed;
  const auto timeout = std::chrono::milliseconds(static_cast<int64_t>(d.timeout_s * 1000));
  GRIDSYNC_ASSIGN_OR_RETURN(auto tables, ImageModelTables(config));
  GRIDSYNC_ASSIGN_OR_RETURN(const wire::ControlAuth control_auth,
                            wire::ControlAuthFor(config, "worker"));
  GRIDSYNC_ASSIGN_OR_RETURN(
      auto coordinator,
      CoordinatorClient::Connect(d.master_addr, static_cast<uint16_t>(d.master_port), timeout,
                                 control_auth, Role::kWorker));
  const auto nodes = d.ResolvedNodes();
  RegisterInfo info;
  info.role = Role::kWorker;
  info.requested_rank = rank;
  info.pid = static_cast<uint32_t>(getpid());
  info.tables = tables;
  if (rank >= 0) {
    info.node = nodes[static_cast<size_t>(d.NodeOf(rank))].name;
    info.local_rank = static_cast<uint32_t>(d.LocalRankOf(rank));
  }
  GRIDSYNC_ASSIGN_OR_RETURN(auto registration, coordinator->Register(info, timeout));
  rank = static_cast<int>(registration.rank);
  GRIDSYNC_RETURN_IF_ERROR(coordinator->GetMap(/*wait_complete=*/true, timeout).status());
  CoordinatorStore store(coordinator.get(), "collective/");
  const std::string kind(ToString(d.collective));
  GRIDSYNC_ASSIGN_OR_RETURN(auto flat, MakeCollective(kind, &store, rank, d.world_size, "flat",
                                                      timeout, options.endpoint));
  AllReduceGroups groups;
  groups.flat = flat.get();
  std::unique_ptr<Collective> intra, inter;
  if (d.hierarchical) {
    const int node = d.NodeOf(rank);
    const int local = d.LocalRankOf(rank);
    int slices = nodes.front().workers;
    for (const auto& n : nodes) slices = std::min(slices, n.workers);
    GRIDSYNC_ASSIGN_OR_RETURN(
        intra, MakeCollective(kind, &store, local, nodes[static_cast<size_t>(node)].workers,
                              "intra-" + nodes[static_cast<size_t>(node)].name, timeout,
                              options.endpoint));
    if (local < slices) {
      GRIDSYNC_ASSIGN_OR_RETURN(
          inter, MakeCollective(kind, &store, node, static_cast<int>(nodes.size()),
                                "inter-" + std::to_string(local), timeout, options.endpoint));
    }
    groups.intra = intra.get();
    groups.inter = inter.get();
  }
  if (!options.train.quiet) {
    spdlog::info("worker-{}: {} all-reduce over {} ({}{} workers, {} node(s))", rank,
                 d.hierarchical ? "hierarchical" : "flat", flat->name(), d.world_size, "",
                 nodes.size());
  }
  return TrainImageAllReduce(config, image, rank, groups, options);
}

}  // namespace gridsync
