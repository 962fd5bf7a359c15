// The load bench's shard process (bench_load_shard.h).
#include "tools/bench_load_shard.h"

#include <dirent.h>
#include <poll.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <csignal>
#include <cstdio>
#include <fstream>
#include <sstream>
#include <string>
#include <thread>

#include "common/host_memory.h"
#include "common/message_heap.h"
#ifdef __GLIBC__
#include <malloc.h>
#endif

#include "server/ps_shard.h"
#include "tools/bench_cpu.h"
#include "tools/bench_pipe.h"

namespace gridsync::bench::load {
namespace {

using Clock = std::chrono::steady_clock;

// Threads of this process (the entries of /proc/self/task); 0 if unreadable.
int CountThreads() {
  DIR* dir = opendir("/proc/self/task");
  if (dir == nullptr) return 0;
  int n = 0;
  while (const dirent* entry = readdir(dir)) {
    if (entry->d_name[0] != '.') ++n;
  }
  closedir(dir);
  return n;
}

// ---- the child ----

ShardReading ReadSelf(const PsShard* shard) {
  ShardReading r;
  if (shard != nullptr) {
    const wire::ShardStats stats = shard->stats();
    r.pushes = stats.pushes;
    r.applied_steps = stats.applied_steps;
    r.pulls = stats.pulls;
    r.errors = stats.errors;
    const ServingStats serving = shard->serving_stats();
    r.waiting_pulls = serving.waiting_pulls;
    for (const auto& [reason, count] : serving.refusals) r.refusals += count;
  }
  const ProcessMemory memory = ReadProcessMemory();
  r.rss = memory.rss;
  r.hwm = memory.hwm;
  r.cpu_seconds = SelfCpuSeconds();
  return r;
}

std::string Format(const ShardReading& r) {
  char line[512];
  std::snprintf(
      line, sizeof(line), "%llu %llu %llu %llu %llu %llu %llu %llu %d %.6f",
      static_cast<unsigned long long>(r.pushes), static_cast<unsigned long long>(r.applied_steps),
      static_cast<unsigned long long>(r.pulls), static_cast<unsigned long long>(r.errors),
      static_cast<unsigned long long>(r.refusals), static_cast<unsigned long long>(r.waiting_pulls),
      static_cast<unsigned long long>(r.rss), static_cast<unsigned long long>(r.hwm),
      r.hwm_reset ? 1 : 0, r.cpu_seconds);
  return line;
}

bool Parse(std::istringstream& in, ShardReading* r) {
  int reset = 0;
  in >> r->pushes >> r->applied_steps >> r->pulls >> r->errors >> r->refusals >> r->waiting_pulls >>
      r->rss >> r->hwm >> reset >> r->cpu_seconds;
  r->hwm_reset = reset != 0;
  return static_cast<bool>(in);
}

// Reads one command line from `fd` (blocking); false on EOF or error.
bool ReadCommand(int fd, std::string* pending, std::string* command) {
  for (;;) {
    if (const size_t eol = pending->find('\n'); eol != std::string::npos) {
      *command = pending->substr(0, eol);
      pending->erase(0, eol + 1);
      return true;
    }
    char buffer[256];
    const ssize_t n = read(fd, buffer, sizeof(buffer));
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return false;
    pending->append(buffer, static_cast<size_t>(n));
  }
}

// The child after fork(): starts the shard, reports, serves commands until
// "stop" or EOF, and leaves with _exit (nothing of the parent's runs twice).
[[noreturn]] void ShardMain(const Partition& partition, uint32_t workers,
                            std::chrono::milliseconds timeout, pid_t parent, int control_fd,
                            int report_fd) {
  // Never outlive the bench; the getppid check covers a parent that died
  // before prctl.
  if (prctl(PR_SET_PDEATHSIG, SIGKILL) != 0 || getppid() != parent) _exit(1);
    // The parent's free memory, copied with it, given back before the
    // baseline (the parent trimmed before forking too).
#ifdef __GLIBC__
  malloc_trim(0);
#endif
  // As gridsync-ps does (common/message_heap.h).
  if (!TuneHeapForMessages())
    std::fprintf(stderr, "load shard: the heap thresholds were refused\n");
  const ShardReading before = ReadSelf(nullptr);
  ShardOptions options;
  options.endpoint = "tcp://127.0.0.1:0";
  options.workers = workers;
  options.connections = ShardConnectionLimits(workers);
  options.consistency = Consistency::kAsync;
  options.timeout = timeout;
  auto shard = PsShard::Start(partition, options);
  if (!shard.ok()) {
    std::string message = shard.status().ToString();
    for (char& c : message) c = c == '\n' ? ' ' : c;
    WriteAll(report_fd, "error " + message + "\n");
    _exit(1);
  }
  if (!WriteAll(report_fd, "ready " + (*shard)->endpoint() + " " + Format(before) + "\n")) {
    _exit(1);
  }
  std::string pending, command;
  bool hwm_reset = false;
  while (ReadCommand(control_fd, &pending, &command) && command != "stop") {
    if (command == "trim") {
#ifdef __GLIBC__
      malloc_trim(0);
#endif
    } else if (command == "peak") {
      std::ofstream clear("/proc/self/clear_refs");
      clear << "5";
      clear.flush();
      hwm_reset = static_cast<bool>(clear);
    } else if (command != "read") {
      WriteAll(report_fd, "error unknown command '" + command + "'\n");
      continue;
    }
    ShardReading r = ReadSelf(shard->get());
    r.hwm_reset = hwm_reset;
    if (!WriteAll(report_fd, "ok " + Format(r) + "\n")) break;
  }
  (*shard)->Stop();
  shard->reset();
  _exit(0);
}

}  // namespace

Result<std::unique_ptr<ShardProcess>> ShardProcess::Fork(const Partition& partition,
                                                         uint32_t workers,
                                                         std::chrono::milliseconds timeout) {
  // A thread just joined may stay listed a moment longer: wait for it
  // (up to a second) before calling it one still running.
  int threads = CountThreads();
  for (int i = 0; i < 100 && threads != 1; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
    threads = CountThreads();
  }
  if (threads != 1) {
    return Status::Internal("cannot fork the shard process: this process runs " +
                            std::to_string(threads) +
                            " threads (allowed: 1, so that no lock is copied held)");
  }
  // A child gone mid-run is reported from the failed write (EPIPE), not
  // by a SIGPIPE that ends the bench without a word.
  std::signal(SIGPIPE, SIG_IGN);
  std::fflush(stdout);
  std::fflush(stderr);
#ifdef __GLIBC__
  malloc_trim(0);  // less of this process's memory for the child to start with
#endif
  const pid_t parent = getpid();
  GRIDSYNC_ASSIGN_OR_RETURN(const PipedChild forked, ForkPiped(
                                                         [&](int control_fd, int report_fd) {
                                                           ShardMain(partition, workers, timeout,
                                                                     parent, control_fd, report_fd);
                                                         },
                                                         [] {}));
  std::unique_ptr<ShardProcess> child(
      new ShardProcess(forked.pid, forked.control_fd, forked.report_fd, timeout));
  GRIDSYNC_ASSIGN_OR_RETURN(const std::string line, child->ReadLine("its endpoint"));
  std::istringstream in(line);
  std::string word;
  in >> word;
  if (word == "ready" && (in >> child->endpoint_) && Parse(in, &child->at_start_)) return child;
  return Status::Internal(child->Describe() + " did not start: " + line);
}

ShardProcess::~ShardProcess() {
  CloseFd(&control_fd_);
  CloseFd(&report_fd_);
  if (!reaped_) {
    kill(pid_, SIGKILL);
    ReapChild(pid_);
  }
}

std::string ShardProcess::Describe() const {
  return "the load bench's shard process (pid " + std::to_string(pid_) + ")";
}

Result<std::string> ShardProcess::ReadLine(const char* awaiting) {
  // The child answers from its main thread, which only waits for commands:
  // the shard's own timeout bounds anything it could be waiting on.
  const auto deadline = Clock::now() + timeout_ + std::chrono::seconds(5);
  for (;;) {
    if (const size_t eol = pending_.find('\n'); eol != std::string::npos) {
      std::string line = pending_.substr(0, eol);
      pending_.erase(0, eol + 1);
      return line;
    }
    const auto left =
        std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now()).count();
    if (left <= 0) {
      return Status::Timeout(Describe() + " did not answer with " + awaiting + " within " +
                             std::to_string(timeout_.count() + 5000) + " ms");
    }
    pollfd fd{report_fd_, POLLIN, 0};
    const int ready = poll(&fd, 1, static_cast<int>(left));
    if (ready < 0 && errno == EINTR) continue;
    if (ready < 0) return Status::IOError(Errno("poll on the shard process's pipe"));
    if (ready == 0) continue;
    char buffer[1024];
    const ssize_t n = read(report_fd_, buffer, sizeof(buffer));
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) return Status::IOError(Errno("read from the shard process's pipe"));
    if (n == 0) {
      const int wstatus = ReapChild(pid_);
      reaped_ = true;
      return Status::Internal(Describe() + " " + DescribeExit(wstatus) + " before " + awaiting +
                              " (its error, if any, is above)");
    }
    pending_.append(buffer, static_cast<size_t>(n));
  }
}

