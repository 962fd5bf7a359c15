// gridsync-bench allreduce: in-place float32 sum all-reduce across N ranks
// on one host, in the form of nccl-tests' all_reduce_perf, side by side
// with torch.distributed (gloo) doing the same in the same run.
//
// gridsync side: N ranks as separate processes on 127.0.0.1, each joining
// the real Gloo backend (MakeCollective("gloo"), worker/collective/
// factory.h) with rendezvous through the real coordinator's KV store
// (server/coordinator.h in this process, a fresh CoordinatorClient +
// CoordinatorStore in each rank). The ranks are forked BEFORE the
// coordinator starts, so no process is forked while it has threads; each
// rank then waits for the coordinator's port on its control pipe. Ranks
// report one line per size back through a second pipe.
//
// Peer: tools/peers/torch_allreduce.py (popen, --python), which spawns as
// many ranks and measures dist.all_reduce on a float32 tensor, one thread
// per rank, printing one JSON line per size.
//
// The two sides take turns in rounds: each size's timed iterations are
// split into --rounds rounds, and gridsync's ranks run round j (released by
// a byte on their control pipes), then the peer's ranks (released by a line
// on its --control-fd), then round j + 1. The waiting side blocks in a read,
// so the sides never compete for the cores, and background load that comes
// and goes (this bench often shares 2 cores with compilers, which can turn
// a 0.2 ms round trip into a 4 ms scheduler tick for seconds at a time)
// hits both sides of a row alike instead of one side's whole size.
//
// Method, identical on both sides (the peer's docstring repeats it):
//   - sizes min, 4 min, 16 min, ... <= max, then max itself if the x4 sweep
//     skipped it (so the default 8 B .. 256 MiB ends at 256 MiB);
//     count = bytes / 4 (at least 2), size = count * 4;
//   - rank r's contribution to element i is (r + 1) + (i % 7): small
//     integers, so the sum over ranks is exact in float32 and known here;
//   - rounds: round j of R = min(--rounds, iters) gets iters / R timed
//     iterations, plus one for j < iters % R; round 0 starts with --warmup
//     untimed iterations, every later round with one (none if --warmup is
//     0) to re-warm after the pause;
//   - every iteration (warmup or timed): reset the buffer to the rank's
//     contribution (untimed), barrier (untimed: it aligns the ranks, so the
//     time is the all-reduce's and not the skew left by the reset), then
//     one timed in-place all-reduce;
//   - time = rank 0's median over the timed iterations of all rounds, in
//     us; algbw = size / time; busbw = algbw * 2(n-1)/n (nccl-tests);
//     GB/s = 1e9 B/s;
//   - #wrong: after the last iteration every rank counts the elements that
//     differ from the exact sum; the column is the total over all ranks.
//     Since the buffer is reset before each iteration, an all-reduce that
//     did nothing leaves a rank's own values, which are wrong everywhere.
//   - ratio = gridsync busbw / torch busbw (> 1: gridsync is faster). The
//     summary line gives the median ratio over sizes >= 1 MiB against the
//     target 0.95.
//
// Output: '#' lines are comments (settings, column groups, summary); every
// other stdout line is one row of whitespace-separated fields. Progress and
// errors go to stderr. --json FILE writes the same results as JSON.
// Exit code: 0 when both sides ran and #wrong is 0 everywhere (whether the
// target is met is reported, not an error), 1 on a failure or any #wrong,
// 2 on invalid arguments (105, CLI11's code, for values the parser rejects).
#include "tools/bench_allreduce.h"

#include <fcntl.h>
#include <poll.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cmath>
#include <csignal>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <sstream>
#include <string>
#include <string_view>
#include <vector>

#include "common/cli_parse.h"
#include "common/coordinator_client.h"
#include "common/status.h"
#include "common/wire/curve.h"
#include "server/coordinator.h"
#include "tools/bench.h"
#include "worker/collective/factory.h"

