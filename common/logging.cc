#include "common/logging.h"

#include <spdlog/pattern_formatter.h>
#include <spdlog/sinks/stdout_color_sinks.h>

#include <cstdlib>
#include <string_view>

namespace gridsync {
namespace {

// %v with its control bytes written as \xNN (see EscapeControlBytes).
class EscapedMessage : public spdlog::custom_flag_formatter {
 public:
  void format(const spdlog::details::log_msg& msg, const std::tm&,
              spdlog::memory_buf_t& dest) override {
    const std::string escaped =
        EscapeControlBytes(std::string_view(msg.payload.data(), msg.payload.size()));
    dest.append(escaped.data(), escaped.data() + escaped.size());
  }
  std::unique_ptr<custom_flag_formatter> clone() const override {
    return std::make_unique<EscapedMessage>();
  }
};

}  // namespace

std::string EscapeControlBytes(std::string_view text) {
  std::string out;
  out.reserve(text.size());
  for (const char c : text) {
    const auto byte = static_cast<unsigned char>(c);
    if (byte < 0x20 || byte == 0x7f) {
      constexpr char kHex[] = "0123456789abcdef";
      out += "\\x";
      out += kHex[byte >> 4];
      out += kHex[byte & 15];
    } else {
      out += c;
    }
  }
  return out;
}

std::unique_ptr<spdlog::formatter> LineFormatter() {
  auto formatter = std::make_unique<spdlog::pattern_formatter>();
  // The date too: runs and their logs span days.
  formatter->add_flag<EscapedMessage>('*').set_pattern("[%Y-%m-%d %H:%M:%S.%e] [%n] [%^%l%$] %*");
  return formatter;
}

void InitLogging(const std::string& name, const std::string& level) {
  auto logger = spdlog::stderr_color_mt(name);
  logger->set_formatter(LineFormatter());
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
