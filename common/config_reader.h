// Reading a JSON config strictly, for Config::Parse (config.cc): JSON text
// with positions in messages, duplicate keys found, --set overrides, and the
// readers that check each key's type and range, record every problem rather
// than stop at the first, and name the keys a section allows when one is
// unknown. Internal to gridsync_common.
//
// Thread safety: Problems and SectionReader belong to one parse on one
// thread; the functions are pure.
#pragma once

#include <cstddef>
#include <cstdint>
#include <limits>
#include <nlohmann/json.hpp>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "common/status.h"

namespace gridsync::config_reader {

using Json = nlohmann::json;

inline constexpr std::string_view kJsonAllowed = "JSON text (UTF-8, // and /* */ comments allowed)";
inline constexpr std::string_view kOverrideAllowed =
    "section.key=value with a JSON or plain-string value, for example training.steps=200";

// Returns the offset of the first byte that does not belong to well-formed UTF-8 (overlong
// forms, surrogates and code points past U+10FFFF included), or npos. The JSON lexer checks
// strings only; comments and --set values would otherwise slip invalid bytes into messages and
// into the paths a Config hands to the rest of the program.
size_t FindInvalidUtf8(std::string_view s);
std::string Position(std::string_view source, std::string_view text, size_t offset);
std::string Describe(const Json& value);
std::string Quote(std::string_view s);
// A key as a message names it: as written when it is a plain name (letters,
// digits, '_', '-', at most 64 of them), else quoted with JSON escapes and
// cut like a value, so that a NUL, a newline or an escape sequence in a
// hostile key can neither cut nor forge a message line, and a megabyte key
// prints as 80 characters.
std::string KeyText(std::string_view key);
// Why `s` is no IPv4 or IPv6 literal (a zone after '%' allowed) and no
// host name (RFC 1123, and '_' as in container service names, which the
// resolver takes); empty when it is one.
std::string HostSyntaxProblem(std::string_view s);
// What that syntax allows, for "allowed: ..." in messages.
inline constexpr const char* kHostSyntax =
    "an IP address or a host name (letters, digits, '-' and '_' between dots), without a port or "
    "scheme";
// A parser's message quotes the token it stopped at, which can be a number
// of 100,000 digits: at most 200 characters of it.
std::string Shortened(const std::string& text);
// The first number literal of JSON `text` (strings and comments skipped)
// whose digits are not all zero but which reads as 0 (1e-400: below the
// smallest double). The parser takes it as 0 without a word, and a key
// that allows 0 would then run with a value nobody wrote. Its offset, or
// npos; *token = the literal.
size_t FindUnderflowingNumber(std::string_view text, std::string* token);
// The problem text for an underflowing literal (FindUnderflowingNumber).
std::string UnderflowText(const std::string& token);
std::string TypeName(const Json& value);
std::string Got(const Json& value);
// What is wrong with `value` where an integer is expected: "wrong type:
// expected an integer, got ...", or, for a whole number past 64-bit
// integers (which the parser can only read as floating point), "out of
// range: ... (past 64-bit integers)".
std::string NotAnInteger(const Json& value);
std::string FormatNumber(double v);
std::string Join(const std::vector<std::string>& lines, std::string_view separator);
size_t EditDistance(std::string_view a, std::string_view b);
bool EqualsIgnoringCase(std::string_view a, std::string_view b);

template <typename T>
std::string JoinQuoted(std::span<const T> names) {
  std::string out;
  for (const auto& name : names) {
    if (!out.empty()) out += ", ";
    out += Quote(name);
  }
  return out;
}

// Collects problems as "<source>: <where>: <problem>; allowed: <what>", one per line.
class Problems {
 public:
  explicit Problems(std::string_view source) : source_(source) {}

  void Add(std::string_view where, std::string_view problem, std::string_view allowed) {
    std::string line = source_;
    line += ": ";
    line += where;
    line += ": ";
    line += problem;
    line += "; allowed: ";
    line += allowed;
    Keep(std::move(line));
  }

  // For problems located by line and column instead of a key path.
  void AddAt(std::string position, std::string_view problem, std::string_view allowed) {
    position += ": ";
    position += problem;
    position += "; allowed: ";
    position += allowed;
    Keep(std::move(position));
  }

