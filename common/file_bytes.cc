// Reading a file whose size is checked first (file_bytes.h).
#include "common/file_bytes.h"

#include <fcntl.h>
#include <spdlog/fmt/fmt.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <filesystem>
#include <functional>
#include <span>
#include <string_view>
#include <vector>

#include "common/config.h"

namespace gridsync {

namespace fs = std::filesystem;

const char* FileKindName(unsigned int st_mode) {
  return S_ISREG(st_mode)    ? "a regular file"
         : S_ISDIR(st_mode)  ? "a folder"
         : S_ISFIFO(st_mode) ? "a FIFO"
         : S_ISCHR(st_mode)  ? "a character device"
         : S_ISBLK(st_mode)  ? "a block device"
         : S_ISSOCK(st_mode) ? "a socket"
                             : "no regular file";
}

Result<uint64_t> FileSize(const std::string& path) {
  std::error_code ec;
  const fs::file_status status = fs::status(path, ec);
  if (!fs::exists(status)) return Status::NotFound("cannot read " + path + ": no such file");
  if (ec) return Status::IOError("cannot look at " + path + ": " + ec.message());
  if (!fs::is_regular_file(status)) {
    return Status::IOError(path + " is no regular file; allowed: a file gridsync wrote");
  }
  const uintmax_t size = fs::file_size(path, ec);
  if (ec) return Status::IOError("cannot take the size of " + path + ": " + ec.message());
  return static_cast<uint64_t>(size);
}

namespace {

// Reads exactly `size` bytes of `path` (ReadFileOfSize's checks): each read
// goes to the memory `into(got)` gives for the bytes from offset `got` on
// (never empty while got < size), and `took` sees what it brought.
Status ReadSizedFile(const std::string& path, uint64_t size,
                     const std::function<std::span<char>(uint64_t got)>& into,
                     const std::function<void(std::string_view)>& took) {
  // Non-blocking: had the file become a FIFO since FileSize, the open
  // would wait for a writer (for a regular file the flag changes nothing).
  const int fd = ::open(path.c_str(), O_RDONLY | O_NONBLOCK | O_CLOEXEC);
  if (fd < 0) {
    return Status::IOError("cannot read " + path + ": " + std::strerror(errno) +
                           "; allowed: a file this process may read");
  }
  uint64_t got = 0;
  bool more = false;
  int error = 0;
  // Until `size` bytes or the end, then one byte more: a file that grew
  // since its size was taken is refused too, never cut short silently.
  while (error == 0) {
    char extra = 0;
    const std::span<char> at = got < size ? into(got) : std::span<char>(&extra, 1);
    const ssize_t n = ::read(fd, at.data(), at.size());
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) error = errno;
    if (n <= 0) break;
    if (got == size) {
      more = true;
      break;
    }
    took(std::string_view(at.data(), static_cast<size_t>(n)));
    got += static_cast<uint64_t>(n);
  }
  ::close(fd);
  if (error != 0) {
    return Status::IOError("cannot read " + path + ": " + std::strerror(error) +
                           "; allowed: a readable regular file");
  }
  if (got != size || more) {
    return Status::IOError(fmt::format(
        "{}: {} bytes where its size said {} (it changed while read, or is a kernel file whose "
        "size says nothing); allowed: a regular file that holds still while it is read",
        path, more ? "more" : std::to_string(got), size));
  }
  return Status::OK();
}

}  // namespace

Result<std::string> ReadFileOfSize(const std::string& path, uint64_t size) {
  std::string bytes;
  try {
    bytes.resize(size);
  } catch (const std::exception&) {  // std::bad_alloc, or std::length_error past max_size()
    return Status::IOError(fmt::format("{}: {} bytes do not fit in memory", path, size));
  }
  GRIDSYNC_RETURN_IF_ERROR(ReadSizedFile(
      path, size,
      [&](uint64_t got) {
        return std::span<char>(bytes.data() + got, static_cast<size_t>(size - got));
      },
      [](std::string_view) {}));
  return bytes;
}

Status ReadFileInPieces(const std::string& path, uint64_t size,
                        const std::function<void(std::string_view)>& piece) {
  constexpr size_t kPieceBytes = size_t{4} << 20;
  std::vector<char> buffer(static_cast<size_t>(std::min<uint64_t>(size, kPieceBytes)) + 1);
  return ReadSizedFile(
      path, size,
      [&](uint64_t got) {
        return std::span<char>(buffer.data(),
                               static_cast<size_t>(std::min<uint64_t>(size - got, kPieceBytes)));
      },
      piece);
}

