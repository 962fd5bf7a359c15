// The parameters one PS shard owns, with their Adam state: for every table,
// the shard's blocks of rows (and, under column partitioning, its columns),
// stored compactly in local row order (see common/sharding.h).
//
// Gradients are summed per table into a dense buffer with a touched-row
// bitmap, then Adam runs on the touched rows only; rows no push touched are
// never updated. Callers sum pushes in worker-rank order, which fixes the
// float reduction order and makes results reproducible bit for bit.
//
// Thread safety: not thread-safe as a whole; calls for different tables may
// run concurrently (each touches only its table's state).
#pragma once

#include <cstdint>
#include <vector>

#include "common/sharding.h"
#include "common/sparse_rows.h"
#include "common/status.h"
#include "common/wire/message.h"
#include "kernels/adam_math.h"
#include "kernels/cpu/adam.h"

namespace gridsync {

class ShardStore {
 public:
  ShardStore(const Partition& partition, uint32_t shard, const AdamHyper& hyper);

  uint32_t shard() const { return shard_; }
  uint32_t n_tables() const { return static_cast<uint32_t>(tables_.size()); }
  uint64_t owned_rows() const;

  // Refuses a block with a row or columns this shard does not own, naming
  // the first offending row and its owner. Changes nothing.
  Status CheckOwnership(const wire::Block& block) const;

  // grad[row] += values of the block (after ownership was checked).
  void Accumulate(const wire::Block& block);
  // Adam on the rows of table t touched since the last call; clears them.
  // Returns the number of rows updated.
  uint64_t ApplyTable(uint32_t t);
  // params[row] = values of the block (initial values).
  void Assign(const wire::Block& block);
  // Values of the requested rows, packed rows x block.width.
  void Gather(const wire::Block& request, float* out) const;

 private:
  struct Table {
    uint32_t width = 0;      // columns stored (owned)
    uint32_t col_begin = 0;  // first owned column
    uint32_t column_group = 0;
    std::vector<float> params;
    std::vector<float> grad;
    std::vector<uint64_t> touched;  // one bit per local row
    cpu::AdamTable adam;
    SparseRows scratch;
  };

  const Partition& partition_;
  uint32_t shard_;
  AdamHyper hyper_;
  std::vector<Table> tables_;
};

}  // namespace gridsync
