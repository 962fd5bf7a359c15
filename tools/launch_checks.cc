#include "tools/launch_checks.h"

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "common/checkpoint_files.h"
#include "common/checkpoint_run.h"
#include "common/config_reader.h"
#include "common/file_bytes.h"
#include "common/logging.h"
#include "common/wire/curve.h"
#include "server/coordinator_state.h"
#include "server/shard_checkpoint.h"
#include "spec/run_spec.h"
#include "spec/shard_memory.h"

namespace gridsync {
namespace {

bool Here(int node, int n) { return node < 0 || n == node; }

}  // namespace

std::string FolderRun(const std::string& dir) {
  const auto state = LoadCoordinatorState(dir + "/coordinator-state.json");
  return state.ok() && state->has_value() ? (*state)->run : std::string();
}

bool OfAnotherRun(const std::string& dir, uint64_t step, const std::string& part,
                  const std::string& own) {
  if (own.empty()) return false;
  const auto run = PartRun(dir, step, part);
  if (!run.ok() || *run == own) return false;  // unreadable: the part's own checks name it
  std::printf(
      "gridsync launch --resume: step %llu: its files belong to run %s, not to this folder's run "
      "%s (%s/coordinator-state.json); passed over (the resumed run replaces or removes them: "
      "move them out of the folder to keep them)\n",
      static_cast<unsigned long long>(step), DescribeRun(*run).c_str(), DescribeRun(own).c_str(),
      dir.c_str());
  return true;
}

int WorkersHere(const ClusterLayout& layout, int node) {
  int workers = 0;
  for (int n = 0; n < static_cast<int>(layout.nodes.size()); ++n)
    workers += Here(node, n) ? layout.nodes[static_cast<size_t>(n)].workers : 0;
  return workers;
}

Result<int> NodeOfOption(const ClusterLayout& layout, const std::string& name,
                         const std::string& config_path, const std::string& command) {
  if (name.empty()) {
    if (!layout.multi_host) return -1;
    return Status::InvalidArgument(command + ": " + config_path +
                                   " places its nodes on several machines; allowed: run `" +
                                   command + " " + config_path + " --node NAME` on each machine");
  }
  const int node = layout.NodeIndex(name);
  if (node >= 0) return node;
  std::string names;
  for (const auto& n : layout.nodes) names += (names.empty() ? "" : ", ") + n.name;
  return Status::InvalidArgument(command + ": --node " + name + ": no such node in " + config_path +
                                 "; allowed: " + names);
}

std::vector<std::string> CheckpointPartsOn(const ClusterLayout& layout, int node,
                                           bool workers_with_state) {
  const auto here = [&](int n) { return node < 0 || n == node; };
  std::vector<std::string> parts;
  for (size_t s = 0; s < layout.shards.size(); ++s) {
    if (here(layout.shards[s].node)) parts.push_back(ShardPart(static_cast<uint32_t>(s)));
  }
  for (int n = 0; workers_with_state && n < static_cast<int>(layout.nodes.size()); ++n) {
    if (!here(n)) continue;
    for (int local = 0; local < layout.nodes[static_cast<size_t>(n)].workers; ++local)
      parts.push_back("worker-" + std::to_string(layout.FirstRank(n) + local));
  }
  return parts;
}

Status CheckKeysOfRolesHere(const Config& config, int node, bool run_coordinator) {
  const ClusterLayout& layout = config.layout;
  bool shards_here = false;
  for (const auto& shard : layout.shards) shards_here |= Here(node, shard.node);
  const bool workers_here = WorkersHere(layout, node) > 0;
  if (run_coordinator) GRIDSYNC_RETURN_IF_ERROR(wire::CheckRoleKeys(config, {"coordinator"}));
  if (shards_here) GRIDSYNC_RETURN_IF_ERROR(wire::CheckRoleKeys(config, {"shard"}));
  if (workers_here) GRIDSYNC_RETURN_IF_ERROR(wire::CheckRoleKeys(config, {"worker"}));
  return Status::OK();
}

namespace {

// The flag an argument names ("--set" of "--set=a=1", "-c" of "-cFILE"),
// or "" for a value.
std::string FlagOf(const std::string& arg) {
  if (arg.rfind("--", 0) == 0) return arg.substr(0, arg.find('='));
  if (arg.size() >= 2 && arg[0] == '-' && arg[1] != '-') return arg.substr(0, 2);
  return "";
}

// The value of the flag at worker_args[i]: after its '=', or the next
// argument.
std::string ValueAt(const std::vector<std::string>& args, size_t i) {
  const std::string& arg = args[i];
  if (const size_t eq = arg.find('='); arg.rfind("--", 0) == 0 && eq != std::string::npos)
    return arg.substr(eq + 1);
  return i + 1 < args.size() ? args[i + 1] : "";
}

}  // namespace

Status CheckArgsSharedByWorkers(const Config& config, int node,
                                const std::vector<std::string>& worker_args,
                                const std::vector<std::string>& rank0_args) {
  // What the launcher itself gives every worker: a second --set lost to the
  // launcher's own (which come after), silently; --check-only made worker 0
  // exit at once and the others wait out timeout_s (hostile probes).
  for (const auto* args : {&worker_args, &rank0_args}) {
    const char* which = args == &worker_args ? "--worker-arg" : "--rank0-arg";
    for (const std::string& arg : *args) {
      const std::string flag = FlagOf(arg);
      for (const char* owned : {"-c", "--config", "--set", "--rank", "--node", "--start-step",
                                "--standalone", "--check-only"}) {
        if (flag != owned) continue;
        return Status::InvalidArgument(
            std::string(which) + " " + arg + ": gridsync launch gives every worker its " + flag +
            " itself (the config, its --set overrides, the rank and node, a resume's step); "
            "allowed: --set before the config's path for every process, --resume for a resume, "
            "and in " +
            which +
            " the worker's other flags (--eval-every, --timeline, "
            "--metrics-port, --dump-params, --log-level, ...)");
      }
    }
  }
  const int workers_here = WorkersHere(config.layout, node);
  if (workers_here < 2) return Status::OK();
  for (size_t i = 0; i < worker_args.size(); ++i) {
    const std::string flag = FlagOf(worker_args[i]);
    if (flag != "--metrics-port" && flag != "--timeline") continue;
    const std::string value = ValueAt(worker_args, i);
    if (flag == "--metrics-port" && value == "0") continue;  // off, for every worker
    const bool port = flag == "--metrics-port";
    return Status::InvalidArgument(
        "--worker-arg " + flag + " " + value + ": one " + (port ? "port" : "file") + " for the " +
        std::to_string(workers_here) + " workers on this machine, which cannot " +
        (port ? "all listen on it" : "all write it (their traces would interleave)") +
        "; allowed: " +
        (port ? "metrics.port in the config (each process takes its own port from it), or "
                "--rank0-arg --metrics-port for worker 0 alone"
              : "--rank0-arg --timeline for worker 0 alone"));
  }
  return Status::OK();
}

std::vector<std::pair<int, int>> WorkerLinesToCheck(const ClusterLayout& layout, int node) {
  std::vector<std::pair<int, int>> lines;
  bool other = false;
  for (int n = 0; n < static_cast<int>(layout.nodes.size()); ++n) {
    if (!Here(node, n)) continue;
    for (int local = 0; local < layout.nodes[static_cast<size_t>(n)].workers; ++local) {
      const int w = layout.FirstRank(n) + local;
      if (w == 0 || !other) lines.emplace_back(w, n);
      other = other || w != 0;
    }
  }
  return lines;
}

Status CheckStepsLeft(const Config& config, uint64_t resume_step) {
  if (resume_step < static_cast<uint64_t>(config.training.steps)) return Status::OK();
  const std::string step = std::to_string(resume_step);
  return Status::InvalidArgument(
      "the newest complete checkpoint in " + config.checkpoint.dir + " is of step " + step +
      ", and training.steps is " + std::to_string(config.training.steps) +
      ": nothing is left to train; allowed: training.steps above " + step);
}

int ChooseResumeStep(const Config& config, const std::vector<std::string>& job_parts,
                     bool workers_hold_state, uint64_t* step, bool dry_run, IntactMemo* memo) {
  const std::string& dir = config.checkpoint.dir;
  uint64_t resume_step = LatestCompleteStep(dir, job_parts);
  if (resume_step == 0) {
    std::fprintf(stderr,
                 "gridsync launch --resume: no complete checkpoint in %s (a step-<s> folder with "
                 "a manifest from each of the %zu shards%s): %s; allowed: a run with "
                 "checkpoint.every_steps > 0 that reached its first checkpoint, resumed with "
                 "the shards and workers it ran with\n",
                 dir.c_str(),
                 static_cast<size_t>(std::count_if(
                     job_parts.begin(), job_parts.end(),
                     [](const std::string& part) { return part.rfind("shard-", 0) == 0; })),
                 workers_hold_state ? " and each of the workers" : "",
                 DescribeHeldParts(dir).c_str());
    return kConfigErrorExitCode;
  }
  // A part's files of that step that fail their checks (a corrupted .bin)
  // would fail its process at start: the resume goes back to the newest
  // complete step whose files are all intact, as a live rejoin does, and
  // says so. (Across machines, tools/launch_resume.h does the same with
  // the other launchers.)
  // The newest intact step at most `at_most`, each damaged one passed over named.
  // Loaded (and any refusal named) once; gridsync checkpoints named it already.
  const PartMacKeys keys = LaunchMacKeys(config, dry_run ? nullptr : "gridsync launch");
  const auto newest_intact = [&](uint64_t at_most) {
    std::vector<std::string> skipped;
    const uint64_t intact =
        NewestIntactStep(dir, job_parts, at_most, &skipped, keys, !dry_run, memo);
    for (const auto& why : skipped) {
      // A manifest's words are anyone's bytes: escaped for the terminal.
      std::fprintf(intact > 0 ? stdout : stderr, "gridsync launch --resume: %s; %s\n",
                   EscapeControlBytes(why).c_str(),
                   intact > 0 ? "passed over" : "no older complete step to resume from");
    }
    return intact;
  };
  uint64_t intact = newest_intact(resume_step);
  if (intact == 0) return kCheckpointsHeldExitCode;
  // The folder's own run, as its coordinator's state file names it: a
  // newer step of another run (copied in, or left by a second run sharing
  // the folder) is passed over, not adopted. Adopted, it gave the job its
  // run, and the resumed parts removed the folder's own older steps as
  // another run's (a hostile probe).
  if (const std::string own = FolderRun(dir); !own.empty()) {
    while (intact > 0 && OfAnotherRun(dir, intact, job_parts.front(), own)) {
      const uint64_t older = LatestCompleteStep(dir, job_parts, intact);
      intact = older == 0 ? 0 : newest_intact(older);
    }
    if (intact == 0) {
      std::fprintf(stderr,
                   "gridsync launch --resume: no complete step of this folder's run %s in %s "
                   "(%s/coordinator-state.json names it); allowed: a folder whose steps are its "
                   "own run's (to resume another run's step, remove coordinator-state.json)\n",
                   DescribeRun(own).c_str(), dir.c_str(), dir.c_str());
      return kCheckpointsHeldExitCode;
    }
  }
  if (intact != resume_step) {
    std::printf("gridsync launch --resume: %s from the older complete step %llu instead\n",
                dry_run ? "would resume" : "resuming", static_cast<unsigned long long>(intact));
  }
  resume_step = intact;
  if (const int refused = CheckChosenResumeStep(config, resume_step, job_parts); refused != 0)
    return refused;
  std::printf("gridsync launch: %s from the checkpoint of step %llu in %s\n",
              dry_run ? "would resume" : "resuming", static_cast<unsigned long long>(resume_step),
              dir.c_str());
  *step = resume_step;
  return 0;
}

namespace {

constexpr const char* kLaunchConfigFile = "/launch-config.json";

// Leaf keys of a resolved config ("training.seed") and their values as
// JSON text; an array is one value.
void Flatten(const nlohmann::json& value, const std::string& prefix,
             std::map<std::string, std::string>* out) {
  if (value.is_object()) {
    for (const auto& [key, child] : value.items())
      Flatten(child, prefix.empty() ? key : prefix + "." + key, out);
    return;
  }
  (*out)[prefix] = value.dump();
}

}  // namespace

void RecordLaunchConfig(const Config& config) {
  const std::string path = config.checkpoint.dir + kLaunchConfigFile;
  std::error_code ec;  // (a failure to create it is the write's to name)
  std::filesystem::create_directories(config.checkpoint.dir, ec);
  if (const Status written = WriteFileAtomically(path, config.ToJson().dump(2) + "\n");
      !written.ok()) {
    std::fprintf(stderr, "gridsync launch: note: %s (a later --resume cannot say what changed)\n",
                 written.message().c_str());
  }
}

std::vector<std::string> ResumedConfigChanges(const Config& config) {
  std::vector<std::string> changes;
  const std::string path = config.checkpoint.dir + kLaunchConfigFile;
  const auto size = FileSize(path);
  if (!size.ok() && size.status().code() == StatusCode::kNotFound) return changes;  // no record
  const auto bytes =
      !size.ok() ? Result<std::string>(size.status())
      : *size <= Config::kMaxConfigBytes
          ? ReadFileOfSize(path, *size)
          : Result<std::string>(Status::InvalidArgument("larger than a config may be"));
  if (!bytes.ok()) {
    changes.push_back(path + ": " + bytes.status().message() + ": nothing to compare with");
    return changes;
  }
  // The config reader's parser: a record is a file anyone with the folder
  // may have written (its depth is bounded, its duplicate keys refused).
  nlohmann::json before;
  config_reader::Problems problems(path);
  if (!config_reader::ParseJson(*bytes, path, &problems, &before) || !problems.empty() ||
      !before.is_object()) {
    changes.push_back(path +
                      " does not parse as the record launch writes: nothing to compare with");
    return changes;
  }
  std::map<std::string, std::string> was, now;
  Flatten(before, "", &was);
  Flatten(config.ToJson(), "", &now);
  for (const auto& [key, value] : now) {
    const auto it = was.find(key);
    if (it == was.end()) {
      changes.push_back(key + " (unset) -> " + value);
    } else if (it->second != value) {
      changes.push_back(key + " " + it->second + " -> " + value);
    }
  }
  for (const auto& [key, value] : was) {
    if (now.count(key) == 0) changes.push_back(key + " " + value + " -> (unset)");
  }
  // A record of thousands of keys (not one launch wrote) says so in a few lines.
  constexpr size_t kListed = 20;
  if (changes.size() > kListed) {
    const size_t more = changes.size() - kListed;
    changes.resize(kListed);
    changes.push_back("... and " + std::to_string(more) + " more");
  }
  return changes;
}

namespace {

// The shards' parts of `step` against what this config's shards hold
// (ShardCheckpointShape, ShardStateBytes): a changed model, partition,
// optimizer placement or compression.pull, which every shard refuses at
// its start, is refused before anything starts, naming the part and what
// changed. Parts whose manifests do not read are the intact checks'.
Status CheckShardPartsFitConfig(const Config& config, uint64_t step,
                                const std::vector<std::string>& parts) {
  // Shards run in ps and hybrid; a config that does not resolve is
  // refused by its own checks.
  const DistributedConfig& d = config.distributed;
  if (!d.enable || d.gradient_sync == GradientSyncMode::kNccl || config.ps.shards <= 0)
    return Status::OK();
  const auto spec = RunSpec::Resolve(config);
  if (!spec.ok()) return Status::OK();
  const auto shards = static_cast<uint32_t>(config.ps.shards);
  const auto partition = Partition::Make(spec->model.tables, shards, spec->sync.partition_dim);
  if (!partition.ok()) return Status::OK();
  // What changed since the run started, read only for a refusal.
  const auto changed = [&] {
    std::string changes;
    for (const std::string& change : ResumedConfigChanges(config))
      changes += (changes.empty() ? "" : ", ") + change;
    return changes.empty() ? "" : " (changed since the run started: " + changes + ")";
  };
  for (uint32_t s = 0; s < shards; ++s) {
    const std::string part = ShardPart(s);
    if (std::find(parts.begin(), parts.end(), part) == parts.end()) continue;  // another machine's
    const auto manifest = ReadPartManifest(config.checkpoint.dir, step, part);
    if (!manifest.ok()) continue;
    const std::string json_path =
        config.checkpoint.dir + "/step-" + std::to_string(step) + "/" + part + ".json";
    const nlohmann::json shape = ShardCheckpointShape(*partition, s);
    if (manifest->shape != shape) {
      return Status::InvalidArgument(json_path + ": shape " + manifest->shape.dump() +
                                     " ([rows, width] a table); this " + "config's shard " +
                                     std::to_string(s) + " holds " + shape.dump() + changed() +
                                     "; allowed: the model and partition the run was trained with");
    }
    const uint64_t bytes = ShardStateBytes(*spec, *partition, s);
    if (manifest->bytes != bytes) {
      return Status::InvalidArgument(
          json_path + ": " + std::to_string(manifest->bytes) + " bytes of state; this config's " +
          "shard " + std::to_string(s) + " holds " + std::to_string(bytes) + changed() +
          "; allowed: the optimizer placement (ps.optimizer, the codec's default) and "
          "compression.pull the run was trained with");
    }
  }
  return Status::OK();
}

}  // namespace

int CheckChosenResumeStep(const Config& config, uint64_t step,
                          const std::vector<std::string>& parts) {
  // Parts of two runs in one step: refused before anything starts (each
  // part refuses too, across machines).
  if (const Status one = CheckStepIsOneRun(config.checkpoint.dir, step, parts); !one.ok()) {
    std::fprintf(stderr, "gridsync launch --resume: step %llu: %s\n",
                 static_cast<unsigned long long>(step), one.message().c_str());
    return kCheckpointsHeldExitCode;
  }
  if (const Status fits = CheckShardPartsFitConfig(config, step, parts); !fits.ok()) {
    std::fprintf(stderr, "gridsync launch --resume: step %llu: %s\n",
                 static_cast<unsigned long long>(step), EscapeControlBytes(fits.message()).c_str());
    return kConfigErrorExitCode;
  }
  if (const Status left = CheckStepsLeft(config, step); !left.ok()) {
    std::fprintf(stderr, "gridsync launch --resume: %s\n", left.message().c_str());
    return kConfigErrorExitCode;
  }
  return 0;
}

PartMacKeys LaunchMacKeys(const Config& config, const char* who) {
  struct Keys {
    std::optional<CheckpointMacKey> shard, worker;
  };
  auto keys = std::make_shared<Keys>();
  const auto load = [&](const char* role, std::optional<CheckpointMacKey>* into) {
    auto key = wire::CheckpointMacKeyFor(config, role);
    if (key.ok()) {
      *into = *key;
    } else if (key.status().code() != StatusCode::kNotFound && who != nullptr) {
      std::fprintf(stderr,
                   "%s: the %s checkpoints' MACs are not checked here: %s (its processes "
                   "refuse to start with it)\n",
                   who, role, key.status().message().c_str());
    }
  };
  load("shard", &keys->shard);
  load("worker", &keys->worker);
  // Parts are named ShardPart(i) ("shard-<i>") and worker-<rank>
  // (worker/worker_checkpoint.h).
  return [keys](const std::string& part) -> const CheckpointMacKey* {
    const std::optional<CheckpointMacKey>* key = nullptr;
    if (part.rfind("shard-", 0) == 0) key = &keys->shard;
    if (part.rfind("worker-", 0) == 0) key = &keys->worker;
    return key != nullptr ? KeyOrNull(*key) : nullptr;
  };
}

uint64_t NewestIntactStep(const std::string& dir, const std::vector<std::string>& parts,
                          uint64_t step, std::vector<std::string>* skipped, const PartMacKeys& keys,
                          bool set_aside, IntactMemo* memo) {
  std::vector<DamagedPart> damaged;
  step = NewestIntactCompleteStep(dir, parts, step, &damaged, keys, memo);
  for (const DamagedPart& d : damaged) {
    // With a step to go back to, the damaged files are set aside
    // (<part>.bin.damaged, .json.damaged), as a rejoin does: the resumed
    // processes remove their steps after the one they load, and took the
    // damaged files with them, leaving nothing to look at. A refusal (none
    // left) leaves the folder as it found it.
    const std::string why = "step " + std::to_string(d.step) + ": " + d.why;
    if (step == 0) {
      skipped->push_back(why);
    } else if (set_aside) {
      skipped->push_back(SetDamagedPartAside(dir, d));
    } else {
      skipped->push_back(why + " (would be set aside as " + d.part + ".bin.damaged)");
    }
  }
  return step;
}

std::string SetDamagedPartAside(const std::string& dir, const DamagedPart& d) {
  const Status aside = SetPartAside(dir, d.step, d.part);
  return "step " + std::to_string(d.step) + ": " + d.why +
         (aside.ok() ? " (set aside as " + d.part + ".bin.damaged)" : " (" + aside.message() + ")");
}

}  // namespace gridsync