  bool empty() const { return lines_.empty(); }
  // Whether the next problem will be listed (past the first kMaxListed only
  // their count is kept): callers skip building costly locations.
  bool listing() const { return lines_.size() < kMaxListed; }
  Status ToStatus() const {
    if (lines_.empty()) return Status::OK();
    std::string all = Join(lines_, "\n");
    if (unlisted_ > 0) {
      all += "\n" + source_ + ": " + std::to_string(unlisted_) +
             " more problems not listed (the first " + std::to_string(kMaxListed) + " are)";
    }
    return Status::InvalidArgument(all);
  }

 private:
  // A hostile file can hold a problem per byte (1.5M duplicate keys made
  // 184 MB of messages); the first ones say what to fix.
  static constexpr size_t kMaxListed = 50;

  void Keep(std::string line) {
    if (lines_.size() < kMaxListed) {
      lines_.push_back(std::move(line));
    } else {
      ++unlisted_;
    }
  }

  std::string source_;
  std::vector<std::string> lines_;
  size_t unlisted_ = 0;
};

// Rules for string keys beyond "is a string".
struct StringRule {
  std::string_view allowed;  // what to print after "allowed: "
  size_t max_length = std::numeric_limits<size_t>::max();
  bool forbid_spaces = false;  // host names: a space is always a paste accident
  // Hosts: no URL brackets around an IPv6 address ("[::1]" failed to bind
  // as tcp://[[::1]]:port, or to resolve, after check-config passed it).
  bool host = false;
};

// Reads the keys of one section (or of the top level when `name` is empty). Every read records
// its key, so the list printed for an unknown key is exactly the set of keys the code reads.
// Each reader returns true when the target holds a valid value (the default when the key is
// absent) and false after it reported a problem.
class SectionReader {
 public:
  SectionReader(Problems* problems, std::string name, const Json* section)
      : problems_(problems), name_(std::move(name)), section_(section) {}

  bool Has(std::string_view key) const { return section_ != nullptr && section_->contains(key); }

  std::string Path(std::string_view key) const {
    return name_.empty() ? KeyText(key) : name_ + "." + KeyText(key);
  }

  // A nested array; null when absent, or when it is not an array (reported).
  const Json* Array(std::string_view key, std::string_view allowed) {
    const Json* value = Find(key);
    if (value == nullptr || value->is_array()) return value;
    problems_->Add(Path(key), "wrong type: expected an array, got " + Got(*value),
                   std::string(allowed));
    return nullptr;
  }

  // A nested section; null when absent, or when it is not an object (reported).
  const Json* Object(std::string_view key) {
    const Json* value = Find(key);
    if (value == nullptr || value->is_object()) return value;
    problems_->Add(Path(key), "wrong type: expected an object, got " + Got(*value),
                   "an object {\"key\": value, ...} with the keys of section " + Quote(key));
    return nullptr;
  }

  bool Int(std::string_view key, int* out, int lo, int hi) {
    const Json* value = Find(key);
    if (value == nullptr) return true;
    const std::string allowed = "integers " + std::to_string(lo) + ".." + std::to_string(hi);
    int64_t v = 0;
    if (!Integer(key, *value, allowed, &v)) return false;
    if (v < lo || v > hi) {
      problems_->Add(Path(key), "out of range: " + Describe(*value), allowed);
      return false;
    }
    *out = static_cast<int>(v);
    return true;
  }

  bool IntChoice(std::string_view key, int* out, std::span<const int> choices) {
    const Json* value = Find(key);
    if (value == nullptr) return true;
    std::string allowed;
    for (int choice : choices) allowed += (allowed.empty() ? "" : ", ") + std::to_string(choice);
    int64_t v = 0;
    if (!Integer(key, *value, allowed, &v)) return false;
    if (std::find(choices.begin(), choices.end(), v) == choices.end()) {
      problems_->Add(Path(key), "not an allowed value: " + Describe(*value), allowed);
      return false;
    }
    *out = static_cast<int>(v);
    return true;
  }

