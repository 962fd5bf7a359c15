// gridsync-ps --shard i: one parameter-server shard. It computes the model's
// tables from the config, binds its ZeroMQ endpoint, registers with the
// coordinator (which checks its table sizes against the cluster's) and serves
// until SIGINT/SIGTERM.
#include <spdlog/spdlog.h>
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <csignal>
#include <cstdio>
#include <string>
#include <thread>
#include <vector>

#include "common/checkpoint_files.h"
#include "common/checkpoint_registry.h"
#include "common/cli_parse.h"
#include "common/cluster_layout.h"
#include "common/config.h"
#include "common/coordinator_client.h"
#include "common/file_limit.h"
#include "common/host_address.h"
#include "common/host_memory.h"
#include "common/logging.h"
#include "common/member_liveness.h"
#include "common/message_heap.h"
#include "common/server_config.h"
#include "common/sharding.h"
#include "ops/metrics.h"
#include "ops/service_watchdog.h"
#include "server/ps_shard.h"
#include "server/serve_metrics.h"
#include "server/shard_checkpoint.h"
#include "server/shard_membership.h"
#include "spec/cluster_settings.h"
#include "spec/shard_memory.h"

namespace {
volatile std::sig_atomic_t g_stop = 0;  // the stop signal's number
void OnSignal(int signal_number) { g_stop = signal_number; }
}  // namespace