namespace gridsync::bench {
namespace allreduce {
namespace {

// SIGPIPE ignored while alive: writing to a rank or a peer that already
// died must fail with EPIPE and be reported, not kill the bench.
class IgnoreSigpipe {
 public:
  IgnoreSigpipe() {
    struct sigaction ignore {};
    ignore.sa_handler = SIG_IGN;
    sigemptyset(&ignore.sa_mask);
    ok_ = sigaction(SIGPIPE, &ignore, &previous_) == 0;
  }
  ~IgnoreSigpipe() {
    if (ok_) sigaction(SIGPIPE, &previous_, nullptr);
  }
  IgnoreSigpipe(const IgnoreSigpipe&) = delete;
  IgnoreSigpipe& operator=(const IgnoreSigpipe&) = delete;

 private:
  struct sigaction previous_ {};
  bool ok_ = false;
};

// ---- the table ----

int Fail(const Status& status) {
  std::fprintf(stderr, "gridsync-bench allreduce: %s\n", status.ToString().c_str());
  return 1;
}

int InvalidArgument(const std::string& message) {
  std::fprintf(stderr, "gridsync-bench allreduce: invalid argument: %s\n", message.c_str());
  return 2;
}

// "-------- label --------", `width` characters.
std::string Centered(const std::string& label, size_t width) {
  const std::string text = " " + label + " ";
  if (text.size() >= width) return text;
  const size_t left = (width - text.size()) / 2;
  return std::string(left, '-') + text + std::string(width - text.size() - left, '-');
}

// The column groups, then the columns (nccl-tests' names; the two groups
// repeat them, as all_reduce_perf's out-of-place and in-place groups do).
void PrintColumnHeaders(const std::vector<SizePlan>& plans, int rounds, bool sealed) {
  std::string iters;
  for (const auto& p : plans) {
    iters += " " + std::to_string(p.bytes()) + ":" + std::to_string(p.iters) + "/" +
             std::to_string(RoundsFor(p, rounds));
  }
  std::printf("# timed iterations/rounds per size (B):%s\n", iters.c_str());
  std::printf(
      "# %32s %s %s\n", "",
      Centered(sealed ? "gridsync (sealed Gloo ring, C++)" : "gridsync (Gloo ring, C++)", 42)
          .c_str(),
      Centered("torch.distributed (gloo)", 42).c_str());
  std::printf("# %10s %12s %6s %10s %11s %11s %7s %10s %11s %11s %7s %7s\n", "size", "count",
              "type", "time(us)", "algbw(GB/s)", "busbw(GB/s)", "#wrong", "time(us)", "algbw(GB/s)",
              "busbw(GB/s)", "#wrong", "ratio");
  std::fflush(stdout);
}

// A row; the peer's fields are "-" when it has no result for this size.
void PrintRow(const SizePlan& p, int ranks, const Measured& ours, const Measured* torch) {
  const double our_algbw = AlgBw(p.bytes(), ours.time_us);
  std::printf("  %10llu %12llu %6s %10.1f %11.3f %11.3f %7llu",
              static_cast<unsigned long long>(p.bytes()), static_cast<unsigned long long>(p.count),
              "float", ours.time_us, our_algbw, BusBw(our_algbw, ranks),
              static_cast<unsigned long long>(ours.wrong));
  if (torch != nullptr) {
    const double algbw = AlgBw(p.bytes(), torch->time_us);
    std::printf(" %10.1f %11.3f %11.3f %7llu %7.3f\n", torch->time_us, algbw, BusBw(algbw, ranks),
                static_cast<unsigned long long>(torch->wrong), torch->time_us / ours.time_us);
  } else {
    std::printf(" %10s %11s %11s %7s %7s\n", "-", "-", "-", "-", "-");
  }
  std::fflush(stdout);
}

nlohmann::json SideJson(const SizePlan& p, int ranks, const Measured& m) {
  const double algbw = AlgBw(p.bytes(), m.time_us);
  return {{"time_us", m.time_us},
          {"algbw_gbps", algbw},
          {"busbw_gbps", BusBw(algbw, ranks)},
          {"wrong", m.wrong}};
}

int RunAllReduce(const AllReduceArgs& given) {
  AllReduceArgs args = given;
  if (args.sealed) {
    // A fresh key pair a run stands for worker.key.
    auto keys = wire::GenerateCurveKeyPair();
    if (!keys.ok()) return Fail(keys.status());
    args.seal_secret = keys->secret_z85;
  }
  if (args.ranks < 2 || args.ranks > kMaxRanks) {
    return InvalidArgument("--ranks " + std::to_string(args.ranks) + "; allowed: 2.." +
                           std::to_string(kMaxRanks));
  }
  if (args.min_bytes < kMinBytes || args.max_bytes < args.min_bytes ||
      args.max_bytes > kMaxBytesAllowed) {
    return InvalidArgument("--min-bytes " + std::to_string(args.min_bytes) + ", --max-bytes " +
                           std::to_string(args.max_bytes) +
                           "; allowed: " + std::to_string(kMinBytes) +
                           " <= min <= max <= " + std::to_string(kMaxBytesAllowed) + " (4 GiB)");
  }
  if (args.iters < 0 || args.iters > kMaxIters || args.warmup < 0 || args.warmup > kMaxIters ||
      args.rounds < 1 || args.rounds > kMaxIters) {
    return InvalidArgument("--iters " + std::to_string(args.iters) + ", --warmup " +
                           std::to_string(args.warmup) + ", --rounds " +
                           std::to_string(args.rounds) + "; allowed: iters and warmup 0.." +
                           std::to_string(kMaxIters) + ", rounds 1.." + std::to_string(kMaxIters));
  }
  if (!(args.timeout_s >= 0.001 && args.timeout_s <= 86400)) {
    return InvalidArgument("--timeout " + std::to_string(args.timeout_s) +
                           "; allowed: 0.001 <= seconds <= 86400");
  }
  const std::string script = std::string(GRIDSYNC_SOURCE_DIR) + kPeerScript;
  if (!std::filesystem::is_regular_file(script)) {
    return Fail(Status::NotFound("the PyTorch peer " + script + " is missing"));
  }

  std::vector<SizePlan> plans;
  auto add = [&](uint64_t bytes) {
    SizePlan p;
    p.count = std::max(kMinCount, bytes / kElementBytes);
    if (!plans.empty() && plans.back().count >= p.count) return;
    p.iters = args.iters > 0 ? args.iters
                             : static_cast<int>(std::clamp<uint64_t>(kAutoItersBytes / p.bytes(),
                                                                     kAutoItersMin, kAutoItersMax));
    plans.push_back(p);
  };
  for (uint64_t bytes = args.min_bytes; bytes <= args.max_bytes; bytes *= 4) add(bytes);
  add(args.max_bytes);  // no-op when the x4 sweep landed on it

  std::printf(
      "# gridsync-bench allreduce: %d ranks as processes on 127.0.0.1; float32 sum, in place; "
      "gridsync: Gloo ring (MakeCollective(\"gloo\"), rendezvous via the coordinator KV store)%s; "
      "peer: torch.distributed gloo, 1 thread per rank; warmup %d; iters %s; rounds %d "
      "(alternating gridsync, torch; later rounds re-warm with 1 iteration); each iteration: "
      "reset + barrier untimed, then one timed all-reduce; time = rank 0's median over all "
      "rounds; algbw = size/time; busbw = algbw*2(n-1)/n; GB/s = 1e9 B/s; #wrong = elements != "
      "exact sum after the last iteration, over all ranks; ratio = gridsync busbw / torch busbw; "
      "timeout %gs\n",
      args.ranks,
      args.sealed ? ", every message sealed (XChaCha20-Poly1305 in parts of 256 KiB, as under "
                    "security.curve: sealed_ring.h)"
                  : "",
      args.warmup,
      args.iters > 0 ? std::to_string(args.iters).c_str() : "auto (8 GiB / size, 10..1000)",
      args.rounds, args.timeout_s);
  std::fflush(stdout);

  // Order matters: the ranks fork while this process has no threads yet;
  // then the coordinator (a thread) and the peer start. Destruction runs in
  // reverse on an early return: the peer is told to stop, the coordinator
  // stops, the ranks are killed.
  const IgnoreSigpipe ignore_sigpipe;
  auto ranks = GridsyncRanks::Fork(args, plans);
  if (!ranks.ok()) return Fail(ranks.status());
  CoordinatorOptions coordinator_options;
  coordinator_options.port = 0;  // any free port; the ranks get it over their pipes
  auto coordinator = Coordinator::Start(coordinator_options);
  if (!coordinator.ok()) return Fail(coordinator.status().WithContext("starting the coordinator"));

  // A peer that fails does not stop the run: gridsync's rows still print,
  // with the peer's columns "-", and the exit code is 1.
  Status peer_status;
  std::unique_ptr<TorchPeer> peer;
  if (auto started = TorchPeer::Start(args, plans, script); started.ok()) {
    peer = std::move(started).value();
  } else {
    peer_status = started.status();
  }
  if (auto s = (*ranks)->Start((*coordinator)->port()); !s.ok()) return Fail(s);

  std::string torch_version = "?";
  if (peer) {
    auto version = peer->ReadStart();
    if (version.ok()) {
      torch_version = *version;
    } else {
      peer_status = version.status();
      peer.reset();
    }
  }
  std::printf("# peer: torch %s%s\n", torch_version.c_str(),
              peer ? "" : " (FAILED to start; its columns are \"-\")");
  PrintColumnHeaders(plans, args.rounds, args.sealed);

  std::vector<Measured> ours(plans.size());
  std::vector<std::optional<Measured>> torch(plans.size());
  for (size_t k = 0; k < plans.size(); ++k) {
    const int rounds = RoundsFor(plans[k], args.rounds);
    for (int j = 0; j < rounds; ++j) {
      const bool last = j + 1 == rounds;
      auto measured = (*ranks)->RunRound(k, j, last);
      if (!measured.ok()) return Fail(measured.status());
      if (last) ours[k] = *measured;
      if (!peer) continue;
      auto theirs = peer->RunRound(k, j, last, plans[k].count);
      if (!theirs.ok()) {
        peer_status = theirs.status();
        peer.reset();
        std::fprintf(stderr, "gridsync-bench allreduce: %s; continuing without the peer\n",
                     peer_status.ToString().c_str());
      } else if (last) {
        torch[k] = *theirs;
      }
    }
    PrintRow(plans[k], args.ranks, ours[k], torch[k] ? &*torch[k] : nullptr);
  }
  if (auto s = (*ranks)->Finish(); !s.ok()) return Fail(s);
  (*coordinator)->Stop();
  if (peer) peer_status = peer->Finish();

  uint64_t our_wrong = 0;
  uint64_t torch_wrong = 0;
  std::vector<double> ratios;
  for (size_t k = 0; k < plans.size(); ++k) {
    our_wrong += ours[k].wrong;
    if (!torch[k]) continue;
    torch_wrong += torch[k]->wrong;
    if (plans[k].bytes() >= kRatioMinBytes) {
      ratios.push_back(torch[k]->time_us / ours[k].time_us);
    }
  }
  std::optional<double> median_ratio;
  if (!ratios.empty()) median_ratio = Median(ratios);
  const bool met = median_ratio && *median_ratio >= kTargetRatio;
  std::printf(
      "# #wrong total: gridsync %llu, torch %llu%s\n", static_cast<unsigned long long>(our_wrong),
      static_cast<unsigned long long>(torch_wrong),
      our_wrong + torch_wrong == 0 ? "" : " (FAILED: all-reduce results differ from the sum)");
  if (median_ratio) {
    std::printf(
        "# median ratio (busbw gridsync / torch) over %zu sizes >= 1 MiB: %.3f; target >= "
        "%.2f: %s\n",
        ratios.size(), *median_ratio, kTargetRatio, met ? "met" : "NOT met");
  } else {
    std::printf(
        "# median ratio (busbw gridsync / torch): no sizes >= 1 MiB with both results; "
        "target >= %.2f: not evaluated\n",
        kTargetRatio);
  }
  std::fflush(stdout);

  int rc = our_wrong + torch_wrong == 0 && peer_status.ok() ? 0 : 1;
  if (!peer_status.ok()) Fail(peer_status);
  if (!args.json_out.empty()) {
    nlohmann::json out;
    out["settings"] = {{"ranks", args.ranks},
                       {"sealed", args.sealed},
                       {"type", "float"},
                       {"op", "sum"},
                       {"in_place", true},
                       {"min_bytes", args.min_bytes},
                       {"max_bytes", args.max_bytes},
                       {"warmup", args.warmup},
                       {"iters", args.iters},
                       {"rounds", args.rounds},
                       {"iters_auto_rule", "8 GiB / size, clamped to 10..1000"},
                       {"timeout_s", args.timeout_s},
                       {"per_iteration", "reset + barrier untimed, one timed all-reduce"},
                       {"time", "rank 0 median, us"},
                       {"busbw", "algbw * 2(n-1)/n"},
                       {"gridsync", "gloo ring via MakeCollective, coordinator KV rendezvous"},
                       {"torch_version", torch_version}};
    out["rows"] = nlohmann::json::array();
    for (size_t k = 0; k < plans.size(); ++k) {
      const SizePlan& p = plans[k];
      nlohmann::json row = {{"size", p.bytes()},
                            {"count", p.count},
                            {"type", "float"},
                            {"iters", p.iters},
                            {"rounds", RoundsFor(p, args.rounds)},
                            {"warmup", args.warmup},
                            {"gridsync", SideJson(p, args.ranks, ours[k])},
                            {"torch", nullptr},
                            {"ratio", nullptr}};
      if (torch[k]) {
        row["torch"] = SideJson(p, args.ranks, *torch[k]);
        row["ratio"] = torch[k]->time_us / ours[k].time_us;
      }
      out["rows"].push_back(row);
    }
    out["summary"] = {{"wrong_gridsync", our_wrong},
                      {"wrong_torch", torch_wrong},
                      {"ratio_min_bytes", kRatioMinBytes},
                      {"ratio_sizes", ratios.size()},
                      {"median_ratio", median_ratio ? nlohmann::json(*median_ratio) : nullptr},
                      {"target", kTargetRatio},
                      {"met", met},
                      {"peer_ok", peer_status.ok()}};
    std::ofstream file(args.json_out);
    file << out.dump(2) << "\n";
    if (!file) return Fail(Status::IOError("cannot write " + args.json_out));
  }
  return rc;
}

}  // namespace
}  // namespace allreduce

Runner AddAllReduceCommand(CLI::App* app) {
  auto args = std::make_shared<allreduce::AllReduceArgs>();
  auto* cmd = app->add_subcommand(
      "allreduce",
      "All-reduce (float32 sum) across processes over Gloo, nccl-tests style, vs torch gloo");
  cmd->add_option("--ranks", args->ranks, "Ranks, each a process on 127.0.0.1")
      ->check(CLI::Range(2, allreduce::kMaxRanks));
  // Sizes accept units (8, 1MB, 256MB; KB = 1024 B).
  cmd->add_option("--min-bytes", args->min_bytes, "Smallest size (bytes; sweep x4; >= 8)")
      ->transform(CLI::AsSizeValue(false));
  cmd->add_option("--max-bytes", args->max_bytes, "Largest size (bytes; always measured)")
      ->transform(CLI::AsSizeValue(false));
  cmd->add_option("--iters", args->iters,
                  "Timed iterations per size (0: auto, 8 GiB / size clamped to 10..1000)")
      ->check(CLI::Range(0, allreduce::kMaxIters));
  cmd->add_option("--warmup", args->warmup, "Untimed iterations per size (in its first round)")
      ->check(CLI::Range(0, allreduce::kMaxIters));
  cmd->add_option("--rounds", args->rounds,
                  "Rounds per size, alternating gridsync and torch (fewer if fewer iters)")
      ->check(CLI::Range(1, allreduce::kMaxIters));
  cmd->add_option("--timeout", args->timeout_s,
                  "Seconds for rendezvous and for each operation, on both sides")
      ->check(gridsync::FiniteRange(0.001, 86400.0));
  cmd->add_option("--json", args->json_out, "Write the results as JSON to this file")
      ->check(OutputFile());
  cmd->add_option("--python", args->python, "Python interpreter for the PyTorch peer");
  cmd->add_flag("--sealed", args->sealed,
                "gridsync's ranks seal every message, as security.curve's Gloo groups do (the "
                "peer stays plain)");
  return [args] { return allreduce::RunAllReduce(*args); };
}

}  // namespace gridsync::bench
