// Loading and strict validation of the gridsync config (see config.h).
//
// Validation never stops at the first problem: an operator fixing a config by hand should see
// every mistake in one run, so each reader records its problem and the load fails at the end.
// Checks that relate two keys run only when both keys were valid on their own, so that one typo
// does not cascade into misleading follow-up messages.

#include "common/config.h"

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <limits>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <system_error>
#include <unordered_set>
#include <utility>
#include <vector>

#include "common/cluster_layout.h"

namespace gridsync {

std::string_view ToString(GradientSyncMode v) {
  switch (v) {
    case GradientSyncMode::kNccl:
      return "nccl";
    case GradientSyncMode::kPs:
      return "ps";
    case GradientSyncMode::kHybrid:
      return "hybrid";
  }
  return "?";
}

std::string_view ToString(BatchSplitting v) {
  switch (v) {
    case BatchSplitting::kEven:
      return "even";
    case BatchSplitting::kWeighted:
      return "weighted";
    case BatchSplitting::kAdaptive:
      return "adaptive";
  }
  return "?";
}

std::string_view ToString(ModelParallelDim v) {
  switch (v) {
    case ModelParallelDim::kRow:
      return "row";
    case ModelParallelDim::kColumn:
      return "column";
    case ModelParallelDim::kBoth:
      return "both";
  }
  return "?";
}

std::string_view ToString(TrainingDevice v) {
  switch (v) {
    case TrainingDevice::kAuto:
      return "auto";
    case TrainingDevice::kCpu:
      return "cpu";
    case TrainingDevice::kCuda:
      return "cuda";
  }
  return "?";
}

std::string_view ToString(CollectiveKind v) {
  switch (v) {
    case CollectiveKind::kAuto:
      return "auto";
    case CollectiveKind::kNccl:
      return "nccl";
    case CollectiveKind::kGloo:
      return "gloo";
  }
  return "?";
}

std::vector<NodeConfig> DistributedConfig::ResolvedNodes() const {
  if (!nodes.empty()) return nodes;
  return {NodeConfig{.name = "node0", .workers = world_size}};
}

int DistributedConfig::NodeOf(int rank) const {
  const auto resolved = ResolvedNodes();
  int first = 0;
  for (size_t n = 0; n < resolved.size(); ++n) {
    if (rank < first + resolved[n].workers) return static_cast<int>(n);
    first += resolved[n].workers;
  }
  return static_cast<int>(resolved.size()) - 1;
}

int DistributedConfig::HierarchicalSlices() const {
  const auto nodes = ResolvedNodes();
  int slices = nodes.front().workers;
  for (const auto& node : nodes) slices = std::min(slices, node.workers);
  return slices;
}

int DistributedConfig::LocalRankOf(int rank) const {
  const auto resolved = ResolvedNodes();
  int first = 0;
  for (const auto& node : resolved) {
    if (rank < first + node.workers) return rank - first;
    first += node.workers;
  }
  return 0;
}

std::string_view ToString(Consistency v) {
  switch (v) {
    case Consistency::kBsp:
      return "bsp";
    case Consistency::kSsp:
      return "ssp";
    case Consistency::kAsync:
      return "async";
  }
  return "?";
}

std::string_view ToString(OptimizerPlacement v) {
  switch (v) {
    case OptimizerPlacement::kAuto:
      return "auto";
    case OptimizerPlacement::kShard:
      return "shard";
    case OptimizerPlacement::kWorker:
      return "worker";
  }
  return "?";
}

std::string_view ToString(SecurityMode v) {
  switch (v) {
    case SecurityMode::kAuto:
      return "auto";
    case SecurityMode::kCurve:
      return "curve";
    case SecurityMode::kOff:
      return "off";
  }
  return "?";
}

std::string_view ToString(TaskType v) {
  switch (v) {
    case TaskType::kImage:
      return "image";
    case TaskType::kSdf:
      return "sdf";
    case TaskType::kNerf:
      return "nerf";
  }
  return "?";
}

namespace {

using Json = nlohmann::json;

// Parsing goes through the enumerator lists and ToString, so the accepted spellings and the
// printed ones cannot drift apart.
constexpr GradientSyncMode kGradientSyncs[] = {GradientSyncMode::kNccl, GradientSyncMode::kPs,
                                               GradientSyncMode::kHybrid};
constexpr BatchSplitting kBatchSplittings[] = {BatchSplitting::kEven, BatchSplitting::kWeighted,
                                               BatchSplitting::kAdaptive};
constexpr ModelParallelDim kModelParallelDims[] = {
    ModelParallelDim::kRow, ModelParallelDim::kColumn, ModelParallelDim::kBoth};
constexpr TaskType kTaskTypes[] = {TaskType::kImage, TaskType::kSdf, TaskType::kNerf};
constexpr std::string_view kCodecNames[] = {"none", "fp16",   "bf16", "int8",
                                            "qsgd", "onebit", "topk", "randomk"};
constexpr TrainingDevice kTrainingDevices[] = {TrainingDevice::kAuto, TrainingDevice::kCpu,
                                               TrainingDevice::kCuda};
constexpr CollectiveKind kCollectiveKinds[] = {CollectiveKind::kAuto, CollectiveKind::kNccl,
                                               CollectiveKind::kGloo};
constexpr Consistency kConsistencies[] = {Consistency::kBsp, Consistency::kSsp,
                                          Consistency::kAsync};
constexpr OptimizerPlacement kOptimizerPlacements[] = {
    OptimizerPlacement::kAuto, OptimizerPlacement::kShard, OptimizerPlacement::kWorker};
constexpr SecurityMode kSecurityModes[] = {SecurityMode::kAuto, SecurityMode::kCurve,
                                           SecurityMode::kOff};
constexpr std::string_view kEncodingTypes[] = {"HashGrid"};
constexpr int kFeaturesPerLevel[] = {1, 2, 4, 8};

constexpr std::string_view kJsonAllowed = "JSON text (UTF-8, // and /* */ comments allowed)";
constexpr std::string_view kOverrideAllowed =
    "section.key=value with a JSON or plain-string value, for example training.steps=200";

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

std::string Describe(const Json& value) {
  constexpr size_t kMaxChars = 80;
  std::string text;
  AppendValue(value, 2, &text);
  if (text.size() > kMaxChars) {
    size_t cut = kMaxChars - 3;
    // Never split a UTF-8 sequence: back up to the start of the cut character.
    while (cut > 0 && (static_cast<unsigned char>(text[cut]) & 0xC0) == 0x80) --cut;
    text.resize(cut);
    text += "...";
  }
  return text;
}

std::string Quote(std::string_view s) { return Describe(Json(std::string(s))); }

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

std::string Got(const Json& value) { return Describe(value) + " (" + TypeName(value) + ")"; }

std::string FormatNumber(double v) {
  char buffer[32];
  std::snprintf(buffer, sizeof(buffer), "%g", v);
  return buffer;
}

template <typename T>
std::string JoinQuoted(std::span<const T> names) {
  std::string out;
  for (const auto& name : names) {
    if (!out.empty()) out += ", ";
    out += Quote(name);
  }
  return out;
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
    lines_.push_back(std::move(line));
  }

