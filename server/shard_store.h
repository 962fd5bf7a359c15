// The parameters one PS shard owns, with their Adam state: for every table,
// the shard's blocks of rows (and, under column partitioning, its columns),
// stored compactly in local row order (see common/sharding.h).
//
// A step's pushes of a table (up to kMaxMergedPushes of them) are merged in
// ascending row order and each row steps once, from its sum held in
// registers (ApplyMerged); more pushes are summed into a dense buffer with a
// touched-row bitmap, then Adam runs on the touched rows. Either way rows no
// push touched are never updated, and the bits are the same. With the
// optimizer on the workers (ps.optimizer), pushes carry parameter updates
// instead: they are summed the same way, each row counting the pushes that
// listed it, and a row moves by the mean of the updates it received; the
// shard keeps no Adam state then. Callers sum pushes in worker-rank order,
// which fixes the float reduction order and makes results reproducible bit
// for bit.
//
// Thread safety: not thread-safe as a whole; calls for different tables may
// run concurrently (each touches only its table's state).
#pragma once

#include <cmath>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "common/huge_pages.h"
#include "common/sharding.h"
#include "common/sparse_rows.h"
#include "common/status.h"
#include "common/thread_pool.h"
#include "common/wire/message.h"
#include "kernels/adam_math.h"
#include "kernels/cpu/adam.h"

namespace gridsync {

class ShardStore {
 public:
  // apply_updates: pushes carry updates from the workers' optimizers.
  ShardStore(const Partition& partition, uint32_t shard, const AdamHyper& hyper,
             bool apply_updates = false);
  // What such a store allocates is spec/shard_memory.h's ShardMemoryBytes.
  bool applies_updates() const { return apply_updates_; }

  uint32_t shard() const { return shard_; }
  uint32_t n_tables() const { return static_cast<uint32_t>(tables_.size()); }
  uint64_t owned_rows() const;

  // Refuses a block with a row or columns this shard does not own, naming
  // the first offending row and its owner. Changes nothing.
  Status CheckOwnership(const wire::Block& block) const;

  // grad[row] += values of the block (after ownership was checked); with
  // updates, also counts the push for each listed row.
  void Accumulate(const wire::Block& block);
  // A step's pushes of one table (`blocks`, one a push, in worker-rank
  // order) summed and applied in one pass over their rows, merged in
  // ascending order: each row steps (Adam on its sum, or the mean of its
  // updates) bit for bit as Accumulate and the apply step it, with no sum
  // buffer, push count or touched row written. False, doing nothing, for
  // more than kMaxMergedPushes pushes: each row visits every cursor, so
  // the merge's work grows as pushes^2 (gridsync-bench apply, 16 tables of
  // 16384 rows a push: merged against summed at 6 pushes 25 against 31 ns a
  // row with Adam, 22 against 25 with updates; at 8 pushes 43 against 30
  // and 28 against 24).
  bool ApplyMerged(const std::vector<const wire::Block*>& blocks);
  // A step's pushes (in worker-rank order), as the shard applies them: one
  // push straight from its values (ApplyDirect) in chunks of rows; more,
  // each table's merged (ApplyMerged) or, past kMaxMergedPushes, summed and
  // then stepped in chunks of touched rows. Tables and chunks run on `pool`
  // (null: this thread), which the store's thread-safety allows (each task
  // touches one table, or distinct rows of one).
  void ApplyPushes(const std::vector<const wire::Message*>& pushes, ThreadPool* pool);
  static constexpr size_t kMaxMergedPushes = 6;
  // A parameter moved by the mean of the n updates summing to `sum` (inv =
  // 1 / n, or 1): one fused multiply-add, so that every path applying
  // updates rounds alike whatever the compiler contracts (it fused p + sum
  // x inv in some loops and not in others, and three pushes' means
  // differed in the last bit); for one update it is p + sum exactly.
  static float MovedByMean(float p, float sum, float inv) { return std::fma(sum, inv, p); }

  // Adam runs in pieces that may execute concurrently (distinct rows).
  // After accumulating a step: the touched rows of table t, in chunks.
  size_t TouchedChunks(uint32_t t, size_t chunk_rows) const;
  void ApplyTouchedChunk(uint32_t t, size_t chunk, size_t chunk_rows);
  // Forgets table t's touched rows once all its chunks ran.
  void FinishTable(uint32_t t);
  // A step with a single push needs no summing: Adam straight from the
  // block's values, rows [begin, end) of the block.
  void ApplyDirect(const wire::Block& block, size_t begin, size_t end);
  // Call before a step's pieces run: readies the step-size memo (see
  // AdamTable::ReserveSteps) for rows stepping once more.
  void PrepareStep();
  // Multiplies Adam's step size of every later update (ssp and async: 1 /
  // workers, see ps_shard.cc). 1 leaves every update bit for bit as is.
  void SetLrScale(float scale) { lr_scale_ = scale; }
  // params[row] = values of the block (initial values).
  void Assign(const wire::Block& block);
  // Values of requested rows [begin, end), packed rows x block.width, into
  // out (which points at row `begin`'s slot).
  void Gather(const wire::Block& request, size_t begin, size_t end, float* out) const;

