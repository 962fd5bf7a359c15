#include "worker/hybrid_trainer.h"

#include <spdlog/spdlog.h>

#include <algorithm>
#include <bit>
#include <chrono>
#include <cstring>
#include <filesystem>

#include "common/coordinator_client.h"
#include "common/thread_pool.h"
#include "kernels/adam_math.h"
#include "worker/batch_split.h"
#include "worker/collective/factory.h"
#include "worker/model.h"

namespace gridsync {
namespace {

using Clock = std::chrono::steady_clock;

double Since(Clock::time_point t) {
  return std::chrono::duration<double>(Clock::now() - t).count();
}

// The parameter rows of the model laid end to end: grid rows (all levels),
// then the rows of each MLP table. "Global row" g maps to (table, row) and to
// an element offset in the packed gradient buffer.
class RowSpace {
 public:
  explicit RowSpace(const HashGridModel& model) {
    const auto& layout = model.layout();
    for (uint32_t l = 0; l < layout.n_levels(); ++l) {
      tables_.push_back({first_row_, layout.level(l).rows, layout.features(), elements_});
      first_row_ += layout.level(l).rows;
      elements_ += uint64_t{layout.level(l).rows} * layout.features();
    }
    for (const auto& m : model.mlp_weights()) {
      const uint64_t rows = static_cast<uint64_t>(m.cols());
      tables_.push_back({first_row_, rows, static_cast<uint32_t>(m.rows()), elements_});
      first_row_ += rows;
      elements_ += static_cast<uint64_t>(m.size());
    }
  }
  struct Table {
    uint64_t first_row;  // global row of its row 0
    uint64_t rows;
    uint32_t width;
    uint64_t first_element;
  };
  uint64_t rows() const { return first_row_; }
  uint64_t elements() const { return elements_; }
  const std::vector<Table>& tables() const { return tables_; }
  uint32_t TableOf(uint64_t global_row) const {
    uint32_t t = 0;
    while (t + 1 < tables_.size() && tables_[t + 1].first_row <= global_row) ++t;
    return t;
  }
  uint64_t ElementOf(uint64_t global_row) const {
    const auto& t = tables_[TableOf(global_row)];
    return t.first_element + (global_row - t.first_row) * t.width;
  }
  // Cuts the rows into `parts` contiguous ranges of near-equal elements.
  std::vector<uint64_t> SliceRows(int parts) const {
    std::vector<uint64_t> bounds = {0};
    uint64_t row = 0;
    for (int p = 1; p < parts; ++p) {
      const uint64_t target = elements_ * static_cast<uint64_t>(p) / static_cast<uint64_t>(parts);
      while (row < first_row_ && ElementOf(row) < target) {
        // Skip whole tables quickly, then single rows.
        const auto& t = tables_[TableOf(row)];
        const uint64_t table_end_element = t.first_element + t.rows * t.width;
        if (table_end_element <= target) {
          row = t.first_row + t.rows;
        } else {
          row = t.first_row + (target - t.first_element + t.width - 1) / t.width;
          break;
        }
      }
      bounds.push_back(std::min(row, first_row_));
    }
    bounds.push_back(first_row_);
    return bounds;
  }

