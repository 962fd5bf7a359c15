#include "tools/monitor.h"

#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <csignal>
#include <cstdio>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "common/cluster_map.h"
#include "common/config.h"
#include "common/coordinator_client.h"
#include "common/logging.h"
#include "common/thread_pool.h"
#include "common/wire/curve.h"
#include "ops/metrics_scrape.h"

namespace gridsync {
namespace {

// Read by the scrape threads too: an atomic (lock-free, so the handler may
// set it), not a volatile sig_atomic_t.
std::atomic<bool> g_stop{false};
static_assert(std::atomic<bool>::is_always_lock_free);
void OnSignal(int) { g_stop.store(true); }

// The metrics address a member put in the store, or "" if none.
std::string AddressOf(CoordinatorClient& coordinator, const std::string& key) {
  // No wait: a member without metrics never sets its key.
  auto values = coordinator.Get({key}, std::chrono::milliseconds(0));
  return values.ok() && !values->empty() ? values->front() : "";
}

nlohmann::json WorkerView(const ScrapedMetrics& m) {
  const double prepare =
      MetricValue(m, "gridsync_worker_phase_seconds_total", {{"phase", "prepare"}});
  const double compute =
      MetricValue(m, "gridsync_worker_phase_seconds_total", {{"phase", "compute"}});
  const double apply = MetricValue(m, "gridsync_worker_phase_seconds_total", {{"phase", "apply"}});
  const double comm =
      MetricValue(m, "gridsync_worker_phase_seconds_total", {{"phase", "push"}}) +
      MetricValue(m, "gridsync_worker_phase_seconds_total", {{"phase", "pull_wait"}}) +
      MetricValue(m, "gridsync_worker_phase_seconds_total", {{"phase", "allreduce"}});
  const double steps = MetricValue(m, "gridsync_worker_steps_total");
  const double total = prepare + compute + apply;
  nlohmann::json w;
  w["step"] = steps;
  w["steps"] = MetricValue(m, "gridsync_worker_steps_planned");
  w["step_seconds"] = steps > 0 ? total / steps : 0.0;
  w["comm_share"] = total > 0 ? comm / total : 0.0;
  w["samples_per_second"] = MetricValue(m, "gridsync_worker_samples_per_second");
  w["loss"] = MetricValue(m, "gridsync_worker_loss");
  // 0 until the model holder's first evaluation (and always on the other
  // ranks): none yet, shown as such rather than as 0.00 dB.
  const double psnr = MetricValue(m, "gridsync_worker_psnr_db");
  w["psnr_db"] = psnr > 0 ? nlohmann::json(psnr) : nlohmann::json(nullptr);
  w["bytes_sent"] = MetricValue(m, "gridsync_worker_bytes_total", {{"direction", "sent"}});
  w["bytes_received"] = MetricValue(m, "gridsync_worker_bytes_total", {{"direction", "received"}});
  if (m.count("gridsync_gpu_utilization_ratio")) {
    w["gpu_utilization"] = MetricValue(m, "gridsync_gpu_utilization_ratio");
    w["gpu_memory_bytes"] = MetricValue(m, "gridsync_gpu_memory_used_bytes");
  }
  return w;
}

nlohmann::json ShardView(const ScrapedMetrics& m) {
  nlohmann::json s;
  s["version"] = MetricValue(m, "gridsync_shard_version");
  s["job"] = MetricValue(m, "gridsync_shard_job");
  s["pushes"] = MetricValue(m, "gridsync_shard_pushes_total");
  s["pulls"] = MetricValue(m, "gridsync_shard_pulls_total");
  s["bytes_in"] = MetricValue(m, "gridsync_shard_bytes_total", {{"direction", "in"}});
  s["bytes_out"] = MetricValue(m, "gridsync_shard_bytes_total", {{"direction", "out"}});
  s["waiting_pulls"] = MetricValue(m, "gridsync_shard_waiting_pulls");
  s["refusals"] = MetricValue(m, "gridsync_shard_refusals_total");
  const double n = MetricValue(m, "gridsync_shard_apply_seconds_count");
  s["apply_seconds_mean"] = n > 0 ? MetricValue(m, "gridsync_shard_apply_seconds_sum") / n : 0.0;
  return s;
}

nlohmann::json CoordinatorView(const ScrapedMetrics& m) {
  nlohmann::json c;
  c["job"] = MetricValue(m, "gridsync_coordinator_job");
  c["generation"] = MetricValue(m, "gridsync_coordinator_generation");
  c["barrier_waiting"] = MetricValue(m, "gridsync_coordinator_barrier_waiting");
  c["barriers_passed"] = MetricValue(m, "gridsync_coordinator_barriers_passed_total");
  c["connections"] = MetricValue(m, "gridsync_coordinator_connections");
  return c;
}

// Members scraped at once: a refresh takes about one --timeout for every
// 16 silent members (one after another, 8 silent shards held a refresh,
// and a SIGTERM, 15 s: a hostile probe), and a SIGTERM ends it within a
// 50 ms slice.
constexpr size_t kConcurrentScrapes = 16;

bool Stopped() { return g_stop.load(); }

// One look at the whole cluster.
Result<nlohmann::json> Snapshot(CoordinatorClient& coordinator, std::chrono::milliseconds timeout) {
  GRIDSYNC_ASSIGN_OR_RETURN(const ClusterMap map, coordinator.GetMap(false, timeout));
  nlohmann::json view;
  view["job"] = map.job;
  view["generation"] = map.generation;
  view["shards_expected"] = map.expected_shards;
  view["workers_expected"] = map.expected_workers;
  struct Member {
    nlohmann::json* entry;
    std::string address;
    nlohmann::json (*describe)(const ScrapedMetrics&);
  };
  std::vector<Member> members;
  auto member = [&](nlohmann::json* entry, const std::string& role, uint32_t rank,
                    const std::string& node, nlohmann::json (*describe)(const ScrapedMetrics&)) {
    (*entry)["rank"] = rank;
    if (!node.empty()) (*entry)["node"] = node;
    // The coordinator's answers come one connection's way: read here,
    // before the scrapes run at once.
    const std::string address =
        AddressOf(coordinator, "metrics/" + role + "/" + std::to_string(rank));
    if (address.empty()) {
      (*entry)["metrics"] = nullptr;
      (*entry)["error"] = "no metrics (metrics.port 0 or --metrics-port not set)";
      return;
    }
    (*entry)["metrics"] = address;
    members.push_back({entry, address, describe});
  };
  view["coordinator"] = nlohmann::json::object();
  view["workers"] = nlohmann::json::array();
  view["shards"] = nlohmann::json::array();
  // Sized first: the entries' addresses stay put while members point at them.
  for (size_t i = 0; i < map.workers.size(); ++i) view["workers"].push_back(nlohmann::json());
  for (size_t i = 0; i < map.shards.size(); ++i) view["shards"].push_back(nlohmann::json());
  member(&view["coordinator"], "coordinator", 0, "", CoordinatorView);
  for (size_t i = 0; i < map.workers.size(); ++i) {
    const auto& w = map.workers[i];
    member(&view["workers"][i], "worker", w.rank, w.node, WorkerView);
  }
  for (size_t i = 0; i < map.shards.size(); ++i) {
    const auto& s = map.shards[i];
    member(&view["shards"][i], "shard", s.rank, s.node, ShardView);
  }
  std::vector<std::optional<Result<ScrapedMetrics>>> scraped(members.size());
  ThreadPool pool(static_cast<int>(std::clamp<size_t>(members.size(), 1, kConcurrentScrapes)));
  pool.ParallelFor(members.size(), [&](size_t m) {
    scraped[m].emplace(ScrapeMetrics(members[m].address, timeout, Stopped));
  });
  for (size_t m = 0; m < members.size(); ++m) {
    const Result<ScrapedMetrics>& got = *scraped[m];
    if (!got.ok()) {
      (*members[m].entry)["error"] = got.status().message();
    } else {
      members[m].entry->update(members[m].describe(*got));
    }
  }
  return view;
}

std::string Mb(double bytes) {
  char buf[32];
  std::snprintf(buf, sizeof(buf), "%.1f", bytes / 1e6);
  return buf;
}

// A figure from a scrape, bounded for the table: the endpoints are peers'
// (and without security anyone's), and a loss of 1e308 printed as a
// 300-digit field, a step of NaN converted to an integer undefined. Not a
// finite number: NaN (printed "nan"); beyond +-1e15: clamped there.
double Num(const nlohmann::json& j, const char* key) {
  if (!j.contains(key) || !j[key].is_number()) return 0.0;
  const double v = j[key].get<double>();
  return std::isfinite(v) ? std::clamp(v, -1e15, 1e15) : std::nan("");
}

// Num as a whole count (steps): NaN counts as 0.
long Count(const nlohmann::json& j, const char* key) {
  const double v = Num(j, key);
  return std::isnan(v) ? 0 : static_cast<long>(v);
}

// A ratio in [0, 1] as a whole percentage; NaN counts as 0.
int Percent(const nlohmann::json& j, const char* key) {
  const double v = Num(j, key);
  return std::isnan(v) ? 0 : static_cast<int>(100 * std::clamp(v, 0.0, 1.0));
}

// A string a peer chose (a node's name, an error's text), as the table
// shows it: with its control bytes escaped (EscapeControlBytes), since a
// member's node name with terminal escapes would otherwise act on the
// operator's terminal.
std::string Shown(const nlohmann::json& j, const char* key) {
  const auto it = j.find(key);
  if (it == j.end() || !it->is_string()) return "";
  return gridsync::EscapeControlBytes(it->get<std::string>());
}

void PrintTable(const nlohmann::json& view, bool clear) {
  if (clear) std::printf("\033[H\033[2J");
  std::printf(
      "gridsync cluster: job %.0f, map generation %.0f, %zu/%.0f workers, %zu/%.0f shards\n",
      Num(view, "job"), Num(view, "generation"), view["workers"].size(),
      Num(view, "workers_expected"), view["shards"].size(), Num(view, "shards_expected"));
  const auto& c = view["coordinator"];
  if (c.contains("error")) {
    std::printf("coordinator: %s\n", Shown(c, "error").c_str());
  } else {
    std::printf("coordinator: %.0f connections, %.0f waiting at a barrier, %.0f barriers passed\n",
                Num(c, "connections"), Num(c, "barrier_waiting"), Num(c, "barriers_passed"));
  }
  std::printf("\n%-7s %-10s %11s %9s %6s %12s %10s %7s %9s %9s %s\n", "worker", "node", "step",
              "step ms", "comm", "samples/s", "loss", "PSNR", "sent MB", "recv MB", "GPU");
  for (const auto& w : view["workers"]) {
    if (w.contains("error")) {
      std::printf("%-7.0f %-10s %s\n", Num(w, "rank"), Shown(w, "node").c_str(),
                  Shown(w, "error").c_str());
      continue;
    }
    const std::string step =
        std::to_string(Count(w, "step")) + "/" + std::to_string(Count(w, "steps"));
    const std::string gpu = w.contains("gpu_utilization")
                                ? std::to_string(Percent(w, "gpu_utilization")) + "% " +
                                      Mb(Num(w, "gpu_memory_bytes")) + " MB"
                                : "-";
    char psnr[32] = "-";
    if (w.contains("psnr_db") && w["psnr_db"].is_number())
      std::snprintf(psnr, sizeof(psnr), "%.2f", Num(w, "psnr_db"));
    std::printf("%-7.0f %-10s %11s %9.1f %5.0f%% %12.0f %10.6f %7s %9s %9s %s\n", Num(w, "rank"),
                Shown(w, "node").c_str(), step.c_str(), 1e3 * Num(w, "step_seconds"),
                100 * Num(w, "comm_share"), Num(w, "samples_per_second"), Num(w, "loss"), psnr,
                Mb(Num(w, "bytes_sent")).c_str(), Mb(Num(w, "bytes_received")).c_str(),
                gpu.c_str());
  }
  std::printf("\n%-7s %-10s %8s %9s %9s %9s %9s %8s %10s %8s\n", "shard", "node", "version",
              "pushes", "pulls", "in MB", "out MB", "waiting", "apply ms", "refused");
  for (const auto& s : view["shards"]) {
    if (s.contains("error")) {
      std::printf("%-7.0f %-10s %s\n", Num(s, "rank"), Shown(s, "node").c_str(),
                  Shown(s, "error").c_str());
      continue;
    }
    std::printf("%-7.0f %-10s %8.0f %9.0f %9.0f %9s %9s %8.0f %10.2f %8.0f\n", Num(s, "rank"),
                Shown(s, "node").c_str(), Num(s, "version"), Num(s, "pushes"), Num(s, "pulls"),
                Mb(Num(s, "bytes_in")).c_str(), Mb(Num(s, "bytes_out")).c_str(),
                Num(s, "waiting_pulls"), 1e3 * Num(s, "apply_seconds_mean"), Num(s, "refusals"));
  }
  std::fflush(stdout);
}

}  // namespace

void PrintJsonError(const std::string& code, const std::string& message, int exit_code) {
  nlohmann::json error;
  error["error"] = {{"code", code}, {"message", message}, {"exit_code", exit_code}};
  std::printf("%s\n", error.dump(-1, ' ', true, nlohmann::json::error_handler_t::replace).c_str());
  std::fflush(stdout);
}

int RunMonitor(const MonitorOptions& options) {
  // An error goes to stderr as text and, under --json, to stdout as one
  // JSON line as well: a program reading the view lines must not take the
  // end of its input for a quiet cluster.
  auto fail = [&](const Status& status, const std::string& text, int exit_code) {
    std::fprintf(stderr, "%s\n", text.c_str());
    if (options.json) PrintJsonError(std::string(StatusCodeName(status.code())), text, exit_code);
    return exit_code;
  };
  auto config = Config::LoadFile(options.config_path, options.overrides);
  if (!config.ok()) {
    return fail(config.status(), config.status().message(), kConfigErrorExitCode);
  }
  auto auth = wire::ControlAuthFor(*config, "observer");
  if (!auth.ok()) {
    return fail(auth.status(), options.config_path + ": " + auth.status().message(),
                kConfigErrorExitCode);
  }
  const auto timeout =
      std::chrono::milliseconds(static_cast<int64_t>(options.timeout_seconds * 1000));
  const auto& d = config->distributed;
  auto coordinator = CoordinatorClient::Connect(d.master_addr, static_cast<uint16_t>(d.master_port),
                                                timeout, *auth, Role::kObserver);
  if (!coordinator.ok()) {
    return fail(coordinator.status(), "gridsync monitor: " + coordinator.status().ToString(), 1);
  }
  // Every reply within --timeout too (a peer that accepted and never
  // answered held the monitor 10 s whatever --timeout said).
  (*coordinator)->SetReplyTimeout(timeout);
  std::signal(SIGINT, OnSignal);
  std::signal(SIGTERM, OnSignal);
  const bool live = !options.once && !options.json && ::isatty(STDOUT_FILENO);
  while (!g_stop) {
    auto view = Snapshot(**coordinator, timeout);
    if (g_stop) break;  // told to stop mid-refresh: no half-scraped view
    if (!view.ok()) return fail(view.status(), "gridsync monitor: " + view.status().ToString(), 1);
    if (options.json) {
      // A member's node name is its own bytes, UTF-8 or not: the strict
      // dump threw on one that is not, and monitor ended in terminate.
      // ASCII only (\uXXXX escapes, DEL's included): JSON escapes C0
      // controls alone, and C1 controls, DEL and bidi overrides reached the
      // terminal raw.
      std::printf("%s\n",
                  view->dump(-1, ' ', true, nlohmann::json::error_handler_t::replace).c_str());
      std::fflush(stdout);
    } else {
      PrintTable(*view, live);
    }
    if (options.once) break;
    const auto until =
        std::chrono::steady_clock::now() +
        std::chrono::milliseconds(static_cast<int64_t>(options.interval_seconds * 1000));
    while (!g_stop && std::chrono::steady_clock::now() < until)
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  return 0;
}

}  // namespace gridsync
