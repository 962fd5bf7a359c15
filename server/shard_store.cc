#include "server/shard_store.h"

#include <bit>
#include <cstring>
#include <string>

namespace gridsync {

ShardStore::ShardStore(const Partition& partition, uint32_t shard, const AdamHyper& hyper)
    : partition_(partition), shard_(shard), hyper_(hyper) {
  tables_.resize(partition.n_tables());
  for (uint32_t t = 0; t < partition.n_tables(); ++t) {
    Table& table = tables_[t];
    table.column_group = partition.ColumnGroupOf(shard, t);
    table.width = partition.ColWidth(t);
    table.col_begin = partition.ColBegin(t, table.column_group);
    const uint64_t rows = partition.LocalRows(shard, t);
    table.params.assign(rows * table.width, 0.0f);
    table.grad.assign(rows * table.width, 0.0f);
    table.touched.assign((rows + 63) / 64, 0);
    table.adam.Resize(rows, table.width);
  }
}

uint64_t ShardStore::owned_rows() const {
  uint64_t rows = 0;
  for (uint32_t t = 0; t < n_tables(); ++t) rows += partition_.OwnedRows(shard_, t);
  return rows;
}

Status ShardStore::CheckOwnership(const wire::Block& block) const {
  const Table& table = tables_[block.table];
  const auto& info = partition_.table(block.table);
  if (block.col_begin != table.col_begin || block.width != table.width) {
    return Status::InvalidArgument(
        "table " + std::to_string(block.table) + " (" + info.name + "): columns [" +
        std::to_string(block.col_begin) + ", " + std::to_string(block.col_begin + block.width) +
        ") are not this shard's; allowed: exactly columns [" + std::to_string(table.col_begin) +
        ", " + std::to_string(table.col_begin + table.width) + ") on shard " +
        std::to_string(shard_));
  }
  // Rows come in whole blocks, so checking the first row of each run of
  // rows in one block is enough.
  uint32_t last_block = UINT32_MAX;
  for (size_t i = 0; i < block.row_count; ++i) {
    const uint32_t row = block.Row(i);
    if (row / kRowBlock == last_block) continue;
    last_block = row / kRowBlock;
    const uint32_t owner = partition_.Owner(block.table, row, table.column_group);
    if (owner != shard_) {
      return Status::InvalidArgument("table " + std::to_string(block.table) + " (" + info.name +
                                     "): row " + std::to_string(row) + " belongs to shard " +
                                     std::to_string(owner) + ", not shard " +
                                     std::to_string(shard_) +
                                     "; allowed: rows of this shard's blocks (common/sharding.h)");
    }
  }
  return Status::OK();
}

void ShardStore::Accumulate(const wire::Block& block) {
  Table& table = tables_[block.table];
  const uint32_t w = table.width;
  for (size_t i = 0; i < block.row_count; ++i) {
    const uint64_t local = partition_.LocalRow(block.table, block.Row(i));
    float* g = table.grad.data() + local * w;
    const float* v = block.values.data() + i * w;
    for (uint32_t f = 0; f < w; ++f) g[f] += v[f];
    table.touched[local >> 6] |= uint64_t{1} << (local & 63);
  }
}

uint64_t ShardStore::ApplyTable(uint32_t t) {
  Table& table = tables_[t];
  const uint32_t w = table.width;
  SparseRows& rows = table.scratch;
  rows.clear();
  rows.width = w;
  for (size_t word_index = 0; word_index < table.touched.size(); ++word_index) {
    for (uint64_t word = table.touched[word_index]; word != 0; word &= word - 1) {
      const uint64_t local = word_index * 64 + std::countr_zero(word);
      rows.rows.push_back(static_cast<uint32_t>(local));
      float* g = table.grad.data() + local * w;
      rows.values.insert(rows.values.end(), g, g + w);
      std::memset(g, 0, w * sizeof(float));
    }
    table.touched[word_index] = 0;
  }
  cpu::AdamUpdateRows(hyper_, rows, 1.0f, table.params.data(), &table.adam);
  return rows.size();
}

void ShardStore::Assign(const wire::Block& block) {
  Table& table = tables_[block.table];
  const uint32_t w = table.width;
  for (size_t i = 0; i < block.row_count; ++i) {
    const uint64_t local = partition_.LocalRow(block.table, block.Row(i));
    std::memcpy(table.params.data() + local * w, block.values.data() + i * w, w * sizeof(float));
  }
}

void ShardStore::Gather(const wire::Block& request, float* out) const {
  const Table& table = tables_[request.table];
  const uint32_t w = table.width;
  for (size_t i = 0; i < request.row_count; ++i) {
    const uint64_t local = partition_.LocalRow(request.table, request.Row(i));
    std::memcpy(out + i * w, table.params.data() + local * w, w * sizeof(float));
  }
}

}  // namespace gridsync
