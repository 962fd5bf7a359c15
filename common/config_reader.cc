// The strict JSON reading of config_reader.h.
//
// Thread safety: see config_reader.h.
#include "common/config_reader.h"

#include <arpa/inet.h>

#include <algorithm>
#include <cctype>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <string>
#include <unordered_set>
#include <vector>

namespace gridsync::config_reader {

// Returns the offset of the first byte that does not belong to well-formed UTF-8 (overlong
// forms, surrogates and code points past U+10FFFF included), or npos. The JSON lexer checks
// strings only; comments and --set values would otherwise slip invalid bytes into messages and
// into the paths a Config hands to the rest of the program.
size_t FindInvalidUtf8(std::string_view s) {
  size_t i = 0;
  while (i < s.size()) {
    const auto lead = static_cast<unsigned char>(s[i]);
    if (lead < 0x80) {
      ++i;
      continue;
    }
    size_t length = 0;
    uint32_t code_point = 0;
    uint32_t smallest = 0;
    if ((lead & 0xE0) == 0xC0) {
      length = 2;
      code_point = lead & 0x1F;
      smallest = 0x80;
    } else if ((lead & 0xF0) == 0xE0) {
      length = 3;
      code_point = lead & 0x0F;
      smallest = 0x800;
    } else if ((lead & 0xF8) == 0xF0) {
      length = 4;
      code_point = lead & 0x07;
      smallest = 0x10000;
    } else {
      return i;
    }
    if (s.size() - i < length) return i;
    for (size_t k = 1; k < length; ++k) {
      const auto next = static_cast<unsigned char>(s[i + k]);
      if ((next & 0xC0) != 0x80) return i;
      code_point = (code_point << 6) | (next & 0x3F);
    }
    if (code_point < smallest || code_point > 0x10FFFF ||
        (code_point >= 0xD800 && code_point <= 0xDFFF)) {
      return i;
    }
    i += length;
  }
  return std::string_view::npos;
}

// 1-based line and column of byte `offset`. Columns count code points, as editors do, so a
// position after Chinese comment text still lands on the right character.
std::pair<size_t, size_t> LineColumn(std::string_view text, size_t offset) {
  offset = std::min(offset, text.size());
  size_t line = 1;
  size_t column = 1;
  for (size_t i = 0; i < offset; ++i) {
    if (text[i] == '\n') {
      ++line;
      column = 1;
    } else if ((static_cast<unsigned char>(text[i]) & 0xC0) != 0x80) {
      ++column;
    }
  }
  return {line, column};
}

std::string Position(std::string_view source, std::string_view text, size_t offset) {
  const auto [line, column] = LineColumn(text, offset);
  return std::string(source) + ":" + std::to_string(line) + ":" + std::to_string(column);
}

std::string DumpScalar(const Json& value) {
  // `replace` keeps a message printable even if a string holds bytes that are not UTF-8.
  return value.dump(-1, ' ', false, Json::error_handler_t::replace);
}

// Prints a value the way it was written, bounded in depth and width: the value comes from the
// user and a message must stay one readable line even for a megabyte of nested arrays.
void AppendValue(const Json& value, int depth, std::string* out) {
  if (!value.is_structured()) {
    *out += DumpScalar(value);
    return;
  }
  const bool object = value.is_object();
  if (value.empty() || depth == 0) {
    *out += object ? (value.empty() ? "{}" : "{...}") : (value.empty() ? "[]" : "[...]");
    return;
  }
  *out += object ? '{' : '[';
  size_t shown = 0;
  for (auto it = value.begin(); it != value.end(); ++it, ++shown) {
    if (shown > 0) *out += ", ";
    if (shown == 4) {
      *out += "...";
      break;
    }
    if (object) *out += DumpScalar(Json(it.key())) + ": ";
    AppendValue(*it, depth - 1, out);
  }
  *out += object ? '}' : ']';
}

namespace {

// `text` cut to at most `max_chars` bytes with "..." and `tail` after the
// cut, never inside a UTF-8 sequence (the cut backs up to the start of the
// character it falls in); unchanged when it fits.
std::string CutText(std::string text, size_t max_chars, const std::string& tail = "") {
  if (text.size() <= max_chars) return text;
  size_t cut = max_chars - 3;
  while (cut > 0 && (static_cast<unsigned char>(text[cut]) & 0xC0) == 0x80) --cut;
  text.resize(cut);
  text.append("...").append(tail);
  return text;
}

}  // namespace

std::string Describe(const Json& value) {
  std::string text;
  AppendValue(value, 2, &text);
  return CutText(std::move(text), 80);
}

std::string Quote(std::string_view s) { return Describe(Json(std::string(s))); }

std::string HostSyntaxProblem(std::string_view s) {
  const auto all_of = [](std::string_view text, auto pred) {
    return std::all_of(text.begin(), text.end(), pred);
  };
  const auto digit = [](char c) { return c >= '0' && c <= '9'; };
  if (s.empty()) return "empty";
  if (s.size() > 253) {
    return "too long (" + std::to_string(s.size()) + " characters; a DNS name has at most 253)";
  }
  if (s.find("://") != std::string_view::npos) {
    return "an endpoint URL: only its host goes here (gridsync adds the scheme and port)";
  }
  if (const size_t colon = s.find(':'); colon != std::string_view::npos) {
    if (s.find(':', colon + 1) == std::string_view::npos && colon + 1 < s.size() &&
        all_of(s.substr(colon + 1), digit)) {
      return "a host with a port: the port is set apart (master_port, ps.base_port, --port)";
    }
    if (s.front() == '[') {
      return "an IPv6 address in brackets (a URL's form): write it without them";
    }
    const std::string_view address = s.substr(0, s.find('%'));
    const std::string_view zone =
        address.size() < s.size() ? s.substr(address.size() + 1) : std::string_view("-");
    in6_addr parsed{};
    const bool zone_ok = !zone.empty() && all_of(zone, [](char c) {
      return std::isalnum(static_cast<unsigned char>(c)) || c == '_' || c == '-' || c == '.';
    });
    if (inet_pton(AF_INET6, std::string(address).c_str(), &parsed) == 1 && zone_ok) {
      // A group, not a host: nothing listens or connects there over TCP.
      if (parsed.s6_addr[0] == 0xff) return "an IPv6 multicast address (ff00::/8), not a host's";
      return "";
    }
    return "not an IPv6 address (it holds ':')";
  }
  if (all_of(s, [&](char c) { return digit(c) || c == '.'; })) {
    in_addr parsed{};
    if (inet_pton(AF_INET, std::string(s).c_str(), &parsed) == 1) {
      // Broadcast and multicast name groups, not a host: a shard bound
      // there, or a worker connecting there, fails only at its start.
      const uint32_t a = ntohl(parsed.s_addr);
      if (a == 0xFFFFFFFFu) return "the broadcast address, not a host's";
      if ((a >> 28) == 0xE) return "an IPv4 multicast address (224.0.0.0/4), not a host's";
      return "";
    }
    return "not an IPv4 address (four numbers 0-255 joined by dots)";
  }
  std::string_view name = s;
  if (name.size() > 1 && name.back() == '.') name.remove_suffix(1);  // fully qualified
  for (size_t start = 0; start <= name.size();) {
    const size_t dot = std::min(name.find('.', start), name.size());
    const std::string_view label = name.substr(start, dot - start);
    if (label.empty() || label.size() > 63) {
      return "not a host name (labels between dots of 1 to 63 characters)";
    }
    if (!all_of(label, [](char c) {
          return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
                 c == '-' || c == '_';
        })) {
      return "not a host name (letters, digits, '-' and '_' between dots)";
    }
    if (label.front() == '-' || label.back() == '-') {
      return "not a host name (a label neither starts nor ends with '-')";
    }
    start = dot + 1;
  }
  return "";
}

std::string KeyText(std::string_view key) {
  const bool plain =
      !key.empty() && key.size() <= 64 && std::all_of(key.begin(), key.end(), [](char c) {
        return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
               c == '_' || c == '-';
      });
  return plain ? std::string(key) : Quote(key);
}

namespace {

// A parser's message quotes the token it stopped at, which can be a number
// of 100,000 digits: at most 200 characters of it.
std::string Shortened(const std::string& text) {
  return CutText(text, 200, " (" + std::to_string(text.size()) + " characters)");
}

}  // namespace

namespace {

// Whether `text` is a JSON number by its grammar, whatever its size:
// -?(0|[1-9][0-9]*)(.[0-9]+)?([eE][+-]?[0-9]+)? (a loop, not std::regex,
// whose recursion a value of 100,000 digits would take past the stack).
bool IsJsonNumber(std::string_view text) {
  size_t i = 0;
  const auto digits = [&] {
    const size_t from = i;
    while (i < text.size() && text[i] >= '0' && text[i] <= '9') ++i;
    return i - from;
  };
  if (i < text.size() && text[i] == '-') ++i;
  const size_t first = i;
  const size_t whole = digits();
  if (whole == 0 || (whole > 1 && text[first] == '0')) return false;
  if (i < text.size() && text[i] == '.') {
    ++i;
    if (digits() == 0) return false;
  }
  if (i < text.size() && (text[i] == 'e' || text[i] == 'E')) {
    ++i;
    if (i < text.size() && (text[i] == '+' || text[i] == '-')) ++i;
    if (digits() == 0) return false;
  }
  return i == text.size();
}

// A JSON number by its grammar that no double holds (1e400): what
// `--set key=1e400` leaves as text.
bool IsOverflowingNumber(const std::string& text) {
  return IsJsonNumber(text) && !std::isfinite(std::strtod(text.c_str(), nullptr));
}

// The first number literal of JSON `text` (strings and comments skipped)
// whose digits are not all zero but which reads as 0 (1e-400: below the
// smallest double). The parser takes it as 0 without a word, and a key
// that allows 0 would then run with a value nobody wrote. Its offset, or
// npos; *token = the literal.
size_t FindUnderflowingNumber(std::string_view text, std::string* token) {
  for (size_t i = 0; i < text.size();) {
    const char c = text[i];
    if (c == '"') {  // a string: skip to its closing quote
      for (++i; i < text.size() && text[i] != '"'; ++i) {
        if (text[i] == '\\') ++i;
      }
      ++i;
      continue;
    }
    if (c == '/' && i + 1 < text.size() && (text[i + 1] == '/' || text[i + 1] == '*')) {
      const bool line = text[i + 1] == '/';
      const size_t end = text.find(line ? "\n" : "*/", i + 2);
      i = end == std::string_view::npos ? text.size() : end + (line ? 1 : 2);
      continue;
    }
    if (c != '-' && (c < '0' || c > '9')) {
      ++i;
      continue;
    }
    const size_t start = i;
    bool nonzero = false, exponent = false;
    for (; i < text.size(); ++i) {
      const char d = text[i];
      if (d == 'e' || d == 'E') exponent = true;
      if (!exponent && d >= '1' && d <= '9') nonzero = true;
      const bool part =
          (d >= '0' && d <= '9') || d == '.' || d == 'e' || d == 'E' || d == '-' || d == '+';
      if (!part) break;
    }
    if (!nonzero || !exponent) continue;  // an underflow needs an exponent
    const std::string literal(text.substr(start, i - start));
    if (IsJsonNumber(literal) && std::strtod(literal.c_str(), nullptr) == 0.0) {
      *token = literal;
      return start;
    }
  }
  return std::string_view::npos;
}

// The problem text for an underflowing literal (FindUnderflowingNumber).
std::string UnderflowText(const std::string& token) {
  return "invalid JSON: number underflow parsing '" + Shortened(token) +
         "' (below the smallest double, about 4.9e-324: it would read as 0)";
}

}  // namespace

std::string TypeName(const Json& value) {
  switch (value.type()) {
    case Json::value_t::number_integer:
    case Json::value_t::number_unsigned:
      return "integer";
    case Json::value_t::number_float:
      return "floating-point number";
    default:
      return value.type_name();
  }
}

std::string Got(const Json& value) {
  // `--set key=1e400` reaches a number key as text: say why.
  if (value.is_string() && IsOverflowingNumber(value.get_ref<const std::string&>()))
    return Describe(value) +
           " (a string: as a number it is past the largest double, about 1.8e308)";
  if (std::string token; value.is_string() && IsJsonNumber(value.get_ref<const std::string&>()) &&
                         FindUnderflowingNumber(value.get_ref<const std::string&>(), &token) == 0)
    return Describe(value) +
           " (a string: as a number it is below the smallest double, about 4.9e-324, and would "
           "read as 0)";
  return Describe(value) + " (" + TypeName(value) + ")";
}

std::string NotAnInteger(const Json& value) {
  if (value.is_number_float()) {
    const double v = value.get<double>();
    // Integer literals the parser could not hold: past 2^64 or below -2^63.
    if (std::isfinite(v) && (v >= 18446744073709551616.0 || v <= -9223372036854775808.0) &&
        v == std::floor(v))
      return "out of range: " + Describe(value) + " (past 64-bit integers)";
  }
  return "wrong type: expected an integer, got " + Got(value);
}

std::string FormatNumber(double v) {
  char buffer[32];
  std::snprintf(buffer, sizeof(buffer), "%g", v);
  return buffer;
}

std::string Join(const std::vector<std::string>& lines, std::string_view separator) {
  std::string out;
  for (const auto& line : lines) {
    if (!out.empty()) out += separator;
    out += line;
  }
  return out;
}

size_t EditDistance(std::string_view a, std::string_view b) {
  std::vector<size_t> row(b.size() + 1);
  for (size_t j = 0; j <= b.size(); ++j) row[j] = j;
  for (size_t i = 1; i <= a.size(); ++i) {
    size_t diagonal = row[0];
    row[0] = i;
    for (size_t j = 1; j <= b.size(); ++j) {
      const size_t above = row[j];
      row[j] = std::min({row[j] + 1, row[j - 1] + 1, diagonal + (a[i - 1] == b[j - 1] ? 0 : 1)});
      diagonal = above;
    }
  }
  return row[b.size()];
}

bool EqualsIgnoringCase(std::string_view a, std::string_view b) {
  return a.size() == b.size() && std::equal(a.begin(), a.end(), b.begin(), [](char x, char y) {
           auto lower = [](char c) { return c >= 'A' && c <= 'Z' ? static_cast<char>(c + 32) : c; };
           return lower(x) == lower(y);
         });
}

// Tracks the key path while nlohmann's DOM parser runs, to catch duplicate keys: the parser
// itself keeps the last value silently, which would hide a half-edited config.
class DuplicateKeyFinder {
 public:
  // prefix: where the parsed text sits (a --set value's "--set '...': a.b"),
  // before the paths inside it.
  explicit DuplicateKeyFinder(Problems* problems, std::string prefix = "")
      : problems_(problems), prefix_(std::move(prefix)) {}

