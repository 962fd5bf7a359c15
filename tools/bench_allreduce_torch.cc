// gridsync-bench allreduce: the PyTorch peer's side (bench_allreduce.h).
//
// Thread safety: see bench_allreduce.h.
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
#include "tools/bench_allreduce.h"
#include "tools/bench_pipe.h"
#include "worker/collective/factory.h"

namespace gridsync::bench::allreduce {
namespace {

// ---- the PyTorch peer ----

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
class PipedPeer final : public TorchPeer {
 public:
  static Result<std::unique_ptr<TorchPeer>> StartPeer(const AllReduceArgs& args,
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
    return std::unique_ptr<TorchPeer>(new PipedPeer(out, control[1], script));
  }

  ~PipedPeer() override { Close(); }

  // Waits until every peer rank has joined; returns the torch version.
  Result<std::string> ReadStart() override {
    GRIDSYNC_ASSIGN_OR_RETURN(const auto line, ReadJson());
    if (StringField(line, "event") != "start") return Unexpected(line);
    const std::string version = StringField(line, "torch_version");
    return version.empty() ? std::string("?") : version;
  }

  // Releases round `round` of size `index` and waits for its line; after
  // the size's last round returns the peer's result.
  Result<Measured> RunRound(size_t index, int round, bool last, uint64_t count) override {
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
  Status Finish() override {
    const int rc = Close();
    if (rc != 0) return Status::Internal("the PyTorch peer " + DescribeRc(rc) + "; see above");
    return Status::OK();
  }

 private:
  PipedPeer(FILE* out, int control_fd, std::string script)
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

}  // namespace

Result<std::unique_ptr<TorchPeer>> TorchPeer::Start(const AllReduceArgs& args,
                                                    const std::vector<SizePlan>& plans,
                                                    const std::string& script) {
  return PipedPeer::StartPeer(args, plans, script);
}

}  // namespace gridsync::bench::allreduce
