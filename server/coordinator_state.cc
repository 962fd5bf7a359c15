#include "server/coordinator_state.h"

#include <spdlog/fmt/fmt.h>

#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <limits>
#include <nlohmann/json.hpp>
#include <set>
#include <sstream>
#include <vector>

#include "common/checkpoint_files.h"
#include "common/checkpoint_registry.h"

namespace gridsync {
namespace {

using Json = nlohmann::json;

constexpr const char* kFormat = "gridsync-coordinator-state";
constexpr uint64_t kVersion = 1;

Status Bad(const std::string& what, const std::string& field, const std::string& problem,
           const std::string& allowed) {
  return Status::Corruption(
      fmt::format("{}: {} {}; allowed: {} (the file is written by "
                  "gridsync-coordinator; remove it, or start the "
                  "coordinator with --fresh, to forget the job it names)",
                  what, field, problem, allowed));
}

Result<uint64_t> Unsigned(const Json& doc, const std::string& what, const char* field,
                          uint64_t max) {
  const auto it = doc.find(field);
  if (it == doc.end())
    return Bad(what, field, "is missing", "an integer 0.." + std::to_string(max));
  if (!it->is_number_unsigned() || it->get<uint64_t>() > max) {
    return Bad(what, field, "is " + it->dump(), "an integer 0.." + std::to_string(max));
  }
  return it->get<uint64_t>();
}

Result<bool> Boolean(const Json& doc, const std::string& what, const char* field) {
  const auto it = doc.find(field);
  if (it == doc.end() || !it->is_boolean()) {
    return Bad(what, field, it == doc.end() ? "is missing" : "is " + it->dump(), "true or false");
  }
  return it->get<bool>();
}

}  // namespace

std::optional<std::string> CheckpointEntryProblem(uint64_t job, const std::string& key,
                                                  const std::string& value) {
  const std::string prefix = CheckpointKey(job, "");
  if (key.rfind(prefix, 0) != 0 || key.size() == prefix.size()) {
    return "is no checkpoint key of job " + std::to_string(job) + "; allowed: '" + prefix +
           "<part>'";
  }
  if (key.size() + value.size() > kMaxCheckpointEntryBytes) {
    return fmt::format("holds {} bytes with its steps; allowed: at most {}",
                       key.size() + value.size(), kMaxCheckpointEntryBytes);
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
                    {"generation", state.generation},
                    {"training_started", state.training_started},
                    {"job_done", state.job_done},
                    {"expected_shards", state.expected_shards},
                    {"expected_workers", state.expected_workers},
                    {"checkpoints", std::move(checkpoints)}};
  return doc.dump(1) + "\n";
}

Result<CoordinatorState> DecodeCoordinatorState(std::string_view bytes, const std::string& what) {
  if (bytes.size() > kMaxCoordinatorStateBytes) {
    return Bad(what, "the file", fmt::format("holds {} bytes", bytes.size()),
               fmt::format("at most {}", kMaxCoordinatorStateBytes));
  }
  // A key twice in one object would be kept silently by the parser (the
  // last one): refused, as a hand edit or damage.
  std::vector<std::set<std::string>> keys;
  std::string duplicate;
  auto watch = [&](int /*depth*/, Json::parse_event_t event, Json& parsed) {
    if (event == Json::parse_event_t::object_start) keys.emplace_back();
    if (event == Json::parse_event_t::object_end && !keys.empty()) keys.pop_back();
    if (event == Json::parse_event_t::key && !keys.empty() &&
        !keys.back().insert(parsed.get<std::string>()).second && duplicate.empty()) {
      duplicate = parsed.get<std::string>();
    }
    return true;
  };
  const Json doc = Json::parse(bytes.begin(), bytes.end(), watch, /*allow_exceptions=*/false);
  if (doc.is_discarded()) return Bad(what, "the file", "is not JSON", "the JSON this writes");
  if (!duplicate.empty()) return Bad(what, "key '" + duplicate + "'", "appears twice", "once");
  if (!doc.is_object()) return Bad(what, "the file", "is not a JSON object", "an object");
  const std::set<std::string> known = {
      "format",     "version",          "job",      "epoch",           "resume_step",
      "generation", "training_started", "job_done", "expected_shards", "expected_workers",
      "checkpoints"};
  for (const auto& [key, value] : doc.items()) {
    if (!known.count(key))
      return Bad(what, "key '" + key + "'", "is unknown", "the keys it writes");
  }
  const auto format = doc.find("format");
  if (format == doc.end() || !format->is_string() || format->get<std::string>() != kFormat) {
    return Bad(what, "format", format == doc.end() ? "is missing" : "is " + format->dump(),
               std::string("\"") + kFormat + "\"");
  }
  GRIDSYNC_ASSIGN_OR_RETURN(const uint64_t version, Unsigned(doc, what, "version", kVersion));
  if (version != kVersion) {
    return Bad(what, "version", "is " + std::to_string(version), std::to_string(kVersion));
  }
  constexpr uint64_t kU32 = std::numeric_limits<uint32_t>::max();
  constexpr uint64_t kU64 = std::numeric_limits<uint64_t>::max();
  CoordinatorState state;
  GRIDSYNC_ASSIGN_OR_RETURN(state.job, Unsigned(doc, what, "job", kU64 - 1));
  if (state.job == 0) return Bad(what, "job", "is 0", "1 or more");
  GRIDSYNC_ASSIGN_OR_RETURN(const uint64_t epoch, Unsigned(doc, what, "epoch", kU32 - 1));
  state.epoch = static_cast<uint32_t>(epoch);
  GRIDSYNC_ASSIGN_OR_RETURN(state.resume_step, Unsigned(doc, what, "resume_step", kU64));
  GRIDSYNC_ASSIGN_OR_RETURN(state.generation, Unsigned(doc, what, "generation", kU64 - 1));
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
  if (checkpoints->size() > kMaxCoordinatorStateKeys) {
    return Bad(what, "checkpoints", fmt::format("holds {} keys", checkpoints->size()),
               fmt::format("at most {}", kMaxCoordinatorStateKeys));
  }
  for (const auto& [key, value] : checkpoints->items()) {
    const std::string field = "checkpoints key '" + key + "'";
    if (!value.is_string()) return Bad(what, field, "has " + value.dump(), "a list of steps");
    const std::string steps = value.get<std::string>();
    if (auto problem = CheckpointEntryProblem(state.job, key, steps)) {
      return Status::Corruption(
          fmt::format("{}: {} {} (the file is written by "
                      "gridsync-coordinator; remove it, or start the "
                      "coordinator with --fresh, to forget the job it names)",
                      what, field, *problem));
    }
    state.checkpoints[key] = steps;
  }
  return state;
}

Result<std::optional<CoordinatorState>> LoadCoordinatorState(const std::string& path) {
  std::error_code ec;
  if (!std::filesystem::exists(path, ec)) {
    if (ec) return Status::IOError("cannot look for " + path + ": " + ec.message());
    return std::optional<CoordinatorState>();
  }
  const auto size = std::filesystem::file_size(path, ec);
  if (ec) return Status::IOError("cannot read " + path + ": " + ec.message());
  if (size > kMaxCoordinatorStateBytes) {
    return Bad(path, "the file", fmt::format("holds {} bytes", size),
               fmt::format("at most {}", kMaxCoordinatorStateBytes));
  }
  std::ifstream in(path, std::ios::binary);
  if (!in) return Status::IOError("cannot read " + path + ": " + std::strerror(errno));
  std::ostringstream bytes;
  bytes << in.rdbuf();
  if (!in && !in.eof()) return Status::IOError("cannot read " + path);
  GRIDSYNC_ASSIGN_OR_RETURN(CoordinatorState state, DecodeCoordinatorState(bytes.str(), path));
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
