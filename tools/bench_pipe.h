// Pipes and child processes for the benches that fork their peers
// (allreduce's ranks, load's shard): whole reads and writes that retry on
// EINTR, and a child's exit in words.
//
// Thread safety: reentrant; a descriptor is used by one thread at a time.
#pragma once

#include <fcntl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <string>
#include <string_view>

#include "common/status.h"

namespace gridsync::bench {

inline std::string Errno(const char* what) {
  return std::string(what) + ": " + std::strerror(errno);
}

// Writes all of `text`, retrying on EINTR and short writes.
inline bool WriteAll(int fd, std::string_view text) {
  while (!text.empty()) {
    const ssize_t n = write(fd, text.data(), text.size());
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return false;
    text.remove_prefix(static_cast<size_t>(n));
  }
  return true;
}

// Reads exactly `size` bytes; false on EOF or error.
inline bool ReadAll(int fd, void* data, size_t size) {
  auto* at = static_cast<char*>(data);
  while (size > 0) {
    const ssize_t n = read(fd, at, size);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return false;
    at += n;
    size -= static_cast<size_t>(n);
  }
  return true;
}

inline void CloseFd(int* fd) {
  if (*fd >= 0) close(*fd);
  *fd = -1;
}

// How a child ended, from its wait status (-1: it could not be waited for).
// A child run through sh that exits 127 or 126 is the shell saying it could
// not find or run the program.
inline std::string DescribeExit(int wstatus) {
  if (wstatus == -1) return "could not be waited for";
  if (WIFSIGNALED(wstatus)) return "was killed by signal " + std::to_string(WTERMSIG(wstatus));
  const int code = WEXITSTATUS(wstatus);
  return "exited with status " + std::to_string(code) +
         (code == 127   ? " (the shell found no such program)"
          : code == 126 ? " (the shell could not run the program)"
                        : "");
}

// `s` as one word of a sh command line, whatever it holds: single-quoted,
// each ' closed, escaped and reopened. Paths and flags a user gives reach
// popen only so (a --python holding a space ran its first word; one holding
// "; cmd" ran cmd).
inline std::string ShellQuote(const std::string& s) {
  std::string out = "'";
  for (char c : s) out += c == '\'' ? std::string("'\\''") : std::string(1, c);
  return out + "'";
}

// Waits for child `pid`; returns its wait status (-1 if waitpid failed).
inline int ReapChild(pid_t pid) {
  int wstatus = -1;
  while (waitpid(pid, &wstatus, 0) < 0) {
    if (errno != EINTR) return -1;
  }
  return wstatus;
}

// A forked child and the parent's ends of its two pipes: control (the
// parent writes) and report (the child writes).
struct PipedChild {
  pid_t pid = -1;
  int control_fd = -1;
  int report_fd = -1;
};

// Forks with two close-on-exec pipes (a peer started later through popen
// must not hold them). In the child, `child(control_read, report_write)`
// runs and must not return (it ends with _exit); `in_child_first` runs
// before it (closing descriptors the child must not hold). Call while this
// process runs one thread.
template <typename Child, typename First>
Result<PipedChild> ForkPiped(Child&& child, First&& in_child_first) {
  int control[2];
  int report[2];
  if (pipe2(control, O_CLOEXEC) != 0) return Status::IOError(Errno("pipe"));
  if (pipe2(report, O_CLOEXEC) != 0) {
    close(control[0]);
    close(control[1]);
    return Status::IOError(Errno("pipe"));
  }
  const pid_t pid = fork();
  if (pid == 0) {
    in_child_first();
    close(control[1]);
    close(report[0]);
    child(control[0], report[1]);
    _exit(1);  // (child must not return)
  }
  close(control[0]);
  close(report[1]);
  if (pid < 0) {
    close(control[1]);
    close(report[0]);
    return Status::IOError(Errno("fork"));
  }
  return PipedChild{pid, control[1], report[0]};
}

}  // namespace gridsync::bench
