#include "kernels/model_tables.h"

#include <string>

namespace gridsync {

std::vector<TableInfo> ModelTables(const HashGridLayout& layout, const cpu::MlpShape& shape) {
  std::vector<TableInfo> tables;
  for (uint32_t l = 0; l < layout.n_levels(); ++l) {
    tables.push_back({"grid.level" + std::to_string(l), layout.level(l).rows, layout.features()});
  }
  for (int i = 0; i < shape.n_matrices(); ++i) {
    tables.push_back({"mlp.weight" + std::to_string(i), static_cast<uint64_t>(shape.cols(i)),
                      static_cast<uint32_t>(shape.rows(i))});
  }
  return tables;
}

HashGridSpec GridSpecFromConfig(const Config& config, uint32_t dims) {
  HashGridSpec spec;
  spec.dims = dims;
  spec.n_levels = static_cast<uint32_t>(config.encoding.n_levels);
  spec.features = static_cast<uint32_t>(config.encoding.n_features_per_level);
  spec.log2_hashmap_size = static_cast<uint32_t>(config.encoding.log2_hashmap_size);
  spec.base_resolution = static_cast<uint32_t>(config.encoding.base_resolution);
  spec.per_level_scale = static_cast<float>(config.encoding.per_level_scale);
  return spec;
}

cpu::MlpShape MlpShapeFromConfig(const Config& config, uint32_t input_width, int outputs) {
  cpu::MlpShape shape;
  shape.input_width = static_cast<int>(input_width);
  shape.hidden_width = config.network.n_neurons;
  shape.hidden_layers = config.network.n_hidden_layers;
  shape.output_width = outputs;
  return shape;
}

AdamHyper AdamHyperFromConfig(const TrainingConfig& training) {
  AdamHyper hyper;
  hyper.learning_rate = static_cast<float>(training.learning_rate);
  return hyper;
}

Result<CodecOptions> CodecFromConfig(const CompressionConfig& compression) {
  GRIDSYNC_ASSIGN_OR_RETURN(const Codec codec, ParseCodec(compression.codec));
  CodecOptions options;
  options.codec = codec;
  options.ratio = compression.ratio;
  options.bits = compression.bits;
  options.block = static_cast<uint32_t>(compression.block);
  GRIDSYNC_RETURN_IF_ERROR(ValidateCodecOptions(options));
  return options;
}

Result<std::vector<TableInfo>> ImageModelTables(const Config& config) {
  GRIDSYNC_ASSIGN_OR_RETURN(HashGridLayout layout,
                            HashGridLayout::Make(GridSpecFromConfig(config, 2)));
  return ModelTables(layout, MlpShapeFromConfig(config, layout.output_width(), 3));
}

}  // namespace gridsync
