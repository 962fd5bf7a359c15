#include "common/checkpoint_files.h"

#include <fcntl.h>
#include <spdlog/fmt/fmt.h>
#include <spdlog/spdlog.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <filesystem>
#include <optional>
#include <random>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "common/checkpoint_manifest.h"
#include "common/checkpoint_run.h"
#include "common/file_bytes.h"
#include "common/logging.h"

namespace gridsync {

uint64_t Fnv1a64(std::string_view bytes, uint64_t h) {
  for (unsigned char c : bytes) h = (h ^ c) * 0x100000001b3ull;
  return h;
}

namespace {

namespace fs = std::filesystem;
using checkpoint_manifest::BadField;
using checkpoint_manifest::CheckManifestMac;
using checkpoint_manifest::CheckManifestMacIs;
using checkpoint_manifest::CheckRegularIfPresent;
using checkpoint_manifest::Cut;
using checkpoint_manifest::EncodeManifest;
using checkpoint_manifest::MacFieldsOf;
using checkpoint_manifest::Manifest;
using checkpoint_manifest::ReadManifest;

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

// The steps that have a folder in `dir`, ascending. Only real folders: a
// step-<s> that is a symbolic link is no step of this folder (a hostile
// probe linked another run's newest step in: the job resumed from it, and
// the cleanup of old steps then deleted that run's files through the link).
// The step of a folder named exactly as StepDir names it ("step-20"), or
// nullopt: "step-020", "step- 20" or "step-+20" read 20 through stoull, yet
// StepDir(20) is another folder.
std::optional<uint64_t> StepOfName(const std::string& name) {
  if (name.rfind("step-", 0) != 0) return std::nullopt;
  const std::string digits = name.substr(5);
  if (digits.empty() || digits.size() > 20 ||
      digits.find_first_not_of("0123456789") != std::string::npos ||
      (digits.size() > 1 && digits[0] == '0'))
    return std::nullopt;
  errno = 0;
  const unsigned long long step = std::strtoull(digits.c_str(), nullptr, 10);
  if (errno == ERANGE) return std::nullopt;
  return step;
}

// Step folders, and (when `odd` is given) the entries named "step-..." that
// are not one: a link, a file, or a name StepDir does not write.
std::set<uint64_t> Steps(const std::string& dir, std::vector<std::string>* odd = nullptr) {
  std::set<uint64_t> steps;
  std::error_code ec;
  // Stepped with an error code: the range-for's increment throws (a folder
  // removed or made unreadable while it is listed).
  for (fs::directory_iterator entry(dir, ec), end; !ec && entry != end; entry.increment(ec)) {
    const std::string name = entry->path().filename().string();
    if (name.rfind("step-", 0) != 0) continue;
    std::error_code kind_error;
    const std::optional<uint64_t> step = StepOfName(name);
    if (step && fs::is_directory(entry->symlink_status(kind_error))) {
      steps.insert(*step);
    } else if (odd != nullptr) {
      odd->push_back(name);
    }
  }
  return steps;
}

// Removes part `part`'s files of step `step`, the manifest first (without
// it the step is incomplete for this part), then the temporary files a
// crashed write of this part left there (WriteFileAtomically's
// <part>.bin.tmp-* and <part>.json.tmp-*: each as large as the part's
// state, and they kept the folder from ever being removed), then the
// step's folder once every part left it. Only this part's own names go:
// another part's writer may be writing into the folder now.
void RemovePart(const std::string& dir, uint64_t step, const std::string& part) {
  std::error_code ec;
  for (const char* ext : {".json", ".bin"}) fs::remove(Base(dir, step, part) + ext, ec);
  const std::string folder = StepDir(dir, step);
  // Never through a link: a step folder that is one is left alone.
  if (fs::is_directory(fs::symlink_status(folder, ec))) {
    std::vector<fs::path> leftovers;
    for (fs::directory_iterator it(folder, ec), end; !ec && it != end; it.increment(ec)) {
      const std::string name = it->path().filename().string();
      for (const char* ext : {".json.tmp-", ".bin.tmp-"}) {
        if (name.rfind(part + ext, 0) == 0) leftovers.push_back(it->path());
      }
    }
    for (const fs::path& leftover : leftovers) {
      spdlog::info("{}: removing {}, left by a write of {} that did not finish", folder,
                   leftover.filename().string(), part);
      fs::remove(leftover, ec);
    }
  }
  fs::remove(folder, ec);
}

}  // namespace

namespace {

// A name beside `path` for its temporary file that no other writer uses:
// path + ".tmp-", this process's id, "-" and 8 random letters or digits.
// The id keeps a forked child, which inherits the generator's state, from
// drawing its parent's names.
std::string TemporaryName(const std::string& path) {
  static constexpr char kLetters[] = "abcdefghijklmnopqrstuvwxyz0123456789";
  thread_local std::mt19937_64 random{std::random_device{}()};
  std::string name = path + ".tmp-" + std::to_string(::getpid()) + "-";
  for (int i = 0; i < 8; ++i) name += kLetters[random() % (sizeof(kLetters) - 1)];
  return name;
}

// Writes all of `bytes` to fd; errno's text on failure.
std::optional<std::string> WriteAll(int fd, std::string_view bytes) {
  while (!bytes.empty()) {
    const ssize_t n = ::write(fd, bytes.data(), bytes.size());
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return std::string(n < 0 ? std::strerror(errno) : "nothing written");
    bytes.remove_prefix(static_cast<size_t>(n));
  }
  return std::nullopt;
}

}  // namespace

Status WriteFileAtomically(const std::string& path, std::string_view bytes) {
  // The temporary file is created new (O_EXCL: never an existing file, nor
  // one a symbolic link points to) under a name of its own: with a fixed
  // name two writers of one path wrote into one file, and a link planted
  // there had the bytes written wherever it pointed.
  std::string tmp;
  int fd = -1;
  for (int attempt = 0; attempt < 16 && fd < 0; ++attempt) {
    tmp = TemporaryName(path);
    fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0666);
    if (fd < 0 && errno != EEXIST) break;
  }
  if (fd < 0) return Status::IOError("cannot create " + tmp + ": " + std::strerror(errno));
  // What a failed write left is removed: the file is this call's own.
  const auto failed = [&](const std::string& what) {
    if (fd >= 0) ::close(fd);
    ::unlink(tmp.c_str());
    return Status::IOError(what);
  };
  if (auto error = WriteAll(fd, bytes)) return failed("cannot write " + tmp + ": " + *error);
  if (::fsync(fd) != 0) return failed("cannot fsync " + tmp + ": " + std::strerror(errno));
  const int closed = ::close(fd);
  fd = -1;
  if (closed != 0) return failed("cannot close " + tmp + ": " + std::strerror(errno));
  if (std::rename(tmp.c_str(), path.c_str()) != 0)
    return failed("cannot rename " + tmp + " to " + path + ": " + std::strerror(errno));
  const fs::path folder = fs::path(path).parent_path();
  return SyncPath(folder.empty() ? "." : folder.string(), O_RDONLY | O_DIRECTORY);
}