  // For problems located by line and column instead of a key path.
  void AddAt(std::string position, std::string_view problem, std::string_view allowed) {
    position += ": ";
    position += problem;
    position += "; allowed: ";
    position += allowed;
    lines_.push_back(std::move(position));
  }

  bool empty() const { return lines_.empty(); }
  Status ToStatus() const {
    return lines_.empty() ? Status::OK() : Status::InvalidArgument(Join(lines_, "\n"));
  }

 private:
  std::string source_;
  std::vector<std::string> lines_;
};

// Rules for string keys beyond "is a string".
struct StringRule {
  std::string_view allowed;  // what to print after "allowed: "
  size_t max_length = std::numeric_limits<size_t>::max();
  bool forbid_spaces = false;  // host names: a space is always a paste accident
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
    return name_.empty() ? std::string(key) : name_ + "." + std::string(key);
  }

  // A nested array; null when absent, or when it is not an array (reported).
  const Json* Array(std::string_view key, std::string_view allowed) {
    const Json* value = Find(key);
    if (value == nullptr || value->is_array()) return value;
    problems_->Add(Path(key), "wrong type: expected an array, got " + Got(*value), std::string(allowed));
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
      problems_->Add(Path(key), "wrong type: expected an integer, got " + Got(*value), allowed);
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
    } else if (s.size() > rule.max_length) {
      problem = "too long (" + std::to_string(s.size()) + " characters): " + Describe(*value);
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
      problems_->Add(Path(key), "wrong type: expected an integer, got " + Got(value), allowed);
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

// Tracks the key path while nlohmann's DOM parser runs, to catch duplicate keys: the parser
// itself keeps the last value silently, which would hide a half-edited config.
class DuplicateKeyFinder {
 public:
  explicit DuplicateKeyFinder(Problems* problems) : problems_(problems) {}

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
          problems_->Add(Path(), "duplicate key",
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
        path += "[" + std::to_string(frame.index) + "]";
      } else {
        if (!path.empty()) path += ".";
        path += frame.key;
      }
    }
    return path;
  }