  bool operator()(int /*depth*/, Json::parse_event_t event, Json& parsed) {
    switch (event) {
      case Json::parse_event_t::object_start:
        frames_.push_back(Frame{false, {}, {}, 0});
        break;
      case Json::parse_event_t::array_start:
        frames_.push_back(Frame{true, {}, {}, 0});
        break;
      case Json::parse_event_t::key: {
        Frame& top = frames_.back();
        top.key = parsed.get<std::string>();
        if (!top.seen.insert(top.key).second) {
          // Past the listed problems only the count grows: no path (O(depth)
          // each) for a million nested duplicates.
          problems_->Add(problems_->listing() ? Path() : std::string(), "duplicate key",
                         "each key at most once per object (a JSON parser keeps only the last)");
        }
        break;
      }
      case Json::parse_event_t::object_end:
      case Json::parse_event_t::array_end:
        frames_.pop_back();
        ValueDone();
        break;
      case Json::parse_event_t::value:
        ValueDone();
        break;
    }
    return true;  // keep everything; problems are reported, not filtered out
  }

 private:
  struct Frame {
    bool array;
    // A hostile config can hold 100k keys in one object: a hash set keeps the
    // duplicate check linear.
    std::unordered_set<std::string> seen;
    std::string key;
    size_t index;
  };