std::vector<uint64_t> HeldSteps(const std::string& dir, const std::string& part) {
  std::vector<uint64_t> held;
  std::error_code ec;
  for (uint64_t step : Steps(dir)) {
    if (fs::exists(Base(dir, step, part) + ".json", ec)) held.push_back(step);
  }
  return held;
}

std::string DescribeHeldParts(const std::string& dir) {
  struct stat info {};
  if (::stat(dir.c_str(), &info) != 0) return dir + ": " + std::strerror(errno);
  if (!S_ISDIR(info.st_mode)) return dir + " is " + FileKindName(info.st_mode) + ", not a folder";
  std::vector<std::string> odd;
  const std::set<uint64_t> steps = Steps(dir, &odd);
  std::sort(odd.begin(), odd.end());
  std::string ignored;
  for (size_t i = 0; i < odd.size() && i < 3; ++i)
    ignored += (i == 0 ? "" : ", ") + Cut(nlohmann::json(odd[i]));
  if (odd.size() > 3) ignored += " and " + std::to_string(odd.size() - 3) + " more";
  if (!ignored.empty()) {
    ignored =
        "; ignored, as not a step folder gridsync writes (step-N, a folder, N without "
        "leading zeros): " +
        ignored;
  }
  // File names are anyone's bytes: escaped, so a name cannot drive the
  // operator's terminal (JSON's escapes leave DEL, C1 and bidi controls).
  if (steps.empty()) return EscapeControlBytes(dir + " holds no step folder" + ignored);
  std::string text = dir + " holds";
  int listed = 0;
  for (auto it = steps.rbegin(); it != steps.rend() && listed < 3; ++it, ++listed) {
    std::vector<std::string> parts;
    std::error_code ec;
    // Stepped with an error code: the range-for's increment throws.
    for (fs::directory_iterator entry(StepDir(dir, *it), ec), end; !ec && entry != end;
         entry.increment(ec)) {
      const std::string name = entry->path().filename().string();
      if (name.size() > 5 && name.compare(name.size() - 5, 5, ".json") == 0)
        parts.push_back(name.substr(0, name.size() - 5));
    }
    std::sort(parts.begin(), parts.end());
    std::string names;
    for (const auto& p : parts) names += (names.empty() ? "" : ", ") + p;
    text += std::string(listed == 0 ? " " : "; ") + "step " + std::to_string(*it) + " (" +
            (names.empty() ? "no manifest" : names) + ")";
  }
  if (steps.size() > 3) text += " and " + std::to_string(steps.size() - 3) + " older steps";
  return EscapeControlBytes(text + ignored);
}