int main(int argc, char** argv) {
  gridsync::KeepStandardStreamsOpen();  // before any descriptor is made
  if (!gridsync::TuneHeapForMessages())
    spdlog::warn("gridsync-ps: the C library kept its heap thresholds (messages are mapped)");
  gridsync::IgnoreHangup();  // nothing to reload: the config is read once
  CLI::App app{"gridsync-ps: one parameter-server shard"};
  std::string config_path = "configs/local.json";
  std::vector<std::string> overrides;
  int shard = 0;
  std::string log_level = "info";
  app.add_option("-c,--config", config_path, "JSON config file");
  app.add_option("--set", overrides, "Override a config key (repeatable)");
  app.add_option("--shard", shard, "Shard index, 0..ps.shards-1 (default: GRIDSYNC_SHARD)")
      ->check(gridsync::IndexNumber(255));
  std::string host_flag;
  std::string bind;
  app.add_option("--host", host_flag,
                 "Address to advertise (and bind); default: GRIDSYNC_HOST, then the address of "
                 "interface GRIDSYNC_SOCKET_IFNAME, then the shard's node host in the config")
      ->check(gridsync::HostSyntax());
  app.add_option("--bind", bind, "Address to bind instead, e.g. 0.0.0.0 (the advertised one stays)")
      ->check(gridsync::HostSyntax());
  uint64_t resume_step = 0;
  app.add_option(
         "--resume-step", resume_step,
         "Start from the checkpoint of this step (checkpoint.dir; gridsync launch --resume)")
      ->check(gridsync::StepNumber());
  gridsync::OpsFlags ops;
  gridsync::AddOpsFlags(app, &ops, "every applied step");
  app.add_option("--log-level", log_level, "trace, debug, info, warn, error")
      ->check(CLI::IsMember({"trace", "debug", "info", "warn", "error"}));
  GRIDSYNC_PARSE_COMMAND_LINE(app, argc, argv);
  if (app.count("--shard") == 0) {
    auto from_env = gridsync::IntFromEnv("GRIDSYNC_SHARD", -1, 0, 255);
    if (!from_env.ok() || *from_env < 0) {
      std::fprintf(stderr, "%s\n",
                   from_env.ok() ? "--shard is required (or GRIDSYNC_SHARD)"
                                 : from_env.status().message().c_str());
      return gridsync::kConfigErrorExitCode;
    }
    shard = *from_env;
  }
  gridsync::InitLogging("ps-" + std::to_string(shard), log_level);
  // One descriptor per connection: a shard started by hand keeps the
  // usual soft limit of 1024 otherwise (common/file_limit.h).
  gridsync::RaiseOpenFileLimitForServing();

  // As the coordinator: no shard runs without a cluster (the shard used to
  // use the cluster's keys it noted as inert).
  auto config = gridsync::LoadServerConfig(config_path, overrides, "PS shard");
  if (!config) return gridsync::kConfigErrorExitCode;
  if (shard < 0 || shard >= config->ps.shards) {
    std::fprintf(stderr, "--shard %d: out of range; allowed: 0..%d (ps.shards = %d)\n", shard,
                 config->ps.shards - 1, config->ps.shards);
    return gridsync::kConfigErrorExitCode;
  }
  if (config->layout.shards.size() != static_cast<size_t>(config->ps.shards)) {
    std::fprintf(
        stderr,
        "%s: distributed.gradient_sync \"%s\" runs no PS shards; allowed: \"ps\" or \"hybrid\"\n",
        config_path.c_str(),
        std::string(gridsync::ToString(config->distributed.gradient_sync)).c_str());
    return gridsync::kConfigErrorExitCode;
  }
  // Every value derived from the config, once, for the whole run.
  auto spec = gridsync::RunSpec::Resolve(*config);
  if (!spec.ok()) {
    std::fprintf(stderr, "%s\n", spec.status().message().c_str());
    return gridsync::kConfigErrorExitCode;
  }
  // Under systemd (Type=notify): the start may take what the waits before
  // READY=1 allow (ServerStartTimeout), not only the unit's 90 s.
  gridsync::NotifyStartTimeout(gridsync::ServerStartTimeout(config->distributed.timeout_s));
  const auto& tables = spec->model.tables;
  auto partition = gridsync::Partition::Make(tables, static_cast<uint32_t>(config->ps.shards),
                                             spec->sync.partition_dim);
  if (!partition.ok()) {
    std::fprintf(stderr, "%s\n", partition.status().message().c_str());
    return gridsync::kConfigErrorExitCode;
  }

  auto shard_options = gridsync::ShardOptionsFor(*spec, static_cast<uint32_t>(shard));
  if (!shard_options.ok()) {
    std::fprintf(stderr, "%s\n", shard_options.status().message().c_str());
    return gridsync::kConfigErrorExitCode;
  }
  gridsync::ShardOptions options = *shard_options;
  options.resume_step = resume_step;
  // As the worker does (worker/main.cc): a partition larger than this
  // machine's memory is refused by name before it is allocated, rather
  // than abort in the allocation or wake the OOM killer.
  // (spec/shard_memory.h: check-config and launch make the same check.)
  if (auto fits = gridsync::CheckShardMemory(*spec, *partition, static_cast<uint32_t>(shard),
                                             gridsync::AvailableToThisProcessBytes());
      !fits.ok()) {
    std::fprintf(stderr, "%s: %s\n", config_path.c_str(), fits.message().c_str());
    return gridsync::kConfigErrorExitCode;
  }
  if (!ops.timeline.empty()) {
    auto timeline = gridsync::TimelineWriter::Open(ops.timeline, "shard " + std::to_string(shard),
                                                   static_cast<uint32_t>(1000 + shard));
    if (!timeline.ok()) {
      std::fprintf(stderr, "%s\n", timeline.status().message().c_str());
      return gridsync::kConfigErrorExitCode;
    }
    options.timeline = std::move(timeline).value();
  }
  gridsync::ShardPlacement placement = config->layout.shards[static_cast<size_t>(shard)];
  if (auto flag = gridsync::CheckMetricsPortFlag(*config, ops.metrics_port, placement.host);
      !flag.ok()) {
    std::fprintf(stderr, "shard %d: %s\n", shard, flag.message().c_str());
    return gridsync::kConfigErrorExitCode;
  }
  // A shard's config host is ps.host when the config sets it (shards on
  // one machine), else its node's.
  auto host = gridsync::ResolveProcessHost(
      host_flag, placement.host, config->layout.multi_host,
      config->ps.host_given ? "ps.host in the config" : "its node's host in the config");
  if (!host.ok()) {
    std::fprintf(stderr, "shard %d: %s\n", shard, host.status().message().c_str());
    return gridsync::kConfigErrorExitCode;
  }
  placement.host = host->host;
  const std::string advertised = placement.Endpoint();
  if (!bind.empty()) placement.host = bind;
  // The workers connect to the advertised name; the socket binds a number.
  auto bind_address = gridsync::BindAddressOf(placement.host);
  if (!bind_address.ok()) {
    // What check-config refuses (CheckHostsResolve), refused the same way,
    // naming where the name came from.
    const char* source = !bind.empty()           ? "--bind"
                         : !host_flag.empty()    ? "--host"
                         : config->ps.host_given ? "ps.host"
                                                 : "its node's host (distributed.nodes)";
    std::fprintf(stderr, "shard %d: %s: %s\n", shard, source,
                 bind_address.status().message().c_str());
    return gridsync::kConfigErrorExitCode;
  }
  placement.host = *bind_address;
  options.endpoint = placement.Endpoint();

  auto auth = gridsync::wire::ControlAuthFor(*config, "shard");
  if (!auth.ok()) {
    std::fprintf(stderr, "%s: %s\n", config_path.c_str(), auth.status().message().c_str());
    return gridsync::kConfigErrorExitCode;
  }
  const auto& d = config->distributed;
  auto client =
      gridsync::CoordinatorClient::Connect(d.master_addr, static_cast<uint16_t>(d.master_port),
                                           options.timeout, *auth, gridsync::Role::kShard);
  if (!client.ok()) {
    spdlog::error("cannot reach the coordinator: {}", client.status().ToString());
    return 1;
  }
  // A call the coordinator does not answer ends within timeout_s (at most
  // the client's 10 s): the serving loop's ping to it feeds the watchdog,
  // which fires at 1.5 x timeout_s, and a partitioned shard was killed as
  // "hung" before it could exit naming the coordinator (a hostile probe,
  // timeout_s 5).
  (*client)->SetReplyTimeout(
      std::min<std::chrono::milliseconds>(options.timeout, std::chrono::seconds(10)));
  gridsync::CoordinatorStore registry(client->get());  // outlives the shard
  // Restarted during training (systemd's Restart=on-failure, or by hand):
  // rejoin from the job's newest complete checkpoint, never with fresh
  // parameters.
  uint64_t rejoin_step = 0;
  if (resume_step == 0) {
    auto found = gridsync::FindRejoinStep(**client, *spec, static_cast<uint32_t>(shard));
    if (!found.ok()) {
      spdlog::error("{}", found.status().ToString());
      return 1;
    }
    rejoin_step = *found;
    if (rejoin_step > 0) {
      options.resume_step = rejoin_step;
      options.rejoining = true;
      spdlog::info("the job is training: rejoining it from the checkpoint of step {}", rejoin_step);
    }
  }
  // The exit code of a start refused over checkpoint files: 3 for another
  // run's (no restart mends it; the coordinator is told why first, for the
  // others' wait to name it), 1 otherwise.
  auto refused_start = [&](const gridsync::Status& why) {
    if (why.code() != gridsync::StatusCode::kCheckpointsHeld) return 1;
    gridsync::ReportCannotJoin(**client, gridsync::Role::kShard, static_cast<uint32_t>(shard), why);
    return gridsync::kCheckpointsHeldExitCode;
  };
  // Neither resuming nor rejoining: a fresh start, which must not delete
  // checkpoints of a run the coordinator does not know (it restarted).
  if (options.resume_step == 0 && config->checkpoint.every_steps > 0) {
    auto map = (*client)->GetMap(/*wait_complete=*/false, std::chrono::milliseconds(0));
    const gridsync::Status fresh =
        map.ok() ? gridsync::CheckFreshStartAgainst(
                       registry, map->job, config->checkpoint.dir,
                       gridsync::ShardPart(static_cast<uint32_t>(shard)),
                       gridsync::CheckpointParts(
                           static_cast<uint32_t>(config->ps.shards),
                           spec->sync.worker_state
                               ? static_cast<uint32_t>(config->distributed.world_size)
                               : 0),
                       static_cast<uint64_t>(config->training.steps))
                 : map.status();
    if (!fresh.ok()) {
      spdlog::error("shard {} (coordinator {}:{}): {}", shard, d.master_addr, d.master_port,
                    fresh.message());
      return refused_start(fresh);
    }
  }
  options.join_first = true;  // serves once registered (JoinAsShard)
  auto server = gridsync::PsShard::Start(*partition, options);
  // Rejoining, its files of the job's step may not load (a corrupted .bin:
  // Corruption, permanent): every restart would fail the same way until the
  // restarts ran out. It rejoins from an older step every part still holds,
  // and the job goes back there. An explicit --resume-step is not changed.
  while (!server.ok() && rejoin_step > 0 &&
         server.status().code() == gridsync::StatusCode::kCorruption) {
    // Set aside and no longer published, so that no other process rejoins
    // the job at this step meanwhile.
    auto map = (*client)->GetMap(/*wait_complete=*/false, std::chrono::milliseconds(0));
    const gridsync::Status aside =
        map.ok()
            ? gridsync::SetAsideDamagedPart(registry, map->job, config->checkpoint.dir, rejoin_step,
                                            gridsync::ShardPart(static_cast<uint32_t>(shard)))
            : map.status();
    if (!aside.ok()) {
      spdlog::error("{}; setting its files aside failed: {}", server.status().ToString(),
                    aside.ToString());
      break;
    }
    auto older =
        gridsync::FindRejoinStep(**client, *spec, static_cast<uint32_t>(shard), rejoin_step);
    if (!older.ok() || *older == 0) {
      spdlog::error("{}; its files are set aside (*.damaged), and no older step to rejoin from: {}",
                    server.status().ToString(),
                    older.ok() ? "every part holds none" : older.status().ToString());
      break;
    }
    spdlog::warn(
        "{}; its files are set aside (*.damaged); rejoining from the older checkpoint of step {} "
        "instead",
        server.status().ToString(), *older);
    rejoin_step = *older;
    options.resume_step = rejoin_step;
    server = gridsync::PsShard::Start(*partition, options);
  }
  if (!server.ok()) {
    spdlog::error("{}", server.status().ToString());
    return 1;
  }
  spdlog::info("serving {} values of {} tables at {} (advertised {}, {}; {} workers, {}{}, {})",
               partition->OwnedValues(options.shard), tables.size(), (*server)->endpoint(),
               advertised, host->source, options.workers, gridsync::ToString(options.consistency),
               options.consistency == gridsync::Consistency::kSsp
                   ? " staleness " + std::to_string(options.staleness)
                   : "",
               options.apply_updates ? "updates from the workers' Adam" : "Adam on the shard");

  gridsync::RegisterInfo info;
  info.role = gridsync::Role::kShard;
  info.requested_rank = shard;
  info.node = config->layout.nodes[static_cast<size_t>(placement.node)].name;
  info.endpoint = advertised;
  info.pid = static_cast<uint32_t>(getpid());
  info.tables = tables;
  info.shared_settings = gridsync::SharedSettings(*spec);
  // Files of a checkpoint are checked to be of one run with the other
  // shards' (a resume) or the job's (a rejoin) before registering, which
  // would move the job's epoch and roll every process back.
  if (options.resume_step > 0) {
    auto map = (*client)->GetMap(/*wait_complete=*/false, std::chrono::milliseconds(0));
    const gridsync::Status run =
        map.ok() ? (*server)->CheckStartRun(registry, map->job) : map.status();
    if (!run.ok()) {
      spdlog::error("shard {}: {}", shard, run.ToString());
      return refused_start(run);
    }
  }
  // Job after job, epoch after epoch: the shard asks the coordinator
  // whether a new one began, and publishes its checkpoints' steps there.
  auto registered =
      gridsync::JoinAsShard(**server, **client, &registry, info, rejoin_step, options.timeout);
  if (!registered.ok()) {
    spdlog::error("cannot join the cluster's job: {}", registered.status().ToString());
    return registered.status().code() == gridsync::StatusCode::kFailedPrecondition
               ? gridsync::kCannotRejoinExitCode
               : 1;
  }
  spdlog::info("registered as shard {} (cluster map generation {}, job {}{})", registered->rank,
               registered->map.generation, registered->map.job,
               registered->map.epoch > 0 ? ", epoch " + std::to_string(registered->map.epoch)
                                         : std::string());
  // Metrics on the shard's own address; the monitor finds them in the store.
  std::unique_ptr<gridsync::MetricsEndpoint> metrics;
  const int port = ops.metrics_port >= 0 ? ops.metrics_port
                                         : gridsync::MetricsPortOf(config->metrics.port, "shard",
                                                                   shard, config->ps.shards);
  if (port > 0) {
    auto started =
        gridsync::MetricsEndpoint::Start(host->host, static_cast<uint16_t>(port),
                                         {{"role", "shard"}, {"rank", std::to_string(shard)}});
    if (!started.ok()) {
      spdlog::error("shard {}: {}", shard, started.status().ToString());
      return 1;
    }
    metrics = std::move(started).value();
    gridsync::ExposeShardMetrics(*metrics, **server);
    if (auto published =
            (*client)->Set("metrics/shard/" + std::to_string(shard), metrics->address());
        !published.ok()) {
      spdlog::warn("shard {}: metrics address not published: {}", shard, published.ToString());
    }
    spdlog::info("metrics at http://{}/metrics", metrics->address());
  }
  // Under systemd (Type=notify): serving and registered.
  gridsync::NotifyReady("serving");

  std::signal(SIGINT, OnSignal);
  std::signal(SIGTERM, OnSignal);
  // systemd's watchdog is fed while the shard's serving loop turns, from a
  // thread of its own: the loop below waits up to timeout_s on each call to
  // the coordinator, and fed from there the watchdog of gridsync launch
  // (1.5 x timeout_s) killed a shard whose link was cut as hung while its
  // serving loop turned (a hostile probe), before the shard could say it
  // had lost the coordinator.
  const gridsync::WatchdogPinger watchdog(gridsync::ServiceWatchdog::FromEnvironment(),
                                          [&server] { return (*server)->heartbeats(); });
  // The shard's membership lasts as its connection to the coordinator. Once
  // that is gone (the coordinator died, or a call to it timed out and the
  // client closed it), the coordinator has dropped this shard and its later
  // jobs and epochs would be refused here: serving on would only hang the
  // workers. Asked four times within timeout_s (0.25 to 5 s apart); on loss
  // the shard exits failed, so that its supervisor (systemd's
  // Restart=on-failure, gridsync launch) restarts it and it rejoins the job
  // from its newest complete checkpoint. The answer also tells the shard
  // which workers are members (NoteCoordinatorState): a pull held for a
  // missing push needs one asked after it arrived.
  const auto ping_every = gridsync::MemberPingInterval(options.timeout);
  auto next_ping = std::chrono::steady_clock::now() + ping_every;
  int exit_code = 0;
  while (!g_stop) {
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
    const auto now = std::chrono::steady_clock::now();
    if (const auto serving = (*server)->serving_stats(); serving.foreign_rollback_step > 0) {
      spdlog::error(
          "shard {}: its checkpoint of step {} is another run's (logged above); exiting {}: a "
          "restart would find the same files",
          shard, serving.foreign_rollback_step, gridsync::kCheckpointsHeldExitCode);
      gridsync::ReportCannotJoin(
          **client, gridsync::Role::kShard, static_cast<uint32_t>(shard),
          gridsync::Status::CheckpointsHeld(
              fmt::format("its checkpoint of step {} is another run's (its log names the files)",
                          serving.foreign_rollback_step)));
      exit_code = gridsync::kCheckpointsHeldExitCode;
      break;
    } else if (serving.damaged_rollback_step > 0) {
      const uint64_t damaged = serving.damaged_rollback_step;
      // Serving on would refuse every request until the workers timed out.
      // Its files are set aside and no longer published, so that restarted
      // it rejoins from an older step (and so does the job).
      const gridsync::Status aside =
          gridsync::SetAsideDamagedPart(registry, serving.job, config->checkpoint.dir, damaged,
                                        gridsync::ShardPart(static_cast<uint32_t>(shard)));
      spdlog::error(
          "shard {}: its checkpoint of step {} failed its checks in a rollback; {}; exiting so "
          "that its supervisor restarts it into a rejoin from an older step",
          shard, damaged,
          aside.ok() ? "its files are set aside (*.damaged)"
                     : "setting its files aside failed: " + aside.ToString());
      exit_code = 1;
      break;
    }
    if (now >= next_ping) {
      const auto asked = std::chrono::steady_clock::now();
      if (auto job = (*client)->CurrentJob(); !job.ok()) {
        // A coordinator stopped along with the whole cluster (a target
        // stopped, gridsync launch stopping everyone) is no loss: the stop
        // signal reaches this shard within a moment, so wait for it.
        for (int i = 0; i < 10 && !g_stop; ++i)
          std::this_thread::sleep_for(std::chrono::milliseconds(100));
        if (g_stop) break;
        spdlog::error("shard {}: lost the coordinator at {}:{} ({}); exiting so that {}", shard,
                      d.master_addr, d.master_port, job.status().message(),
                      config->checkpoint.every_steps > 0
                          ? "its supervisor restarts this shard and it rejoins the job from "
                            "its newest complete checkpoint"
                          : "the job ends: it keeps no checkpoints (checkpoint.every_steps is "
                            "0), so a restarted shard cannot rejoin it");
        exit_code = 1;
        break;
      } else {
        // Who the job's members are, for the pulls the shard holds
        // (PsShard::NoteCoordinatorState).
        (*server)->NoteCoordinatorState(*job, asked);
      }
      next_ping = std::chrono::steady_clock::now() + ping_every;
    }
  }
  gridsync::NotifyStopping();
  metrics.reset();  // before the shard it reads
  const auto stats = (*server)->stats();
  const auto serving = (*server)->serving_stats();
  // The counts first, as log readers parse them; then why it stops.
  spdlog::info(
      "stopping: {} pushes, {} pulls ({} answered in {} parts), {} errors, {:.1f} MB in, {:.1f} "
      "MB out{}",
      stats.pushes, stats.pulls, serving.pulls_in_parts, serving.reply_parts, stats.errors,
      stats.bytes_in / 1e6, stats.bytes_out / 1e6,
      g_stop == SIGTERM  ? "; received SIGTERM"
      : g_stop == SIGINT ? "; received SIGINT"
                         : "");
  (*server)->Stop();
  if (serving.checkpoint_failures > 0 && exit_code == 0) {
    spdlog::error(
        "shard {}: {} checkpoint(s) were not written since it started (the errors above name "
        "the steps and why); its checkpoints in {} may be incomplete",
        shard, serving.checkpoint_failures, config->checkpoint.dir);
    exit_code = gridsync::kCheckpointsNotWrittenExitCode;
  }
  return exit_code;
}
