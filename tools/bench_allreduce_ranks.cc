// gridsync-bench allreduce: gridsync's side (bench_allreduce.h), one forked
// process per rank, driven through pipes.
//
// Thread safety: see bench_allreduce.h.
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

#include "common/coordinator_client.h"
#include "common/status.h"
#include "server/coordinator.h"
#include "tools/bench.h"
#include "tools/bench_allreduce.h"
#include "worker/collective/factory.h"

namespace gridsync::bench::allreduce {
namespace {

// ---- the gridsync side: one forked process per rank ----

// The body of rank `rank` (in its own process): joins the Gloo group through
// the coordinator on `port`; for each round of each size waits for a byte on
// `control_fd`, runs it and writes "round <index> <round>" to `report_fd`,
// or after a size's last round "size <index> <wrong> <median_us>".
Status RunRank(const AllReduceArgs& args, const std::vector<SizePlan>& plans, uint16_t port,
               int rank, int control_fd, int report_fd) {
  const auto timeout = std::chrono::milliseconds(static_cast<int64_t>(args.timeout_s * 1000));
  GRIDSYNC_ASSIGN_OR_RETURN(auto client, CoordinatorClient::Connect("127.0.0.1", port, timeout));
  auto store = std::make_unique<CoordinatorStore>(client.get());
  CollectiveEndpoint endpoint;
  if (args.sealed) {
    GRIDSYNC_ASSIGN_OR_RETURN(CollectiveSeal seal,
                              CollectiveSeal::FromCurveSecret(args.seal_secret));
    endpoint.seal = std::make_shared<const CollectiveSeal>(std::move(seal));
  }
  GRIDSYNC_ASSIGN_OR_RETURN(auto collective, MakeCollective("gloo", store.get(), rank, args.ranks,
                                                            kGroup, timeout, endpoint));
  for (size_t k = 0; k < plans.size(); ++k) {
    const SizePlan& p = plans[k];
    std::vector<float> pristine(p.count);
    std::vector<float> data(p.count);
    for (uint64_t i = 0; i < p.count; ++i) pristine[i] = Contribution(rank, i);
    std::vector<double> us;
    us.reserve(static_cast<size_t>(p.iters));
    const int rounds = RoundsFor(p, args.rounds);
    for (int j = 0; j < rounds; ++j) {
      char go = 0;
      if (!ReadAll(control_fd, &go, 1)) {
        return Status::Internal("the bench closed the control pipe before round " +
                                std::to_string(j) + " of size " + std::to_string(k));
      }
      const int warmup = RoundWarmup(args.warmup, j);
      for (int it = 0; it < warmup + RoundIters(p, rounds, j); ++it) {
        std::copy(pristine.begin(), pristine.end(), data.begin());
        GRIDSYNC_RETURN_IF_ERROR(collective->Barrier());
        const auto start = Clock::now();
        GRIDSYNC_RETURN_IF_ERROR(collective->AllReduceSum(data.data(), data.size()));
        const double elapsed =
            std::chrono::duration<double, std::micro>(Clock::now() - start).count();
        if (it >= warmup) us.push_back(elapsed);
      }
      if (j + 1 < rounds) {
        const std::string line = "round " + std::to_string(k) + " " + std::to_string(j) + "\n";
        if (!WriteAll(report_fd, line)) return Status::IOError(Errno("rank report pipe"));
      }
    }
    uint64_t wrong = 0;
    for (uint64_t i = 0; i < p.count; ++i) wrong += data[i] == ExpectedSum(args.ranks, i) ? 0 : 1;
    char line[128];
    std::snprintf(line, sizeof(line), "size %zu %llu %.3f\n", k,
                  static_cast<unsigned long long>(wrong), Median(std::move(us)));
    if (!WriteAll(report_fd, line)) return Status::IOError(Errno("rank report pipe"));
  }
  // Nobody leaves while another rank may still be sending to it: closing a
  // socket with unread bytes resets the connection under the peer.
  GRIDSYNC_RETURN_IF_ERROR(collective->Barrier());
  collective.reset();
  return Status::OK();
}

// The child after fork(): waits for the port, runs the rank, reports an
// error as "error <code> <message>", and leaves with _exit so that nothing
// of the parent (stdio buffers, atexit handlers) runs twice.
[[noreturn]] void RankProcess(const AllReduceArgs& args, const std::vector<SizePlan>& plans,
                              int rank, pid_t parent, int control_fd, int report_fd) {
  // Never outlive the bench (for example when it is killed mid-run); the
  // getppid check covers a parent that died before prctl.
  if (prctl(PR_SET_PDEATHSIG, SIGKILL) != 0 || getppid() != parent) _exit(1);
  uint16_t port = 0;
  // EOF: the parent gave up before the coordinator started; it reports why.
  if (!ReadAll(control_fd, &port, sizeof(port))) _exit(1);
  const Status status = RunRank(args, plans, port, rank, control_fd, report_fd);
  if (!status.ok()) {
    std::string message = status.message();
    std::replace(message.begin(), message.end(), '\n', ' ');
    WriteAll(report_fd,
             "error " + std::to_string(static_cast<int>(status.code())) + " " + message + "\n");
    _exit(1);
  }
  _exit(0);
}

// The gridsync ranks, seen from the parent. Fork() must run before this
// process starts any thread. The destructor kills (SIGKILL) and reaps any
// rank still running, so an early return never leaves one behind.
class ForkedRanks final : public GridsyncRanks {
 public:
  static Result<std::unique_ptr<GridsyncRanks>> ForkAll(const AllReduceArgs& args,
                                                        const std::vector<SizePlan>& plans) {
    std::unique_ptr<ForkedRanks> ranks(new ForkedRanks(args.ranks));
    const pid_t parent = getpid();
    std::fflush(stdout);  // (the children _exit, but flushing first costs nothing)
    std::fflush(stderr);
    for (int r = 0; r < args.ranks; ++r) {
      GRIDSYNC_ASSIGN_OR_RETURN(const PipedChild forked, ForkPiped(
                                                             [&](int control_fd, int report_fd) {
                                                               RankProcess(args, plans, r, parent,
                                                                           control_fd, report_fd);
                                                             },
                                                             [&] {
                                                               // The parent's ends, including
                                                               // earlier ranks': a rank holding
                                                               // another's control pipe open would
                                                               // hide the parent closing it.
                                                               for (auto& c : ranks->children_) {
                                                                 CloseFd(&c.control_fd);
                                                                 CloseFd(&c.report_fd);
                                                               }
                                                             }));
      ranks->children_.push_back(
          {forked.pid, forked.control_fd, forked.report_fd, {}, false, false});
    }
    return std::unique_ptr<GridsyncRanks>(std::move(ranks));
  }

