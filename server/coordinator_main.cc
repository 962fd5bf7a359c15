// gridsync-coordinator: the control plane. Serves registration, the cluster
// map, barriers and the KV store on distributed.master_addr:master_port
// until SIGINT or SIGTERM, then exits 0. A config error exits 2
// (kConfigErrorExitCode) before anything listens. With checkpoints on, it
// keeps its job in <checkpoint.dir>/coordinator-state.json and, restarted,
// serves that job again (server/coordinator_state.h); --fresh forgets it.
#include <spdlog/spdlog.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <boost/asio/io_context.hpp>
#include <boost/asio/signal_set.hpp>
#include <chrono>
#include <cmath>
#include <csignal>
#include <cstdio>
#include <string>
#include <vector>

#include "common/cli_parse.h"
#include "common/cluster_layout.h"
#include "common/config.h"
#include "common/file_limit.h"
#include "common/host_address.h"
#include "common/logging.h"
#include "common/member_liveness.h"
#include "common/server_config.h"
#include "ops/metrics.h"
#include "ops/service_watchdog.h"
#include "server/coordinator.h"
#include "server/serve_metrics.h"
#include "spec/cluster_settings.h"
#include "spec/run_spec.h"

int main(int argc, char** argv) {
  gridsync::KeepStandardStreamsOpen();  // before any descriptor is made
  gridsync::IgnoreHangup();             // nothing to reload: the config is read once
  CLI::App app{
      "gridsync-coordinator: the control plane (registration, cluster map, barriers, KV store)"};
  std::string config_path;
  std::vector<std::string> overrides;
  int port = -1;
  std::string log_level = "info";
  app.add_option("-c,--config", config_path, "JSON config file")->required();
  app.add_option("--set", overrides,
                 "Override a config key: --set distributed.master_port=29600 (repeatable)");
  app.add_option("--port", port,
                 "Listen on this port instead of distributed.master_port (0: any free port)")
      ->check(CLI::Range(0, 65535));
  std::string bind;
  app.add_option("--bind", bind,
                 "Address to listen on instead of distributed.master_addr, e.g. 0.0.0.0")
      ->check(gridsync::HostSyntax());
  bool fresh = false;
  app.add_flag("--fresh", fresh,
               "Start at job 1, forgetting the job a previous run of this coordinator kept in "
               "<checkpoint.dir>/coordinator-state.json (gridsync launch starts every run so)");
  gridsync::OpsFlags ops;
  gridsync::AddOpsFlags(app, &ops, nullptr);
  app.add_option("--log-level", log_level, "trace, debug, info, warn, error")
      ->check(CLI::IsMember({"trace", "debug", "info", "warn", "error"}));
  GRIDSYNC_PARSE_COMMAND_LINE(app, argc, argv);
  gridsync::InitLogging("coordinator", log_level);
  // One descriptor per connection: a coordinator started by hand keeps the
  // usual soft limit of 1024 otherwise (common/file_limit.h).
  gridsync::RaiseOpenFileLimitForServing();

  // One process trains alone: there is no cluster to coordinate (it served
  // "0 shards, 1 worker" forever, while launch and the shards refused it);
  // and its state file goes to checkpoint.dir.
  auto config = gridsync::LoadServerConfig(config_path, overrides, "coordinator");
  if (!config) return gridsync::kConfigErrorExitCode;
  auto spec = gridsync::RunSpec::Resolve(*config);
  if (!spec.ok()) {
    std::fprintf(stderr, "%s\n", spec.status().message().c_str());
    return gridsync::kConfigErrorExitCode;
  }
  // Under systemd (Type=notify): the start may take what the waits before
  // READY=1 allow (ServerStartTimeout), not only the unit's 90 s.
  gridsync::NotifyStartTimeout(gridsync::ServerStartTimeout(config->distributed.timeout_s));

  // Installed before the server starts, so a signal is never lost to the
  // default action once we listen.
  boost::asio::io_context signals_io;
  boost::asio::signal_set signals(signals_io, SIGINT, SIGTERM);
  int received = 0;
  signals.async_wait([&](const boost::system::error_code& ec, int signal_number) {
    if (!ec) received = signal_number;
  });

  gridsync::CoordinatorOptions options;
  options.bind_host = bind.empty() ? config->distributed.master_addr : bind;
  options.port = static_cast<uint16_t>(port >= 0 ? port : config->distributed.master_port);
  // The address resolves here first, as check-config requires of
  // distributed.master_addr (CheckHostsResolve): a name this machine does
  // not resolve is the config's error, and says which key holds it (it was
  // exit 1, "cannot resolve bind address", naming none; a hostile probe).
  if (auto address = gridsync::BindAddressOf(options.bind_host); !address.ok()) {
    std::fprintf(stderr, "%s: %s: %s\n", config_path.c_str(),
                 bind.empty() ? "distributed.master_addr" : "--bind",
                 address.status().message().c_str());
    return gridsync::kConfigErrorExitCode;
  }
  // All-reduce clusters have no PS shards to wait for.
  options.expected_shards = config->distributed.gradient_sync == gridsync::GradientSyncMode::kNccl
                                ? 0
                                : static_cast<uint32_t>(config->ps.shards);
  options.expected_workers = static_cast<uint32_t>(config->distributed.world_size);
  // A member silent for timeout_s on top of its own ping interval
  // (common/member_liveness.h).
  options.dead_peer_after = gridsync::DeadPeerAfter(config->distributed.timeout());
  auto auth = gridsync::wire::ControlAuthFor(*config, "coordinator");
  if (!auth.ok()) {
    std::fprintf(stderr, "%s: %s\n", config_path.c_str(), auth.status().message().c_str());
    return gridsync::kConfigErrorExitCode;
  }
  options.auth = *auth;
  // This config is the cluster's: a member whose shared settings differ is
  // refused, naming this file, whichever registers first.
  options.shared_settings = gridsync::SharedSettings(*spec);
  options.shared_settings_source = "the coordinator's config " + config_path;
  // With checkpoints, the job survives this process: restarted, it serves
  // the same job and its restarted shards and workers rejoin it.
  if (config->checkpoint.every_steps > 0) {
    options.state_file = config->checkpoint.dir + "/coordinator-state.json";
    options.fresh_state = fresh;
  } else if (fresh) {
    std::fprintf(stderr,
                 "%s: --fresh: this coordinator keeps no job to forget (checkpoint.every_steps "
                 "is 0); allowed: --fresh with checkpoint.every_steps > 0\n",
                 config_path.c_str());
    return gridsync::kConfigErrorExitCode;
  }
  // Nor a shard's: the config's ports are checked against each other
  // (CheckPorts), a --port was not (a hostile probe: shard 0's port taken,
  // the shard's bind then failing at its start).
  if (port >= 0) {
    for (size_t s = 0; s < config->layout.shards.size(); ++s) {
      const gridsync::ShardPlacement& shard = config->layout.shards[s];
      const bool same_machine =
          !config->layout.multi_host || shard.host == config->distributed.master_addr;
      if (same_machine && shard.port == port &&
          config->distributed.gradient_sync != gridsync::GradientSyncMode::kNccl) {
        std::fprintf(stderr,
                     "%s: --port %d is where shard %zu listens (%s); allowed: a port clear of the "
                     "shards' ports\n",
                     config_path.c_str(), port, s,
                     config->ps.base_port > 0 ? "ps.base_port + its index"
                                              : "distributed.master_port + 1 + its index");
        return gridsync::kConfigErrorExitCode;
      }
    }
  }
  // One port cannot serve both: the second bind failed with exit 1 after
  // the coordinator had started (a hostile probe). Refused as a usage error.
  const int mport = ops.metrics_port >= 0 ? ops.metrics_port : config->metrics.port;
  if (mport > 0 && mport == options.port) {
    std::fprintf(stderr,
                 "%s: metrics port %d (%s) is the coordinator's port (%s); allowed: another "
                 "port, or 0 for no metrics endpoint\n",
                 config_path.c_str(), mport,
                 ops.metrics_port >= 0 ? "--metrics-port" : "metrics.port",
                 port >= 0 ? "--port" : "distributed.master_port");
    return gridsync::kConfigErrorExitCode;
  }
  if (auto flag = gridsync::CheckMetricsPortFlag(*config, ops.metrics_port,
                                                 config->distributed.master_addr);
      !flag.ok()) {
    std::fprintf(stderr, "%s: %s\n", config_path.c_str(), flag.message().c_str());
    return gridsync::kConfigErrorExitCode;
  }
  auto coordinator = gridsync::Coordinator::Start(options);
  if (!coordinator.ok()) {
    spdlog::error("{}", coordinator.status().message());
    return 1;
  }
  spdlog::info("listening on {}:{} (expecting {} shards, {} workers; config {})", options.bind_host,
               (*coordinator)->port(), options.expected_shards, options.expected_workers,
               config->source);
  // Metrics, published in the coordinator's own store for the monitor.
  std::unique_ptr<gridsync::MetricsEndpoint> metrics;
  if (mport > 0) {
    auto started = gridsync::MetricsEndpoint::Start(options.bind_host, static_cast<uint16_t>(mport),
                                                    {{"role", "coordinator"}, {"rank", "0"}});
    if (!started.ok()) {
      spdlog::error("{}", started.status().ToString());
      return 1;
    }
    metrics = std::move(started).value();
    gridsync::ExposeCoordinatorMetrics(*metrics, **coordinator);
    const std::string advertised = (options.bind_host == "0.0.0.0" || options.bind_host == "::"
                                        ? config->distributed.master_addr
                                        : options.bind_host) +
                                   ":" + std::to_string(metrics->port());
    (*coordinator)->StoreLocally("metrics/coordinator/0", advertised);
    spdlog::info("metrics at http://{}/metrics", advertised);
  }
  // Under systemd (Type=notify) this is when dependents may start.
  gridsync::NotifyReady("serving");

  // Until a signal: systemd's watchdog is fed while the serving thread turns.
  auto watchdog = gridsync::ServiceWatchdog::FromEnvironment();
  while (received == 0) {
    signals_io.run_for(watchdog.interval());
    if (received == 0) watchdog.Tick((*coordinator)->heartbeats());
  }
  gridsync::NotifyStopping();
  metrics.reset();  // before the coordinator it reads
  spdlog::info("received {}; stopping", received == SIGINT ? "SIGINT" : "SIGTERM");
  (*coordinator)->Stop();
  return 0;
}