void RemoveStepsAfter(const std::string& dir, const std::string& part, uint64_t step) {
  for (uint64_t held : HeldSteps(dir, part)) {
    if (held > step) RemovePart(dir, held, part);
  }
}

namespace {

// Whether a write failed for want of room (a full disk, or the quota).
bool IsOutOfSpace(const Status& status) {
  return status.message().find(std::strerror(ENOSPC)) != std::string::npos ||
         status.message().find(std::strerror(EDQUOT)) != std::string::npos;
}

// WriteCheckpointPart's removal of part `part`'s files of the steps it does
// not keep once step `step` is written.
void RemoveUnkeptSteps(const std::string& dir, uint64_t step, const std::string& part,
                       const std::vector<uint64_t>& keep, const std::string& run) {
  // Keep this step and the newest one before it, and what the coordinator
  // last acknowledged (`keep`): with the coordinator down, the steps written
  // since were never published, and removing the published ones left the
  // job nothing to roll back to (fault_test 4b on a fast host: killed after
  // step 150, the shards wrote 200 and 250 before they noticed, and
  // restarted found only those). This part's files of any later step belong
  // to another history (an earlier run in the same folder, or a rollback's
  // abandoned steps) and go too: they would be taken for the newest
  // checkpoint.
  const std::vector<uint64_t> held = HeldSteps(dir, part);
  uint64_t previous = 0;
  for (uint64_t s : held) {
    if (s < step) previous = s;
  }
  const auto kept = [&](uint64_t s) {
    return s == step || s == previous ||
           (s < step && std::find(keep.begin(), keep.end(), s) != keep.end());
  };
  for (uint64_t s : Steps(dir)) {  // a crash may have left a .bin without its manifest
    if (kept(s)) continue;
    // Another run's step (a job before this one, in the same folder) goes
    // as this run's older ones do, but not without a word: started by
    // hand or by units on a folder of an ended job, a fresh job replaced
    // its checkpoints silently (a hostile probe; gridsync launch refuses to
    // start afresh there, CheckFreshStart).
    if (!run.empty()) {
      if (auto other = ReadManifest(Base(dir, s, part) + ".json");
          other.ok() && other->run != run) {
        spdlog::warn(
            "{}: removing {}'s checkpoint of step {} of another run ({}): this run ({}) keeps "
            "its own two newest steps there; to keep a run's checkpoints, give the next run "
            "another checkpoint.dir",
            dir, part, s, other->run.empty() ? "unnamed" : other->run, run);
      }
    }
    RemovePart(dir, s, part);
  }
}

}  // namespace

