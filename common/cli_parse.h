// Command-line parsing with gridsync's exit codes: any usage error (unknown
// flag, missing or malformed value) exits kConfigErrorExitCode (2), like a
// config error, instead of CLI11's own codes (105 and up); --help exits 0.
// A missing config file is not checked here: loading it reports the path
// and the reason, with the same exit code.
//
// Thread safety: call from main.
#pragma once

#include <fcntl.h>
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <cerrno>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <string>

#include "common/config.h"
#include "common/config_reader.h"
#include "common/file_bytes.h"

namespace gridsync {

// Opens /dev/null on whichever of descriptors 0, 1 and 2 is closed, first
// thing in main: a process started with stdout closed (`>&-`) otherwise
// gave descriptor 1 to the first socket it made (gridsync launch's watchdog
// socket), wrote its log lines into it and lost the reason it failed (a
// hostile probe).
inline void KeepStandardStreamsOpen() {
  for (int fd = 0; fd <= 2; ++fd) {
    if (fcntl(fd, F_GETFD) != -1 || errno != EBADF) continue;
    const int opened = open("/dev/null", fd == 0 ? O_RDONLY : O_WRONLY);
    if (opened >= 0 && opened != fd) {
      dup2(opened, fd);
      close(opened);
    }
  }
}

// A flag naming a file the process writes when it is done (a bench's
// --json): checked when parsed (CheckOutputFile), so that a folder or an
// unwritable place is refused before the run, not after it.
inline CLI::Validator OutputFile() {
  return CLI::Validator(
      [](std::string& path) -> std::string {
        const Status ok = CheckOutputFile(path);
        return ok.ok() ? std::string() : ok.message();
      },
      "FILE");
}

// Returns -1 when the program should go on, else the exit code; a usage
// error's text goes to `error` too when given.
inline int ParseCommandLine(CLI::App& app, int argc, char** argv, std::string* error = nullptr) {
  try {
    app.parse(argc, argv);
  } catch (const CLI::Success& e) {  // --help, --version
    return app.exit(e);
  } catch (const CLI::ExtrasError& e) {
    // CLI11 lists the extras by their text: an empty one read as nothing
    // ("The following argument was not expected: ").
    const std::string what = e.what();
    for (int i = 1; what.ends_with(": ") && i < argc; ++i) {
      if (argv[i][0] == '\0') {
        const std::string text = "argument " + std::to_string(i) +
                                 " is empty; allowed: the flags of --help and their values";
        std::fprintf(stderr, "%s\n", text.c_str());
        if (error != nullptr) *error = text;
        return kConfigErrorExitCode;
      }
    }
    (void)app.exit(e);
    if (error != nullptr) *error = e.what();
    return kConfigErrorExitCode;
  } catch (const CLI::ParseError& e) {
    (void)app.exit(e);  // prints the message and usage hint
    if (error != nullptr) *error = e.what();
    return kConfigErrorExitCode;
  }
  return -1;
}

// CLI::Range for floating-point flags that also refuses NaN and the
// infinities: CLI::Range only compares, and NaN compares false both ways,
// so `--interval nan` passed it (and refreshed as fast as it could).
inline CLI::Validator FiniteRange(double lo, double hi) {
  char range[96];
  std::snprintf(range, sizeof(range), "%g to %g", lo, hi);
  const std::string allowed = range;
  return CLI::Validator(
      [lo, hi, allowed](std::string& input) -> std::string {
        double value = 0;
        if (!CLI::detail::lexical_cast(input, value)) {
          return "Value " + input + " is not a number; allowed: " + allowed;
        }
        if (!std::isfinite(value) || value < lo || value > hi) {
          return "Value " + input + " not in range; allowed: a finite number from " + allowed;
        }
        return std::string();
      },
      "FLOAT in [" + allowed + "]");
}

// A flag holding a training step (--resume-step, --start-step): digits
// only, at most training.steps' bound. CLI11 reads an unsigned flag with
// strtoull, so "-1" became 18446744073709551615 and a value past 2^64 was
// clamped, and the error that followed named a step nobody typed.
inline CLI::Validator StepNumber() {
  constexpr uint64_t kMaxStep = kMaxTrainingSteps;
  const std::string allowed = "a step from 0 to " + std::to_string(kMaxStep);
  return CLI::Validator(
      [allowed](std::string& input) -> std::string {
        const bool digits = !input.empty() && input.size() <= 8 &&
                            input.find_first_not_of("0123456789") == std::string::npos;
        if (digits && std::stoull(input) <= kMaxStep) return std::string();
        return "Value " + config_reader::Quote(input) + " is not a step; allowed: " + allowed;
      },
      "STEP");
}

// A flag holding an index (--shard, --rank): digits only, from 0 to `hi`.
// CLI11 read an empty --shard as 0, so `--shard ''` served as shard 0.
inline CLI::Validator IndexNumber(int hi) {
  const std::string allowed = "an index from 0 to " + std::to_string(hi);
  return CLI::Validator(
      [allowed, hi](std::string& input) -> std::string {
        const bool digits = !input.empty() && input.size() <= 9 &&
                            input.find_first_not_of("0123456789") == std::string::npos;
        if (digits && std::stoll(input) <= hi) return std::string();
        return "Value " + config_reader::Quote(input) + " is not an index; allowed: " + allowed;
      },
      "INDEX");
}

// A flag whose empty value would silently mean "not given" (--bin-dir ''
// searched next to the executable; --node '' ran every node's processes).
inline CLI::Validator NotEmpty(const std::string& allowed) {
  return CLI::Validator(
      [allowed](std::string& input) -> std::string {
        if (!input.empty()) return std::string();
        return "Value \"\" is empty; allowed: " + allowed;
      },
      "TEXT");
}

// A flag holding a host (--host, --bind): the syntax the config's hosts
// meet (config_reader::HostSyntaxProblem), so "10.0.0.7:29500", "tcp://..."
// or an empty value is refused here rather than failing in a bind or a
// peer's connect, or silently falling back to the config's host.
inline CLI::Validator HostSyntax() {
  return CLI::Validator(
      [](std::string& input) -> std::string {
        const std::string why = config_reader::HostSyntaxProblem(input);
        if (why.empty()) return std::string();
        return config_reader::Quote(input) + " is " + why +
               "; allowed: " + config_reader::kHostSyntax;
      },
      "HOST");
}

// The operations flags every serving binary shares (ops/): --metrics-port
// (-1 when absent: metrics.port decides) and, where given, --timeline.
struct OpsFlags {
  int metrics_port = -1;
  std::string timeline;
};
inline void AddOpsFlags(CLI::App& app, OpsFlags* flags, const char* timeline_what) {
  app.add_option("--metrics-port", flags->metrics_port,
                 "Serve Prometheus metrics on this port (0: off; default: from metrics.port)")
      ->check(CLI::Range(0, 65535));
  if (timeline_what != nullptr) {
    app.add_option("--timeline", flags->timeline,
                   std::string("Write a Chrome trace of ") + timeline_what +
                       " here (chrome://tracing, Perfetto)")
        ->check(NotEmpty("a file to write the trace to"));
  }
}

}  // namespace gridsync

// In main: GRIDSYNC_PARSE_COMMAND_LINE(app, argc, argv);
#define GRIDSYNC_PARSE_COMMAND_LINE(app, argc, argv)                                             \
  do {                                                                                           \
    if (const int gridsync_rc = ::gridsync::ParseCommandLine(app, argc, argv); gridsync_rc >= 0) \
      return gridsync_rc;                                                                        \
  } while (false)
