#include "ops/progress_line.h"

#include <sys/ioctl.h>
#include <unistd.h>

#include <algorithm>
#include <nlohmann/json.hpp>

namespace gridsync {
namespace {

std::string Seconds(double s) {
  // Beyond ~31,700 years the cast to long would overflow (a line with
  // steps near 2^64 showed an ETA of -9223372036854775808s).
  if (!(s >= 0 && s < 1e12)) return "?";
  const long t = static_cast<long>(s + 0.5);
  char buf[32];
  if (t >= 3600) {
    std::snprintf(buf, sizeof(buf), "%ldh%02ldm", t / 3600, (t / 60) % 60);
  } else if (t >= 60) {
    std::snprintf(buf, sizeof(buf), "%ldm%02lds", t / 60, t % 60);
  } else {
    std::snprintf(buf, sizeof(buf), "%lds", t);
  }
  return buf;
}

int TerminalWidth(std::FILE* out) {
  winsize w{};
  if (ioctl(fileno(out), TIOCGWINSZ, &w) == 0 && w.ws_col > 20) return w.ws_col;
  return 100;
}

}  // namespace

std::string ProgressState::ToJson() const {
  nlohmann::json j = {{"step", step},
                      {"steps", steps},
                      {"samples_per_second", samples_per_second},
                      {"loss", loss},
                      {"elapsed_seconds", elapsed_seconds}};
  if (!std::isnan(psnr)) j["psnr"] = psnr;
  return j.dump();
}

bool ProgressState::FromJson(const std::string& text, ProgressState* out) {
  const nlohmann::json j = nlohmann::json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (!j.is_object()) return false;
  // Each field checked for its type (json::value threw on a null loss, which
  // ToJson writes for NaN, and on a string step; the launcher ended in
  // terminate): a field of another type refuses the line.
  bool ok = true;
  const auto count = [&](const char* key) -> uint64_t {
    const auto it = j.find(key);
    if (it == j.end()) return 0;
    if (!it->is_number_unsigned()) ok = false;
    return ok ? it->get<uint64_t>() : 0;
  };
  const auto real = [&](const char* key, double absent) -> double {
    const auto it = j.find(key);
    if (it == j.end()) return absent;
    if (it->is_null()) return NAN;  // ToJson's NaN
    if (!it->is_number()) ok = false;
    return ok ? it->get<double>() : absent;
  };
  ProgressState s;
  s.step = count("step");
  s.steps = count("steps");
  s.samples_per_second = real("samples_per_second", 0.0);
  s.loss = real("loss", 0.0);
  s.psnr = real("psnr", NAN);
  s.elapsed_seconds = real("elapsed_seconds", 0.0);
  if (!ok) return false;
  *out = s;
  return true;
}

std::string FormatProgress(const ProgressState& s, int width) {
  const double fraction =
      s.steps > 0 ? std::clamp(static_cast<double>(s.step) / static_cast<double>(s.steps), 0.0, 1.0)
                  : 0.0;
  const double eta = s.step > 0 ? s.elapsed_seconds / static_cast<double>(s.step) *
                                      static_cast<double>(s.steps - std::min(s.step, s.steps))
                                : NAN;
  char rate[32];
  if (s.samples_per_second >= 1e6) {
    std::snprintf(rate, sizeof(rate), "%.2fM", s.samples_per_second / 1e6);
  } else {
    std::snprintf(rate, sizeof(rate), "%.0fk", s.samples_per_second / 1e3);
  }
  char text[256];
  std::snprintf(
      text, sizeof(text), " %llu/%llu %3.0f%% | %s samples/s | loss %.5f%s | %s, ETA %s",
      static_cast<unsigned long long>(s.step), static_cast<unsigned long long>(s.steps),
      100 * fraction, rate, s.loss,
      std::isnan(s.psnr) ? "" : (" | PSNR " + std::to_string(s.psnr).substr(0, 5) + " dB").c_str(),
      Seconds(s.elapsed_seconds).c_str(), Seconds(eta).c_str());
  const std::string tail = text;
  const int bar = std::clamp(width - static_cast<int>(tail.size()) - 3, 0, 30);
  std::string line;
  if (bar >= 5) {
    const int filled = static_cast<int>(fraction * bar);
    line = "[" + std::string(static_cast<size_t>(filled), '#') +
           std::string(static_cast<size_t>(bar - filled), '-') + "]";
  }
  line += tail;
  if (static_cast<int>(line.size()) > width) line.resize(static_cast<size_t>(width));
  return line;
}

bool ProgressLine::IsTerminal(std::FILE* out) { return isatty(fileno(out)) == 1; }

void ProgressLine::Update(const ProgressState& state) {
  state_ = state;
  has_state_ = true;
  const auto now = std::chrono::steady_clock::now();
  if (state.step < state.steps && now - last_draw_ < std::chrono::milliseconds(100)) return;
  last_draw_ = now;
  Redraw();
}

void ProgressLine::Clear() {
  if (!drawn_) return;
  std::fputs("\r\033[K", out_);
  std::fflush(out_);
  drawn_ = false;
}

void ProgressLine::Redraw() {
  if (!has_state_) return;
  std::fprintf(out_, "\r\033[K%s", FormatProgress(state_, TerminalWidth(out_) - 1).c_str());
  std::fflush(out_);
  drawn_ = true;
}

void ProgressLine::Finish() {
  if (drawn_) std::fputs("\n", out_);
  std::fflush(out_);
  drawn_ = false;
}

}  // namespace gridsync