  bool Uint64(std::string_view key, uint64_t* out) {
    const Json* value = Find(key);
    if (value == nullptr) return true;
    const std::string allowed =
        "integers 0.." + std::to_string(std::numeric_limits<uint64_t>::max());
    if (!value->is_number_integer()) {
      problems_->Add(Path(key), NotAnInteger(*value), allowed);
      return false;
    }
    if (!value->is_number_unsigned() && value->get<int64_t>() < 0) {
      problems_->Add(Path(key), "out of range: " + Describe(*value), allowed);
      return false;
    }
    *out = value->get<uint64_t>();
    return true;
  }

  // Accepts integers and floats in [lo, hi], or (lo, hi] when `lo_open`.
  bool Double(std::string_view key, double* out, double lo, bool lo_open, double hi) {
    const Json* value = Find(key);
    if (value == nullptr) return true;
    const std::string allowed = "finite numbers in " + std::string(lo_open ? "(" : "[") +
                                FormatNumber(lo) + ", " + FormatNumber(hi) + "]";
    if (!value->is_number()) {
      problems_->Add(Path(key), "wrong type: expected a number, got " + Got(*value), allowed);
      return false;
    }
    const double v = value->get<double>();
    if (!std::isfinite(v) || v < lo || (lo_open && v == lo) || v > hi) {
      problems_->Add(Path(key), "out of range: " + Describe(*value), allowed);
      return false;
    }
    // Above an open 0 the kernels take these as floats: a value below the
    // smallest normal float becomes 0 or a denormal there (a learning rate
    // of 5e-324 trained nothing, without a word).
    if (lo_open && lo == 0.0 && v < std::numeric_limits<float>::min()) {
      problems_->Add(Path(key), "too small for a float: " + Describe(*value),
                     allowed + ", at least " + FormatNumber(std::numeric_limits<float>::min()) +
                         " (the smallest normal float)");
      return false;
    }
    *out = v;
    return true;
  }

  bool Bool(std::string_view key, bool* out) {
    const Json* value = Find(key);
    if (value == nullptr) return true;
    if (!value->is_boolean()) {
      problems_->Add(Path(key), "wrong type: expected a boolean, got " + Got(*value),
                     "true, false");
      return false;
    }
    *out = value->get<bool>();
    return true;
  }

  bool String(std::string_view key, std::string* out, const StringRule& rule) {
    const Json* value = Find(key);
    if (value == nullptr) return true;
    if (!value->is_string()) {
      problems_->Add(Path(key), "wrong type: expected a string, got " + Got(*value), rule.allowed);
      return false;
    }
    const auto& s = value->get_ref<const std::string&>();
    std::string problem;
    if (s.empty()) {
      problem = "empty string";
    } else if (s.find('\0') != std::string::npos) {
      // The value ends up in C APIs (paths, getaddrinfo) that would silently cut it at the NUL.
      problem = "contains a NUL character: " + Describe(*value);
    } else if (rule.forbid_spaces && std::any_of(s.begin(), s.end(), [](char c) {
                 return static_cast<unsigned char>(c) <= 0x20 || c == 0x7F;
               })) {
      problem = "contains a space or control character: " + Describe(*value);
    } else if (rule.host && s.find_first_of("[]") != std::string::npos) {
      problem = "brackets in " + Describe(*value) +
                " (an IPv6 address is written bare, e.g. ::1; they are added where an endpoint "
                "needs them)";
    } else if (s.size() > rule.max_length) {
      problem = "too long (" + std::to_string(s.size()) + " characters): " + Describe(*value);
    } else if (rule.host) {
      // A name no resolver takes passed here, and the binaries then failed
      // (the coordinator exit 1, a shard retrying until its timeout).
      if (std::string why = HostSyntaxProblem(s); !why.empty()) {
        problem = Describe(*value) + " is " + why;
      }
    }
    if (!problem.empty()) {
      problems_->Add(Path(key), problem, rule.allowed);
      return false;
    }
    *out = s;
    return true;
  }

  bool StringChoice(std::string_view key, std::string* out,
                    std::span<const std::string_view> choices) {
    std::string_view chosen;
    if (!Choice(
            key, choices, [](std::string_view s) { return s; }, &chosen))
      return false;
    if (!chosen.empty()) *out = std::string(chosen);
    return true;
  }

  template <typename Enum>
  bool EnumValue(std::string_view key, Enum* out, std::span<const Enum> values) {
    return Choice(
        key, values, [](Enum v) { return ToString(v); }, out);
  }

