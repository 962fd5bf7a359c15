// The processes `gridsync launch` starts (tools/launch.h): spawning each
// with its environment and no orphan left behind, streaming its output
// with a prefix (worker 0's progress drawn below on a terminal), reaping,
// describing how it ended, and stopping them all.
//
// Thread safety: the launcher's one thread.
#pragma once

#include <sys/types.h>

#include <chrono>
#include <deque>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "ops/progress_line.h"
#include "tools/launch_watchdog.h"

namespace gridsync::launch_detail {

using Env = std::vector<std::pair<std::string, std::string>>;

struct Child {
  std::string name;
  bool is_worker = false;
  pid_t pid = -1;
  int fd = -1;                   // read end of its stdout+stderr
  std::string partial;           // an unfinished output line
  std::deque<std::string> tail;  // last lines, for failure reports
  bool exited = false;
  int status = 0;
  std::string summary;            // the worker's JSON summary line
  std::vector<std::string> argv;  // how it was started (a shard restarts the same way)
  Env env;
  int restarts = 0;
  // A server's watchdog (launch_watchdog.h): its socket, kept across
  // restarts, and when it last pinged (or started: until armed, the start
  // timeout counts from there).
  std::shared_ptr<NotifySocket> notify;
  std::chrono::steady_clock::time_point pinged;
  bool armed = false;                     // READY=1 or a ping came since it started
  std::chrono::milliseconds watchdog{0};  // the longest time allowed between pings
  // A failed process whose restart waits out its backoff (RestartDelay):
  // started again with restart_argv at restart_at.
  std::optional<std::chrono::steady_clock::time_point> restart_at;
  std::vector<std::string> restart_argv;
};

// How long the launcher waits before restart `restart` (1, 2, ...) of a
// process: the first at once, as before (the others wait timeout_s for a
// rejoin, and a watchdog kill is restarted within that wait); then 0.5 s,
// doubling, at most half of timeout_s, so that a process failing at once
// spends its restarts over seconds rather than milliseconds and each still
// rejoins within the others' wait (systemd's RestartSec with RestartSteps).
std::chrono::milliseconds RestartDelay(int restart, std::chrono::milliseconds timeout);

// Worker 0's progress, drawn below the children's output when stdout is a
// terminal (the workers then write "@progress" lines instead of step lines).
extern std::unique_ptr<ProgressLine> g_progress;

// Forks and runs argv[0] with `env` added, its stdout and stderr into a
// pipe the launcher reads; the child dies with the launcher.
Child Spawn(const std::string& name, const std::vector<std::string>& argv, const Env& env,
            bool is_worker);
// Reads what the child wrote, line by line, each printed with its prefix.
void Drain(Child& child);
// "exit status N" or "killed by signal S".
std::string Describe(int status);
bool Failed(const Child& c);
// Whether the child exited kCheckpointsNotWrittenExitCode: it finished its
// part (a worker trained, a shard served to the end) but some checkpoints it
// was to write are missing. Not a failure to restart; the run ends 1.
bool TrainedWithoutCheckpoints(const Child& c);
// Whether the child exited kCannotRejoinExitCode: the coordinator refused it
// for good (training had started, and no complete checkpoint holds every
// part), so a restart would only be refused again.
bool CannotRejoin(const Child& c);
// Whether the child exited kCheckpointsHeldExitCode: it refused checkpoint
// files of another run (a fresh start over them, or a step's parts of two
// runs), which a restart finds again.
bool RefusedCheckpoints(const Child& c);
// What a restarted shard or worker will do, for the restart line. With
// `every_part_here` (one launcher runs the whole job) the newest complete
// step in `dir` is exact and named; the launcher of one node sees its own
// parts only.
std::string RestartPlan(bool is_coordinator, bool every_part_here, const std::string& dir,
                        const std::vector<std::string>& parts);
// The running children other than `failed` whose watchdog pings are late:
// armed, with a notify socket, and silent for more than half their
// watchdog timeout (a ping is due every third of it), one line each
// ("coordinator (pid N) has sent no watchdog ping for 4.1 s (one is due
// every 2.0 s)"). Named beside a failure, since the failed process may have
// waited on one of them: a frozen coordinator made a worker's wait time out
// 0.1 s before the watchdog killed it, and the failure named only the
// worker (a hostile probe).
std::vector<std::string> LateToPing(const std::vector<Child>& children, const Child* failed,
                                    std::chrono::steady_clock::time_point now);
// Marks the children that exited (without waiting).
void Reap(std::vector<Child>& children);
// Waits up to timeout_ms for output, and prints it.
void PumpOutput(std::vector<Child>& children, int timeout_ms);
// SIGTERM (and SIGCONT) to all, SIGKILL to those still there after
// grace_seconds.
void StopAll(std::vector<Child>& children, double grace_seconds);

}  // namespace gridsync::launch_detail