Status WriteCheckpointPart(const std::string& dir, uint64_t step, const std::string& part,
                           std::string_view data, const nlohmann::json& shape,
                           const std::vector<uint64_t>& keep, const std::string& run,
                           const CheckpointMacKey* key) {
  std::error_code ec;
  const std::string base = Base(dir, step, part);
  const std::string manifest = EncodeManifest(step, part, shape, data, run, key);
  // Checked before anything is written: a manifest the reader would refuse
  // would leave a checkpoint nobody can load.
  if (manifest.size() > kMaxManifestBytes) {
    return Status::InvalidArgument(
        fmt::format("{}.json: {} bytes of manifest; allowed: at most {} (a shape that large is "
                    "no model gridsync trains)",
                    base, manifest.size(), kMaxManifestBytes));
  }
  // A disk that holds two steps and not a third: the steps this write
  // removes once it is done go first, and the write is tried again (a
  // probe's 30 MiB disk held steps 50 and 100, and every later checkpoint
  // failed for the rest of the run). What the job rolls back to stays.
  // Parts sharing the disk write at once, so the room one freed may be
  // taken by another's write in flight: a few tries, a moment apart. (A
  // failed step's folder stays: another part may be about to write there;
  // the next write's removals take it.)
  const auto write = [&]() -> Status {
    // (A full disk can refuse the folder too.)
    fs::create_directories(StepDir(dir, step), ec);
    if (ec) return Status::IOError("cannot create " + StepDir(dir, step) + ": " + ec.message());
    // Written only into a real folder: through a link this part's files
    // would replace another folder's (another run's checkpoint).
    if (!fs::is_directory(fs::symlink_status(StepDir(dir, step), ec))) {
      return Status::IOError(StepDir(dir, step) +
                             " is a symbolic link, not a folder of checkpoint.dir; allowed: a "
                             "step folder the job made itself (remove the link)");
    }
    GRIDSYNC_RETURN_IF_ERROR(WriteFileAtomically(base + ".bin", data));
    return WriteFileAtomically(base + ".json", manifest);
  };
  // Only once the job's common step is known (`keep`): before, the step
  // this removes may be the only one every part holds.
  Status written = write();
  if (!written.ok() && !keep.empty() && IsOutOfSpace(written)) {
    spdlog::warn("{}: {}; removing {}'s steps the write would remove after it, and trying again",
                 dir, written.message(), part);
    RemoveUnkeptSteps(dir, step, part, keep, run);
    for (int retry = 0; retry < 3; ++retry) {
      std::this_thread::sleep_for(std::chrono::milliseconds(100 * retry));
      written = write();
      if (written.ok() || !IsOutOfSpace(written)) break;
    }
  }
  GRIDSYNC_RETURN_IF_ERROR(written);
  RemoveUnkeptSteps(dir, step, part, keep, run);
  return Status::OK();
}

