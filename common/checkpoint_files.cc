#include "common/checkpoint_files.h"

#include <fcntl.h>
#include <spdlog/fmt/fmt.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <set>
#include <sstream>

namespace gridsync {
namespace {

namespace fs = std::filesystem;

uint64_t Fnv1a64(std::string_view bytes) {
  uint64_t h = 0xcbf29ce484222325ull;
  for (unsigned char c : bytes) h = (h ^ c) * 0x100000001b3ull;
  return h;
}

std::string StepDir(const std::string& dir, uint64_t step) {
  return dir + "/step-" + std::to_string(step);
}
std::string Base(const std::string& dir, uint64_t step, const std::string& part) {
  return StepDir(dir, step) + "/" + part;
}

Status SyncPath(const std::string& path, int flags) {
  const int fd = ::open(path.c_str(), flags);
  if (fd < 0) return Status::IOError("cannot open " + path + ": " + std::strerror(errno));
  const int rc = ::fsync(fd);
  ::close(fd);
  if (rc != 0) return Status::IOError("cannot fsync " + path + ": " + std::strerror(errno));
  return Status::OK();
}

Result<std::string> ReadFile(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return Status::NotFound("cannot read " + path + ": " + std::strerror(errno));
  std::ostringstream s;
  s << in.rdbuf();
  return s.str();
}

// The steps that have a folder in `dir`, ascending.
std::set<uint64_t> Steps(const std::string& dir) {
  std::set<uint64_t> steps;
  std::error_code ec;
  for (const auto& entry : fs::directory_iterator(dir, ec)) {
    const std::string name = entry.path().filename().string();
    if (name.rfind("step-", 0) != 0) continue;
    try {
      size_t used = 0;
      const uint64_t step = std::stoull(name.substr(5), &used);
      if (used == name.size() - 5) steps.insert(step);
    } catch (...) {
    }
  }
  return steps;
}

// Removes part `part`'s files of step `step`, the manifest first (without
// it the step is incomplete for this part), then the step's folder once
// every part left it.
void RemovePart(const std::string& dir, uint64_t step, const std::string& part) {
  std::error_code ec;
  for (const char* ext : {".json", ".bin"}) fs::remove(Base(dir, step, part) + ext, ec);
  fs::remove(StepDir(dir, step), ec);
}

}  // namespace

Status WriteFileAtomically(const std::string& path, std::string_view bytes) {
  const std::string tmp = path + ".tmp";
  {
    std::ofstream out(tmp, std::ios::binary | std::ios::trunc);
    out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
    out.flush();
    if (!out) return Status::IOError("cannot write " + tmp);
  }
  GRIDSYNC_RETURN_IF_ERROR(SyncPath(tmp, O_RDONLY));
  if (std::rename(tmp.c_str(), path.c_str()) != 0) {
    return Status::IOError("cannot rename " + tmp + ": " + std::strerror(errno));
  }
  return SyncPath(fs::path(path).parent_path().string(), O_RDONLY | O_DIRECTORY);
}

std::vector<uint64_t> HeldSteps(const std::string& dir, const std::string& part) {
  std::vector<uint64_t> held;
  std::error_code ec;
  for (uint64_t step : Steps(dir)) {
    if (fs::exists(Base(dir, step, part) + ".json", ec)) held.push_back(step);
  }
  return held;
}

void RemoveStepsAfter(const std::string& dir, const std::string& part, uint64_t step) {
  for (uint64_t held : HeldSteps(dir, part)) {
    if (held > step) RemovePart(dir, held, part);
  }
}

Status WriteCheckpointPart(const std::string& dir, uint64_t step, const std::string& part,
                           std::string_view data, const nlohmann::json& shape) {
  std::error_code ec;
  fs::create_directories(StepDir(dir, step), ec);
  if (ec) return Status::IOError("cannot create " + StepDir(dir, step) + ": " + ec.message());
  const std::string base = Base(dir, step, part);
  GRIDSYNC_RETURN_IF_ERROR(WriteFileAtomically(base + ".bin", data));
  const nlohmann::json manifest = {{"step", step},
                                   {"part", part},
                                   {"shape", shape},
                                   {"bytes", data.size()},
                                   {"fnv1a64", fmt::format("{:016x}", Fnv1a64(data))}};
  GRIDSYNC_RETURN_IF_ERROR(WriteFileAtomically(base + ".json", manifest.dump()));
  // Keep this step and the newest one before it. This part's files of any
  // later step belong to another history (an earlier run in the same folder,
  // or a rollback's abandoned steps) and go too: they would be taken for
  // the newest checkpoint.
  const std::vector<uint64_t> held = HeldSteps(dir, part);
  uint64_t previous = 0;
  for (uint64_t s : held) {
    if (s < step) previous = s;
  }
  for (uint64_t s : Steps(dir)) {  // a crash may have left a .bin without its manifest
    if (s != step && s != previous) RemovePart(dir, s, part);
  }
  return Status::OK();
}

Result<std::string> ReadCheckpointPart(const std::string& dir, uint64_t step,
                                       const std::string& part, const nlohmann::json& shape) {
  const std::string base = Base(dir, step, part);
  GRIDSYNC_ASSIGN_OR_RETURN(const std::string manifest_text, ReadFile(base + ".json"));
  const auto manifest = nlohmann::json::parse(manifest_text, nullptr, false);
  if (manifest.is_discarded() || !manifest.is_object()) {
    return Status::Corruption(base + ".json: not a checkpoint manifest");
  }
  if (manifest.value("step", uint64_t{0}) != step ||
      manifest.value("part", std::string()) != part) {
    return Status::Corruption(base + ".json: names another step or part");
  }
  if (manifest.value("shape", nlohmann::json()) != shape) {
    return Status::InvalidArgument(base + ".json: shape " +
                                   manifest.value("shape", nlohmann::json()).dump() +
                                   " differs from this process's " + shape.dump() +
                                   "; allowed: a checkpoint of the same model and partition");
  }
  GRIDSYNC_ASSIGN_OR_RETURN(std::string data, ReadFile(base + ".bin"));
  const std::string sum = fmt::format("{:016x}", Fnv1a64(data));
  if (data.size() != manifest.value("bytes", uint64_t{0}) ||
      sum != manifest.value("fnv1a64", std::string())) {
    return Status::Corruption(fmt::format(
        "{}.bin: {} bytes with checksum {}; the manifest says {} bytes, {}", base, data.size(), sum,
        manifest.value("bytes", uint64_t{0}), manifest.value("fnv1a64", std::string("?"))));
  }
  return data;
}

uint64_t LatestCompleteStep(const std::string& dir, const std::vector<std::string>& parts) {
  std::error_code ec;
  uint64_t best = 0;
  for (uint64_t step : Steps(dir)) {
    bool complete = true;
    for (const auto& part : parts) {
      complete = complete && fs::exists(Base(dir, step, part) + ".json", ec);
    }
    if (complete) best = step;
  }
  return best;
}

Status CheckFreshStart(const std::string& dir, const std::vector<std::string>& parts,
                       const std::vector<std::string>& job_parts) {
  std::vector<std::string> held;
  for (const std::string& part : parts) {
    const std::vector<uint64_t> steps = HeldSteps(dir, part);
    if (steps.empty()) continue;
    std::string list;
    for (uint64_t s : steps) list += (list.empty() ? "" : ", ") + std::to_string(s);
    held.push_back(part + " (step " + list + ")");
  }
  if (held.empty()) return Status::OK();
  std::string names;
  for (const std::string& h : held) names += (names.empty() ? "" : ", ") + h;
  // What a resume would start from: the newest step every part of the job
  // holds here (parts on other machines keep theirs in their own folders).
  const uint64_t complete = LatestCompleteStep(dir, job_parts);
  const std::string resume =
      complete > 0 ? fmt::format(
                         "resume it from step {}, the newest step every part of the job holds here "
                         "(gridsync launch --resume; for the units --resume-step {} for "
                         "gridsync-ps and --start-step {} for gridsync-worker), or ",
                         complete, complete, complete)
                   : std::string(
                         "no step here holds every part of the job, so no resume from this folder "
                         "alone; ");
  return Status::InvalidArgument(fmt::format(
      "checkpoint.dir {} holds checkpoints this job did not write: {}; starting afresh would "
      "delete them with its first checkpoint. Allowed: {}move the folder away or set "
      "checkpoint.dir elsewhere to start afresh",
      dir, names, resume));
}

}  // namespace gridsync