  void ValueDone() {
    if (!frames_.empty() && frames_.back().array) ++frames_.back().index;
  }

  std::string Path() const {
    std::string path;
    for (const Frame& frame : frames_) {
      if (frame.array) {
        // Appended piece by piece: "[" + to_string(...) trips GCC 12's
        // -Wrestrict false positive.
        path.append("[").append(std::to_string(frame.index)).append("]");
      } else {
        if (!path.empty()) path += ".";
        path += KeyText(frame.key);
      }
    }
    if (prefix_.empty()) return path;
    return path.empty() || path[0] == '[' ? prefix_ + path : prefix_ + "." + path;
  }

  Problems* problems_;
  std::string prefix_;
  std::vector<Frame> frames_;
};

// A SAX handler that keeps nothing but where the first error begins: the
// byte offset of the token it stopped at.
class ErrorPositionFinder : public nlohmann::json_sax<Json> {
 public:
  bool found = false;
  size_t offset = 0;

  bool null() override { return true; }
  bool boolean(bool) override { return true; }
  bool number_integer(number_integer_t) override { return true; }
  bool number_unsigned(number_unsigned_t) override { return true; }
  bool number_float(number_float_t, const string_t&) override { return true; }
  bool string(string_t&) override { return true; }
  bool binary(binary_t&) override { return true; }
  bool start_object(std::size_t) override { return true; }
  bool key(string_t&) override { return true; }
  bool end_object() override { return true; }
  bool start_array(std::size_t) override { return true; }
  bool end_array() override { return true; }
  bool parse_error(std::size_t position, const std::string& token,
                   const nlohmann::detail::exception&) override {
    // `position` counts the bytes read, the token's included.
    found = true;
    offset = position >= token.size() ? position - token.size() : 0;
    return false;
  }
};

// Parses `text` into `root`; false when it is not JSON at all (reported with line and column).
bool ParseJson(std::string_view text, std::string_view source, Problems* problems, Json* root) {
  // nlohmann stops at a NUL byte as at the end of input, which would accept
  // whatever garbage follows it.
  if (const size_t nul = text.find('\0'); nul != std::string_view::npos) {
    problems->AddAt(Position(source, text, nul), "a NUL byte (0x00)", kJsonAllowed);
    return false;
  }
  if (const size_t bad = FindInvalidUtf8(text); bad != std::string_view::npos) {
    char byte[8];
    std::snprintf(byte, sizeof(byte), "0x%02X", static_cast<unsigned char>(text[bad]));
    problems->AddAt(Position(source, text, bad), "invalid UTF-8 (byte " + std::string(byte) + ")",
                    kJsonAllowed);
    return false;
  }
  try {
    DuplicateKeyFinder finder(problems);
    *root = Json::parse(text, std::ref(finder), /*allow_exceptions=*/true,
                        /*ignore_comments=*/true);
    std::string token;
    if (const size_t at = FindUnderflowingNumber(text, &token); at != std::string_view::npos) {
      problems->AddAt(Position(source, text, at), UnderflowText(token), kJsonAllowed);
      return false;
    }
    return true;
  } catch (const Json::parse_error& e) {
    // nlohmann's text is "[json.exception.parse_error.101] parse error at line L, column C:
    // <detail>"; keep the detail and compute the position ourselves, counting code points.
    std::string detail = e.what();
    if (const size_t at = detail.find("parse error at line "); at != std::string::npos) {
      if (const size_t colon = detail.find(": ", at); colon != std::string::npos) {
        detail.erase(0, colon + 2);
      }
    }
    const size_t offset = e.byte > 0 ? e.byte - 1 : 0;
    problems->AddAt(Position(source, text, offset), "invalid JSON: " + Shortened(detail),
                    kJsonAllowed);
  } catch (const Json::exception& e) {
    // Number overflow (1e400) arrives as out_of_range, without a position:
    // the DOM parser drops the one its SAX layer had. A SAX pass finds it.
    std::string detail = e.what();
    if (const size_t bracket = detail.find("] "); bracket != std::string::npos) {
      detail.erase(0, bracket + 2);
    }
    ErrorPositionFinder finder;
    (void)Json::sax_parse(text, &finder, nlohmann::detail::input_format_t::json,
                          /*strict=*/true, /*ignore_comments=*/true);
    const std::string where =
        finder.found ? Position(source, text, finder.offset) : std::string(source);
    // The token is what gets cut, so that its length is its own.
    const std::string kOverflow = "number overflow parsing '";
    if (detail.starts_with(kOverflow) && detail.size() > kOverflow.size() &&
        detail.back() == '\'') {
      const std::string token =
          detail.substr(kOverflow.size(), detail.size() - kOverflow.size() - 1);
      detail = kOverflow + Shortened(token) + "' (past the largest double, about 1.8e308)";
    } else {
      detail = Shortened(detail);
    }
    problems->AddAt(where, "invalid JSON: " + detail, kJsonAllowed);
  }
  return false;
}

// Applies one "a.b.c=value" to `root`. Missing intermediate sections are created, so a typo in
// a section name reaches the normal unknown-key check instead of needing its own message.
void ApplyOverride(const std::string& override_text, Json* root, Problems* problems) {
  const std::string where = "--set " + Quote(override_text);
  if (FindInvalidUtf8(override_text) != std::string_view::npos) {
    problems->Add(where, "not valid UTF-8", kOverrideAllowed);
    return;
  }
  const size_t equals = override_text.find('=');
  if (equals == std::string::npos) {
    problems->Add(where, "missing '='", kOverrideAllowed);
    return;
  }
  const std::string_view path = std::string_view(override_text).substr(0, equals);
  const std::string value_text = override_text.substr(equals + 1);

  std::vector<std::string> keys;
  for (size_t start = 0;;) {
    const size_t dot = path.find('.', start);
    keys.emplace_back(path.substr(start, dot == std::string_view::npos ? dot : dot - start));
    if (keys.back().empty()) {
      problems->Add(where, "empty key in path " + Quote(path), kOverrideAllowed);
      return;
    }
    if (dot == std::string_view::npos) break;
    start = dot + 1;
  }

  // The value is JSON when it parses ("5", "true", "\"5\""), otherwise the raw text, so that
  // host names and paths need no quoting on a command line.
  Json value = Json::parse(value_text, nullptr, /*allow_exceptions=*/false);
  // (A number that overflows, 1e400, stays text too: a string key may hold
  // it; a number key's type error says what it is, see Got.)
  if (value.is_discarded()) value = value_text;
  // A number that underflows (1e-400) stays text as well; inside an object
  // or array value it is refused, as in a file.
  if (std::string token;
      !value.is_string() && FindUnderflowingNumber(value_text, &token) != std::string_view::npos) {
    if (!value.is_structured()) {
      value = value_text;
    } else {
      problems->Add(where, UnderflowText(token), kOverrideAllowed);
      return;
    }
  }
  if (value.is_structured()) {
    // Duplicate keys in an object or array value, as in a file.
    std::string at;
    for (const auto& key : keys) at += (at.empty() ? "" : ".") + KeyText(key);
    DuplicateKeyFinder finder(problems, where + ": " + at);
    // Parsed for the finder's callbacks only (GCC warns on a (void) cast).
    [[maybe_unused]] const Json walked_for_duplicates =
        Json::parse(value_text, std::ref(finder), /*allow_exceptions=*/false);
  }

  Json* node = root;
  std::string walked;
  for (size_t i = 0; i + 1 < keys.size(); ++i) {
    walked += (walked.empty() ? "" : ".") + keys[i];
    // A section the file lacks is made; one the file holds as null stays
    // null and is refused (it was made an object, and the file's
    // `"training": null` passed once any --set named it).
    const bool present = node->contains(keys[i]);
    Json& child = (*node)[keys[i]];
    if (child.is_null() && !present) child = Json::object();
    if (!child.is_object()) {
      problems->Add(where, walked + " is " + Got(child) + ", not a section", kOverrideAllowed);
      return;
    }
    node = &child;
  }
  // An object value merges into the section it names, key by key and as
  // deep as both are objects: `--set training={"threads":1}` sets one key
  // (replacing the section dropped the file's other training keys without
  // a word). Anything else replaces what the file holds. A work list, not
  // recursion: both sides may nest deeply.
  std::vector<std::pair<Json*, Json*>> merges = {{&(*node)[keys.back()], &value}};
  while (!merges.empty()) {
    auto [target, from] = merges.back();
    merges.pop_back();
    if (!target->is_object() || !from->is_object()) {
      *target = std::move(*from);
      continue;
    }
    for (auto it = from->begin(); it != from->end(); ++it) {
      Json& child = (*target)[it.key()];
      if (child.is_object() && it->is_object()) {
        merges.emplace_back(&child, &*it);
      } else {
        child = std::move(*it);
      }
    }
  }
}

}  // namespace gridsync::config_reader