  Problems* problems_;
  std::vector<Frame> frames_;
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
    problems->AddAt(Position(source, text, offset), "invalid JSON: " + detail, kJsonAllowed);
  } catch (const Json::exception& e) {
    // Number overflow (1e400) arrives as out_of_range, without a position.
    std::string detail = e.what();
    if (const size_t bracket = detail.find("] "); bracket != std::string::npos) {
      detail.erase(0, bracket + 2);
    }
    problems->AddAt(std::string(source), "invalid JSON: " + detail, kJsonAllowed);
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
  if (value.is_discarded()) value = value_text;

  Json* node = root;
  std::string walked;
  for (size_t i = 0; i + 1 < keys.size(); ++i) {
    walked += (walked.empty() ? "" : ".") + keys[i];
    Json& child = (*node)[keys[i]];
    if (child.is_null()) child = Json::object();
    if (!child.is_object()) {
      problems->Add(where, walked + " is " + Got(child) + ", not a section", kOverrideAllowed);
      return;
    }
    node = &child;
  }
  (*node)[keys.back()] = std::move(value);
}

}  // namespace

Result<Config> Config::Parse(std::string_view text, std::string_view source,
                             const std::vector<std::string>& overrides) {
  Problems problems(source);
  Json root;
  if (!ParseJson(text, source, &problems, &root)) return problems.ToStatus();
  if (!root.is_object()) {
    problems.Add("(top level)", "wrong type: expected an object, got " + Got(root),
                 "an object {\"encoding\": {...}, \"training\": {...}, ...}");
    return problems.ToStatus();
  }
  for (const auto& override_text : overrides) ApplyOverride(override_text, &root, &problems);

  Config config;
  config.source = std::string(source);

  SectionReader top(&problems, "", &root);
  {
    EncodingConfig& e = config.encoding;
    SectionReader r(&problems, "encoding", top.Object("encoding"));
    r.StringChoice("otype", &e.otype, kEncodingTypes);
    r.Int("n_levels", &e.n_levels, 1, 32);
    r.IntChoice("n_features_per_level", &e.n_features_per_level, kFeaturesPerLevel);
    r.Int("log2_hashmap_size", &e.log2_hashmap_size, 4, 30);
    r.Int("base_resolution", &e.base_resolution, 1, 1 << 20);
    r.Double("per_level_scale", &e.per_level_scale, 1.0, /*lo_open=*/false, 16.0);
    r.ReportUnknownKeys();
  }
  {
    NetworkConfig& n = config.network;
    SectionReader r(&problems, "network", top.Object("network"));
    r.Int("n_neurons", &n.n_neurons, 1, 1024);
    r.Int("n_hidden_layers", &n.n_hidden_layers, 0, 16);
    r.ReportUnknownKeys();
  }
  {
    DistributedConfig& d = config.distributed;
    SectionReader r(&problems, "distributed", top.Object("distributed"));
    const bool enable_ok = r.Bool("enable", &d.enable);
    const bool world_size_ok = r.Int("world_size", &d.world_size, 1, 65536);
    // 253 is the longest DNS name; an IP address is far shorter.
    r.String("master_addr", &d.master_addr,
             {.allowed = "a host name or IP address: non-empty, no spaces, at most 253 characters",
              .max_length = 253,
              .forbid_spaces = true});
    r.Int("master_port", &d.master_port, 1, 65535);
    const bool sync_ok = r.EnumValue("gradient_sync", &d.gradient_sync,
                                     std::span<const GradientSyncMode>(kGradientSyncs));
    r.EnumValue("batch_splitting", &d.batch_splitting,
                std::span<const BatchSplitting>(kBatchSplittings));
    const bool model_parallel_ok = r.Bool("model_parallel", &d.model_parallel);
    const bool mp_dim_ok =
        r.EnumValue("mp_dim", &d.mp_dim, std::span<const ModelParallelDim>(kModelParallelDims));
    const bool hierarchical_ok = r.Bool("hierarchical", &d.hierarchical);
    r.Double("timeout_s", &d.timeout_s, 0.0, /*lo_open=*/true, 3600.0);
    r.EnumValue("collective", &d.collective, std::span<const CollectiveKind>(kCollectiveKinds));
    r.Double("bucket_mb", &d.bucket_mb, 0.0, /*lo_open=*/true, 4096.0);
    r.Int("adaptive_interval", &d.adaptive_interval, 1, 100000);
    const char* kNodesAllowed =
        "an array of objects {\"name\": string, \"workers\": integer, \"weight\": number, "
        "\"host\": address, \"shards\": integer}";
    bool nodes_ok = true;
    if (const Json* nodes = r.Array("nodes", kNodesAllowed); nodes != nullptr) {
      for (size_t i = 0; i < nodes->size(); ++i) {
        const std::string path = "distributed.nodes[" + std::to_string(i) + "]";
        const Json& item = (*nodes)[i];
        if (!item.is_object()) {
          problems.Add(path, "wrong type: expected an object, got " + Got(item), kNodesAllowed);
          nodes_ok = false;
          continue;
        }
        NodeConfig node;
        SectionReader nr(&problems, path, &item);
        nodes_ok &= nr.String("name", &node.name,
                              {.allowed = "a non-empty node name without spaces",
                               .max_length = 253,
                               .forbid_spaces = true});
        nodes_ok &= nr.Int("workers", &node.workers, 1, 4096);
        nodes_ok &= nr.Double("weight", &node.weight, 0.0, /*lo_open=*/true, 1e6);
        nodes_ok &= nr.String("host", &node.host,
                              {.allowed = "the address this node's processes bind and advertise: "
                                          "a host name or IP address, no spaces, at most 253 "
                                          "characters",
                               .max_length = 253,
                               .forbid_spaces = true});
        if (nr.Has("shards")) nodes_ok &= nr.Int("shards", &node.shards, 0, 256);
        if (!nr.Has("name")) {
          problems.Add(path + ".name", "missing", "every node needs a name");
          nodes_ok = false;
        }
        nr.ReportUnknownKeys();
        for (const auto& earlier : d.nodes) {
          if (earlier.name == node.name && !node.name.empty()) {
            problems.Add(path + ".name", "duplicate node name " + Quote(node.name), "unique names");
            nodes_ok = false;
          }
        }
        d.nodes.push_back(node);
      }
      if (nodes->empty()) {
        problems.Add("distributed.nodes", "empty array", "at least one node, or leave the key out");
        nodes_ok = false;
      }
    }
    r.ReportUnknownKeys();
    if (nodes_ok && world_size_ok && !d.nodes.empty()) {
      int total = 0;
      for (const auto& node : d.nodes) total += node.workers;
      if (total != d.world_size) {
        problems.Add("distributed.nodes",
                     "workers add up to " + std::to_string(total) + ", but distributed.world_size is " +
                         std::to_string(d.world_size),
                     "node worker counts that sum to distributed.world_size");
      }
    }

    // A key that silently does nothing misleads whoever reads the config later, so settings
    // that only matter together with another one are refused when that one is off.
    if (enable_ok && world_size_ok && !d.enable && d.world_size > 1) {
      problems.Add("distributed.world_size",
                   std::to_string(d.world_size) + " needs distributed.enable true",
                   "1 while distributed.enable is false");
    }
    if (model_parallel_ok && mp_dim_ok && r.Has("mp_dim") && !d.model_parallel) {
      problems.Add(
          "distributed.mp_dim",
          Quote(ToString(d.mp_dim)) + " has no effect unless distributed.model_parallel is true",
          "distributed.mp_dim only with distributed.model_parallel: true; remove it or "
          "enable model parallelism");
    }
    // Hierarchical means reduce inside each node first, then across nodes:
    // nccl's hierarchical all-reduce, and what hybrid always does (a
    // collective inside the node, the PS across nodes). Plain ps has no
    // intra-node stage, so the key would do nothing there.
    if (hierarchical_ok && sync_ok && d.hierarchical && d.gradient_sync == GradientSyncMode::kPs) {
      problems.Add("distributed.hierarchical",
                   "true needs a node-level stage, which gradient_sync \"ps\" does not have",
                   "distributed.hierarchical: true with gradient_sync \"nccl\" (hierarchical "
                   "all-reduce) or \"hybrid\" (a collective inside each node, the PS across "
                   "nodes); with \"ps\" set it to false or use \"hybrid\"");
    }
  }
  {
    TrainingConfig& t = config.training;
    SectionReader r(&problems, "training", top.Object("training"));
    const bool batch_ok = r.Int("batch_size", &t.batch_size, 1, 1 << 24);
    r.Double("learning_rate", &t.learning_rate, 0.0, /*lo_open=*/true, 10.0);
    r.Bool("mixed_precision", &t.mixed_precision);
    const bool accumulation_ok = r.Int("gradient_accumulation", &t.gradient_accumulation, 1, 1024);
    const bool dynamic_ok = r.Bool("dynamic_resolution", &t.dynamic_resolution);
    const bool dynamic_steps_ok =
        r.Int("dynamic_resolution_steps", &t.dynamic_resolution_steps, 0, 10'000'000);
    r.Int("steps", &t.steps, 1, 10'000'000);
    r.Uint64("seed", &t.seed);
    r.Int("threads", &t.threads, 1, 256);
    r.Int("log_every", &t.log_every, 0, std::numeric_limits<int>::max());
    r.EnumValue("device", &t.device, std::span<const TrainingDevice>(kTrainingDevices));
    r.ReportUnknownKeys();

    // Every micro-batch must hold the same whole number of samples (>= 1), or accumulated
    // gradients would weight samples unevenly; divisibility implies both.
    if (batch_ok && accumulation_ok && t.batch_size % t.gradient_accumulation != 0) {
      const int limit = std::min(t.batch_size, 1024);
      int below = t.gradient_accumulation < limit ? t.gradient_accumulation : limit;
      while (t.batch_size % below != 0) --below;
      int above = t.gradient_accumulation + 1;
      while (above <= limit && t.batch_size % above != 0) ++above;
      std::string nearest = std::to_string(below);
      if (above <= limit) nearest += " or " + std::to_string(above);
      problems.Add("training.gradient_accumulation",
                   std::to_string(t.gradient_accumulation) +
                       " does not divide training.batch_size " + std::to_string(t.batch_size) +
                       " (each micro-batch is batch_size / gradient_accumulation samples, a whole "
                       "number >= 1)",
                   "a divisor of training.batch_size in 1..1024, nearest: " + nearest);
    }
    if (dynamic_ok && dynamic_steps_ok && !t.dynamic_resolution && t.dynamic_resolution_steps > 0) {
      problems.Add("training.dynamic_resolution_steps",
                   std::to_string(t.dynamic_resolution_steps) +
                       " has no effect unless training.dynamic_resolution is true",
                   "0 while training.dynamic_resolution is false");
    }
  }
  {
    TaskConfig& k = config.task;
    SectionReader r(&problems, "task", top.Object("task"));
    r.EnumValue("type", &k.type, std::span<const TaskType>(kTaskTypes));
    r.String("image", &k.image, {.allowed = "a non-empty path to a JPEG or PNG image"});
    r.String("output", &k.output, {.allowed = "a non-empty folder path"});
    r.ReportUnknownKeys();
  }
  {
    PsConfig& p = config.ps;
    SectionReader r(&problems, "ps", top.Object("ps"));
    r.Int("shards", &p.shards, 1, 256);
    const bool consistency_ok =
        r.EnumValue("consistency", &p.consistency, std::span<const Consistency>(kConsistencies));
    const bool staleness_ok = r.Int("staleness", &p.staleness, 0, 1000);
    r.Int("threads", &p.threads, 1, 64);
    r.String("host", &p.host,
             {.allowed = "a host name or IP address: non-empty, no spaces, at most 253 characters",
              .max_length = 253,
              .forbid_spaces = true});
    p.host_given = r.Has("host");
    r.Int("base_port", &p.base_port, 0, 65535);
    r.EnumValue("optimizer", &p.optimizer, std::span<const OptimizerPlacement>(kOptimizerPlacements));
    r.ReportUnknownKeys();
    if (consistency_ok && staleness_ok && r.Has("staleness") &&
        p.consistency != Consistency::kSsp) {
      problems.Add("ps.staleness",
                   std::to_string(p.staleness) + " has no effect unless ps.consistency is \"ssp\"",
                   "ps.staleness only with ps.consistency \"ssp\"");
    }
  }
  {
    CompressionConfig& c = config.compression;
    SectionReader r(&problems, "compression", top.Object("compression"));
    r.StringChoice("codec", &c.codec, kCodecNames);
    r.Double("ratio", &c.ratio, 0.0, /*lo_open=*/true, 1.0);
    r.Int("bits", &c.bits, 1, 8);
    r.Int("block", &c.block, 1, 65536);
    // Unset, error feedback follows the codec: on for the biased ones; off
    // for qsgd and randomk, which are unbiased by rescaling, so their
    // residual is (1 - n/k) times what they kept and feeding it back
    // diverges (measured: gridsync-bench compress --train).
    // (Read in either case, so the key is known to the unknown-key report.)
    c.error_feedback = c.codec != "qsgd" && c.codec != "randomk";
    r.Bool("error_feedback", &c.error_feedback);
    r.Int("min_bytes", &c.min_bytes, 0, 1 << 30);
    r.Bool("pull", &c.pull);
    r.ReportUnknownKeys();
    if (c.pull && c.codec == "none") {
      problems.Add("compression.pull",
                   "true has no effect with compression.codec \"none\" (pulls then carry the "
                   "parameters themselves)",
                   "false, or a codec (fp16, bf16, int8, qsgd, onebit, topk, randomk)");
    }
  }
  {
    CheckpointConfig& k = config.checkpoint;
    SectionReader r(&problems, "checkpoint", top.Object("checkpoint"));
    r.Int("every_steps", &k.every_steps, 0, 10'000'000);
    r.String("dir", &k.dir, {.allowed = "a folder for the shards' checkpoints"});
    r.ReportUnknownKeys();
    if (!r.Has("dir")) k.dir = config.task.output + "/checkpoints";
  }
  {
    SectionReader r(&problems, "metrics", top.Object("metrics"));
    r.Int("port", &config.metrics.port, 0, 65535);
    r.ReportUnknownKeys();
    // The metrics ports (coordinator, shards, workers) must neither run past
    // 65535 nor take the cluster's own (master_port and the shards' after it).
    const int m = config.metrics.port;
    const int shards =
        config.distributed.gradient_sync == GradientSyncMode::kNccl ? 0 : config.ps.shards;
    const int last = m + shards + config.distributed.world_size;
    const int own_first = config.distributed.master_port;
    const int own_last = own_first + shards;
    if (m > 0 && last > 65535) {
      problems.Add(
          "metrics.port",
          std::to_string(m) + " puts the last worker's metrics at port " + std::to_string(last),
          "1.." + std::to_string(65535 - shards - config.distributed.world_size) +
              " (1 + ps.shards + world_size ports from it)");
    } else if (m > 0 && m <= own_last && last >= own_first) {
      problems.Add("metrics.port",
                   std::to_string(m) + ".." + std::to_string(last) +
                       " overlaps the cluster's ports " + std::to_string(own_first) + ".." +
                       std::to_string(own_last) + " (master_port, then one per shard)",
                   "0 (off) or a range clear of them, e.g. " + std::to_string(own_last + 1000));
    }
  }
  {
    SecurityConfig& sec = config.security;
    SectionReader r(&problems, "security", top.Object("security"));
    r.EnumValue("mode", &sec.mode, std::span<const SecurityMode>(kSecurityModes));
    r.String("keys_dir", &sec.keys_dir,
             {.allowed = "a folder with the keys `gridsync keygen` wrote"});
    r.ReportUnknownKeys();
  }
  top.ReportUnknownKeys();

  if (!problems.empty()) return problems.ToStatus();
  std::vector<ConfigProblem> layout_problems;
  config.layout = ResolveLayout(config, &layout_problems);
  for (const auto& p : layout_problems) problems.Add(p.key, p.problem, p.allowed);
  SecurityConfig& sec = config.security;
  sec.curve = sec.mode == SecurityMode::kCurve ||
              (sec.mode == SecurityMode::kAuto && config.layout.multi_host);
  if (sec.curve && sec.keys_dir.empty()) {
    problems.Add("security.keys_dir",
                 sec.mode == SecurityMode::kCurve
                     ? "missing while security.mode is \"curve\""
                     : "missing: the cluster spans several machines, so its data plane is "
                       "authenticated and encrypted (security.mode \"auto\")",
                 "the folder `gridsync keygen DIR` wrote (role keys), or security.mode \"off\" "
                 "on a trusted network");
  }
  if (!problems.empty()) return problems.ToStatus();
  return config;
}

