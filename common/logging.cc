#include "common/logging.h"

#include <spdlog/sinks/stdout_color_sinks.h>

namespace gridsync {

void InitLogging(const std::string& name, const std::string& level) {
  auto logger = spdlog::stderr_color_mt(name);
  // The date too: runs and their logs span days.
  logger->set_pattern("[%Y-%m-%d %H:%M:%S.%e] [%n] [%^%l%$] %v");
  logger->set_level(spdlog::level::from_str(level));
  spdlog::set_default_logger(logger);
}

void LogConfigNotes(const std::string& source, const std::vector<std::string>& lines) {
  for (const auto& line : lines) spdlog::info("{}: note: {}", source, line);
}

}  // namespace gridsync
