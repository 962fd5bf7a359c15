// Command-line parsing with gridsync's exit codes: any usage error (unknown
// flag, missing or malformed value) exits kConfigErrorExitCode (2), like a
// config error, instead of CLI11's own codes (105 and up); --help exits 0.
// A missing config file is not checked here: loading it reports the path
// and the reason, with the same exit code.
//
// Thread safety: call from main.
#pragma once

#include <CLI/CLI.hpp>

#include "common/config.h"

namespace gridsync {

// Returns -1 when the program should go on, else the exit code.
inline int ParseCommandLine(CLI::App& app, int argc, char** argv) {
  try {
    app.parse(argc, argv);
  } catch (const CLI::Success& e) {  // --help, --version
    return app.exit(e);
  } catch (const CLI::ParseError& e) {
    (void)app.exit(e);  // prints the message and usage hint
    return kConfigErrorExitCode;
  }
  return -1;
}

}  // namespace gridsync

// In main: GRIDSYNC_PARSE_COMMAND_LINE(app, argc, argv);
#define GRIDSYNC_PARSE_COMMAND_LINE(app, argc, argv)                                             \
  do {                                                                                           \
    if (const int gridsync_rc = ::gridsync::ParseCommandLine(app, argc, argv); gridsync_rc >= 0) \
      return gridsync_rc;                                                                        \
  } while (false)
