// libFuzzer target: the params file (worker/params_file.h: what
// --dump-params writes and ReadParams loads), on a path that is a regular
// file holding the input's bytes or, as a damaged or hostile setup may
// leave it, another kind of file: a folder, a FIFO nobody writes, a device
// that reads forever. A read gives exactly the file's float32s or a Status
// naming the file; it never hangs, nor sizes memory by anything but a
// regular file's size.
// Input: [u8 kind][file bytes]; kind % 4: regular file, folder, FIFO,
// symlink to /dev/zero.
#include <sys/stat.h>

#include <cstdint>
#include <cstring>
#include <filesystem>
#include <string>

#include "fuzz/fuzz_files.h"
#include "fuzz/fuzz_input.h"
#include "worker/params_file.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  namespace fs = std::filesystem;
  gridsync::fuzz::FuzzInput in(data, size);
  const int kind = in.Take<uint8_t>() % 4;
  const std::string bytes = in.Rest();
  const std::string path = gridsync::fuzz::ScratchDir("params-file") + "/params.bin";
  std::error_code ec;
  fs::remove_all(path, ec);
  switch (kind) {
    case 0:
      gridsync::fuzz::WriteBytes(path, bytes);
      break;
    case 1:
      fs::create_directory(path, ec);
      break;
    case 2:
      if (::mkfifo(path.c_str(), 0600) != 0) __builtin_trap();
      break;
    default:
      fs::create_symlink("/dev/zero", path, ec);
  }
  const auto params = gridsync::ReadParams(path);
  if (kind != 0) {
    if (params.ok() || params.status().message().find(path) == std::string::npos)
      __builtin_trap();  // no file of floats, and the refusal names it
    return 0;
  }
  // Whole float32s are read as they are; anything else is refused.
  if (params.ok() != (bytes.size() % sizeof(float) == 0)) __builtin_trap();
  if (!params.ok()) {
    if (params.status().message().find(path) == std::string::npos) __builtin_trap();
    return 0;
  }
  if (params->size() * sizeof(float) != bytes.size()) __builtin_trap();
  if (!bytes.empty() && std::memcmp(params->data(), bytes.data(), bytes.size()) != 0)
    __builtin_trap();
  return 0;
}
