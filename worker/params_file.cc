#include "worker/params_file.h"

#include <fstream>

namespace gridsync {

std::vector<float> FlattenParams(const HashGridModel& model) {
  std::vector<float> flat = model.grid_params();
  for (const auto& m : model.mlp_weights()) flat.insert(flat.end(), m.data(), m.data() + m.size());
  return flat;
}

Status WriteParams(const std::string& path, const HashGridModel& model) {
  const auto flat = FlattenParams(model);
  std::ofstream out(path, std::ios::binary);
  out.write(reinterpret_cast<const char*>(flat.data()),
            static_cast<std::streamsize>(flat.size() * sizeof(float)));
  if (!out) return Status::IOError("cannot write " + path);
  return Status::OK();
}

Result<std::vector<float>> ReadParams(const std::string& path) {
  std::ifstream in(path, std::ios::binary | std::ios::ate);
  if (!in) return Status::IOError("cannot read " + path);
  const auto size = static_cast<size_t>(in.tellg());
  if (size % sizeof(float) != 0)
    return Status::Corruption(path + ": " + std::to_string(size) + " bytes, not whole float32s");
  std::vector<float> flat(size / sizeof(float));
  in.seekg(0);
  in.read(reinterpret_cast<char*>(flat.data()), static_cast<std::streamsize>(size));
  if (!in) return Status::IOError("cannot read " + path);
  return flat;
}

}  // namespace gridsync