  // Checkpoints (server/shard_checkpoint.h): the partition's state, every
  // table's parameters, (Adam on the shard) m, v and per-row step counts
  // and (delta pulls) every worker's replica, as raw little-endian arrays;
  // RestoreState refuses data of another size,
  // step counts above `step` (the checkpoint's: a row steps at most once
  // a step, so a larger count is a damaged or forged file), and values no
  // training makes: parameters or replicas beyond the wire's bound (wire::Limits::
  // max_abs_value, which pushes and pulls are held to) or not finite, m not
  // finite, v not finite or negative. A refused state leaves the store
  // partly overwritten: the caller must not serve it (gridsync-ps does not
  // start; a shard whose rollback fails is broken).
  uint64_t table_rows(uint32_t t) const { return tables_[t].params.size() / tables_[t].width; }
  uint32_t table_width(uint32_t t) const { return tables_[t].width; }
  void AppendState(std::string* out) const;
  Status RestoreState(std::string_view data, uint64_t step);
  // The bytes AppendState appends: fixed by the partition, where Adam runs
  // and the replicas, so that a checkpoint of another size is refused before
  // it is read.
  uint64_t StateBytes() const;

  // Delta pulls (compression.pull): the shard keeps, per worker, a copy of
  // what that worker's replica holds of this shard's rows, starting from the
  // initial values (Assign sets every worker's copy). A compressed pull reply
  // carries params - replica for the requested rows; the shard then adds
  // what the codec delivered to the copy, exactly as the worker adds it to
  // its replica, so what a lossy codec held back is sent again by the next
  // pull of the row (error feedback without a residual buffer). Memory:
  // (1 + workers) x the partition. Call before Assign.
  void EnableReplicas(uint32_t workers);
  bool replicas_enabled() const { return replica_workers_ != 0; }
  // Stale reads (ssp, async): out = params moved `steps_ahead` Adam steps
  // further along each row's current direction (bias-corrected step size x
  // m / (sqrt(v) + epsilon)), the look-ahead of DANA (Hakimi et al. 2019):
  // the worker computes its gradient near the parameters it will be applied
  // to, not those of `steps_ahead` steps before. Rows never stepped are
  // sent as they are. Adam on the shard only.
  void GatherAhead(const wire::Block& request, size_t begin, size_t end, float steps_ahead,
                   float* out) const;
  // out = params - replica of `worker`, rows [begin, end) of the request.
  void GatherDelta(const wire::Block& request, uint32_t worker, size_t begin, size_t end,
                   float* out) const;
  // replica of `worker` += delivered (compressed), or = values (sent whole).
  void AdvanceReplica(const wire::Block& request, uint32_t worker, size_t begin, size_t end,
                      const float* delivered, bool whole);

 private:
  // RestoreState's refusal of table t's parameters beyond the wire's bound.
  Status CheckParams(uint32_t t) const;

  struct Table {
    uint32_t width = 0;      // columns stored (owned)
    uint32_t col_begin = 0;  // first owned column
    uint32_t column_group = 0;
    HugePageVector<float> params;  // common/huge_pages.h: read and written at scattered rows
    HugePageVector<float> grad;
    std::vector<uint64_t> touched;       // one bit per local row
    std::vector<uint32_t> touched_rows;  // the same rows as a list: no scan of the bitmap
    std::vector<uint32_t> pushes;        // updates only: pushes that listed the row, per local row
    bool dense_step = false;             // a dense push this step: every row steps (MLP)
    cpu::AdamTable adam;
    std::vector<HugePageVector<float>> replicas;  // delta pulls: per worker, what it holds
  };
  // ApplyMerged, with the width known at compile time (W > 0) or at run
  // time (W = 0: `width`); local_of maps a global row id to its local row.
  template <uint32_t W, typename LocalOf>
  void MergeUpdates(const std::vector<const wire::Block*>& blocks, LocalOf local_of, uint32_t width,
                    Table* table);
  template <uint32_t W, typename LocalOf>
  void MergeAdam(const std::vector<const wire::Block*>& blocks, LocalOf local_of, uint32_t width,
                 bool dense, Table* table);
  // The merge itself: prefetch(local) for rows ahead, step(local, sum, n)
  // for each row, n pushes summing to `sum`.
  template <uint32_t W, typename LocalOf, typename Prefetch, typename Step>
  void MergeRows(const std::vector<const wire::Block*>& blocks, LocalOf local_of, uint32_t width,
                 Prefetch prefetch, Step step);
  // ApplyDirect's Adam, with the width known at compile time (W > 0: the
  // row unrolled) or at run time (W = 0: `width`).
  template <uint32_t W, typename LocalOf>
  void AdamRows(const wire::Block& block, LocalOf local_of, size_t begin, size_t end,
                uint32_t width, Table* table);
  // Calls f(local_of), where local_of(i) is the local row of the block's
  // i-th row. A sparse block on a table with one row group (one shard, or
  // columns only) maps each row to itself; the hot loops get that mapping
  // as its own type, so they load the id and index with it, nothing more.
  template <typename F>
  void WithLocalRows(const wire::Block& block, F&& f) const {
    if (!block.dense && partition_.RowGroups(block.table) == 1) {
      f([ids = block.rows.data()](size_t i) -> uint64_t { return ids[i]; });
    } else {
      f([this, &block](size_t i) { return partition_.LocalRow(block.table, block.Row(i)); });
    }
  }

  const Partition& partition_;
  uint32_t shard_;
  AdamHyper hyper_;
  float lr_scale_ = 1.0f;
  bool apply_updates_;
  std::vector<Table> tables_;
  uint32_t steps_prepared_ = 0;  // an upper bound of any row's step count
  uint32_t replica_workers_ = 0;
};

}  // namespace gridsync
