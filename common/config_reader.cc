// The strict readers of config_reader.h and the words of their messages
// (the text itself is parsed in config_json.cc).
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

#include "common/utf8.h"

namespace gridsync::config_reader {

// Returns the offset of the first byte that does not belong to well-formed UTF-8 (overlong
// forms, surrogates and code points past U+10FFFF included), or npos. The JSON lexer checks
// strings only; comments and --set values would otherwise slip invalid bytes into messages and
// into the paths a Config hands to the rest of the program.
size_t FindInvalidUtf8(std::string_view s) {
  uint32_t code_point = 0;
  for (size_t i = 0; i < s.size();) {
    if (static_cast<unsigned char>(s[i]) < 0x80) {
      ++i;
      continue;
    }
    const size_t length = Utf8Sequence(s, i, &code_point);
    if (length == 0) return i;
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
      // A zone by name is for the link of a link-local address; on any
      // other the resolver refuses it ("::1%lo": the coordinator bound it,
      // and every shard and worker then failed to look it up until their
      // timeout). A zone by number it takes on any address.
      const bool numeric_zone = all_of(zone, digit);
      if (address.size() < s.size() && !numeric_zone && !IN6_IS_ADDR_LINKLOCAL(&parsed)) {
        return "an IPv6 address with a zone named '" + std::string(zone) +
               "' that is not link-local: a zone by name is only for fe80::/10 addresses (a "
               "zone by number is for any)";
      }
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
  // A name the resolver reads as an IPv4 address in another form (hex
  // "0x7f.1", one number "0x7f000001"): refused as the decimal forms above are.
  if (in_addr numeric{}; inet_aton(std::string(name).c_str(), &numeric) != 0) {
    return "an IPv4 address in a form other than four decimal numbers 0-255 joined by dots";
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

std::string Shortened(const std::string& text) {
  return CutText(text, 200, " (" + std::to_string(text.size()) + " characters)");
}

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

}  // namespace

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

std::string UnderflowText(const std::string& token) {
  return "invalid JSON: number underflow parsing '" + Shortened(token) +
         "' (below the smallest double, about 4.9e-324: it would read as 0)";
}

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

}  // namespace gridsync::config_reader
