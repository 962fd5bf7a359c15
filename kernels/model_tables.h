// The model's parameters as the PS sees them: tables of rows x width floats.
// Tables 0..L-1 are the hash-grid levels (width = features per level); then
// one table per MLP weight matrix, stored column-major, so table row j is
// column j of the matrix (width = the matrix's row count).
//
// Thread safety: pure functions.
#pragma once

#include <vector>

#include "common/cluster_map.h"
#include "common/config.h"
#include "common/status.h"
#include "kernels/adam_math.h"
#include "kernels/cpu/codec.h"
#include "kernels/cpu/mlp.h"
#include "kernels/hash_grid_layout.h"

namespace gridsync {

std::vector<TableInfo> ModelTables(const HashGridLayout& layout, const cpu::MlpShape& shape);

// The tables of the image task's model for `config` (2D grid, RGB output).
Result<std::vector<TableInfo>> ImageModelTables(const Config& config);

// The grid spec and MLP shape `config` describes, for `dims` and `outputs`.
HashGridSpec GridSpecFromConfig(const Config& config, uint32_t dims);
cpu::MlpShape MlpShapeFromConfig(const Config& config, uint32_t input_width, int outputs);

// Adam's hyper-parameters for `training` (the learning rate; betas and
// epsilon are tiny-cuda-nn's, kernels/adam_math.h).
AdamHyper AdamHyperFromConfig(const TrainingConfig& training);

// The codec the `compression` section describes.
Result<CodecOptions> CodecFromConfig(const CompressionConfig& compression);

}  // namespace gridsync
