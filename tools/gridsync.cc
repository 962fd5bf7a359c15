// gridsync: the operator CLI. `check-config FILE` validates a config and
// prints it resolved, with every default filled in; `launch CONFIG` runs a
// local cluster (coordinator, shards, workers) from one config; `monitor
// CONFIG` watches a running one; `keygen DIR` makes CURVE keys.
#include <sys/stat.h>
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <set>
#include <string>
#include <string_view>
#include <vector>

#include "common/cli_parse.h"
#include "common/config.h"
#include "common/file_bytes.h"
#include "common/host_address.h"
#include "common/host_memory.h"
#include "common/wire/curve.h"
#include "spec/run_spec.h"
#include "spec/shard_memory.h"
#include "tools/checkpoints_cmd.h"
#include "tools/launch.h"
#include "tools/launch_checks.h"
#include "tools/monitor.h"
#include "worker/image_task.h"
#include "worker/worker_precheck.h"

namespace {

// Every check first, then every pair written into a staging folder and
// moved into place: a refusal or a failed write leaves DIR as it was (a
// probe's repeated role, or a folder named like a key file, left a mix of
// new and old keys).
int RunKeygen(const std::string& keys_dir, const std::vector<std::string>& roles, bool overwrite) {
  std::set<std::string> seen;
  for (const auto& role : roles) {
    if (!seen.insert(role).second) {
      std::fprintf(stderr, "gridsync keygen: --roles lists %s twice; allowed: each role once\n",
                   role.c_str());
      return gridsync::kConfigErrorExitCode;
    }
    for (const char* ext : {".key", ".pub"}) {
      const std::string path = keys_dir + "/" + role + ext;
      struct stat st {};
      if (::lstat(path.c_str(), &st) != 0) continue;
      if (!S_ISREG(st.st_mode)) {
        std::fprintf(stderr, "gridsync keygen: %s is %s; allowed: a regular file, or none\n",
                     path.c_str(), gridsync::FileKindName(st.st_mode));
        return gridsync::kConfigErrorExitCode;
      }
      if (!overwrite) {
        std::fprintf(stderr, "gridsync keygen: %s exists; allowed: --force to replace it\n",
                     path.c_str());
        return gridsync::kConfigErrorExitCode;
      }
    }
  }
  const std::string staging = keys_dir + "/.keygen-" + std::to_string(::getpid());
  std::error_code ec;
  auto fail = [&](const std::string& why) {
    std::filesystem::remove_all(staging, ec);
    std::fprintf(stderr, "gridsync keygen: %s (nothing in %s was changed)\n", why.c_str(),
                 keys_dir.c_str());
    return 1;
  };
  for (const auto& role : roles) {
    auto pair = gridsync::wire::GenerateCurveKeyPair();
    gridsync::Status written =
        pair.ok() ? gridsync::wire::WriteCurveKeyPair(staging, role, *pair) : pair.status();
    if (!written.ok()) return fail(written.message());
  }
  ::chmod(keys_dir.c_str(), 0700);
  for (const auto& role : roles) {
    for (const char* ext : {".key", ".pub"}) {
      const std::string name = role + ext;
      std::filesystem::rename(staging + "/" + name, keys_dir + "/" + name, ec);
      if (ec) {
        std::fprintf(stderr,
                     "gridsync keygen: cannot move %s into %s: %s (the roles before %s have "
                     "their new keys; run it again with --force)\n",
                     name.c_str(), keys_dir.c_str(), ec.message().c_str(), role.c_str());
        std::filesystem::remove_all(staging, ec);
        return 1;
      }
    }
    std::printf("%s/%s.key, %s/%s.pub\n", keys_dir.c_str(), role.c_str(), keys_dir.c_str(),
                role.c_str());
  }
  std::filesystem::remove_all(staging, ec);
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  gridsync::KeepStandardStreamsOpen();  // before any descriptor is made
  CLI::App app{"gridsync: operate a gridsync cluster"};
  app.require_subcommand(1);

  auto* check = app.add_subcommand("check-config", "Validate a config and print it resolved");
  std::string path;
  std::vector<std::string> overrides;
  bool standalone = false;
  check->add_option("file", path, "JSON config file")->required();
  check->add_option("--set", overrides, "Override a key: --set distributed.master_addr=127.0.0.1");
  check->add_flag("--standalone", standalone,
                  "Check a single-process run (gridsync-worker --standalone) instead of the "
                  "distributed one the config describes");
  auto* launch =
      app.add_subcommand("launch", "Run a local cluster (coordinator, PS shards, workers)");
  gridsync::LaunchOptions launch_options;
  launch->add_option("config", launch_options.config_path, "JSON config file")->required();
  launch->add_option("--set", launch_options.overrides,
                     "Override a key in every process (repeatable)");
  launch->add_option("--bin-dir", launch_options.bin_dir, "Folder with the gridsync binaries")
      ->check(gridsync::NotEmpty(
          "the folder that holds gridsync-coordinator, gridsync-ps and gridsync-worker"));
  launch->add_option("--worker-arg", launch_options.worker_args,
                     "Extra argument for every worker (repeatable; not the flags launch gives "
                     "them itself: --config, --set, --rank, --node, --start-step, --standalone, "
                     "--check-only)");
  launch->add_option("--rank0-arg", launch_options.rank0_args,
                     "Extra argument for worker 0 (repeatable; the same flags refused)");
  auto* node_option =
      launch
          ->add_option(
              "--node", launch_options.node,
              "Start only this node's processes (distributed.nodes[].name); run once per machine")
          ->check(gridsync::NotEmpty("a name from distributed.nodes[].name"));
  // Without --node every process runs here, the coordinator included: the
  // flag would do nothing.
  launch
      ->add_flag("--coordinator", launch_options.coordinator,
                 "With --node: also run the coordinator here (by default it runs on the node "
                 "whose host is master_addr)")
      ->needs(node_option);
  launch->add_flag(
      "--resume", launch_options.resume,
      "Start from the newest complete checkpoint (checkpoint.dir); with --node, run on "
      "every machine: the launchers agree on the newest step every machine holds "
      "intact");
  launch
      ->add_option("--max-restarts", launch_options.max_restarts,
                   "Restart a shard, worker or the coordinator that fails during training, up to "
                   "N times each; shards and workers rejoin from the newest complete checkpoint, "
                   "the coordinator serves the job it kept (checkpoint.every_steps > 0); under "
                   "gradient_sync nccl the whole job restarts from that checkpoint, N times")
      ->check(CLI::Range(0, 1000));
  launch
      ->add_option("--start-timeout", launch_options.start_timeout_seconds,
                   "Seconds a started process may take to say it serves (READY=1, a worker's "
                   "first watchdog ping) before it is killed as stuck, as systemd's "
                   "TimeoutStartSec= (default: 90, or 3 x distributed.timeout_s if longer)")
      ->check(gridsync::FiniteRange(1.0, 86400.0));
  launch
      ->add_option("--grace", launch_options.grace_seconds,
                   "Seconds between SIGTERM and SIGKILL when stopping")
      ->check(gridsync::FiniteRange(0.0, 3600.0));
  auto* monitor = app.add_subcommand(
      "monitor", "Watch a running cluster: per worker, shard and the coordinator (--once, --json)");
  gridsync::MonitorOptions monitor_options;
  monitor->add_option("config", monitor_options.config_path, "JSON config file")->required();
  monitor->add_option("--set", monitor_options.overrides, "Override a key (repeatable)");
  monitor->add_flag("--once", monitor_options.once, "Print one view and exit");
  monitor->add_flag("--json", monitor_options.json,
                    "Print the view as JSON (one line per refresh)");
  monitor->add_option("--interval", monitor_options.interval_seconds, "Seconds between refreshes")
      ->check(gridsync::FiniteRange(0.1, 3600.0));
  monitor
      ->add_option("--timeout", monitor_options.timeout_seconds,
                   "Seconds to wait for the coordinator and for each scrape")
      ->check(gridsync::FiniteRange(0.1, 600.0));
  auto* checkpoints = app.add_subcommand(
      "checkpoints",
      "What checkpoint.dir holds for this machine's parts, step by step (intact, damaged, "
      "forged, another run's), and the step gridsync launch --resume would start from; "
      "changes nothing");
  gridsync::CheckpointsOptions checkpoints_options;
  checkpoints->add_option("config", checkpoints_options.config_path, "JSON config file")
      ->required();
  checkpoints->add_option("--set", checkpoints_options.overrides, "Override a key (repeatable)");
  checkpoints
      ->add_option("--node", checkpoints_options.node,
                   "This machine's node (distributed.nodes[].name), as gridsync launch --node")
      ->check(gridsync::NotEmpty("a name from distributed.nodes[].name"));
  auto* keygen = app.add_subcommand(
      "keygen",
      "Write CURVE key pairs for the data plane: DIR/<role>.key (0600) and DIR/<role>.pub");
  std::string keys_dir;
  std::vector<std::string> roles = {"coordinator", "shard", "worker", "observer"};
  // An empty folder name wrote the keys into / (the process's root).
  keygen->add_option("dir", keys_dir, "Folder for the keys (security.keys_dir)")
      ->required()
      ->check(gridsync::NotEmpty("a folder for the keys, e.g. /etc/gridsync/keys"));
  keygen->add_option("--roles", roles, "Roles to make keys for")
      ->delimiter(',')
      ->check(CLI::IsMember({"coordinator", "shard", "worker", "observer"}));
  bool overwrite = false;
  keygen->add_flag("--force", overwrite, "Replace existing keys");
  // CLI11 answers a misspelt subcommand with "A subcommand is required";
  // name it, and what is allowed.
  const auto known = [&app](const std::string& name) {
    for (const CLI::App* sub : app.get_subcommands({}))
      if (sub->check_name(name)) return true;
    return false;
  };
  if (argc > 1 && argv[1][0] != '-' && !known(argv[1])) {
    std::fprintf(
        stderr,
        "gridsync: no subcommand '%s'; allowed: check-config, launch, monitor, checkpoints, "
        "keygen "
        "(gridsync --help)\n",
        argv[1]);
    return gridsync::kConfigErrorExitCode;
  }
  std::string usage_error;
  if (const int rc = gridsync::ParseCommandLine(app, argc, argv, &usage_error); rc >= 0) {
    // monitor --json: a program reads stdout, so a refused flag is a JSON
    // line there too (as RunMonitor's own errors are).
    const bool monitor_json = argc > 1 && std::string_view(argv[1]) == "monitor" &&
                              std::any_of(argv + 2, argv + argc, [](const char* a) {
                                return std::string_view(a) == "--json";
                              });
    if (rc != 0 && monitor_json) gridsync::PrintJsonError("InvalidArgument", usage_error, rc);
    return rc;
  }
  if (launch->parsed()) return gridsync::RunLaunch(launch_options);
  if (monitor->parsed()) return gridsync::RunMonitor(monitor_options);
  if (checkpoints->parsed()) return gridsync::RunCheckpoints(checkpoints_options);
  if (keygen->parsed()) return RunKeygen(keys_dir, roles, overwrite);

  if (check->parsed()) {
    auto config = gridsync::Config::LoadFile(path, overrides);
    if (!config.ok()) {
      std::fprintf(stderr, "%s\n", config.status().message().c_str());
      return gridsync::kConfigErrorExitCode;
    }
    std::printf("%s\n", config->ToJson().dump(2).c_str());
    for (const auto& note : config->NotesFor(standalone))
      std::fprintf(stderr, "%s: note: %s\n", path.c_str(), note.c_str());
    // What the printed "auto" resolves to, as every shard and worker
    // resolves it (a shard refuses the other kind of push).
    if (!standalone && config->distributed.enable &&
        config->distributed.gradient_sync != gridsync::GradientSyncMode::kNccl) {
      std::fprintf(stderr, "%s: resolved: %s\n", path.c_str(),
                   config->DescribeOptimizerPlacement().c_str());
    }
    // The check the binaries run (Config::CheckRunnable), so check-config
    // refuses exactly what they refuse.
    if (auto runnable = config->CheckRunnable(standalone); !runnable.ok()) {
      std::fprintf(stderr, "%s: %s\n", path.c_str(), runnable.message().c_str());
      return gridsync::kConfigErrorExitCode;
    }
    // And the run specification they resolve (the model's shape, the codec).
    auto spec = gridsync::RunSpec::Resolve(*config);
    if (!spec.ok()) {
      std::fprintf(stderr, "%s\n", spec.status().message().c_str());
      return gridsync::kConfigErrorExitCode;
    }
    // And the host names its processes resolve at their start, for a
    // cluster wholly on one machine (one of several may be checked from
    // anywhere: its names need not resolve here; launch checks on each).
    if (!standalone && config->distributed.enable && !config->layout.multi_host) {
      if (auto resolved = gridsync::CheckHostsResolve(*config); !resolved.ok()) {
        std::fprintf(stderr, "%s: %s\n", path.c_str(), resolved.message().c_str());
        return gridsync::kConfigErrorExitCode;
      }
    }
    // And the image the workers load (the same Load: its refusals, word for
    // word; the whole file is decoded, as a worker decodes it). Only a
    // machine that runs workers must hold it: one missing here is refused
    // for a run on this machine (--standalone, or a coordinator on loopback
    // or on one of this machine's addresses), and named otherwise.
    std::error_code exists_error;
    const std::string& master = config->distributed.master_addr;
    const bool on_this_machine = standalone || !config->distributed.enable ||
                                 gridsync::IsLoopbackHost(master) ||
                                 !gridsync::InterfaceOf(master).empty();
    // What is left to each machine's own processes is said, not passed over
    // in silence: a bare OK read as if the keys, the checkpoint folder and
    // the device had been checked (a hostile probe).
    if (!standalone && config->distributed.enable && !on_this_machine) {
      std::fprintf(stderr,
                   "%s: note: distributed.master_addr '%s' is not known to be this machine (not a "
                   "loopback address nor one of its interfaces'): what depends on "
                   "the machine (security keys, checkpoint.dir, training.device, memory) is "
                   "not checked here but on each machine that runs the cluster's processes "
                   "(gridsync launch there, or gridsync-worker --check-only)\n",
                   path.c_str(), master.c_str());
    } else if (!standalone && config->distributed.enable && config->layout.multi_host) {
      std::fprintf(stderr,
                   "%s: note: the cluster spans machines: each machine's security keys, "
                   "training.device and memory are not checked here but on that machine "
                   "(gridsync launch there, or gridsync-worker --check-only)\n",
                   path.c_str());
    }
    if (on_this_machine && !standalone && config->distributed.enable) {
      // What the coordinator, shards and workers read at their start: every
      // role's keys when the whole cluster is here (a machine of several
      // holds its own roles' only), and the checkpoint folder.
      // (A machine of a cluster on several holds its own roles' keys only.)
      if (auto keys = config->layout.multi_host
                          ? gridsync::Status::OK()
                          : gridsync::CheckKeysOfRolesHere(*config, -1, /*run_coordinator=*/true);
          !keys.ok()) {
        std::fprintf(stderr, "%s: %s\n", path.c_str(), keys.message().c_str());
        return gridsync::kConfigErrorExitCode;
      }
      if (config->checkpoint.every_steps > 0) {
        if (auto writable = gridsync::CheckWritableFolder(config->checkpoint.dir, /*create=*/false);
            !writable.ok()) {
          std::fprintf(stderr, "%s: checkpoint.dir: %s\n", path.c_str(),
                       writable.message().c_str());
          return gridsync::kConfigErrorExitCode;
        }
      }
    }
    // The workers of a run wholly on this machine would find no GPU for
    // training.device cuda (of a cluster on several, their machines are
    // not this one).
    if (standalone || !config->distributed.enable ||
        (on_this_machine && !config->layout.multi_host)) {
      if (auto device = gridsync::CheckTrainingDevice(*config, standalone); !device.ok()) {
        std::fprintf(stderr, "%s: %s\n", path.c_str(), device.message().c_str());
        return gridsync::kConfigErrorExitCode;
      }
    }
    // Each shard of a cluster on this machine in its own process's memory,
    // as gridsync-ps checks it before it allocates.
    if (!standalone && config->distributed.enable && on_this_machine &&
        !config->layout.multi_host) {
      if (auto fits =
              gridsync::CheckShardMemoryOn(*spec, -1, gridsync::AvailableToThisProcessBytes());
          !fits.ok()) {
        std::fprintf(stderr, "%s: %s\n", path.c_str(), fits.message().c_str());
        return gridsync::kConfigErrorExitCode;
      }
    }
    if (std::filesystem::exists(config->task.image, exists_error) || on_this_machine) {
      auto image = gridsync::ImageTask::Load(config->task.image);
      if (!image.ok()) {
        std::fprintf(stderr, "%s: task.image: %s\n", path.c_str(),
                     image.status().message().c_str());
        return gridsync::kConfigErrorExitCode;
      }
      // And what a worker checks before it trains (worker_precheck.h): its
      // model and largest micro-batch in this machine's memory, as rank 0
      // holds them (it also writes the reconstruction), and task.output a
      // folder it can write or make (nothing is made here).
      const bool distributed = !standalone && config->distributed.enable;
      if (auto fits = gridsync::CheckWorkerMemory(*spec, *image, distributed, /*writes_png=*/true);
          !fits.ok()) {
        std::fprintf(stderr, "%s: %s\n", path.c_str(), fits.message().c_str());
        return gridsync::kConfigErrorExitCode;
      }
      // And, on one machine, every process of the cluster at once, as
      // `gridsync launch` starts them.
      if (distributed && on_this_machine && !config->layout.multi_host) {
        const int shards = static_cast<int>(config->layout.shards.size());
        if (auto together = gridsync::CheckMachineMemory(
                *spec, *image, config->distributed.world_size, shards, /*writes_png=*/true);
            !together.ok()) {
          std::fprintf(stderr, "%s: %s\n", path.c_str(), together.message().c_str());
          return gridsync::kConfigErrorExitCode;
        }
      }
      if (auto writable = gridsync::CheckTaskOutput(config->task.output, /*create=*/false);
          !writable.ok()) {
        std::fprintf(stderr, "%s: task.output: %s\n", path.c_str(), writable.message().c_str());
        return gridsync::kConfigErrorExitCode;
      }
    } else {
      std::fprintf(stderr,
                   "%s: note: task.image '%s' is not on this machine%s%s; every machine that "
                   "runs workers must hold it (a worker refuses to start without it)\n",
                   path.c_str(), config->task.image.c_str(), exists_error ? ": " : "",
                   exists_error ? exists_error.message().c_str() : "");
    }
    std::fprintf(stderr, "%s: OK\n", path.c_str());
  }
  return 0;
}