  // Reports every key of the section that no reader asked for. Call after all reads.
  void ReportUnknownKeys() {
    if (section_ == nullptr) return;
    std::string allowed;
    for (const auto& known : known_) allowed += (allowed.empty() ? "" : ", ") + known;
    // Report the first few unknown keys in full and count the rest, so a
    // config with 100k stray keys is refused in linear time and a short message.
    constexpr size_t kMaxReported = 20;
    size_t unknown = 0;
    for (auto it = section_->begin(); it != section_->end(); ++it) {
      const std::string& key = it.key();
      if (std::find(known_.begin(), known_.end(), key) != known_.end()) continue;
      if (++unknown > kMaxReported) continue;
      std::string problem = "unknown key";
      // A one- or two-letter slip is the usual cause; naming the intended key saves a search.
      std::string best;
      size_t best_distance = 3;
      for (const auto& known : known_) {
        // Lengths 3 or more apart are 3 or more edits apart: no quadratic
        // distance for a megabyte key.
        if (key.size() >= known.size() + best_distance ||
            known.size() >= key.size() + best_distance) {
          continue;
        }
        const size_t distance = EditDistance(key, known);
        if (distance < best_distance) {
          best_distance = distance;
          best = known;
        }
      }
      if (!best.empty()) problem += " (did you mean " + Quote(best) + "?)";
      problems_->Add(Path(key), problem,
                     (name_.empty() ? "sections " : "keys of " + name_ + ": ") + allowed);
    }
    if (unknown > kMaxReported) {
      problems_->Add(name_.empty() ? "(top level)" : name_,
                     std::to_string(unknown - kMaxReported) + " more unknown keys (not listed)",
                     (name_.empty() ? "sections " : "keys of " + name_ + ": ") + allowed);
    }
  }

 private:
  const Json* Find(std::string_view key) {
    known_.emplace_back(key);
    if (section_ == nullptr) return nullptr;
    const auto it = section_->find(key);
    return it == section_->end() ? nullptr : &*it;
  }

  bool Integer(std::string_view key, const Json& value, const std::string& allowed, int64_t* out) {
    if (!value.is_number_integer()) {
      problems_->Add(Path(key), NotAnInteger(value), allowed);
      return false;
    }
    if (value.is_number_unsigned()) {
      // Clamp: anything past int64 is out of every int range anyway.
      const uint64_t u = value.get<uint64_t>();
      *out = static_cast<int64_t>(
          std::min<uint64_t>(u, static_cast<uint64_t>(std::numeric_limits<int64_t>::max())));
    } else {
      *out = value.get<int64_t>();
    }
    return true;
  }

  template <typename T, typename Name>
  bool Choice(std::string_view key, std::span<const T> choices, Name name, T* out) {
    const Json* value = Find(key);
    if (value == nullptr) return true;
    std::vector<std::string_view> names;
    for (const T& choice : choices) names.push_back(name(choice));
    const std::string allowed = JoinQuoted(std::span<const std::string_view>(names));
    if (!value->is_string()) {
      problems_->Add(Path(key), "wrong type: expected a string, got " + Got(*value), allowed);
      return false;
    }
    const auto& s = value->get_ref<const std::string&>();
    for (const T& choice : choices) {
      if (name(choice) == s) {
        *out = choice;
        return true;
      }
    }
    std::string problem = "unknown value " + Describe(*value);
    if (std::any_of(names.begin(), names.end(),
                    [&](std::string_view n) { return EqualsIgnoringCase(n, s); })) {
      problem += " (values are case-sensitive)";
    }
    problems_->Add(Path(key), problem, allowed);
    return false;
  }

  Problems* problems_;
  std::string name_;
  const Json* section_;
  std::vector<std::string> known_;
};

// Reading the text (config_json.cc).

// Parses `text` into `root`; false when it is not JSON at all (reported with line and column).
bool ParseJson(std::string_view text, std::string_view source, Problems* problems, Json* root);

// Applies one "a.b.c=value" to `root`. Missing intermediate sections are created, so a typo in
// a section name reaches the normal unknown-key check instead of needing its own message. An
// object value merges into an object it lands on (key by key, as deep as both are objects);
// duplicate keys in a value are refused as in a file.
void ApplyOverride(const std::string& override_text, Json* root, Problems* problems);

}  // namespace gridsync::config_reader
