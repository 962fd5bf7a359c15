// Logging setup shared by every gridsync binary (spdlog underneath).
//
// Thread safety: InitLogging must run once, before other threads log;
// after that spdlog's default logger is safe to use from any thread.
#pragma once

#include <spdlog/spdlog.h>

#include <chrono>
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace gridsync {

// `name` prefixes every line ("worker", "ps-0"); `level` is an spdlog level
// name ("info", "debug"). Logs go to stderr so stdout stays parseable, one
// line a message (LineFormatter).
void InitLogging(const std::string& name, const std::string& level = "info");

// The lines InitLogging's logger writes: date, name, level, then the
// message with EscapeControlBytes. Messages quote what peers sent (a
// node's name, a key, an error's text): a newline there forged whole log
// lines (and gridsync launch's prefixed copies of them), and terminal
// escapes acted on whoever read the log.
std::unique_ptr<spdlog::formatter> LineFormatter();

// `text` with each byte of these as \xNN: the C0 controls (below 0x20) and
// DEL; the C1 controls (U+0080..U+009F: a terminal not in UTF-8 mode reads
// their bytes as CSI and the like); the line and paragraph separators and
// the bidirectional overrides and isolates (U+2028, U+2029, U+202A..U+202E,
// U+2066..U+2069: a viewer breaks lines at the first, and the others
// reorder what a reader sees, "Trojan Source"); and every byte that is not
// part of well-formed UTF-8 (overlong forms, surrogates, past U+10FFFF,
// truncated sequences). Other UTF-8 stays as it is.
std::string EscapeControlBytes(std::string_view text);

// Config::notes, one info line each ("<source>: note: ..."), after the
// config loaded: what the file sets that has no effect in this run. With
// kConfigNotesShownEnv set to 1 (gridsync launch sets it for its children,
// having printed the notes once itself), the lines go out at debug level:
// under launch every process would otherwise repeat them.
inline constexpr char kConfigNotesShownEnv[] = "GRIDSYNC_CONFIG_NOTES_SHOWN";
void LogConfigNotes(const std::string& source, const std::vector<std::string>& lines);

// A budget for lines a peer can cause: at most `burst` a `window`; the rest
// are counted, and the count is logged in one line once the next window
// opens, so a peer refused in a tight loop cannot flood the log (a hostile
// probe: 3000 bad connections in 0.2 s wrote 3000 coordinator warnings).
// The metrics count every refusal regardless.
//
// Thread safety: not thread-safe; one per serving thread.
class LogBudget {
 public:
  explicit LogBudget(std::string what, int burst = 20,
                     std::chrono::steady_clock::duration window = std::chrono::seconds(10))
      : what_(std::move(what)), burst_(burst), window_(window) {}

  // Whether this line may be logged now.
  bool Allow() {
    Tick();
    if (used_ < burst_) {
      ++used_;
      return true;
    }
    ++suppressed_;
    return false;
  }

  // Opens the next window once this one is over, logging the count of the
  // lines it held back; a caller that may go quiet calls it now and then,
  // so that the count does not wait for the next line (which may never
  // come).
  void Tick() {
    const auto now = std::chrono::steady_clock::now();
    if (now - window_start_ < window_) return;
    if (suppressed_ > 0) {
      spdlog::warn("{} more {} in the last {} s not logged one by one", suppressed_, what_,
                   std::chrono::duration_cast<std::chrono::seconds>(now - window_start_).count());
    }
    window_start_ = now;
    used_ = 0;
    suppressed_ = 0;
  }

 private:
  std::string what_;
  int burst_;
  std::chrono::steady_clock::duration window_;
  std::chrono::steady_clock::time_point window_start_{};
  int used_ = 0;
  uint64_t suppressed_ = 0;
};

}  // namespace gridsync