  ~ForkedRanks() override {
    for (auto& c : children_) {
      CloseFd(&c.control_fd);
      CloseFd(&c.report_fd);
      if (!c.reaped) {
        kill(c.pid, SIGKILL);
        Reap(&c);
      }
    }
  }

  // Lets the ranks join the Gloo group through the coordinator on `port`.
  Status Start(uint16_t port) override {
    for (auto& c : children_) {
      if (!WriteAll(c.control_fd,
                    std::string_view(reinterpret_cast<const char*>(&port), sizeof(port)))) {
        return Status::IOError(Errno("sending the coordinator port to a rank"));
      }
    }
    return Status::OK();
  }

  // Releases round `round` of size `index` on every rank and waits for all
  // their reports. After the size's last round: rank 0's time and the
  // summed #wrong; before it, nothing of meaning.
  Result<Measured> RunRound(size_t index, int round, bool last) override {
    for (size_t r = 0; r < children_.size(); ++r) {
      if (!WriteAll(children_[r].control_fd, "g")) {
        // EPIPE: the rank is gone. Its own error line, when it wrote one
        // (a rendezvous that timed out), says why; it had exited, so the
        // read ends at EOF. ("Broken pipe" alone told a probe nothing.)
        const std::string why = Errno("releasing it");
        std::string line;
        if (auto read = ReadLine(r, &line); read.ok() && *read && line.rfind("error ", 0) == 0) {
          return ParseReport(r, line, index, round, last).status();
        }
        return Status::Internal(Describe(r) + " " + DescribeExit(Reap(&children_[r])) + " (" + why +
                                ")");
      }
    }
    std::vector<std::optional<Measured>> got(children_.size());
    for (;;) {
      std::vector<pollfd> fds;
      std::vector<size_t> who;
      for (size_t r = 0; r < children_.size(); ++r) {
        if (!got[r]) {
          fds.push_back({children_[r].report_fd, POLLIN, 0});
          who.push_back(r);
        }
      }
      if (fds.empty()) break;
      // No deadline here: every operation of a rank has --timeout, after
      // which it reports the failure and exits, which closes its pipe.
      if (poll(fds.data(), fds.size(), -1) < 0) {
        if (errno == EINTR) continue;
        return Status::IOError(Errno("poll on the rank report pipes"));
      }
      for (size_t j = 0; j < fds.size(); ++j) {
        if (fds[j].revents == 0) continue;
        const size_t r = who[j];
        std::string line;
        GRIDSYNC_ASSIGN_OR_RETURN(const bool have_line, ReadLine(r, &line));
        if (!have_line) continue;  // a partial line; more to come
        GRIDSYNC_ASSIGN_OR_RETURN(got[r], ParseReport(r, line, index, round, last));
      }
    }
    if (!last) return Measured{};
    Measured total;
    total.time_us = got[0]->time_us;
    for (const auto& m : got) total.wrong += m->wrong;
    return total;
  }

