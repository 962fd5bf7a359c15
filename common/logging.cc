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

}  // namespace gridsync
