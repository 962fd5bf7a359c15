// Files for the targets whose boundary reads files (checkpoints, the params
// file): a scratch folder per process, on tmpfs when there is one, so that
// the fsyncs of the real writers (WriteFileAtomically) cost nothing and the
// disk sees no traffic; and the bytes of a file written as they are.
//
// Thread safety: libFuzzer runs one input at a time per process; a folder
// is per process (its pid), so parallel jobs never share one.
#pragma once

#include <unistd.h>

#include <cstdint>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>
#include <string_view>

namespace gridsync::fuzz {

// <tmpfs or temp>/gridsync-fuzz-<name>-<pid>, made empty at the first call
// and removed at exit.
inline const std::string& ScratchDir(const char* name) {
  static const std::string dir = [name] {
    namespace fs = std::filesystem;
    std::error_code ec;
    const fs::path base =
        fs::is_directory("/dev/shm", ec) ? fs::path("/dev/shm") : fs::temp_directory_path();
    const fs::path path =
        base / ("gridsync-fuzz-" + std::string(name) + "-" + std::to_string(::getpid()));
    fs::remove_all(path, ec);
    fs::create_directories(path);
    static std::string removed_at_exit;
    removed_at_exit = path.string();
    std::atexit([] {
      std::error_code ignored;
      std::filesystem::remove_all(removed_at_exit, ignored);
    });
    return path.string();
  }();
  return dir;
}

// Writes `bytes` to `path` as they are (the folder must exist).
inline void WriteBytes(const std::string& path, std::string_view bytes) {
  std::ofstream(path, std::ios::binary | std::ios::trunc)
      .write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
}

// Empties `dir` (the scratch folder): each input starts from no files.
inline void EmptyDir(const std::string& dir) {
  std::error_code ec;
  for (const auto& entry : std::filesystem::directory_iterator(dir, ec))
    std::filesystem::remove_all(entry.path(), ec);
}

// Part `part` of step `step` in `dir` as raw bytes: the manifest and the
// .bin the reader finds, whatever they hold.
inline void WriteRawPart(const std::string& dir, uint64_t step, const std::string& part,
                         std::string_view manifest, std::string_view bin) {
  const std::string folder = dir + "/step-" + std::to_string(step);
  std::error_code ec;
  std::filesystem::create_directories(folder, ec);
  WriteBytes(folder + "/" + part + ".json", manifest);
  WriteBytes(folder + "/" + part + ".bin", bin);
}

}  // namespace gridsync::fuzz