  // After the last size: lets the ranks leave and checks that each exited
  // cleanly.
  Status Finish() override {
    Status status;
    for (size_t r = 0; r < children_.size(); ++r) {
      RankChild& c = children_[r];
      CloseFd(&c.control_fd);
      const int wstatus = Reap(&c);
      if (status.ok() && !(WIFEXITED(wstatus) && WEXITSTATUS(wstatus) == 0)) {
        status = Status::Internal(Describe(r) + " " + DescribeExit(wstatus));
      }
    }
    return status;
  }

 private:
  struct RankChild {
    pid_t pid = -1;
    int control_fd = -1;  // parent -> child: the port, then one byte per round
    int report_fd = -1;   // child -> parent: one line per round
    std::string pending;  // bytes read from report_fd, not yet a whole line
    bool eof = false;
    bool reaped = false;
  };

  explicit ForkedRanks(int size) : size_(size) {}

  std::string Describe(size_t r) const {
    return "gridsync rank " + std::to_string(r) + " of " + std::to_string(size_);
  }

  // Waits for the child; returns its wait status (-1 if waitpid failed).
  static int Reap(RankChild* c) {
    const int wstatus = ReapChild(c->pid);
    c->reaped = true;
    return wstatus;
  }

  // Reads from rank r's pipe; true with a whole line in *line. EOF before
  // one is the rank's failure, reported with how it exited.
  Result<bool> ReadLine(size_t r, std::string* line) {
    RankChild& c = children_[r];
    for (;;) {
      if (const size_t eol = c.pending.find('\n'); eol != std::string::npos) {
        *line = c.pending.substr(0, eol);
        c.pending.erase(0, eol + 1);
        return true;
      }
      char buffer[4096];
      const ssize_t n = read(c.report_fd, buffer, sizeof(buffer));
      if (n < 0 && errno == EINTR) continue;
      if (n < 0) return Status::IOError(Errno("read from a rank report pipe"));
      if (n == 0) {
        c.eof = true;
        return Status::Internal(Describe(r) + " " + DescribeExit(Reap(&c)) +
                                " without reporting (its error, if any, is above)");
      }
      c.pending.append(buffer, static_cast<size_t>(n));
      if (c.pending.find('\n') == std::string::npos) return false;
    }
  }

  // One report line of rank r for round `round` of size `index`; an error
  // line becomes the rank's Status.
  Result<Measured> ParseReport(size_t r, const std::string& line, size_t index, int round,
                               bool last) const {
    std::istringstream in(line);
    std::string kind;
    in >> kind;
    if (kind == "error") {
      int code = static_cast<int>(StatusCode::kInternal);
      in >> code;
      std::string message;
      std::getline(in >> std::ws, message);
      return Status(static_cast<StatusCode>(code), Describe(r) + ": " + message);
    }
    size_t got_index = 0;
    int got_round = 0;
    Measured m;
    const bool ok =
        last ? kind == "size" && (in >> got_index >> m.wrong >> m.time_us) && got_index == index
             : kind == "round" && (in >> got_index >> got_round) && got_index == index &&
                   got_round == round;
    if (!ok) {
      return Status::Internal(Describe(r) + " reported '" + line + "' for round " +
                              std::to_string(round) + " of size " + std::to_string(index));
    }
    return m;
  }

  const int size_;
  std::vector<RankChild> children_;
};

}  // namespace

Result<std::unique_ptr<GridsyncRanks>> GridsyncRanks::Fork(const AllReduceArgs& args,
                                                           const std::vector<SizePlan>& plans) {
  return ForkedRanks::ForkAll(args, plans);
}

}  // namespace gridsync::bench::allreduce