namespace {

// A name on the way to `folder` (the folder itself, or one of the parents
// that do not exist) that is a symbolic link to nothing: the folder cannot
// be made through it, and create_directories said only "File exists"
// (check-config passed it, the processes refused it at their start).
Status CheckNoDanglingLink(const std::string& folder) {
  namespace fs = std::filesystem;
  std::error_code ec;
  for (fs::path at = folder; !at.empty() && !fs::exists(at, ec); at = at.parent_path()) {
    if (fs::is_symlink(fs::symlink_status(at, ec))) {
      return Status::IOError("cannot create folder '" + folder + "': '" + at.string() +
                             "' is a symbolic link to '" + fs::read_symlink(at, ec).string() +
                             "', which does not exist; allowed: a folder this process can "
                             "create and write (make the link's target, or remove the link)");
    }
    if (at == at.parent_path()) break;
  }
  return Status::OK();
}

// CheckWritableFolder without leaving anything: the nearest of the
// folder's parents that exists must take a new folder (one is made there
// and removed: the permission bits alone say nothing for root, and /proc
// takes none).
Status CheckFolderCouldBeMade(const std::string& folder) {
  namespace fs = std::filesystem;
  std::error_code ec;
  GRIDSYNC_RETURN_IF_ERROR(CheckNoDanglingLink(folder));
  fs::path existing = fs::path(folder).parent_path();
  while (!existing.empty() && !fs::exists(existing, ec)) existing = existing.parent_path();
  if (existing.empty()) existing = ".";
  if (!fs::is_directory(existing, ec)) {
    return Status::IOError("cannot create folder '" + folder + "': '" + existing.string() +
                           "' is not a folder; allowed: a folder this process can create and "
                           "write");
  }
  std::string probe = (existing / ".gridsync-folder-test-XXXXXX").string();
  if (::mkdtemp(probe.data()) == nullptr) {
    return Status::IOError("cannot create folder '" + folder + "': cannot create a folder in '" +
                           existing.string() + "': " + std::strerror(errno) +
                           "; allowed: a folder this process can create and write");
  }
  ::rmdir(probe.c_str());
  return Status::OK();
}

}  // namespace

Status CheckWritableFolder(const std::string& folder, bool create) {
  std::error_code ec;
  if (!create && !std::filesystem::exists(folder, ec)) return CheckFolderCouldBeMade(folder);
  GRIDSYNC_RETURN_IF_ERROR(CheckNoDanglingLink(folder));
  std::filesystem::create_directories(folder, ec);
  if (ec) {
    return Status::IOError("cannot create folder '" + folder + "': " + ec.message() +
                           "; allowed: a folder this process can create and write");
  }
  const auto probe =
      std::filesystem::path(folder) / (".gridsync-write-test-" + std::to_string(::getpid()));
  std::FILE* f = std::fopen(probe.c_str(), "wb");
  if (f == nullptr) {
    return Status::IOError("cannot write in folder '" + folder + "': " + std::strerror(errno) +
                           "; allowed: a folder this process can write");
  }
  std::fclose(f);
  std::filesystem::remove(probe, ec);
  return Status::OK();
}

Status CheckTaskOutput(const std::string& folder, bool create) {
  GRIDSYNC_RETURN_IF_ERROR(CheckWritableFolder(folder, create));
  const auto file = std::filesystem::path(folder) / kReconstructionFile;
  std::error_code ec;
  if (std::filesystem::is_directory(file, ec)) {
    // Not "'" + file.string(): GCC 12 warns (-Wrestrict, a false positive)
    // inside the operator+ that starts from a literal.
    std::string quoted = file.string();
    quoted.insert(quoted.begin(), '\'');
    return Status::IOError(quoted +
                           "' is a folder, where the run writes its reconstruction; allowed: "
                           "a file there (or none), or another task.output");
  }
  return Status::OK();
}

Status CheckOutputFile(const std::string& path, bool create) {
  std::error_code ec;
  if (std::filesystem::is_directory(path, ec))
    return Status::InvalidArgument(path + ": is a folder; allowed: a file to write");
  const std::string folder = std::filesystem::path(path).parent_path().string();
  if (auto writable = CheckWritableFolder(folder.empty() ? "." : folder, create); !writable.ok())
    return Status::InvalidArgument(path + ": " + writable.message());
  // Its folder is not there and may not be made: nothing more to try.
  if (!create && !std::filesystem::exists(folder.empty() ? "." : folder, ec)) return Status::OK();
  // A file that is not there is made by the write, in a folder shown
  // writable above: nothing is created to check it (the check made one
  // through a link to nothing, and removed the link instead of the file it
  // had made). One that is there (through a link too) must open for
  // writing, not created, not truncated.
  if (!std::filesystem::exists(path, ec)) return Status::OK();
  // Non-blocking: a FIFO with no reader would hold the open forever.
  const int probe = ::open(path.c_str(), O_WRONLY | O_APPEND | O_NONBLOCK | O_CLOEXEC);
  if (probe < 0) {
    return Status::InvalidArgument(path + ": cannot write it: " + std::strerror(errno) +
                                   "; allowed: a file this process can write");
  }
  ::close(probe);
  return Status::OK();
}

}  // namespace gridsync