namespace {

// ReadCheckpointPart; `shape` null: any shape; `keep_data` false: checked
// only, "" returned (CheckCheckpointPartIntact).
Result<std::string> ReadPart(const std::string& dir, uint64_t step, const std::string& part,
                             const nlohmann::json* shape, std::optional<uint64_t> state_bytes,
                             std::string* run, const CheckpointMacKey* key, bool keep_data = true) {
  const std::string base = Base(dir, step, part);
  const std::string json_path = base + ".json", bin_path = base + ".bin";
  // A step the folder does not hold: say which it does, so the resume can
  // be pointed at one (a mistyped --resume-step named only the file).
  if (std::error_code ec; !fs::exists(json_path, ec) && !ec) {
    const std::vector<uint64_t> held = HeldSteps(dir, part);
    return Status::NotFound(fmt::format(
        "{}: no checkpoint of step {} for {} in {}; allowed: a step it holds ({})", json_path, step,
        part, dir, held.empty() ? "none" : fmt::format("{}", fmt::join(held, ", "))));
  }
  GRIDSYNC_ASSIGN_OR_RETURN(const Manifest manifest, ReadManifest(json_path));
  if (manifest.step != step) {
    return BadField(json_path, "step", fmt::format("is {}", manifest.step),
                    fmt::format("{}, the step of its folder", step));
  }
  if (manifest.part != part) {
    return BadField(json_path, "part", "is " + Cut(manifest.part),
                    Cut(part) + ", the part its name says");
  }
  if (shape != nullptr && manifest.shape != *shape) {
    return Status::InvalidArgument(json_path + ": shape " + Cut(manifest.shape) +
                                   " differs from this process's " + Cut(*shape) +
                                   "; allowed: a checkpoint of the same model and partition");
  }
  GRIDSYNC_RETURN_IF_ERROR(CheckRegularIfPresent(bin_path));
  auto bin_size = FileSize(bin_path);
  if (!bin_size.ok() && bin_size.status().code() == StatusCode::kNotFound) {
    // The .bin is written before its manifest: one without the other is
    // damage, as a wrong checksum is.
    return Status::Corruption(bin_path + ": missing, though its manifest is there");
  }
  GRIDSYNC_ASSIGN_OR_RETURN(const uint64_t size, std::move(bin_size));
  if (size != manifest.bytes) {
    return Status::Corruption(
        fmt::format("{}: {} bytes; the manifest says {}", bin_path, size, manifest.bytes));
  }
  if (state_bytes && manifest.bytes != *state_bytes) {
    return Status::InvalidArgument(fmt::format(
        "{}: {} bytes; this process's state is {} bytes; allowed: a checkpoint of the same "
        "model, partition, optimizer placement and compression.pull (with it the shards keep "
        "each worker's replica)",
        bin_path, manifest.bytes, *state_bytes));
  }
  const auto check_sum = [&](uint64_t fnv) {
    const std::string sum = fmt::format("{:016x}", fnv);
    if (sum == manifest.fnv1a64) return Status::OK();
    return Status::Corruption(
        fmt::format("{}: checksum {}; the manifest says {}", bin_path, sum, manifest.fnv1a64));
  };
  if (!keep_data) {
    // Only checked: hashed in pieces, so that a .bin of any size (a
    // forged manifest may claim gigabytes) takes a few MiB, where the
    // whole file was read into memory.
    uint64_t fnv = kFnv1a64Start;
    std::optional<CheckpointMacKey::Hasher> mac;
    if (key != nullptr && !manifest.mac.empty()) mac.emplace(*key, MacFieldsOf(manifest));
    GRIDSYNC_RETURN_IF_ERROR(ReadFileInPieces(bin_path, size, [&](std::string_view piece) {
      fnv = Fnv1a64(piece, fnv);
      if (mac) mac->Add(piece);
    }));
    GRIDSYNC_RETURN_IF_ERROR(check_sum(fnv));
    if (key != nullptr)
      GRIDSYNC_RETURN_IF_ERROR(
          CheckManifestMacIs(manifest, json_path, bin_path, mac ? mac->Finish() : ""));
    if (run != nullptr) *run = manifest.run;
    return std::string();
  }
  GRIDSYNC_ASSIGN_OR_RETURN(std::string data, ReadFileOfSize(bin_path, size));
  GRIDSYNC_RETURN_IF_ERROR(check_sum(Fnv1a64(data)));
  if (key != nullptr)
    GRIDSYNC_RETURN_IF_ERROR(CheckManifestMac(manifest, json_path, bin_path, data, *key));
  if (run != nullptr) *run = manifest.run;
  return data;
}

}  // namespace

Result<std::string> ReadCheckpointPart(const std::string& dir, uint64_t step,
                                       const std::string& part, const nlohmann::json& shape,
                                       std::optional<uint64_t> state_bytes, std::string* run,
                                       const CheckpointMacKey* key) {
  return ReadPart(dir, step, part, &shape, state_bytes, run, key);
}

Status SetPartAside(const std::string& dir, uint64_t step, const std::string& part) {
  const std::string base = Base(dir, step, part);
  for (const char* ext : {".json", ".bin"}) {
    const std::string from = base + ext, to = from + ".damaged";
    std::error_code ec;
    if (!fs::exists(fs::symlink_status(from, ec))) continue;
    fs::rename(from, to, ec);
    if (ec) return Status::IOError("cannot set " + from + " aside as " + to + ": " + ec.message());
  }
  return Status::OK();
}

Status CheckCheckpointPartIntact(const std::string& dir, uint64_t step, const std::string& part,
                                 const CheckpointMacKey* key) {
  return ReadPart(dir, step, part, nullptr, std::nullopt, nullptr, key, /*keep_data=*/false)
      .status();
}

Status IntactMemo::Check(const std::string& dir, uint64_t step, const std::string& part,
                         const CheckpointMacKey* key) {
  const auto [at, fresh] = checked_.try_emplace({step, part});
  if (fresh) at->second = CheckCheckpointPartIntact(dir, step, part, key);
  return at->second;
}

