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

}  // namespace gridsync
