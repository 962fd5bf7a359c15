// Logging setup shared by every gridsync binary (spdlog underneath).
//
// Thread safety: InitLogging must run once, before other threads log;
// after that spdlog's default logger is safe to use from any thread.
#pragma once

#include <string>

#include <spdlog/spdlog.h>

namespace gridsync {

// `name` prefixes every line ("worker", "ps-0"); `level` is an spdlog level
// name ("info", "debug"). Logs go to stderr so stdout stays parseable.
void InitLogging(const std::string& name, const std::string& level = "info");

}  // namespace gridsync