 private:
  std::vector<Table> tables_;
  uint64_t first_row_ = 0;
  uint64_t elements_ = 0;
};

// Row ids travel through float collectives bit for bit.
float BitsToFloat(uint32_t v) { return std::bit_cast<float>(v); }
uint32_t FloatToBits(float f) { return std::bit_cast<uint32_t>(f); }

}  // namespace

Result<TrainReport> TrainImageHybrid(const Config& config, const ImageTask& image,
                                     const HybridWorkerOptions& options) {
  const auto& d = config.distributed;
  const auto& t = config.training;
  const auto timeout = std::chrono::milliseconds(static_cast<int64_t>(d.timeout_s * 1000));
  GRIDSYNC_ASSIGN_OR_RETURN(std::shared_ptr<HashGridModel> model,
                            HashGridModel::Create(config, 2, 3));
  GRIDSYNC_ASSIGN_OR_RETURN(PsSession session, JoinPsCluster(config, *model, options.ps));
  const int rank = static_cast<int>(session.rank);
  const auto nodes = d.ResolvedNodes();
  const int node = d.NodeOf(rank);
  const int local = d.LocalRankOf(rank);
  const int node_size = nodes[static_cast<size_t>(node)].workers;

  std::unique_ptr<CoordinatorStore> store;
  std::unique_ptr<Collective> owned_intra;
  Collective* intra = nullptr;
  if (options.intra_group) {
    GRIDSYNC_ASSIGN_OR_RETURN(intra, options.intra_group(session, node, local, node_size));
  } else {
    store = std::make_unique<CoordinatorStore>(session.coordinator.get(), "collective/");
    GRIDSYNC_ASSIGN_OR_RETURN(
        owned_intra, MakeCollective(ToString(d.collective), store.get(), local, node_size,
                                    "intra-" + nodes[static_cast<size_t>(node)].name, timeout,
                                    options.endpoint));
    intra = owned_intra.get();
  }

  const auto& layout = model->layout();
  const uint32_t levels = layout.n_levels();
  const uint32_t F = layout.features();
  const RowSpace space(*model);
  const auto bounds = space.SliceRows(node_size);
  const uint64_t my_first = bounds[static_cast<size_t>(local)];
  const uint64_t my_end = bounds[static_cast<size_t>(local) + 1];
  std::vector<size_t> slice_elements(static_cast<size_t>(node_size));
  for (int l = 0; l < node_size; ++l) {
    const uint64_t a = bounds[static_cast<size_t>(l)];
    const uint64_t b = bounds[static_cast<size_t>(l) + 1];
    slice_elements[static_cast<size_t>(l)] =
        (b == space.rows() ? space.elements() : space.ElementOf(b)) -
        (a == space.rows() ? space.elements() : space.ElementOf(a));
  }

  ThreadPool pool(t.threads);
  const size_t batch = static_cast<size_t>(t.batch_size);
  const BatchSplit split(d, t.batch_size);
  const uint64_t count = split.count(rank);
  const uint64_t begin = split.begin(rank);
  ModelGradients grads(layout, model->mlp_shape());
  std::vector<float> positions(count * 2), targets(count * 3);
  cpu::GridBatchLookup lookup;
  cpu::GridRowSet row_set(layout);
  std::vector<float> packed(space.elements());
  std::vector<float> my_grad(slice_elements[static_cast<size_t>(local)]);
  std::vector<uint64_t> needed_bits((space.rows() + 63) / 64);
  auto param_of = [&](uint64_t global_row) -> float* {
    const uint32_t t_index = space.TableOf(global_row);
    const auto& tab = space.tables()[t_index];
    const uint64_t row = global_row - tab.first_row;
    if (t_index < levels)
      return model->grid_params().data() + (layout.level(t_index).row_offset + row) * F;
    return model->mlp_weights()[t_index - levels].data() + row * tab.width;
  };

  TrainReport report;
  report.rank = static_cast<uint32_t>(rank);
  report.n_params = model->n_params();
  double comm = 0;
  const auto loop_start = Clock::now();
  for (uint64_t step = 0; step < static_cast<uint64_t>(t.steps); ++step) {
    image.SampleBatch(t.seed, step, begin, count, positions.data(), targets.data());
    const uint32_t active = model->ActiveLevels(step);
    cpu::HashGridLookup(layout, positions.data(), count, active, &lookup, &pool);
    row_set.Assign(lookup, &pool);

    // 1. The node's union of rows to read next, and its fresh values.
    const auto comm_start = Clock::now();
    std::vector<float> mine;
    for (uint32_t l = 0; l < levels; ++l) {
      const uint64_t first = space.tables()[l].first_row;
      for (uint32_t row : row_set.rows(l))
        mine.push_back(BitsToFloat(static_cast<uint32_t>(first + row)));
    }
    const float my_count = static_cast<float>(mine.size());
    std::vector<float> counts_f(static_cast<size_t>(node_size));
    GRIDSYNC_RETURN_IF_ERROR(intra->AllGather(&my_count, 1, counts_f.data()));
    std::vector<size_t> counts(counts_f.begin(), counts_f.end());
    size_t total_ids = 0;
    for (size_t c : counts) total_ids += c;
    std::vector<float> all_ids(total_ids);
    GRIDSYNC_RETURN_IF_ERROR(intra->AllGatherV(mine.data(), counts, all_ids.data()));
    std::fill(needed_bits.begin(), needed_bits.end(), 0);
    for (float f : all_ids) {
      const uint64_t g = FloatToBits(f);
      needed_bits[g >> 6] |= uint64_t{1} << (g & 63);
    }
    for (size_t ti = levels; ti < space.tables().size(); ++ti) {  // MLP rows: always read
      const auto& tab = space.tables()[ti];
      for (uint64_t g = tab.first_row; g < tab.first_row + tab.rows; ++g)
        needed_bits[g >> 6] |= uint64_t{1} << (g & 63);
    }
    // Per local rank, the needed rows inside its slice (ascending).
    std::vector<std::vector<uint64_t>> slice_rows(static_cast<size_t>(node_size));
    for (int l = 0; l < node_size; ++l) {
      for (uint64_t g = bounds[static_cast<size_t>(l)]; g < bounds[static_cast<size_t>(l) + 1];
           ++g) {
        if (needed_bits[g >> 6] >> (g & 63) & 1) slice_rows[static_cast<size_t>(l)].push_back(g);
      }
    }
    // Pull mine, per table.
    std::vector<std::vector<uint32_t>> pull_rows(space.tables().size());
    for (uint64_t g : slice_rows[static_cast<size_t>(local)]) {
      const uint32_t ti = space.TableOf(g);
      pull_rows[ti].push_back(static_cast<uint32_t>(g - space.tables()[ti].first_row));
    }
    std::vector<TablePullRef> pulls;
    for (uint32_t ti = 0; ti < pull_rows.size(); ++ti) {
      if (pull_rows[ti].empty()) continue;
      float* dest = ti < levels ? model->grid_params().data() + layout.level(ti).row_offset * F
                                : model->mlp_weights()[ti - levels].data();
      pulls.push_back({ti, false, pull_rows[ti].data(), pull_rows[ti].size(), dest});
    }
    const uint64_t min_version = MinVersionFor(config.ps, step);
    GRIDSYNC_RETURN_IF_ERROR(session.ps->SendPull(min_version, pulls));
    GRIDSYNC_ASSIGN_OR_RETURN(const uint64_t version, session.ps->ReceivePull());
    (void)version;
    session.ps->AddPendingUpdates(pulls);  // before the node shares them
    // Share the pulled values inside the node.
    std::vector<size_t> value_counts(static_cast<size_t>(node_size));
    for (int l = 0; l < node_size; ++l) {
      size_t n = 0;
      for (uint64_t g : slice_rows[static_cast<size_t>(l)])
        n += space.tables()[space.TableOf(g)].width;
      value_counts[static_cast<size_t>(l)] = n;
    }
    std::vector<float> my_values;
    my_values.reserve(value_counts[static_cast<size_t>(local)]);
    for (uint64_t g : slice_rows[static_cast<size_t>(local)]) {
      const float* p = param_of(g);
      my_values.insert(my_values.end(), p, p + space.tables()[space.TableOf(g)].width);
    }
    size_t total_values = 0;
    for (size_t c : value_counts) total_values += c;
    std::vector<float> all_values(total_values);
    GRIDSYNC_RETURN_IF_ERROR(intra->AllGatherV(my_values.data(), value_counts, all_values.data()));
    size_t at = 0;
    for (int l = 0; l < node_size; ++l) {
      for (uint64_t g : slice_rows[static_cast<size_t>(l)]) {
        const uint32_t w = space.tables()[space.TableOf(g)].width;
        std::memcpy(param_of(g), all_values.data() + at, w * sizeof(float));
        at += w;
      }
    }
    comm += Since(comm_start);

    // 2. This worker's gradient.
    const double sse = model->AccumulateGradients(positions.data(), targets.data(), count, batch,
                                                  1.0f, active, &grads, &pool);
    report.final_loss = sse / static_cast<double>(count * 3);

    // 3. Reduce-scatter inside the node: local rank l gets its slice's sum.
    const auto comm2_start = Clock::now();
    std::memcpy(packed.data(), grads.grid.dense(),
                uint64_t{layout.total_rows()} * F * sizeof(float));
    size_t offset = layout.total_rows() * F;
    for (const auto& m : grads.mlp) {
      std::memcpy(packed.data() + offset, m.data(), static_cast<size_t>(m.size()) * sizeof(float));
      offset += static_cast<size_t>(m.size());
    }
    grads.Clear(&pool);
    GRIDSYNC_RETURN_IF_ERROR(
        intra->ReduceScatterSum(packed.data(), my_grad.data(), slice_elements));

    // 4. Push the slice's non-zero rows.
    std::vector<std::vector<uint32_t>> push_rows(space.tables().size());
    std::vector<std::vector<float>> push_values(space.tables().size());
    size_t element = 0;
    for (uint64_t g = my_first; g < my_end; ++g) {
      const uint32_t ti = space.TableOf(g);
      const uint32_t w = space.tables()[ti].width;
      const float* v = my_grad.data() + element;
      element += w;
      if (!RowHasGradient(v, w)) continue;
      push_rows[ti].push_back(static_cast<uint32_t>(g - space.tables()[ti].first_row));
      push_values[ti].insert(push_values[ti].end(), v, v + w);
    }
    std::vector<TableRowsRef> push;
    for (uint32_t ti = 0; ti < push_rows.size(); ++ti) {
      if (push_rows[ti].empty()) continue;
      push.push_back(
          {ti, false, push_rows[ti].data(), push_rows[ti].size(), push_values[ti].data()});
    }
    GRIDSYNC_RETURN_IF_ERROR(session.ps->Push(wire::Kind::kPush, step, push)
                                 .WithContext(session.me + " step " + std::to_string(step)));
    comm += Since(comm2_start);
    const uint64_t done = step + 1;
    if (!options.ps.train.quiet && t.log_every > 0 &&
        done % static_cast<uint64_t>(t.log_every) == 0) {
      spdlog::info("{} step {:>6} loss {:.6f} | pushed {:.2f} MB/step, pulled {:.2f} MB/step",
                   session.me, done, report.final_loss,
                   session.ps->counters().bytes_pushed / 1e6 / done,
                   session.ps->counters().bytes_pulled / 1e6 / done);
    }
  }
  // Each local rank's slice residuals, delivered as one more step.
  GRIDSYNC_ASSIGN_OR_RETURN(
      report.flushed_residuals,
      session.ps->FlushResiduals(static_cast<uint64_t>(t.steps),
                                 MinVersionFor(config.ps, static_cast<uint64_t>(t.steps))));
  report.steps = static_cast<uint64_t>(t.steps);
  report.samples = report.steps * batch;
  report.train_seconds = Since(loop_start);
  report.samples_per_second = static_cast<double>(report.samples) / report.train_seconds;
  report.bytes_pushed_per_step =
      static_cast<double>(session.ps->counters().bytes_pushed) / report.steps;
  report.bytes_pulled_per_step =
      static_cast<double>(session.ps->counters().bytes_pulled) / report.steps;
  report.comm_seconds = comm;

  GRIDSYNC_RETURN_IF_ERROR(session.coordinator->Barrier("done", static_cast<uint32_t>(d.world_size),
                                                        session.me, timeout));
  if (rank == 0) {
    GRIDSYNC_RETURN_IF_ERROR(PullAllParams(*session.ps, *model, FinalVersion(config.ps, report)));
    GRIDSYNC_RETURN_IF_ERROR(
        EvaluateAndSave(*model, image, config, options.ps.train.write_png, &pool, &report));
    if (!options.ps.dump_params.empty())
      GRIDSYNC_RETURN_IF_ERROR(WriteParams(options.ps.dump_params, *model));
  }
  report.model = std::move(model);
  return report;
}

}  // namespace gridsync