Result<ShardReading> ShardProcess::Command(const char* command) {
  if (reaped_) return Status::IOError(Describe() + " is gone (sending '" + command + "')");
  if (!WriteAll(control_fd_, std::string(command) + "\n")) {
    // EPIPE: the child closed its end, which it does only by exiting.
    const std::string why = Errno("write");
    kill(pid_, SIGKILL);
    const int wstatus = ReapChild(pid_);
    reaped_ = true;
    return Status::IOError(Describe() + " " + DescribeExit(wstatus) + " (sending '" + command +
                           "': " + why + ")");
  }
  GRIDSYNC_ASSIGN_OR_RETURN(const std::string line,
                            ReadLine((std::string("its answer to '") + command + "'").c_str()));
  std::istringstream in(line);
  std::string word;
  in >> word;
  ShardReading r;
  if (word == "ok" && Parse(in, &r)) return r;
  return Status::Internal(Describe() + " answered '" + command + "' with: " + line);
}

Status ShardProcess::Stop() {
  if (reaped_) return Status::Internal(Describe() + " had already exited");
  WriteAll(control_fd_, "stop\n");
  CloseFd(&control_fd_);
  // The shard's Stop joins its threads, each bounded by its timeout.
  const auto deadline = Clock::now() + timeout_ + std::chrono::seconds(5);
  int wstatus = -1;
  for (;;) {
    const pid_t got = waitpid(pid_, &wstatus, WNOHANG);
    if (got == pid_) break;
    if (got < 0 && errno != EINTR) {
      wstatus = -1;
      break;
    }
    if (Clock::now() >= deadline) {
      kill(pid_, SIGKILL);
      wstatus = ReapChild(pid_);
      reaped_ = true;
      return Status::Timeout(Describe() + " did not stop within " +
                             std::to_string(timeout_.count() + 5000) + " ms; killed");
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  reaped_ = true;
  if (WIFEXITED(wstatus) && WEXITSTATUS(wstatus) == 0) return Status::OK();
  return Status::Internal(Describe() + " " + DescribeExit(wstatus) + " when stopped");
}

}  // namespace gridsync::bench::load
