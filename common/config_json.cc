// ParseJson and ApplyOverride (config_reader.h): JSON text into a document,
// with duplicate keys, bad bytes, underflowing numbers and syntax errors
// reported by position, and the --set overrides merged into it.
//
// Thread safety: see config_reader.h.
#include <algorithm>
#include <cstdint>
#include <string>
#include <unordered_set>
#include <utility>
#include <vector>

#include "common/config_reader.h"
#include "common/logging.h"
#include "common/utf8.h"

namespace gridsync::config_reader {
namespace {

// "; the character there is U+00A0 (...)": the non-ASCII character a parse
// error stopped at, or nothing when the byte at `offset` is ASCII or not
// UTF-8 (which the reader refused before parsing).
std::string CharacterAt(std::string_view text, size_t offset) {
  // The error may point into the character: back to its first byte.
  size_t at = std::min(offset, text.size());
  for (int k = 0;
       k < 3 && at > 0 && at < text.size() && (static_cast<unsigned char>(text[at]) & 0xc0) == 0x80;
       ++k) {
    --at;
  }
  uint32_t code_point = 0;
  if (at >= text.size() || static_cast<unsigned char>(text[at]) < 0x80 ||
      Utf8Sequence(text, at, &code_point) == 0) {
    return "";
  }
  const char* name = code_point == 0xa0     ? " (a no-break space)"
                     : code_point == 0xfeff ? " (a byte-order mark, allowed only as the first "
                                              "bytes of the file)"
                     : (code_point >= 0x2000 && code_point <= 0x200b) || code_point == 0x3000
                         ? " (a Unicode space)"
                         : "";
  return "; the character there is " + CodePointName(code_point) + name +
         ", which JSON allows only inside strings (between tokens: space, tab, CR and LF)";
}

// Objects and arrays a config may nest (gridsync's own nest 3). Deeper
// values are dropped as they are read and the text refused: a 16 MiB file
// of "[" took 2.8 GB to parse (this finder's frames and the parser's
// document), now 0.22 GB (the parser's stack of 8 bytes a level).
constexpr int kMaxJsonDepth = 64;

// Whether a parser callback's event opens an object or array past the limit.
bool OpensTooDeep(int depth, Json::parse_event_t event) {
  return depth >= kMaxJsonDepth &&
         (event == Json::parse_event_t::object_start || event == Json::parse_event_t::array_start);
}

// Tracks the key path while nlohmann's DOM parser runs, to catch duplicate keys: the parser
// itself keeps the last value silently, which would hide a half-edited config. It also refuses
// nesting deeper than kMaxJsonDepth.
class DuplicateKeyFinder {
 public:
  // prefix: where the parsed text sits (a --set value's "--set '...': a.b"),
  // before the paths inside it.
  explicit DuplicateKeyFinder(Problems* problems, std::string prefix = "")
      : problems_(problems), prefix_(std::move(prefix)) {}

  bool operator()(int depth, Json::parse_event_t event, Json& parsed) {
    switch (event) {
      case Json::parse_event_t::object_start:
      case Json::parse_event_t::array_start:
        // The parser calls back for what lies inside a dropped value too,
        // except its values and ends; depth counts the dropped levels.
        if (OpensTooDeep(depth, event)) {
          if (!too_deep_) {
            too_deep_ = true;
            problems_->Add(
                Path(),
                "objects and arrays nested deeper than " + std::to_string(kMaxJsonDepth) +
                    " levels",
                "at most " + std::to_string(kMaxJsonDepth) + " levels (a gridsync config nests 3)");
          }
          return false;  // dropped: no frame, and no end event comes for it
        }
        frames_.push_back(Frame{event == Json::parse_event_t::array_start, {}, {}, 0});
        break;
      case Json::parse_event_t::key: {
        if (depth != static_cast<int>(frames_.size())) break;  // inside a dropped value
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
  bool too_deep_ = false;
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

}  // namespace

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
    // nlohmann's "last read" stops inside a character it cannot take (a
    // no-break space or a second byte-order mark between tokens read as
    // '"steps": ' and a lone byte, which made the message itself invalid
    // UTF-8): its bytes are escaped, and the character is named.
    problems->AddAt(
        Position(source, text, offset),
        "invalid JSON: " + EscapeControlBytes(Shortened(detail)) + CharacterAt(text, offset),
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
  // A value nested deeper than the finder below allows is not built here.
  bool deep = false;
  Json value = Json::parse(
      value_text,
      [&deep](int depth, Json::parse_event_t event, Json&) {
        deep = deep || OpensTooDeep(depth, event);
        return !deep;
      },
      /*allow_exceptions=*/false);
  // JSON too deep: structured, so that the finder below reports the depth
  // (text that is not JSON at all stays text, as before).
  if (deep && !value.is_discarded()) value = Json::array();
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
    // Appended piece by piece: "." + KeyText(...) trips GCC 12's -Wrestrict
    // false positive.
    for (const auto& key : keys) {
      if (!at.empty()) at += '.';
      at += KeyText(key);
    }
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
