#include "common/logging.h"

#include <spdlog/sinks/stdout_color_sinks.h>

#include <cstdlib>
#include <string_view>

namespace gridsync {

void InitLogging(const std::string& name, const std::string& level) {
  auto logger = spdlog::stderr_color_mt(name);
  // The date too: runs and their logs span days.
  logger->set_pattern("[%Y-%m-%d %H:%M:%S.%e] [%n] [%^%l%$] %v");
  logger->set_level(spdlog::level::from_str(level));
  spdlog::set_default_logger(logger);
}

void LogConfigNotes(const std::string& source, const std::vector<std::string>& lines) {
  const char* shown = std::getenv(kConfigNotesShownEnv);
  const bool once_elsewhere = shown != nullptr && std::string_view(shown) == "1";
  for (const auto& line : lines) {
    if (once_elsewhere) {
      spdlog::debug("{}: note: {}", source, line);
    } else {
      spdlog::info("{}: note: {}", source, line);
    }
  }
}

}  // namespace gridsync
