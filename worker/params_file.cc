#include "worker/params_file.h"

#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <string_view>

#include "common/checkpoint_files.h"
#include "common/file_bytes.h"

namespace gridsync {

namespace fs = std::filesystem;

std::vector<float> FlattenParams(const HashGridModel& model) {
  std::vector<float> flat = model.grid_params();
  for (const auto& m : model.mlp_weights()) flat.insert(flat.end(), m.data(), m.data() + m.size());
  return flat;
}

Status WriteParams(const std::string& path, const HashGridModel& model) {
  const auto flat = FlattenParams(model);
  // A new or regular file is replaced whole or not at all: a full disk left
  // a truncated file where the last run's was. Anything else (/dev/null, a
  // symbolic link the operator placed) is written through, not renamed over.
  std::error_code ec;
  const fs::file_status kind = fs::symlink_status(path, ec);
  if (!fs::exists(kind) || fs::is_regular_file(kind)) {
    return WriteFileAtomically(path, std::string_view(reinterpret_cast<const char*>(flat.data()),
                                                      flat.size() * sizeof(float)));
  }
  std::ofstream out(path, std::ios::binary);
  out.write(reinterpret_cast<const char*>(flat.data()),
            static_cast<std::streamsize>(flat.size() * sizeof(float)));
  if (!out) return Status::IOError("cannot write " + path + ": " + std::strerror(errno));
  return Status::OK();
}

Result<std::vector<float>> ReadParams(const std::string& path) {
  // The size from the file system first: a folder, a FIFO or a device is
  // refused by name before it is opened (a FIFO would be waited on, a folder
  // seemed to hold 2^63 - 1 bytes, /dev/zero none), and nothing is
  // allocated for a size that cannot hold whole float32s.
  GRIDSYNC_ASSIGN_OR_RETURN(const uint64_t size, FileSize(path));
  if (size % sizeof(float) != 0) {
    return Status::Corruption(path + ": " + std::to_string(size) +
                              " bytes, not whole float32s; allowed: a multiple of 4 bytes (what "
                              "--dump-params writes)");
  }
  GRIDSYNC_ASSIGN_OR_RETURN(const std::string bytes, ReadFileOfSize(path, size));
  std::vector<float> flat(size / sizeof(float));
  if (size > 0) std::memcpy(flat.data(), bytes.data(), size);
  return flat;
}

}  // namespace gridsync
