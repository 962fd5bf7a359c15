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

#include "common/coordinator_client.h"
#include "common/status.h"
#include "server/coordinator.h"
#include "tools/bench.h"
#include "worker/collective/factory.h"

namespace gridsync::bench {
namespace {

using Clock = std::chrono::steady_clock;

constexpr uint64_t kElementBytes = sizeof(float);
constexpr uint64_t kMinCount = 2;
constexpr uint64_t kMinBytes = kMinCount * kElementBytes;
// Each rank holds two buffers of the largest size (the data and its reset
// copy); this keeps a typo from asking for tens of GB per rank.
constexpr uint64_t kMaxBytesAllowed = uint64_t{4} << 30;
constexpr int kMaxRanks = 64;
// --iters 0 (auto): iters = 8 GiB / size, clamped to 10..1000. Small sizes
// get many iterations (each costs ~0.1-0.2 ms), the largest few, so that the
// default sweep takes about a minute per side on a 2-core host (~1 GB/s).
constexpr uint64_t kAutoItersBytes = uint64_t{8} << 30;
constexpr int kAutoItersMin = 10;
constexpr int kAutoItersMax = 1000;
constexpr int kMaxIters = 1000000;  // each timing is kept (8 B) until the median
constexpr uint64_t kRatioMinBytes = uint64_t{1} << 20;
constexpr double kTargetRatio = 0.95;
constexpr char kGroup[] = "bench-allreduce";
constexpr char kPeerScript[] = "/tools/peers/torch_allreduce.py";

struct AllReduceArgs {
  int ranks = 2;
  uint64_t min_bytes = 8;
  uint64_t max_bytes = uint64_t{256} << 20;
  int iters = 0;  // 0: auto
  int warmup = 5;
  int rounds = 8;
  double timeout_s = 120;
  std::string json_out;
  std::string python = "/usr/bin/python3";
};

struct SizePlan {
  uint64_t count = 0;
  int iters = 0;
  uint64_t bytes() const { return count * kElementBytes; }
};

// One side's result for one size.
struct Measured {
  double time_us = 0;  // rank 0's median
  uint64_t wrong = 0;  // summed over the ranks
};

float Contribution(int rank, uint64_t i) {
  return static_cast<float>(rank + 1 + static_cast<int>(i % 7));
}

// Sum over r < ranks of (r + 1) + p = ranks (ranks + 1) / 2 + ranks p.
float ExpectedSum(int ranks, uint64_t i) {
  return static_cast<float>(ranks * (ranks + 1) / 2 + ranks * static_cast<int>(i % 7));
}

double AlgBw(uint64_t bytes, double us) {
  return us > 0 ? static_cast<double>(bytes) / (us * 1e-6) / 1e9 : 0.0;
}

double BusBw(double algbw, int ranks) { return algbw * 2.0 * (ranks - 1) / ranks; }

// As Python's statistics.median (the peer's): the mean of the two middle
// values for an even count.
double Median(std::vector<double> v) {
  if (v.empty()) return 0.0;
  std::sort(v.begin(), v.end());
  const size_t mid = v.size() / 2;
  return v.size() % 2 == 1 ? v[mid] : (v[mid - 1] + v[mid]) / 2.0;
}

// The split of a size's iterations into rounds (the peer does the same).
int RoundsFor(const SizePlan& p, int rounds) { return std::min(rounds, p.iters); }
int RoundIters(const SizePlan& p, int rounds, int j) {
  return p.iters / rounds + (j < p.iters % rounds ? 1 : 0);
}
int RoundWarmup(int warmup, int j) { return j == 0 ? warmup : std::min(1, warmup); }

std::string Errno(const char* what) { return std::string(what) + ": " + std::strerror(errno); }

// ---- the gridsync side: one forked process per rank ----

// Writes all of `text`, retrying on EINTR and short writes.
bool WriteAll(int fd, std::string_view text) {
  while (!text.empty()) {
    const ssize_t n = write(fd, text.data(), text.size());
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return false;
    text.remove_prefix(static_cast<size_t>(n));
  }
  return true;
}

// Reads exactly `size` bytes; false on EOF or error.
bool ReadAll(int fd, void* data, size_t size) {
  auto* at = static_cast<char*>(data);
  while (size > 0) {
    const ssize_t n = read(fd, at, size);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return false;
    at += n;
    size -= static_cast<size_t>(n);
  }
  return true;
}

void CloseFd(int* fd) {
  if (*fd >= 0) close(*fd);
  *fd = -1;
}

// The body of rank `rank` (in its own process): joins the Gloo group through
// the coordinator on `port`; for each round of each size waits for a byte on
// `control_fd`, runs it and writes "round <index> <round>" to `report_fd`,
// or after a size's last round "size <index> <wrong> <median_us>".
Status RunRank(const AllReduceArgs& args, const std::vector<SizePlan>& plans, uint16_t port,
               int rank, int control_fd, int report_fd) {
  const auto timeout = std::chrono::milliseconds(static_cast<int64_t>(args.timeout_s * 1000));
  GRIDSYNC_ASSIGN_OR_RETURN(auto client, CoordinatorClient::Connect("127.0.0.1", port, timeout));
  auto store = std::make_unique<CoordinatorStore>(client.get());
  GRIDSYNC_ASSIGN_OR_RETURN(auto collective,
                            MakeCollective("gloo", store.get(), rank, args.ranks, kGroup, timeout));
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
class GridsyncRanks {
 public:
  static Result<std::unique_ptr<GridsyncRanks>> Fork(const AllReduceArgs& args,
                                                     const std::vector<SizePlan>& plans) {
    std::unique_ptr<GridsyncRanks> ranks(new GridsyncRanks(args.ranks));
    const pid_t parent = getpid();
    std::fflush(stdout);  // (the children _exit, but flushing first costs nothing)
    std::fflush(stderr);
    for (int r = 0; r < args.ranks; ++r) {
      int control[2];
      int report[2];
      // CLOEXEC: the peer, started later through popen, must not hold them.
      if (pipe2(control, O_CLOEXEC) != 0) return Status::IOError(Errno("pipe"));
      if (pipe2(report, O_CLOEXEC) != 0) {
        close(control[0]);
        close(control[1]);
        return Status::IOError(Errno("pipe"));
      }
      const pid_t pid = fork();
      if (pid == 0) {
        // The parent's ends, including earlier ranks': a rank holding
        // another's control pipe open would hide the parent closing it.
        for (auto& c : ranks->children_) {
          CloseFd(&c.control_fd);
          CloseFd(&c.report_fd);
        }
        close(control[1]);
        close(report[0]);
        RankProcess(args, plans, r, parent, control[0], report[1]);
      }
      close(control[0]);
      close(report[1]);
      if (pid < 0) {
        close(control[1]);
        close(report[0]);
        return Status::IOError(Errno("fork"));
      }
      ranks->children_.push_back({pid, control[1], report[0], {}, false, false});
    }
    return ranks;
  }

  ~GridsyncRanks() {
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
  Status Start(uint16_t port) {
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
  Result<Measured> RunRound(size_t index, int round, bool last) {
    for (size_t r = 0; r < children_.size(); ++r) {
      if (!WriteAll(children_[r].control_fd, "g")) {
        // EPIPE: the rank is gone; how it went is the useful part.
        const std::string why = Errno("releasing it");
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
  Status Finish() {
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

  explicit GridsyncRanks(int size) : size_(size) {}

  std::string Describe(size_t r) const {
    return "gridsync rank " + std::to_string(r) + " of " + std::to_string(size_);
  }

  static std::string DescribeExit(int wstatus) {
    if (wstatus == -1) return "could not be waited for";
    if (WIFSIGNALED(wstatus)) return "was killed by signal " + std::to_string(WTERMSIG(wstatus));
    return "exited with status " + std::to_string(WEXITSTATUS(wstatus));
  }

  // Waits for the child; returns its wait status (-1 if waitpid failed).
  static int Reap(RankChild* c) {
    int wstatus = -1;
    while (waitpid(c->pid, &wstatus, 0) < 0) {
      if (errno != EINTR) return -1;
    }
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

// ---- the PyTorch peer ----

std::string ShellQuote(const std::string& s) {
  std::string out = "'";
  for (char c : s) out += c == '\'' ? std::string("'\\''") : std::string(1, c);
  return out + "'";
}

template <typename F>
std::string JoinPlans(const std::vector<SizePlan>& plans, F field) {
  std::string out;
  for (const auto& p : plans) out += (out.empty() ? "" : ",") + std::to_string(field(p));
  return out;
}

// Typed fields of a peer line, without exceptions: absent or of another
// type reads as "" / nullopt (nlohmann's value() throws on a type mismatch).
std::string StringField(const nlohmann::json& line, const char* key) {
  const auto it = line.find(key);
  return it != line.end() && it->is_string() ? it->get<std::string>() : std::string();
}
std::optional<uint64_t> UintField(const nlohmann::json& line, const char* key) {
  const auto it = line.find(key);
  if (it == line.end() || !it->is_number_unsigned()) return std::nullopt;
  return it->get<uint64_t>();
}

// tools/peers/torch_allreduce.py, run through popen with the same sizes,
// iterations and warmup, paced through --control-fd. The destructor closes
// the control pipe (the peer then stops) and waits for it.
class TorchPeer {
 public:
  static Result<std::unique_ptr<TorchPeer>> Start(const AllReduceArgs& args,
                                                  const std::vector<SizePlan>& plans,
                                                  const std::string& script) {
    int control[2];
    if (pipe2(control, O_CLOEXEC) != 0) return Status::IOError(Errno("pipe"));
    // The read end goes to the peer (through the shell popen starts).
    if (fcntl(control[0], F_SETFD, 0) != 0) {
      close(control[0]);
      close(control[1]);
      return Status::IOError(Errno("fcntl"));
    }
    std::ostringstream cmd;
    cmd << ShellQuote(args.python) << " " << ShellQuote(script) << " --ranks " << args.ranks
        << " --counts " << JoinPlans(plans, [](const SizePlan& p) { return p.count; })
        << " --iters " << JoinPlans(plans, [](const SizePlan& p) { return p.iters; })
        << " --warmup " << args.warmup << " --rounds " << args.rounds << " --timeout "
        << args.timeout_s << " --control-fd " << control[0];
    std::fprintf(stderr, "running the PyTorch peer: %s\n", cmd.str().c_str());
    std::fflush(stderr);
    std::fflush(stdout);
    // "e": our end of its stdout is close-on-exec too.
    FILE* out = popen(cmd.str().c_str(), "re");
    const int popen_errno = errno;
    close(control[0]);
    if (out == nullptr) {
      close(control[1]);
      errno = popen_errno;
      return Status::IOError(Errno(("popen " + args.python).c_str()));
    }
    return std::unique_ptr<TorchPeer>(new TorchPeer(out, control[1], script));
  }

  ~TorchPeer() { Close(); }

  // Waits until every peer rank has joined; returns the torch version.
  Result<std::string> ReadStart() {
    GRIDSYNC_ASSIGN_OR_RETURN(const auto line, ReadJson());
    if (StringField(line, "event") != "start") return Unexpected(line);
    const std::string version = StringField(line, "torch_version");
    return version.empty() ? std::string("?") : version;
  }

  // Releases round `round` of size `index` and waits for its line; after
  // the size's last round returns the peer's result.
  Result<Measured> RunRound(size_t index, int round, bool last, uint64_t count) {
    if (!WriteAll(control_fd_, "go\n")) {
      return Status::IOError(Errno("releasing the PyTorch peer") + Exited());
    }
    GRIDSYNC_ASSIGN_OR_RETURN(const auto line, ReadJson());
    if (!last) {
      if (StringField(line, "event") != "round" || UintField(line, "index") != index ||
          UintField(line, "round") != static_cast<uint64_t>(round)) {
        return Unexpected(line);
      }
      return Measured{};
    }
    const auto time_us = line.find("time_us");
    const auto wrong = UintField(line, "wrong");
    if (StringField(line, "event") != "size" || UintField(line, "index") != index ||
        UintField(line, "count") != count || time_us == line.end() || !time_us->is_number() ||
        !(time_us->get<double>() > 0 && std::isfinite(time_us->get<double>())) || !wrong) {
      return Unexpected(line);
    }
    Measured m;
    m.time_us = time_us->get<double>();
    m.wrong = *wrong;
    return m;
  }

  // After the last size: the peer must exit cleanly.
  Status Finish() {
    const int rc = Close();
    if (rc != 0) return Status::Internal("the PyTorch peer " + DescribeRc(rc) + "; see above");
    return Status::OK();
  }

 private:
  TorchPeer(FILE* out, int control_fd, std::string script)
      : out_(out), control_fd_(control_fd), script_(std::move(script)) {}

  // Closes the control pipe and waits for the peer; its pclose status.
  int Close() {
    CloseFd(&control_fd_);
    if (out_ == nullptr) return rc_;
    rc_ = pclose(out_);
    out_ = nullptr;
    return rc_;
  }

  static std::string DescribeRc(int rc) {
    if (rc == -1) return "could not be waited for";
    if (WIFEXITED(rc)) return "exited with status " + std::to_string(WEXITSTATUS(rc));
    if (WIFSIGNALED(rc)) return "was killed by signal " + std::to_string(WTERMSIG(rc));
    return "ended with wait status " + std::to_string(rc);
  }

  // "; the peer exited with status 1 (its error is above)", after waiting
  // for it: for errors that mean the peer is gone.
  std::string Exited() { return "; the PyTorch peer " + DescribeRc(Close()) + " (see above)"; }

  Status Unexpected(const nlohmann::json& line) {
    return Status::Corruption("the PyTorch peer (" + script_ +
                              ") printed an unexpected line: " + line.dump());
  }

  // The next stdout line, which must be one JSON object.
  Result<nlohmann::json> ReadJson() {
    if (out_ == nullptr) return Status::Internal("the PyTorch peer has exited");
    std::string line;
    char buffer[4096];
    while (line.empty() || line.back() != '\n') {
      if (std::fgets(buffer, sizeof(buffer), out_) == nullptr) {
        return Status::Internal("the PyTorch peer closed its output early" + Exited());
      }
      line += buffer;
    }
    line.pop_back();
    auto parsed = nlohmann::json::parse(line, nullptr, false);
    if (!parsed.is_object()) {
      return Status::Corruption("the PyTorch peer printed a line that is not a JSON object: " +
                                line);
    }
    return parsed;
  }

  FILE* out_;
  int control_fd_;
  const std::string script_;
  int rc_ = -1;
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
void PrintColumnHeaders(const std::vector<SizePlan>& plans, int rounds) {
  std::string iters;
  for (const auto& p : plans) {
    iters += " " + std::to_string(p.bytes()) + ":" + std::to_string(p.iters) + "/" +
             std::to_string(RoundsFor(p, rounds));
  }
  std::printf("# timed iterations/rounds per size (B):%s\n", iters.c_str());
  std::printf("# %32s %s %s\n", "", Centered("gridsync (Gloo ring, C++)", 42).c_str(),
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

int RunAllReduce(const AllReduceArgs& args) {
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
      "gridsync: Gloo ring (MakeCollective(\"gloo\"), rendezvous via the coordinator KV store); "
      "peer: torch.distributed gloo, 1 thread per rank; warmup %d; iters %s; rounds %d "
      "(alternating gridsync, torch; later rounds re-warm with 1 iteration); each iteration: "
      "reset + barrier untimed, then one timed all-reduce; time = rank 0's median over all "
      "rounds; algbw = size/time; busbw = algbw*2(n-1)/n; GB/s = 1e9 B/s; #wrong = elements != "
      "exact sum after the last iteration, over all ranks; ratio = gridsync busbw / torch busbw; "
      "timeout %gs\n",
      args.ranks, args.warmup,
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
  PrintColumnHeaders(plans, args.rounds);

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

Runner AddAllReduceCommand(CLI::App* app) {
  auto args = std::make_shared<AllReduceArgs>();
  auto* cmd = app->add_subcommand(
      "allreduce",
      "All-reduce (float32 sum) across processes over Gloo, nccl-tests style, vs torch gloo");
  cmd->add_option("--ranks", args->ranks, "Ranks, each a process on 127.0.0.1")
      ->check(CLI::Range(2, kMaxRanks));
  // Sizes accept units (8, 1MB, 256MB; KB = 1024 B).
  cmd->add_option("--min-bytes", args->min_bytes, "Smallest size (bytes; sweep x4; >= 8)")
      ->transform(CLI::AsSizeValue(false));
  cmd->add_option("--max-bytes", args->max_bytes, "Largest size (bytes; always measured)")
      ->transform(CLI::AsSizeValue(false));
  cmd->add_option("--iters", args->iters,
                  "Timed iterations per size (0: auto, 8 GiB / size clamped to 10..1000)")
      ->check(CLI::Range(0, kMaxIters));
  cmd->add_option("--warmup", args->warmup, "Untimed iterations per size (in its first round)")
      ->check(CLI::Range(0, kMaxIters));
  cmd->add_option("--rounds", args->rounds,
                  "Rounds per size, alternating gridsync and torch (fewer if fewer iters)")
      ->check(CLI::Range(1, kMaxIters));
  cmd->add_option("--timeout", args->timeout_s,
                  "Seconds for rendezvous and for each operation, on both sides")
      ->check(CLI::Range(0.001, 86400.0));
  cmd->add_option("--json", args->json_out, "Write the results as JSON to this file");
  cmd->add_option("--python", args->python, "Python interpreter for the PyTorch peer");
  return [args] { return RunAllReduce(*args); };
}

}  // namespace gridsync::bench
