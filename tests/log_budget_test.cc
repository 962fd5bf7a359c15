// LogBudget (common/logging.h): a peer refused in a tight loop gets `burst`
// lines a window, the rest counted, and a new window opens the budget again.
// LineFormatter: a message is one line, whatever bytes a peer put in it.
#include <gtest/gtest.h>
#include <spdlog/sinks/ostream_sink.h>

#include <algorithm>
#include <chrono>
#include <memory>
#include <sstream>
#include <thread>

#include "common/logging.h"

namespace gridsync {
namespace {

TEST(LogBudgetTest, AllowsABurstAWindowThenCounts) {
  LogBudget budget("refusals", /*burst=*/3, std::chrono::milliseconds(200));
  int allowed = 0;
  for (int i = 0; i < 1000; ++i) allowed += budget.Allow() ? 1 : 0;
  EXPECT_EQ(allowed, 3);
  std::this_thread::sleep_for(std::chrono::milliseconds(250));
  EXPECT_TRUE(budget.Allow()) << "a new window";
  EXPECT_TRUE(budget.Allow());
  EXPECT_TRUE(budget.Allow());
  EXPECT_FALSE(budget.Allow());
}

// A hostile probe: the attacker's lines used the budget, then the peer
// went quiet, and the count of what was held back (a worker's connection
// shut down among them) was never logged. Tick logs it once the window is
// over, with no further line needed.
TEST(LogBudgetTest, TickLogsTheHeldBackCountWithoutANewLine) {
  std::ostringstream out;
  auto sink = std::make_shared<spdlog::sinks::ostream_sink_mt>(out);
  auto previous = spdlog::default_logger();
  spdlog::set_default_logger(std::make_shared<spdlog::logger>("budget", sink));
  LogBudget budget("refusals", /*burst=*/1, std::chrono::milliseconds(100));
  EXPECT_TRUE(budget.Allow());
  for (int i = 0; i < 5; ++i) EXPECT_FALSE(budget.Allow());
  budget.Tick();
  EXPECT_EQ(out.str(), "") << "the window is not over";
  std::this_thread::sleep_for(std::chrono::milliseconds(150));
  budget.Tick();
  spdlog::set_default_logger(previous);
  EXPECT_NE(out.str().find("5 more refusals"), std::string::npos) << out.str();
}

// A peer's bytes in a message (a node's name, a key, an error's text) must
// not forge log lines or send terminal escapes: each message is one line.
TEST(LogLinesTest, ControlBytesAreEscapedAndEachMessageIsOneLine) {
  std::ostringstream out;
  auto sink = std::make_shared<spdlog::sinks::ostream_sink_mt>(out);
  auto logger = std::make_shared<spdlog::logger>("coordinator", sink);
  logger->set_formatter(LineFormatter());
  logger->warn("register refused (worker from node '{}')",
               "a\n[2026-01-01 00:00:00.000] [coordinator] [info] done\x1b[2J\r\x7f");
  logger->info("utf-8 stays: {}", "r\xc3\xa9sum\xc3\xa9");
  const std::string text = out.str();
  EXPECT_EQ(std::count(text.begin(), text.end(), '\n'), 2) << text;
  EXPECT_EQ(text.find('\x1b'), std::string::npos) << text;
  EXPECT_NE(text.find("node 'a\\x0a[2026-01-01 00:00:00.000] [coordinator] [info] "
                      "done\\x1b[2J\\x0d\\x7f')"),
            std::string::npos)
      << text;
  EXPECT_NE(text.find("[coordinator] [warning] register refused"), std::string::npos) << text;
  EXPECT_NE(text.find("utf-8 stays: r\xc3\xa9sum\xc3\xa9"), std::string::npos) << text;
  EXPECT_EQ(EscapeControlBytes("tab\there"), "tab\\x09here");
}

// A terminal not in UTF-8 mode reads C1 bytes as controls (0x9b is CSI),
// and bidirectional overrides reorder what a reader sees: both escaped, as
// is every byte that is not well-formed UTF-8; other UTF-8 stays.
TEST(LogLinesTest, C1ControlsBidiOverridesAndBytesNotUtf8AreEscaped) {
  EXPECT_EQ(EscapeControlBytes("csi\xc2\x9b"
                               "2J"),
            "csi\\xc2\\x9b2J");  // U+009B
  EXPECT_EQ(EscapeControlBytes("a\xe2\x80\xae"
                               "b"),
            "a\\xe2\\x80\\xaeb");  // U+202E
  EXPECT_EQ(EscapeControlBytes("a\xe2\x80\xa8"
                               "b"),
            "a\\xe2\\x80\\xa8b");  // U+2028
  EXPECT_EQ(EscapeControlBytes("a\xe2\x81\xa6"
                               "b"),
            "a\\xe2\\x81\\xa6b");  // U+2066
  // Not UTF-8: a lone continuation byte, a raw C1 byte, an overlong '/',
  // a surrogate, past U+10FFFF, a truncated sequence at the end.
  EXPECT_EQ(EscapeControlBytes("\x80"), "\\x80");
  EXPECT_EQ(EscapeControlBytes("x\x9by"), "x\\x9by");
  EXPECT_EQ(EscapeControlBytes("\xc0\xaf"), "\\xc0\\xaf");
  EXPECT_EQ(EscapeControlBytes("\xed\xa0\x80"), "\\xed\\xa0\\x80");
  EXPECT_EQ(EscapeControlBytes("\xf4\x90\x80\x80"), "\\xf4\\x90\\x80\\x80");
  EXPECT_EQ(EscapeControlBytes("ok\xe2\x82"), "ok\\xe2\\x82");
  // Well-formed UTF-8 of every length stays: e-acute, the euro sign, an
  // emoji, and the last code point.
  const std::string kept = "r\xc3\xa9 \xe2\x82\xac \xf0\x9f\x98\x80 \xf4\x8f\xbf\xbf";
  EXPECT_EQ(EscapeControlBytes(kept), kept);
}

}  // namespace
}  // namespace gridsync
