#include "tools/launch_children.h"

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <thread>

#include "common/checkpoint_files.h"
#include "common/config.h"

namespace gridsync::launch_detail {

std::chrono::milliseconds RestartDelay(int restart, std::chrono::milliseconds timeout) {
  if (restart <= 1) return std::chrono::milliseconds(0);
  const int doublings = std::min(restart - 2, 20);
  const std::chrono::milliseconds delay(int64_t{500} << doublings);
  return std::min(delay, timeout / 2);
}

Child Spawn(const std::string& name, const std::vector<std::string>& argv, const Env& env,
            bool is_worker) {
  Child child;
  child.name = name;
  child.is_worker = is_worker;
  child.argv = argv;
  child.env = env;
  int fds[2];
  if (pipe2(fds, O_CLOEXEC) != 0) {
    std::perror("gridsync launch: pipe");
    return child;
  }
  const pid_t parent = getpid();
  // The stop signals blocked around fork: a SIGTERM the launcher sends a
  // child between its fork and its exec would otherwise run the launcher's
  // copied handler there and vanish at exec, and the child would live on
  // until the grace period's SIGKILL. The child restores the defaults and
  // then takes what is pending.
  sigset_t stops, before;
  sigemptyset(&stops);
  for (int s : {SIGINT, SIGTERM, SIGHUP}) sigaddset(&stops, s);
  sigprocmask(SIG_BLOCK, &stops, &before);
  const pid_t pid = fork();
  if (pid == 0) {
    signal(SIGINT, SIG_DFL);
    signal(SIGTERM, SIG_DFL);
    signal(SIGHUP, SIG_DFL);
    // No orphan if the launcher dies without cleaning up (SIGKILL, crash).
    // SIGKILL, not SIGTERM: a stopped child (SIGSTOP, a debugger) would
    // hold SIGTERM pending forever and outlive the launcher.
    prctl(PR_SET_PDEATHSIG, SIGKILL);
    if (getppid() != parent) _exit(127);
    // SIGHUP blocked across exec (a mask survives it, a handler does not):
    // a closed terminal's hangup in the child's first milliseconds, before
    // its main blocks SIGHUP itself (ops/service_watchdog.h), killed it.
    // Pending, it reaches the child's sigwait thread, which logs it.
    sigset_t child_mask = before;
    sigaddset(&child_mask, SIGHUP);
    sigdelset(&child_mask, SIGINT);
    sigdelset(&child_mask, SIGTERM);
    sigprocmask(SIG_SETMASK, &child_mask, nullptr);
    // The launcher's own watchdog settings (it may run under systemd) are
    // not the child's: a WATCHDOG_PID of the launcher turned a server's
    // pings off. A watched child gets its own below.
    for (const char* key : {"NOTIFY_SOCKET", "WATCHDOG_USEC", "WATCHDOG_PID"}) unsetenv(key);
    for (const auto& [key, value] : env) setenv(key.c_str(), value.c_str(), 1);
    if (std::getenv("WATCHDOG_USEC") != nullptr)
      setenv("WATCHDOG_PID", std::to_string(getpid()).c_str(), 1);
    dup2(fds[1], STDOUT_FILENO);
    dup2(fds[1], STDERR_FILENO);
    std::vector<char*> args;
    for (const auto& a : argv) args.push_back(const_cast<char*>(a.c_str()));
    args.push_back(nullptr);
    execv(args[0], args.data());
    std::fprintf(stderr, "cannot run %s: %s\n", args[0], std::strerror(errno));
    _exit(127);
  }
  sigprocmask(SIG_SETMASK, &before, nullptr);
  close(fds[1]);
  child.pid = pid;
  child.fd = fds[0];
  fcntl(child.fd, F_SETFL, fcntl(child.fd, F_GETFL) | O_NONBLOCK);
  return child;
}

std::unique_ptr<ProgressLine> g_progress;

void EmitLine(Child& child, const std::string& line) {
  static const std::string kProgress = "@progress ";
  if (line.compare(0, kProgress.size(), kProgress) == 0) {
    ProgressState state;
    if (g_progress && child.name == "worker-0" &&
        ProgressState::FromJson(line.substr(kProgress.size()), &state)) {
      g_progress->Update(state);
    }
    return;
  }
  if (g_progress) g_progress->Clear();
  std::printf("[%s] %s\n", child.name.c_str(), line.c_str());
  std::fflush(stdout);
  if (g_progress) g_progress->Redraw();
  child.tail.push_back(line);
  if (child.tail.size() > 12) child.tail.pop_front();
  if (child.is_worker && !line.empty() && line.front() == '{') child.summary = line;
}

void Drain(Child& child) {
  if (child.fd < 0) return;
  char buf[8192];
  for (;;) {
    const ssize_t n = read(child.fd, buf, sizeof(buf));
    if (n > 0) {
      child.partial.append(buf, static_cast<size_t>(n));
      size_t pos;
      while ((pos = child.partial.find('\n')) != std::string::npos) {
        EmitLine(child, child.partial.substr(0, pos));
        child.partial.erase(0, pos + 1);
      }
      continue;
    }
    if (n == 0) {  // EOF
      if (!child.partial.empty()) EmitLine(child, child.partial);
      child.partial.clear();
      close(child.fd);
      child.fd = -1;
    }
    return;
  }
}

std::string Describe(int status) {
  if (WIFEXITED(status)) return "exit status " + std::to_string(WEXITSTATUS(status));
  if (WIFSIGNALED(status)) return std::string("killed by signal ") + strsignal(WTERMSIG(status));
  return "status " + std::to_string(status);
}

bool Failed(const Child& c) { return !WIFEXITED(c.status) || WEXITSTATUS(c.status) != 0; }

namespace {

// Whether the child has exited, and with `code` (not by a signal).
bool ExitedWith(const Child& c, int code) {
  return c.exited && WIFEXITED(c.status) && WEXITSTATUS(c.status) == code;
}

}  // namespace

bool TrainedWithoutCheckpoints(const Child& c) {
  return ExitedWith(c, kCheckpointsNotWrittenExitCode);
}

bool CannotRejoin(const Child& c) { return ExitedWith(c, kCannotRejoinExitCode); }

bool RefusedCheckpoints(const Child& c) { return ExitedWith(c, kCheckpointsHeldExitCode); }

std::string RestartPlan(bool is_coordinator, bool every_part_here, const std::string& dir,
                        const std::vector<std::string>& parts) {
  if (is_coordinator) {
    return "it serves the job it kept in checkpoint.dir, and the processes restarted after it "
           "rejoin that job";
  }
  if (!every_part_here) {
    return "it rejoins the job from the newest complete checkpoint (the other nodes hold their "
           "parts), or joins afresh if training had not started";
  }
  const uint64_t step = LatestCompleteStep(dir, parts);
  if (step == 0) {
    return "no complete checkpoint yet: it joins afresh if training had not started, and is "
           "refused otherwise";
  }
  // Not read here (a restart's message would read every part's files): a
  // process whose own files of that step fail their checks rejoins from the
  // older step instead, and says so.
  return "it rejoins the job from the newest complete checkpoint, step " + std::to_string(step) +
         " (or the next older one if its files of that step are damaged), and the job rolls back "
         "to it";
}

std::vector<std::string> LateToPing(const std::vector<Child>& children, const Child* failed,
                                    std::chrono::steady_clock::time_point now) {
  std::vector<std::string> late;
  for (const Child& c : children) {
    if (&c == failed || c.exited || !c.notify || !c.armed) continue;
    const auto silent = now - c.pinged;
    if (silent <= c.watchdog / 2) continue;
    char line[256];
    std::snprintf(line, sizeof(line),
                  "%s (pid %d) has sent no watchdog ping for %.1f s (one is due every %.1f s)",
                  c.name.c_str(), c.pid, std::chrono::duration<double>(silent).count(),
                  std::chrono::duration<double>(c.watchdog).count() / 3.0);
    late.push_back(line);
  }
  return late;
}

void Reap(std::vector<Child>& children) {
  for (auto& c : children) {
    if (c.exited || c.pid <= 0) continue;
    int status = 0;
    if (waitpid(c.pid, &status, WNOHANG) == c.pid) {
      c.exited = true;
      c.status = status;
      Drain(c);
    }
  }
}

void PumpOutput(std::vector<Child>& children, int timeout_ms) {
  std::vector<pollfd> fds;
  for (auto& c : children) {
    if (c.fd >= 0) fds.push_back({c.fd, POLLIN, 0});
  }
  if (fds.empty()) {
    std::this_thread::sleep_for(std::chrono::milliseconds(timeout_ms));
  } else {
    poll(fds.data(), fds.size(), timeout_ms);
  }
  for (auto& c : children) Drain(c);
}

void StopAll(std::vector<Child>& children, double grace_seconds) {
  for (auto& c : children) {
    if (!c.exited && c.pid > 0) {
      kill(c.pid, SIGTERM);
      kill(c.pid, SIGCONT);  // a stopped child acts on SIGTERM only once continued
    }
  }
  const auto deadline = std::chrono::steady_clock::now() +
                        std::chrono::milliseconds(static_cast<int64_t>(grace_seconds * 1000));
  for (;;) {
    Reap(children);
    bool all = true;
    for (const auto& c : children) all = all && (c.exited || c.pid <= 0);
    if (all) break;
    if (std::chrono::steady_clock::now() > deadline) {
      for (auto& c : children) {
        if (!c.exited && c.pid > 0) {
          std::printf("gridsync launch: %s (pid %d) did not stop within %.0f s; killing it\n",
                      c.name.c_str(), c.pid, grace_seconds);
          kill(c.pid, SIGKILL);
          waitpid(c.pid, &c.status, 0);
          c.exited = true;
        }
      }
      break;
    }
    PumpOutput(children, 50);
  }
  for (auto& c : children) Drain(c);
}

}  // namespace gridsync::launch_detail