Result<Config> Config::LoadFile(const std::string& path,
                                const std::vector<std::string>& overrides) {
  std::unique_ptr<std::FILE, int (*)(std::FILE*)> file(std::fopen(path.c_str(), "rb"),
                                                       &std::fclose);
  if (file == nullptr) {
    return Status::IOError("cannot open config " + path + ": " +
                           std::generic_category().message(errno));
  }
  std::string text;
  char buffer[1 << 16];
  size_t n = 0;
  while ((n = std::fread(buffer, 1, sizeof(buffer), file.get())) > 0) text.append(buffer, n);
  // fopen succeeds on a directory on Linux; the read is what fails (EISDIR).
  if (std::ferror(file.get())) {
    return Status::IOError("cannot read config " + path + ": " +
                           std::generic_category().message(errno));
  }
  return Parse(text, path, overrides);
}

nlohmann::json Config::ToJson() const {
  // nlohmann::json stores objects in a std::map, so a dump lists sections and keys
  // alphabetically whatever the insertion order; they are written here in the documented order
  // (encoding, network, distributed, training, task) for the reader of this code only.
  Json j;
  auto& e = j["encoding"];
  e["otype"] = encoding.otype;
  e["n_levels"] = encoding.n_levels;
  e["n_features_per_level"] = encoding.n_features_per_level;
  e["log2_hashmap_size"] = encoding.log2_hashmap_size;
  e["base_resolution"] = encoding.base_resolution;
  e["per_level_scale"] = encoding.per_level_scale;

  auto& n = j["network"];
  n["n_neurons"] = network.n_neurons;
  n["n_hidden_layers"] = network.n_hidden_layers;

  auto& d = j["distributed"];
  d["enable"] = distributed.enable;
  d["world_size"] = distributed.world_size;
  d["master_addr"] = distributed.master_addr;
  d["master_port"] = distributed.master_port;
  d["gradient_sync"] = ToString(distributed.gradient_sync);
  d["batch_splitting"] = ToString(distributed.batch_splitting);
  d["model_parallel"] = distributed.model_parallel;
  // Parse refuses mp_dim without model parallelism, so printing it then would make the
  // resolved config fail to load again.
  if (distributed.model_parallel) d["mp_dim"] = ToString(distributed.mp_dim);
  d["hierarchical"] = distributed.hierarchical;
  d["timeout_s"] = distributed.timeout_s;
  d["collective"] = ToString(distributed.collective);
  d["bucket_mb"] = distributed.bucket_mb;
  d["adaptive_interval"] = distributed.adaptive_interval;
  if (!distributed.nodes.empty()) {
    Json nodes = Json::array();
    for (const auto& node : distributed.nodes) {
      Json item = {{"name", node.name}, {"workers", node.workers}, {"weight", node.weight}};
      if (!node.host.empty()) item["host"] = node.host;
      if (node.shards >= 0) item["shards"] = node.shards;
      nodes.push_back(std::move(item));
    }
    d["nodes"] = nodes;
  }

  auto& t = j["training"];
  t["batch_size"] = training.batch_size;
  t["learning_rate"] = training.learning_rate;
  t["mixed_precision"] = training.mixed_precision;
  t["gradient_accumulation"] = training.gradient_accumulation;
  t["dynamic_resolution"] = training.dynamic_resolution;
  t["dynamic_resolution_steps"] = training.dynamic_resolution_steps;
  t["steps"] = training.steps;
  t["seed"] = training.seed;
  t["threads"] = training.threads;
  t["log_every"] = training.log_every;
  t["device"] = ToString(training.device);

  auto& k = j["task"];
  k["type"] = ToString(task.type);
  k["image"] = task.image;
  k["output"] = task.output;

  auto& p = j["ps"];
  p["shards"] = ps.shards;
  p["consistency"] = ToString(ps.consistency);
  // Parse refuses staleness outside ssp (see mp_dim above).
  if (ps.consistency == Consistency::kSsp) p["staleness"] = ps.staleness;
  p["threads"] = ps.threads;
  // Written only when given: in a multi-host cluster it is an error.
  if (ps.host_given) p["host"] = ps.host;
  p["base_port"] = ps.base_port;
  p["optimizer"] = ToString(ps.optimizer);

  auto& c = j["compression"];
  c["codec"] = compression.codec;
  c["ratio"] = compression.ratio;
  c["bits"] = compression.bits;
  c["block"] = compression.block;
  c["error_feedback"] = compression.error_feedback;
  c["min_bytes"] = compression.min_bytes;
  c["pull"] = compression.pull;

  auto& ck = j["checkpoint"];
  ck["every_steps"] = checkpoint.every_steps;
  ck["dir"] = checkpoint.dir;

  j["metrics"]["port"] = metrics.port;

  auto& sec = j["security"];
  sec["mode"] = ToString(security.mode);
  if (!security.keys_dir.empty()) sec["keys_dir"] = security.keys_dir;
  return j;
}

