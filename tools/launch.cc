// `gridsync launch` (tools/launch.h): RunLaunch, from the config's checks
// before anything starts, through starting the job's processes and
// watching them (watchdog kills, restarts of one process or of the whole
// job), to stopping them. Its parts are beside it: launch_checks.h (the
// checks), launch_children.h (the processes), launch_watchdog.h (their
// pings) and launch_finish.h (interrupts, the other nodes, the summary).
//
// Thread safety: see tools/launch.h (the main thread).
#include "tools/launch.h"

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <deque>
#include <filesystem>
#include <memory>
#include <thread>

#include "common/checkpoint_files.h"
#include "common/config.h"
#include "common/host_address.h"
#include "common/host_memory.h"
#include "common/logging.h"
#include "ops/progress_line.h"
#include "server/shard_checkpoint.h"
#include "spec/run_spec.h"
#include "spec/shard_memory.h"
#include "tools/launch_checks.h"
#include "tools/launch_children.h"
#include "tools/launch_finish.h"
#include "tools/launch_resume.h"
#include "tools/launch_watchdog.h"
#include "worker/image_task.h"
#include "worker/worker_precheck.h"

namespace gridsync {
namespace {

using namespace launch_detail;  // NOLINT: the launcher's own helpers

std::string FindBinary(const std::string& bin_dir, const std::string& name) {
  namespace fs = std::filesystem;
  std::vector<fs::path> dirs;
  if (!bin_dir.empty()) {
    // An install's bin folder, or a build tree's root.
    dirs = {fs::path(bin_dir), fs::path(bin_dir) / "server", fs::path(bin_dir) / "worker"};
  } else {
    const fs::path self = fs::read_symlink("/proc/self/exe").parent_path();
    dirs = {self, self / ".." / "server", self / ".." / "worker"};
  }
  for (const auto& dir : dirs) {
    const fs::path candidate = dir / name;
    if (::access(candidate.c_str(), X_OK) == 0) return fs::weakly_canonical(candidate).string();
  }
  return "";
}

// " in 1.5 s" for a restart's backoff; nothing for none.
std::string InSeconds(std::chrono::milliseconds delay) {
  if (delay.count() <= 0) return "";
  char text[48];
  std::snprintf(text, sizeof(text), " in %.1f s", delay.count() / 1000.0);
  return text;
}

// Beside a failure, the others whose watchdog pings are late (LateToPing):
// what the failed process may have waited on.
void NoteLateToPing(const std::vector<std::string>& late, const std::string& failed) {
  std::fflush(stdout);
  for (const auto& line : late) {
    std::fprintf(stderr, "gridsync launch: note: %s: frozen or hung, it may be what %s waited on\n",
                 line.c_str(), failed.c_str());
  }
}

}  // namespace

int RunLaunch(const LaunchOptions& options) {
  // First: a signal while the config loads (tens of ms) took the default
  // action, and the launcher died without a word.
  CatchInterrupts();
  auto config = Config::LoadFile(options.config_path, options.overrides);
  if (!config.ok()) {
    std::fprintf(stderr, "%s\n", config.status().message().c_str());
    return kConfigErrorExitCode;
  }
  if (!config->distributed.enable) {
    std::fprintf(stderr,
                 "%s: distributed.enable is false; allowed: launch needs a distributed config "
                 "(use gridsync-worker --standalone to train in one process)\n",
                 options.config_path.c_str());
    return kConfigErrorExitCode;
  }
  if (auto runnable = config->CheckRunnable(false); !runnable.ok()) {
    std::fprintf(stderr, "%s: %s\n", options.config_path.c_str(), runnable.message().c_str());
    return kConfigErrorExitCode;
  }
  // Names that do not resolve here, before anything starts (the
  // coordinator exited 1 on an unresolvable master_addr), as check-config.
  if (auto resolved = CheckHostsResolve(*config); !resolved.ok()) {
    std::fprintf(stderr, "%s: %s\n", options.config_path.c_str(), resolved.message().c_str());
    return kConfigErrorExitCode;
  }
  // The notes once, here: every child loads the same file with the same
  // overrides, so each would log the same lines (kConfigNotesShownEnv).
  for (const auto& note : config->NotesFor(/*standalone=*/false))
    std::fprintf(stderr, "gridsync launch: %s: note: %s\n", options.config_path.c_str(),
                 note.c_str());
  const std::string coordinator = FindBinary(options.bin_dir, "gridsync-coordinator");
  const std::string ps = FindBinary(options.bin_dir, "gridsync-ps");
  const std::string worker = FindBinary(options.bin_dir, "gridsync-worker");
  if (coordinator.empty() || ps.empty() || worker.empty()) {
    if (options.bin_dir.empty()) {
      std::fprintf(stderr,
                   "gridsync launch: cannot find gridsync-coordinator, gridsync-ps and "
                   "gridsync-worker next to this executable; pass --bin-dir\n");
    } else {
      std::fprintf(stderr,
                   "gridsync launch: --bin-dir %s: cannot find gridsync-coordinator, gridsync-ps "
                   "and gridsync-worker there; allowed: the folder that holds all three\n",
                   options.bin_dir.c_str());
    }
    return kConfigErrorExitCode;
  }
  std::vector<std::string> common = {"--config", options.config_path};
  for (const auto& o : options.overrides) {
    common.push_back("--set");
    common.push_back(o);
  }

  const ClusterLayout& layout = config->layout;
  if (options.max_restarts > 0 && config->checkpoint.every_steps <= 0) {
    // A restarted process rejoins from a checkpoint; without any, a restart
    // could only train afresh beside the others (the coordinator refuses it).
    std::fprintf(stderr,
                 "gridsync launch: --max-restarts %d with checkpoint.every_steps 0: a restarted "
                 "process has no checkpoint to rejoin from; allowed: checkpoint.every_steps > 0, "
                 "or --max-restarts 0\n",
                 options.max_restarts);
    return kConfigErrorExitCode;
  }
  // Under nccl a restarted worker cannot rejoin its peers' collectives, so
  // --max-restarts restarts the whole job from its newest complete
  // checkpoint (below): only a launcher that runs every process can.
  const bool whole_job_restarts = options.max_restarts > 0 && config->checkpoint.every_steps > 0 &&
                                  config->distributed.gradient_sync == GradientSyncMode::kNccl;
  if (whole_job_restarts && !options.node.empty()) {
    std::fprintf(stderr,
                 "gridsync launch: --max-restarts %d with --node %s: not supported with "
                 "gradient_sync nccl (a failed nccl worker restarts the whole job, which the "
                 "launcher of one node cannot); allowed: --max-restarts 0, and after a failure "
                 "gridsync launch %s --resume on every node\n",
                 options.max_restarts, options.node.c_str(), options.config_path.c_str());
    return kConfigErrorExitCode;
  }
  const auto node_option =
      NodeOfOption(layout, options.node, options.config_path, "gridsync launch");
  if (!node_option.ok()) {
    std::fprintf(stderr, "%s\n", node_option.status().message().c_str());
    return kConfigErrorExitCode;
  }
  const int node = *node_option;  // -1: every node (one machine)
  auto here = [&](int n) { return node < 0 || n == node; };
  const bool run_coordinator = node < 0 || options.coordinator || layout.coordinator_node == node;
  // The keys of the roles started here, before anything starts.
  if (const Status keys = CheckKeysOfRolesHere(*config, node, run_coordinator); !keys.ok()) {
    std::fprintf(stderr, "gridsync launch: %s: %s\n", options.config_path.c_str(),
                 keys.message().c_str());
    return kConfigErrorExitCode;
  }
  // Resolved once, for the memory check and the checkpoint parts below. A
  // config every shard and worker would refuse is refused here, before any
  // of them starts (a ps.shards leaving shards with nothing started the
  // coordinator and 8 shards, which exited 2, and launch exited 1).
  const auto spec = RunSpec::Resolve(*config);
  if (!spec.ok()) {
    std::fprintf(stderr, "gridsync launch: %s\n", spec.status().message().c_str());
    return kConfigErrorExitCode;
  }
  // Every process this machine starts, in its memory together (each one
  // checks itself alone). The image as the workers load it: one they would
  // refuse is refused here, before anything starts (the workers exited 2
  // after the coordinator and shards had started, and launch with 1).
  const int workers = WorkersHere(layout, node);
  int shards = 0;
  for (const auto& shard : layout.shards) shards += here(shard.node) ? 1 : 0;
  if (auto device = CheckTrainingDevice(*config); !device.ok() && workers > 0) {
    std::fprintf(stderr, "gridsync launch: %s: %s\n", options.config_path.c_str(),
                 device.message().c_str());
    return kConfigErrorExitCode;
  }
  auto image = ImageTask::Load(config->task.image);
  if (!image.ok() && workers > 0) {
    std::fprintf(stderr, "gridsync launch: %s: task.image: %s\n", options.config_path.c_str(),
                 image.status().message().c_str());
    return kConfigErrorExitCode;
  }
  // Each shard started here in its own memory, as gridsync-ps checks it
  // (it exited 2 after the coordinator had started).
  if (const Status fits = CheckShardMemoryOn(*spec, node, AvailableToThisProcessBytes());
      !fits.ok()) {
    std::fprintf(stderr, "gridsync launch: %s: %s\n", options.config_path.c_str(),
                 fits.message().c_str());
    return kConfigErrorExitCode;
  }
  if (image.ok()) {
    const Status together =
        CheckMachineMemory(*spec, *image, workers, shards, /*writes_png=*/here(0));
    if (!together.ok()) {
      std::fprintf(stderr, "gridsync launch: %s: %s\n", options.config_path.c_str(),
                   together.message().c_str());
      return kConfigErrorExitCode;
    }
  }
  // The parts a checkpoint step needs on disk, for --resume and for the
  // fresh-start check below.
  uint32_t workers_with_state = 0;
  std::vector<std::string> job_parts;
  if (options.resume || config->checkpoint.every_steps > 0) {
    workers_with_state =
        spec->sync.worker_state ? static_cast<uint32_t>(config->distributed.world_size) : 0;
    job_parts = CheckpointParts(static_cast<uint32_t>(layout.shards.size()), workers_with_state);
  }
  // The parts of this machine: its shards, and its workers when they hold
  // state of their own.
  const std::vector<std::string> local_parts =
      CheckpointPartsOn(layout, node, workers_with_state > 0);
  uint64_t resume_step = 0;
  // With --node, this machine's folder holds only its own parts: the
  // launchers agree on the step through the coordinator once it runs
  // (below, tools/launch_resume.h).
  const bool resume_across_nodes = options.resume && node >= 0;
  if (options.resume && !resume_across_nodes) {
    if (const int refused =
            ChooseResumeStep(*config, job_parts, workers_with_state > 0, &resume_step);
        refused != 0)
      return refused;
  }
  if (options.resume) {
    // Allowed (more steps, another rate), but said: the checkpoints check
    // the model's shape alone (a hostile probe resumed with another seed and
    // rate without a word).
    for (const std::string& change : ResumedConfigChanges(*config))
      std::fprintf(stderr, "gridsync launch --resume: note: changed since the run started: %s\n",
                   change.c_str());
  }
  if (!options.resume && config->checkpoint.every_steps > 0) {
    // A fresh job here would delete another run's checkpoints (each shard
    // refuses too; this says it once, before anything starts). The parts are
    // the ones --resume would need, those of this machine.
    if (const Status fresh = CheckFreshStart(config->checkpoint.dir, local_parts, job_parts,
                                             static_cast<uint64_t>(config->training.steps));
        !fresh.ok()) {
      std::fprintf(stderr, "gridsync launch: %s\n", fresh.message().c_str());
      return kCheckpointsHeldExitCode;
    }
  }
  const auto& d = config->distributed;
  Env base = {{"GRIDSYNC_WORLD_SIZE", std::to_string(d.world_size)},
              {"GRIDSYNC_MASTER_ADDR", d.master_addr},
              {"GRIDSYNC_MASTER_PORT", std::to_string(d.master_port)},
              {kConfigNotesShownEnv, "1"}};
  // On a terminal, a progress line for worker 0 instead of its step lines.
  if (ProgressLine::IsTerminal(stdout)) g_progress = std::make_unique<ProgressLine>(stdout);
  auto node_env = [&](int n) {
    Env env = base;
    const auto& info = layout.nodes[static_cast<size_t>(n)];
    env.push_back({"GRIDSYNC_NODE", info.name});
    return env;
  };

  std::vector<Child> children;
  const auto server_watchdog = LaunchWatchdogTimeout(*config);
  const auto worker_watchdog = LaunchWorkerWatchdogTimeout(*config);
  const auto start_timeout = LaunchStartTimeout(*config, options.start_timeout_seconds);
  auto start = [&](const std::string& name, std::vector<std::string> argv, Env env,
                   bool is_worker) {
    argv.insert(argv.end(), common.begin(), common.end());
    std::string line;
    for (const auto& a : argv) line += a + " ";
    std::printf("gridsync launch: starting %s: %s\n", name.c_str(), line.c_str());
    // Every child pings as under systemd's WatchdogSec.
    std::shared_ptr<NotifySocket> notify;
    const auto watchdog = is_worker ? worker_watchdog : server_watchdog;
    if (auto opened = NotifySocket::Open(name); opened.ok()) {
      notify = std::move(opened).value();
      env.push_back({"NOTIFY_SOCKET", notify->address()});
      env.push_back({"WATCHDOG_USEC", std::to_string(watchdog.count() * 1000)});
    } else {
      std::printf("gridsync launch: %s runs without a watchdog: %s\n", name.c_str(),
                  opened.status().ToString().c_str());
    }
    children.push_back(Spawn(name, argv, env, is_worker));
    children.back().notify = std::move(notify);
    children.back().watchdog = watchdog;
    children.back().pinged = std::chrono::steady_clock::now();
  };
  if (options.coordinator && node >= 0 && layout.coordinator_node == node) {
    std::fprintf(stderr,
                 "gridsync launch: note: --coordinator changes nothing: node %s runs the "
                 "coordinator anyway (its host is distributed.master_addr)\n",
                 options.node.c_str());
  }
  // Each launch starts a job of its own (afresh, or --resume); a restart
  // below serves the job this coordinator kept.
  auto start_coordinator = [&] {
    std::vector<std::string> argv = {coordinator};
    if (config->checkpoint.every_steps > 0) argv.push_back("--fresh");
    start("coordinator", argv, node < 0 ? base : node_env(node), false);
  };
  // The job's processes, from `from_step` (0: afresh); the coordinator too
  // unless it already runs.
  auto start_job = [&](uint64_t from_step, bool coordinator_runs = false) {
    if (run_coordinator && !coordinator_runs) start_coordinator();
    for (size_t s = 0; s < layout.shards.size(); ++s) {
      const int n = layout.shards[s].node;
      if (!here(n)) continue;
      Env env = node_env(n);
      env.push_back({"GRIDSYNC_SHARD", std::to_string(s)});
      std::vector<std::string> argv = {ps, "--shard", std::to_string(s)};
      if (from_step > 0) argv.insert(argv.end(), {"--resume-step", std::to_string(from_step)});
      start("ps-" + std::to_string(s), argv, env, false);
    }
    for (int n = 0; n < static_cast<int>(layout.nodes.size()); ++n) {
      if (!here(n)) continue;
      const int first = layout.FirstRank(n);
      for (int local = 0; local < layout.nodes[static_cast<size_t>(n)].workers; ++local) {
        const int w = first + local;
        std::vector<std::string> argv = {worker, "--rank", std::to_string(w)};
        if (from_step > 0) argv.insert(argv.end(), {"--start-step", std::to_string(from_step)});
        argv.insert(argv.end(), options.worker_args.begin(), options.worker_args.end());
        if (w == 0) argv.insert(argv.end(), options.rank0_args.begin(), options.rank0_args.end());
        Env env = node_env(n);
        env.push_back({"GRIDSYNC_RANK", std::to_string(w)});
        env.push_back({"GRIDSYNC_LOCAL_RANK", std::to_string(local)});
        if (g_progress) env.push_back({"GRIDSYNC_PROGRESS_LINES", "1"});
        env.push_back({"GRIDSYNC_LOCAL_WORLD_SIZE",
                       std::to_string(layout.nodes[static_cast<size_t>(n)].workers)});
        start("worker-" + std::to_string(w), argv, env, true);
      }
    }
  };
  if (const Status shared =
          CheckArgsSharedByWorkers(*config, node, options.worker_args, options.rank0_args);
      !shared.ok()) {
    std::fprintf(stderr, "gridsync launch: %s\n", shared.message().c_str());
    return kConfigErrorExitCode;
  }
  // Extra worker arguments reach only the workers, which start last: a bad
  // one let the coordinator and the shards start and then failed the run
  // (a hostile probe). Each distinct worker command line is checked first
  // (gridsync-worker --check-only), and nothing starts if one is refused.
  if (!options.worker_args.empty() || !options.rank0_args.empty()) {
    for (const auto& [w, n] : WorkerLinesToCheck(layout, node)) {
      std::vector<std::string> argv = {worker, "--rank", std::to_string(w)};
      argv.insert(argv.end(), options.worker_args.begin(), options.worker_args.end());
      if (w == 0) argv.insert(argv.end(), options.rank0_args.begin(), options.rank0_args.end());
      argv.push_back("--check-only");
      argv.insert(argv.end(), common.begin(), common.end());
      std::vector<Child> check;
      check.push_back(Spawn("check worker-" + std::to_string(w), argv, node_env(n), false));
      while (!check[0].exited) {
        PumpOutput(check, 100);
        Reap(check);
        if (g_interrupted) {
          StopAll(check, options.grace_seconds);
          return InterruptedExit(" while checking the workers' command lines; nothing was started");
        }
      }
      Drain(check[0]);
      if (Failed(check[0])) {
        std::fprintf(stderr,
                     "gridsync launch: worker %d refuses its command line (--worker-arg%s); "
                     "nothing was started\n",
                     w, w == 0 ? ", --rank0-arg" : "");
        return kConfigErrorExitCode;
      }
    }
  }
  if (g_interrupted) return InterruptedExit(" before starting anything; nothing was started");
  if (resume_across_nodes) {
    if (run_coordinator) start_coordinator();
    if (const int refused =
            ResumeAcrossNodes(*config, options.node, local_parts, children, &resume_step);
        refused != 0) {
      StopAll(children, options.grace_seconds);
      return refused;
    }
  }
  // What this run started with, for every later --resume to compare (once
  // nothing refused the start; a resume keeps the start's record, so that
  // one refused or cut short hides no change from the next).
  if (config->checkpoint.every_steps > 0 && !options.resume) RecordLaunchConfig(*config);
  start_job(resume_step, /*coordinator_runs=*/resume_across_nodes);
  int job_restarts = 0;
  const auto restart_timeout =
      std::chrono::milliseconds(static_cast<int64_t>(config->distributed.timeout_s * 1000));

  int exit_code = 0;
  for (;;) {
    PumpOutput(children, 100);
    Reap(children);
    // A server whose serving loop stopped turning (hung, or stopped), or a
    // worker that stopped, is killed, as systemd's watchdog would, and
    // restarted below like any failed process.
    for (auto& c : children) {
      if (c.exited || !c.notify) continue;
      const auto now = std::chrono::steady_clock::now();
      if (c.notify->Pinged()) {
        c.pinged = now;
        c.armed = true;
      }
      // Armed by READY=1 (or the first ping), as systemd counts from
      // READY=1: before it the server is starting (loading a checkpoint,
      // registering), and gets start_timeout for that, as systemd's
      // TimeoutStartSec= (a process frozen there was never killed).
      if (!c.armed) {
        if (now - c.pinged <= start_timeout) continue;
        std::printf(
            "gridsync launch: %s (pid %d) did not say it serves within %.0f s of its start (no "
            "%s; --start-timeout): stuck or frozen while starting; killing it\n",
            c.name.c_str(), c.pid, start_timeout.count() / 1000.0,
            c.is_worker ? "watchdog ping" : "READY=1 or watchdog ping");
      } else {
        if (now - c.pinged <= c.watchdog) continue;
        std::printf(
            "gridsync launch: %s (pid %d) sent no watchdog ping for %.0f s (%s); killing it\n",
            c.name.c_str(), c.pid, c.watchdog.count() / 1000.0,
            c.is_worker ? "it does not run: stopped or frozen"
                        : "its serving loop does not turn: hung or stopped");
      }
      kill(c.pid, SIGKILL);
      c.pinged = now;  // reaped as failed on the next turn
    }
    if (g_interrupted) {
      exit_code = InterruptedExit("; stopping all processes");
      break;
    }
    // Restarts whose backoff ran out (RestartDelay).
    for (auto& c : children) {
      if (!c.restart_at || std::chrono::steady_clock::now() < *c.restart_at) continue;
      Child fresh = Spawn(c.name, c.restart_argv, c.env, c.is_worker);
      fresh.restarts = c.restarts;
      fresh.notify = c.notify;
      fresh.watchdog = c.watchdog;
      fresh.pinged = std::chrono::steady_clock::now();
      c = std::move(fresh);
    }
    bool workers_done = true;
    for (const auto& c : children) {
      workers_done = workers_done && (!c.is_worker || (c.exited && !c.restart_at));
    }
    const Child* failed = nullptr;
    for (const auto& c : children) {
      if (!c.exited || c.restart_at) continue;
      // A worker fails by its exit status; a server has no reason to exit
      // at all while workers still run.
      if ((c.is_worker && Failed(c) && !TrainedWithoutCheckpoints(c)) ||
          (!c.is_worker && !workers_done)) {
        failed = &c;
        break;
      }
    }
    if (failed != nullptr && whole_job_restarts) {
      // Read before StopAll, which stops them all.
      const std::vector<std::string> late =
          LateToPing(children, failed, std::chrono::steady_clock::now());
      const std::string who = failed->name;
      const std::string how = Describe(failed->status);
      const pid_t pid = failed->pid;
      const std::deque<std::string> tail = failed->tail;
      StopAll(children, options.grace_seconds);
      // Intact files only (a corrupted newest step failed every restart
      // the same way); each passed over is named.
      std::vector<std::string> skipped;
      const uint64_t step = NewestIntactStep(config->checkpoint.dir, job_parts,
                                             LatestCompleteStep(config->checkpoint.dir, job_parts),
                                             &skipped, LaunchMacKeys(*config));
      for (const auto& why : skipped)
        std::printf("gridsync launch: %s; passed over for the restart\n", why.c_str());
      // A checkpoint of the run's last step: every worker would refuse to
      // resume from it (nothing left to train), so it is not restarted into
      // that refusal; the failure came after training (an evaluation, the
      // final image).
      const bool trained = !CheckStepsLeft(*config, step).ok();
      // Nor into another run's files a worker refused (exit 3): restarted
      // from their step, the job would train on that run.
      const bool refused_files = RefusedCheckpoints(*failed);
      if (job_restarts < options.max_restarts && step > 0 && !trained && !refused_files) {
        ++job_restarts;
        const std::chrono::milliseconds delay = RestartDelay(job_restarts, restart_timeout);
        std::printf(
            "gridsync launch: %s (pid %d) failed: %s; restarting the whole job (%d of %d)%s from "
            "the checkpoint of step %llu (gradient_sync nccl: its workers do not rejoin a "
            "running job)\n",
            who.c_str(), pid, how.c_str(), job_restarts, options.max_restarts,
            InSeconds(delay).c_str(), static_cast<unsigned long long>(step));
        NoteLateToPing(late, who);
        std::fflush(stdout);
        for (const auto until = std::chrono::steady_clock::now() + delay;
             std::chrono::steady_clock::now() < until && !g_interrupted;) {
          std::this_thread::sleep_for(std::chrono::milliseconds(20));
        }
        for (auto& c : children) {
          if (c.fd >= 0) close(c.fd);
        }
        children.clear();
        start_job(step);
        continue;
      }
      const std::string why = refused_files ? "not restarted: it refused checkpoint files of "
                                              "another run (its log names them)"
                              : step == 0 && !skipped.empty()
                                  ? "every complete checkpoint failed its checks (above)"
                              : step == 0 ? "no complete checkpoint to restart the job from"
                              : trained   ? "not restarting: the newest complete checkpoint is "
                                            "of step " +
                                              std::to_string(step) +
                                              ", the run's last, so it had trained every step "
                                              "(nothing is left to train)"
                                        : "no restarts left";
      // Why the run failed goes to stderr (after what stdout holds): a
      // launch with its output thrown away ended 1 and said nothing.
      std::fflush(stdout);
      std::fprintf(stderr, "gridsync launch: %s (pid %d) failed: %s; %s; stopping\n", who.c_str(),
                   pid, how.c_str(), why.c_str());
      for (const auto& line : tail)
        std::fprintf(stderr, "gridsync launch:   %s| %s\n", who.c_str(), line.c_str());
      NoteLateToPing(late, who);
      exit_code = 1;
      break;
    }
    // A process the coordinator refused for good (it found no complete
    // checkpoint after training started) is not restarted into the same
    // refusal, which spent every restart within a second.
    // Nor is one that refused another run's checkpoint files (exit 3).
    const bool cannot_rejoin = failed != nullptr && CannotRejoin(*failed);
    const bool refused_files = failed != nullptr && RefusedCheckpoints(*failed);
    if (failed != nullptr && !cannot_rejoin && !refused_files &&
        failed->restarts < options.max_restarts && config->checkpoint.every_steps > 0) {
      // As systemd's Restart=on-failure would: the shard or worker rejoins
      // the job from its newest complete checkpoint, and the job rolls back
      // to it; the coordinator serves the job it kept, and the others, which
      // fail without it, rejoin it once restarted.
      Child& dead = children[static_cast<size_t>(failed - children.data())];
      const bool is_coordinator = dead.name == "coordinator";
      Drain(dead);
      std::vector<std::string> argv;
      for (size_t i = 0; i < dead.argv.size(); ++i) {
        if (dead.argv[i] == "--resume-step" || dead.argv[i] == "--start-step") {
          ++i;  // it finds the step to rejoin from itself
          continue;
        }
        if (dead.argv[i] == "--fresh") continue;  // the job it kept, not a new one
        argv.push_back(dead.argv[i]);
      }
      const int restarts = dead.restarts + 1;
      const std::chrono::milliseconds delay = RestartDelay(restarts, restart_timeout);
      std::printf("gridsync launch: %s (pid %d) failed: %s; restarting it (%d of %d)%s: %s\n",
                  dead.name.c_str(), dead.pid, Describe(dead.status).c_str(), restarts,
                  options.max_restarts, InSeconds(delay).c_str(),
                  RestartPlan(is_coordinator, node < 0, config->checkpoint.dir, job_parts).c_str());
      if (dead.fd >= 0) close(dead.fd);
      dead.fd = -1;
      dead.restarts = restarts;
      dead.restart_argv = std::move(argv);
      dead.restart_at = std::chrono::steady_clock::now() + delay;
      continue;
    }
    if (failed != nullptr) {
      const char* why =
          cannot_rejoin
              ? "it cannot rejoin (training had started, and no complete checkpoint held "
                "every part yet: the first comes at step checkpoint.every_steps; run the job "
                "again afresh); "
          : refused_files && options.max_restarts > 0
              ? "not restarted: it refused checkpoint files of another run (its log names "
                "them), which a restart would find again; "
          : options.max_restarts > 0 && config->checkpoint.every_steps > 0
              ? "no restarts left (--max-restarts); "
              : "";
      std::fflush(stdout);  // the failure to stderr, after what stdout holds
      std::fprintf(stderr, "gridsync launch: %s (pid %d) failed: %s; %sstopping the others\n",
                   failed->name.c_str(), failed->pid, Describe(failed->status).c_str(), why);
      for (const auto& line : failed->tail)
        std::fprintf(stderr, "gridsync launch:   %s| %s\n", failed->name.c_str(), line.c_str());
      NoteLateToPing(LateToPing(children, failed, std::chrono::steady_clock::now()), failed->name);
      exit_code = 1;
      break;
    }
    if (workers_done) break;
  }
  if (exit_code == 0 && node >= 0 && layout.nodes.size() > 1) {
    // This node's workers are done, but other nodes' workers may still
    // pull from the shards here (rank 0's final pull), and the coordinator
    // here serves them all: every launcher waits for every other first.
    exit_code = WaitForOtherNodes(*config, layout.nodes[static_cast<size_t>(node)].name, children);
  }
  if (g_progress) g_progress->Finish();
  StopAll(children, options.grace_seconds);
  if (exit_code == 0) {
    for (const auto& c : children) {
      if (c.name == "worker-0") PrintSummary(c, *config);
    }
    // Trained, but a shard could not write checkpoints it was to write: the
    // run does not end as if they were there (it exited 0 with them gone).
    for (const auto& c : children) {
      if (TrainedWithoutCheckpoints(c)) {
        std::fflush(stdout);
        std::fprintf(
            stderr,
            "gridsync launch: %s could not write checkpoints of this run (its log above names "
            "why): the checkpoints in %s are incomplete\n",
            c.name.c_str(), config->checkpoint.dir.c_str());
        exit_code = 1;
      }
    }
    // A signal while the servers were being stopped (the workers had
    // finished): the run is complete, but the signal is not ignored.
    if (g_interrupted)
      exit_code = InterruptedExit(" while stopping; the workers had finished (summary above)");
  }
  return exit_code;
}

}  // namespace gridsync