uint64_t NewestIntactCompleteStep(const std::string& dir, const std::vector<std::string>& parts,
                                  uint64_t step, std::vector<DamagedPart>* damaged,
                                  const PartMacKeys& keys, IntactMemo* memo) {
  while (step > 0) {
    Status intact;
    std::string failed;
    for (const auto& part : parts) {
      const CheckpointMacKey* key = keys ? keys(part) : nullptr;
      intact = memo != nullptr ? memo->Check(dir, step, part, key)
                               : CheckCheckpointPartIntact(dir, step, part, key);
      if (!intact.ok()) {
        failed = part;
        break;
      }
    }
    // Anything but damage (a file it may not read) is the part's to
    // report, naming it: the step stands.
    if (intact.code() != StatusCode::kCorruption) return step;
    if (damaged != nullptr) damaged->push_back({step, failed, intact.message()});
    step = LatestCompleteStep(dir, parts, step);
  }
  return 0;
}

Status CheckStepIsOneRun(const std::string& dir, uint64_t step,
                         const std::vector<std::string>& parts) {
  std::vector<std::string> present, runs;
  for (const auto& part : parts) {
    const std::string json_path = Base(dir, step, part) + ".json";
    std::error_code ec;
    if (!fs::exists(json_path, ec)) continue;
    GRIDSYNC_ASSIGN_OR_RETURN(const Manifest manifest, ReadManifest(json_path));
    present.push_back(part);
    runs.push_back(manifest.run);
  }
  std::string with, common_run;
  const std::string apart = RunsApart(present, runs, &with, &common_run);
  if (apart.empty()) return Status::OK();
  return Status::CheckpointsHeld(fmt::format(
      "the files of {} in {} belong to another run than those of {} (run {}): a step's parts "
      "must all be one run's (another run's files were copied in, or two runs shared the "
      "folder); allowed: every part's files of the step as one run wrote them",
      apart, StepDir(dir, step), with, common_run));
}

Result<Manifest> ReadPartManifest(const std::string& dir, uint64_t step, const std::string& part) {
  return ReadManifest(Base(dir, step, part) + ".json");
}

Result<std::string> PartRun(const std::string& dir, uint64_t step, const std::string& part) {
  GRIDSYNC_ASSIGN_OR_RETURN(const Manifest manifest, ReadPartManifest(dir, step, part));
  return manifest.run;
}

uint64_t LatestCompleteStep(const std::string& dir, const std::vector<std::string>& parts,
                            uint64_t below) {
  std::error_code ec;
  uint64_t best = 0;
  for (uint64_t step : Steps(dir)) {
    if (step >= below) break;  // ascending
    bool complete = true;
    for (const auto& part : parts) {
      complete = complete && fs::exists(Base(dir, step, part) + ".json", ec);
    }
    if (complete) best = step;
  }
  return best;
}

Status CheckFreshStart(const std::string& dir, const std::vector<std::string>& parts,
                       const std::vector<std::string>& job_parts, uint64_t run_steps) {
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
  // holds here (parts on other machines keep theirs in their own folders)
  // whose files are intact, as gridsync launch --resume chooses it (the
  // units' --resume-step at a damaged step would fail on its file). Read
  // on this refusal only.
  std::vector<DamagedPart> damaged;
  const uint64_t complete =
      NewestIntactCompleteStep(dir, job_parts, LatestCompleteStep(dir, job_parts), &damaged);
  std::string damage;
  for (const DamagedPart& d : damaged)
    damage += fmt::format("step {} holds every part of the job, but {}; ", d.step, d.why);
  const std::string resume =
      complete > 0 && run_steps > 0 && complete >= run_steps
          ? fmt::format(
                "step {} holds every part of the job and is its last (training.steps "
                "{}): that run finished, so a resume has nothing to train; raise "
                "training.steps and resume (gridsync launch --resume) to train it "
                "further, or ",
                complete, run_steps)
      : complete > 0
          ? fmt::format(
                "{}resume it from step {}, the newest step every part of the job holds here "
                "intact (gridsync launch --resume; for the units --resume-step {} for "
                "gridsync-ps and --start-step {} for gridsync-worker), or ",
                damage, complete, complete, complete)
          : damage +
                (damage.empty() ? "no step here holds every part of the job"
                                : "and no older step holds every part intact") +
                ", so no resume from this folder alone; ";
  return Status::CheckpointsHeld(fmt::format(
      "checkpoint.dir {} holds checkpoints this job did not write: {}; starting afresh would "
      "delete them with its first checkpoint. Allowed: {}move the folder away or set "
      "checkpoint.dir elsewhere to start afresh",
      dir, names, resume));
}

}  // namespace gridsync