bool Config::OptimizerOnWorkers() const {
  switch (ps.optimizer) {
    case OptimizerPlacement::kShard:
      return false;
    case OptimizerPlacement::kWorker:
      return true;
    case OptimizerPlacement::kAuto:
      break;
  }
  return compression.codec != "none";
}

Status Config::CheckRunnable(bool standalone) const {
  std::vector<std::string> lines;
  Status invalid;
  if (!standalone && distributed.enable) {
    const GradientSyncMode sync = distributed.gradient_sync;
    if (sync == GradientSyncMode::kNccl && compression.codec != "none") {
      const bool half = compression.codec == "fp16" || compression.codec == "bf16";
      if (!half) {
        lines.push_back("compression.codec=" + compression.codec +
                        ": not supported with distributed.gradient_sync=nccl (an all-reduce "
                        "sums values, which this codec's encoding cannot); allowed: none, fp16, "
                        "bf16, or gradient_sync ps or hybrid, whose pushes the codec compresses");
      } else if (distributed.hierarchical || distributed.model_parallel) {
        lines.push_back(
            "compression.codec=" + compression.codec +
            ": not supported yet with distributed.gradient_sync=nccl and " +
            (distributed.hierarchical ? "distributed.hierarchical" : "distributed.model_parallel") +
            " (their reduce-scatter and all-gather sum fp32); allowed now: the flat, "
            "replicated all-reduce, or codec none");
      }
      if (compression.pull) {
        lines.push_back(
            "compression.pull=true: not supported with distributed.gradient_sync=nccl (an "
            "all-reduce has no pulls); allowed: false, or gradient_sync ps or hybrid");
      }
    }
    if (sync == GradientSyncMode::kPs) {
      const int split = distributed.world_size * training.gradient_accumulation;
      if (distributed.batch_splitting == BatchSplitting::kEven && training.batch_size % split != 0) {
        invalid = Status::InvalidArgument(
            source + ": training.batch_size: " + std::to_string(training.batch_size) +
            " does not split evenly over distributed.world_size " +
            std::to_string(distributed.world_size) + " x training.gradient_accumulation " +
            std::to_string(training.gradient_accumulation) + "; allowed: a multiple of " +
            std::to_string(split));
      }
    }
    if (training.batch_size < distributed.world_size * training.gradient_accumulation) {
      invalid = Status::InvalidArgument(
          source + ": training.batch_size: " + std::to_string(training.batch_size) +
          " is smaller than distributed.world_size x training.gradient_accumulation; allowed: at "
          "least one sample per micro-batch of every worker");
    }
  }
  if (checkpoint.every_steps > 0) {
    const bool ps_bsp = distributed.enable && !standalone &&
                        distributed.gradient_sync == GradientSyncMode::kPs &&
                        ps.consistency == Consistency::kBsp;
    if (!ps_bsp) {
      lines.push_back(
          "checkpoint.every_steps=" + std::to_string(checkpoint.every_steps) +
          ": not supported yet in this setting; allowed now: gradient_sync ps with consistency "
          "bsp (under ssp and async each shard applies pushes as they come, so no version is one "
          "state of every shard; nccl and hybrid keep state outside the shards), or 0");
    } else if (compression.pull) {
      lines.push_back("checkpoint.every_steps=" + std::to_string(checkpoint.every_steps) +
                      " with compression.pull=true: not supported yet (the shards' copies of "
                      "every worker's replica are not checkpointed); allowed now: "
                      "compression.pull=false, or 0");
    }
  }
  if (task.type != TaskType::kImage) {
    lines.push_back("task.type=" + std::string(ToString(task.type)) +
                    ": not supported yet; allowed now: image");
  }
  if (!invalid.ok()) return invalid;
  if (lines.empty()) return Status::OK();
  return Status::Unsupported(Join(lines, "\n"));
}

}  // namespace gridsync
