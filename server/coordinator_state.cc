#include "server/coordinator_state.h"

#include <spdlog/fmt/fmt.h>

#include <charconv>
#include <filesystem>
#include <limits>
#include <nlohmann/json.hpp>
#include <set>
#include <vector>

#include "common/checkpoint_files.h"
#include "common/checkpoint_registry.h"
#include "common/checkpoint_run.h"

namespace gridsync {
namespace {

using Json = nlohmann::json;

constexpr const char* kFormat = "gridsync-coordinator-state";
constexpr uint64_t kVersion = 1;
constexpr const char* kHowToForget =
    "the file is written by gridsync-coordinator; remove it, or start the coordinator with "
    "--fresh, to forget the job it names";

Status Bad(const std::string& what, const std::string& field, const std::string& problem,
           const std::string& allowed) {
  return Status::Corruption(
      fmt::format("{}: {} {}; allowed: {} ({})", what, field, problem, allowed, kHowToForget));
}

// A value for an error message: scalars as written (cut short), arrays and
// objects by their type (never dumped whole: they may be huge).
std::string Show(const Json& value) {
  if (value.is_structured()) return std::string("a JSON ") + value.type_name();
  std::string text = value.dump(-1, ' ', false, Json::error_handler_t::replace);
  if (text.size() > 64) text = text.substr(0, 64) + "...";
  return text;
}

Result<uint64_t> Unsigned(const Json& doc, const std::string& what, const char* field,
                          uint64_t max) {
  const auto it = doc.find(field);
  const std::string allowed = "an integer 0.." + std::to_string(max);
  if (it == doc.end()) return Bad(what, field, "is missing", allowed);
  if (!it->is_number_unsigned() || it->get<uint64_t>() > max) {
    return Bad(what, field, "is " + Show(*it), allowed);
  }
  return it->get<uint64_t>();
}

// Refused by its size alone, before it is read (LoadCoordinatorState) or
// parsed (DecodeCoordinatorState).
Status CheckStateSize(const std::string& what, uint64_t size) {
  if (size <= kMaxCoordinatorStateBytes) return Status::OK();
  return Bad(what, "the file", fmt::format("holds {} bytes", size),
             fmt::format("at most {}", kMaxCoordinatorStateBytes));
}

Result<bool> Boolean(const Json& doc, const std::string& what, const char* field) {
  const auto it = doc.find(field);
  if (it == doc.end() || !it->is_boolean()) {
    return Bad(what, field, it == doc.end() ? "is missing" : "is " + Show(*it), "true or false");
  }
  return it->get<bool>();
}

}  // namespace

bool IsClusterPart(std::string_view part, uint32_t shards, uint32_t workers) {
  uint32_t limit = 0;
  if (part.rfind("shard-", 0) == 0) {
    part.remove_prefix(6);
    limit = shards;
  } else if (part.rfind("worker-", 0) == 0) {
    part.remove_prefix(7);
    limit = workers;
  } else {
    return false;
  }
  uint32_t index = 0;
  const auto [end, err] = std::from_chars(part.data(), part.data() + part.size(), index);
  return err == std::errc() && end == part.data() + part.size() && index < limit &&
         part == std::to_string(index);
}

std::optional<std::string> CheckpointEntryProblem(uint64_t job, uint32_t shards, uint32_t workers,
                                                  const std::string& key,
                                                  const std::string& value) {
  const std::string prefix = CheckpointKey(job, "");
  if (key.rfind(prefix, 0) != 0 ||
      !IsClusterPart(std::string_view(key).substr(prefix.size()), shards, workers)) {
    return fmt::format(
        "is no checkpoint key of a part of job {}; allowed: '{}shard-<s>' (s < {}) or "
        "'{}worker-<w>' (w < {})",
        job, prefix, shards, prefix, workers);
  }
  if (value.size() > kMaxCheckpointStepsBytes) {
    return fmt::format("has {} bytes of steps; allowed: at most {}", value.size(),
                       kMaxCheckpointStepsBytes);
  }
  if (auto parsed = ParseHeldSteps(value, key.substr(prefix.size())); !parsed.ok()) {
    return "has steps '" + value + "' (" + parsed.status().message() +
           "); allowed: steps as the parts publish them, e.g. \"100,150\"";
  }
  return std::nullopt;
}

std::string EncodeCoordinatorState(const CoordinatorState& state) {
  Json checkpoints = Json::object();
  for (const auto& [key, value] : state.checkpoints) checkpoints[key] = value;
  const Json doc = {{"format", kFormat},
                    {"version", kVersion},
                    {"job", state.job},
                    {"epoch", state.epoch},
                    {"resume_step", state.resume_step},
                    {"training_started", state.training_started},
                    {"job_done", state.job_done},
                    {"expected_shards", state.expected_shards},
                    {"expected_workers", state.expected_workers},
                    {"checkpoints", std::move(checkpoints)},
                    {"run", state.run}};
  // Keys are part names and values steps (CheckpointEntryProblem): plain
  // ASCII; a replacement character, never an exception, for anything else.
  return doc.dump(1, ' ', false, Json::error_handler_t::replace) + "\n";
}

Result<CoordinatorState> DecodeCoordinatorState(std::string_view bytes, const std::string& what) {
  GRIDSYNC_RETURN_IF_ERROR(CheckStateSize(what, bytes.size()));
  // A key twice in one object would be kept silently by the parser (the
  // last one): refused, as a hand edit or damage. Nothing nests deeper than
  // the checkpoints object: deeper values are dropped as they are read (the
  // parser itself does not recurse) and the file refused.
  std::vector<std::set<std::string>> keys;
  std::string duplicate;
  bool too_deep = false;
  auto watch = [&](int depth, Json::parse_event_t event, Json& parsed) {
    const bool starts =
        event == Json::parse_event_t::object_start || event == Json::parse_event_t::array_start;
    if (starts && depth >= 2) {
      too_deep = true;
      return false;
    }
    if (event == Json::parse_event_t::object_start) keys.emplace_back();
    if (event == Json::parse_event_t::object_end && !keys.empty()) keys.pop_back();
    if (event == Json::parse_event_t::key && !keys.empty() &&
        !keys.back().insert(parsed.get<std::string>()).second && duplicate.empty()) {
      duplicate = parsed.get<std::string>();
    }
    return true;
  };
  const Json doc = Json::parse(bytes.begin(), bytes.end(), watch, /*allow_exceptions=*/false);
  if (doc.is_discarded()) return Bad(what, "the file", "is not JSON", "the JSON it writes");
  if (too_deep) {
    return Bad(what, "a value", "nests deeper than the checkpoints object",
               "numbers, true or false and strings in the two objects it writes");
  }
  if (!duplicate.empty()) {
    return Bad(what, "key " + Show(Json(duplicate)), "appears twice", "once");
  }
  if (!doc.is_object()) return Bad(what, "the file", "is not a JSON object", "an object");
  const std::set<std::string> known = {"format",
                                       "version",
                                       "job",
                                       "epoch",
                                       "resume_step",
                                       "job_done",
                                       "expected_shards",
                                       "checkpoints",
                                       "expected_workers",
                                       "training_started",
                                       "run"};
  for (const auto& [key, value] : doc.items()) {
    if (!known.count(key)) return Bad(what, "key " + Show(Json(key)), "is unknown", "its keys");
  }
  const auto format = doc.find("format");
  if (format == doc.end() || !format->is_string() || format->get<std::string>() != kFormat) {
    return Bad(what, "format", format == doc.end() ? "is missing" : "is " + Show(*format),
               std::string("\"") + kFormat + "\"");
  }
  GRIDSYNC_ASSIGN_OR_RETURN(const uint64_t version, Unsigned(doc, what, "version", kVersion));
  if (version != kVersion) {
    return Bad(what, "version", "is " + std::to_string(version), std::to_string(kVersion));
  }
  constexpr uint64_t kU32 = std::numeric_limits<uint32_t>::max();
  CoordinatorState state;
  GRIDSYNC_ASSIGN_OR_RETURN(state.job, Unsigned(doc, what, "job", kMaxCoordinatorJob));
  if (state.job == 0) return Bad(what, "job", "is 0", "1 or more");
  GRIDSYNC_ASSIGN_OR_RETURN(const uint64_t epoch,
                            Unsigned(doc, what, "epoch", kMaxCoordinatorEpoch));
  state.epoch = static_cast<uint32_t>(epoch);
  GRIDSYNC_ASSIGN_OR_RETURN(
      state.resume_step, Unsigned(doc, what, "resume_step", std::numeric_limits<uint64_t>::max()));
  GRIDSYNC_ASSIGN_OR_RETURN(state.training_started, Boolean(doc, what, "training_started"));
  GRIDSYNC_ASSIGN_OR_RETURN(state.job_done, Boolean(doc, what, "job_done"));
  GRIDSYNC_ASSIGN_OR_RETURN(const uint64_t shards, Unsigned(doc, what, "expected_shards", kU32));
  GRIDSYNC_ASSIGN_OR_RETURN(const uint64_t workers, Unsigned(doc, what, "expected_workers", kU32));
  state.expected_shards = static_cast<uint32_t>(shards);
  state.expected_workers = static_cast<uint32_t>(workers);
  const auto checkpoints = doc.find("checkpoints");
  if (checkpoints == doc.end() || !checkpoints->is_object()) {
    return Bad(what, "checkpoints", checkpoints == doc.end() ? "is missing" : "is not an object",
               "an object of the job's checkpoint keys and their steps");
  }
  for (const auto& [key, value] : checkpoints->items()) {
    const std::string field = "checkpoints key " + Show(Json(key));
    if (!value.is_string()) return Bad(what, field, "has " + Show(value), "a list of steps");
    const std::string steps = value.get<std::string>();
    if (auto problem = CheckpointEntryProblem(state.job, state.expected_shards,
                                              state.expected_workers, key, steps)) {
      return Status::Corruption(fmt::format("{}: {} {} ({})", what, field, *problem, kHowToForget));
    }
    state.checkpoints[key] = steps;
  }
  // Optional: files written before runs were named have none.
  if (const auto run = doc.find("run"); run != doc.end()) {
    if (!run->is_string() || !IsRunId(run->get<std::string>())) {
      return Bad(what, "run", "is " + Show(*run), "up to 64 lowercase hex digits");
    }
    state.run = run->get<std::string>();
  }
  return state;
}

Result<std::optional<CoordinatorState>> LoadCoordinatorState(const std::string& path) {
  std::error_code ec;
  if (!std::filesystem::exists(path, ec)) {
    if (ec) return Status::IOError("cannot look for " + path + ": " + ec.message());
    return std::optional<CoordinatorState>();
  }
  if (!std::filesystem::is_regular_file(path, ec)) {
    return Bad(path, "the path", "is no regular file", "the file it writes");
  }
  // The size first (common/checkpoint_files.h, as a checkpoint's files): a
  // file past the bound is refused unread, and one that changed size
  // meanwhile is refused, never read whole or cut short.
  GRIDSYNC_ASSIGN_OR_RETURN(const uint64_t size, FileSize(path));
  GRIDSYNC_RETURN_IF_ERROR(CheckStateSize(path, size));
  GRIDSYNC_ASSIGN_OR_RETURN(const std::string bytes, ReadFileOfSize(path, size));
  GRIDSYNC_ASSIGN_OR_RETURN(CoordinatorState state, DecodeCoordinatorState(bytes, path));
  return std::optional<CoordinatorState>(std::move(state));
}

Status SaveCoordinatorState(const std::string& path, const CoordinatorState& state) {
  std::error_code ec;
  const auto folder = std::filesystem::path(path).parent_path();
  if (!folder.empty()) std::filesystem::create_directories(folder, ec);
  if (ec) return Status::IOError("cannot create " + folder.string() + ": " + ec.message());
  return WriteFileAtomically(path, EncodeCoordinatorState(state));
}

}  // namespace gridsync
