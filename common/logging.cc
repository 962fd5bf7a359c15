#include "common/logging.h"

#include <spdlog/pattern_formatter.h>
#include <spdlog/sinks/stdout_color_sinks.h>

#include <cstdint>
#include <cstdlib>
#include <string_view>

#include "common/utf8.h"

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

namespace {

bool EscapedCodePoint(uint32_t cp) {
  return (cp >= 0x80 && cp <= 0x9f) || cp == 0x2028 || cp == 0x2029 ||
         (cp >= 0x202a && cp <= 0x202e) || (cp >= 0x2066 && cp <= 0x2069);
}

void AppendEscaped(std::string_view bytes, std::string* out) {
  constexpr char kHex[] = "0123456789abcdef";
  for (const char c : bytes) {
    const auto byte = static_cast<unsigned char>(c);
    *out += "\\x";
    *out += kHex[byte >> 4];
    *out += kHex[byte & 15];
  }
}

}  // namespace

std::string EscapeControlBytes(std::string_view text) {
  std::string out;
  out.reserve(text.size());
  for (size_t i = 0; i < text.size();) {
    const auto byte = static_cast<unsigned char>(text[i]);
    if (byte < 0x80) {
      if (byte < 0x20 || byte == 0x7f) {
        AppendEscaped(text.substr(i, 1), &out);
      } else {
        out += text[i];
      }
      ++i;
      continue;
    }
    uint32_t cp = 0;
    const size_t length = Utf8Sequence(text, i, &cp);
    if (length == 0) {
      AppendEscaped(text.substr(i, 1), &out);  // not UTF-8: this byte alone
      ++i;
    } else {
      if (EscapedCodePoint(cp)) {
        AppendEscaped(text.substr(i, length), &out);
      } else {
        out.append(text.substr(i, length));
      }
      i += length;
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
