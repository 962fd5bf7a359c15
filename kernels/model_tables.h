// The model's parameters as the PS sees them: tables of rows x width floats.
// Tables 0..L-1 are the hash-grid levels (width = features per level); then
// one table per MLP weight matrix, stored column-major, so table row j is
// column j of the matrix (width = the matrix's row count).
//
// Thread safety: pure functions.
#pragma once

#include <vector>

#include "common/cluster_map.h"
#include "kernels/cpu/mlp.h"
#include "kernels/hash_grid_layout.h"

namespace gridsync {

std::vector<TableInfo> ModelTables(const HashGridLayout& layout, const cpu::MlpShape& shape);

// The model a config describes, with these tables: spec/run_spec.h.

}  // namespace gridsync
