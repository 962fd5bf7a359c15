// How `gridsync launch` ends (tools/launch_finish.h): the interrupts, the
// wait for the other nodes' launchers, the summary.
//
// Thread safety: see tools/launch_finish.h.
#include "tools/launch_finish.h"

#include <signal.h>

#include <chrono>
#include <cstdio>
#include <cstring>
#include <future>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "common/coordinator_client.h"
#include "common/wire/curve.h"

namespace gridsync::launch_detail {

volatile sig_atomic_t g_interrupted = 0;

namespace {

void OnInterrupt(int signal) { g_interrupted = signal; }

}  // namespace

void CatchInterrupts() {
  struct sigaction action {};
  action.sa_handler = OnInterrupt;
  sigaction(SIGINT, &action, nullptr);
  sigaction(SIGTERM, &action, nullptr);
  sigaction(SIGHUP, &action, nullptr);
}

int InterruptedExit(const char* when) {
  const int signal = g_interrupted;  // read once: the line and the code agree
  std::printf("gridsync launch: interrupted (%s)%s\n", strsignal(signal), when);
  std::fflush(stdout);
  return 128 + signal;
}

void PrintSummary(const Child& worker0, const Config& config) {
  auto j = nlohmann::json::parse(worker0.summary, nullptr, false);
  if (j.is_discarded()) return;
  const bool ps = config.distributed.gradient_sync != GradientSyncMode::kNccl;
  std::printf("\n== gridsync launch: %d workers, %d shards, gradient_sync %s (%s), %d steps ==\n",
              config.distributed.world_size, ps ? config.ps.shards : 0,
              std::string(ToString(config.distributed.gradient_sync)).c_str(),
              ps ? std::string(ToString(config.ps.consistency)).c_str()
                 : (config.distributed.hierarchical ? "hierarchical" : "flat"),
              config.training.steps);
  std::printf("PSNR               %.2f dB\n", j.value("psnr_db", 0.0));
  std::printf("reconstruction     %s\n", j.value("png", std::string("-")).c_str());
  std::printf("throughput         %.0f samples/s (global batch %d)\n",
              j.value("samples_per_second", 0.0), config.training.batch_size);
  if (ps) {
    std::printf("pushed per step    %.2f MB (worker 0)\n",
                j.value("bytes_pushed_per_step", 0.0) / 1e6);
    std::printf("pulled per step    %.2f MB (worker 0)\n",
                j.value("bytes_pulled_per_step", 0.0) / 1e6);
  } else {
    std::printf("all-reduced/step   %.2f MB per worker (dense gradient)\n",
                j.value("bytes_pushed_per_step", 0.0) / 1e6);
  }
  const double train = j.value("train_seconds", 0.0);
  const double comm = j.value("comm_seconds", 0.0);
  std::printf(
      "communication      %.2f s of %.2f s training (%.0f%%, worker 0 blocked in communication)\n",
      comm, train, train > 0 ? 100.0 * comm / train : 0.0);
}

int WaitForOtherNodes(const Config& config, const std::string& node, std::vector<Child>& children) {
  const auto& d = config.distributed;
  const auto timeout = d.timeout();
  std::printf("gridsync launch: node %s is done; waiting up to %.0f s for the other %zu node(s)\n",
              node.c_str(), d.timeout_s, config.layout.nodes.size() - 1);
  std::fflush(stdout);
  auto done = std::async(std::launch::async, [&]() -> Status {
    GRIDSYNC_ASSIGN_OR_RETURN(const wire::ControlAuth control_auth,
                              wire::ControlAuthFor(config, "observer"));
    GRIDSYNC_ASSIGN_OR_RETURN(
        auto client, CoordinatorClient::Connect(d.master_addr, static_cast<uint16_t>(d.master_port),
                                                timeout, control_auth, Role::kObserver));
    return client->Barrier("launch/done", static_cast<uint32_t>(config.layout.nodes.size()),
                           "launcher of node " + node, timeout);
  });
  while (done.wait_for(std::chrono::milliseconds(0)) != std::future_status::ready) {
    PumpOutput(children, 100);
    Reap(children);
    if (g_interrupted) break;
  }
  if (g_interrupted) return InterruptedExit("; stopping all processes");
  const Status status = done.get();
  if (!status.ok()) {
    std::fflush(stdout);
    // This node's processes all finished. The barrier's failure says only
    // that no answer came: the others may not have finished, or they did
    // and the coordinator's node stopped its coordinator before this reply
    // reached here (a hostile probe cut the link then: the job had ended,
    // bit for bit). Exit 1 all the same, since nothing confirms the rest.
    std::fprintf(stderr,
                 "gridsync launch: node %s finished, but could not confirm that the other nodes "
                 "did: %s (the coordinator stops once every node's launcher reached this "
                 "barrier, so a lost reply looks the same; see the other nodes' launchers)\n",
                 node.c_str(), status.ToString().c_str());
    return 1;
  }
  return 0;
}

}  // namespace gridsync::launch_detail
