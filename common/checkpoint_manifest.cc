// The format of a checkpoint part's manifest (checkpoint_manifest.h).
#include "common/checkpoint_manifest.h"

#include <spdlog/fmt/fmt.h>
#include <sys/stat.h>

#include <unordered_set>
#include <vector>

#include "common/checkpoint_files.h"
#include "common/checkpoint_run.h"
#include "common/file_bytes.h"

namespace gridsync::checkpoint_manifest {

std::string Cut(const nlohmann::json& value) {
  std::string text = value.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
  if (text.size() > 200) text = text.substr(0, 200) + "...";
  return text;
}

Status BadField(const std::string& what, const std::string& field, const std::string& problem,
                const std::string& allowed) {
  return Status::Corruption(
      fmt::format("{}: {} {}; allowed: {} (the manifest WriteCheckpointPart writes)", what, field,
                  problem, allowed));
}

namespace {

// What a part's MAC covers besides its .bin: every field of its manifest
// that the reader trusts, one a line (the part and the run hold no line
// break: the reader checks them first).
std::string MacFields(uint64_t step, const std::string& part, const nlohmann::json& shape,
                      uint64_t bytes, const std::string& fnv1a64, const std::string& run) {
  return fmt::format(
      "gridsync checkpoint part v1\nstep {}\npart {}\nrun {}\nbytes {}\nfnv1a64 {}\nshape {}\n",
      step, part, run, bytes, fnv1a64,
      shape.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace));
}

// Nothing a manifest holds nests deeper than the callers' shapes do (a
// worker's: manifest, shape, tables, a table's [rows, width]); deeper
// values are dropped while parsing (the parser itself does not recurse) and
// the file refused, so that comparing or printing the shape cannot recurse
// as deep as a forged file nests.
constexpr int kMaxManifestDepth = 8;

// What a value is, for an error message: "a string ("5")", "an array",
// "the number -1".
std::string Described(const nlohmann::json& value) {
  if (value.is_number()) return "the number " + Cut(value);
  if (value.is_string()) return "a string (" + Cut(value) + ")";
  if (value.is_null()) return "null";
  const std::string type = value.type_name();
  return (type[0] == 'a' || type[0] == 'o' ? "an " : "a ") + type;
}

// The member `field` of `doc`; a refusal naming the file and the field when
// it is missing or `is_allowed` refuses its type. Never throws: every access
// of a manifest's bytes goes through here (a wrong type would otherwise throw
// nlohmann::json::type_error, which aborts the process).
template <typename IsAllowed>
Result<const nlohmann::json*> Field(const nlohmann::json& doc, const std::string& what,
                                    const char* field, IsAllowed is_allowed, const char* allowed) {
  const auto it = doc.find(field);
  if (it == doc.end()) return BadField(what, field, "is missing", allowed);
  if (!is_allowed(*it)) {
    return BadField(what, field, "is " + Described(*it), allowed);
  }
  return &*it;
}

// Whether `v` is a string of exactly `digits` lowercase hex digits (a
// checksum, a MAC).
bool IsLowerHex(const nlohmann::json& v, size_t digits) {
  if (!v.is_string()) return false;
  const auto& s = v.get_ref<const std::string&>();
  return s.size() == digits && s.find_first_not_of("0123456789abcdef") == std::string::npos;
}

}  // namespace

std::string EncodeManifest(uint64_t step, const std::string& part, const nlohmann::json& shape,
                           std::string_view data, const std::string& run,
                           const CheckpointMacKey* key) {
  const std::string fnv = fmt::format("{:016x}", Fnv1a64(data));
  nlohmann::json doc = {{"step", step},         {"part", part},   {"shape", shape},
                        {"bytes", data.size()}, {"fnv1a64", fnv}, {"run", run}};
  if (key != nullptr)
    doc["mac"] = key->Mac(MacFields(step, part, shape, data.size(), fnv, run), data);
  return doc.dump();
}

Result<Manifest> DecodeManifest(std::string_view text, const std::string& what) {
  using Event = nlohmann::json::parse_event_t;
  bool too_deep = false;
  // A key twice in one object: the parser keeps the last silently, so a
  // forged second "bytes" or "step" would be read past the first (the
  // config loader refuses duplicates the same way).
  std::vector<std::unordered_set<std::string>> keys;  // one per open object or array
  std::string duplicate;
  auto watch = [&](int depth, Event event, nlohmann::json& parsed) {
    const bool starts = event == Event::object_start || event == Event::array_start;
    if (starts && depth >= kMaxManifestDepth) too_deep = true;
    if (too_deep) return false;
    if (starts) keys.emplace_back();
    if ((event == Event::object_end || event == Event::array_end) && !keys.empty()) keys.pop_back();
    if (event == Event::key && !keys.empty() && duplicate.empty() &&
        !keys.back().insert(parsed.get<std::string>()).second) {
      duplicate = parsed.get<std::string>();
    }
    return true;
  };
  const auto doc =
      nlohmann::json::parse(text.begin(), text.end(), watch, /*allow_exceptions=*/false);
  if (too_deep) {
    return BadField(what, "a value", fmt::format("nests deeper than {} levels", kMaxManifestDepth),
                    "the shapes gridsync writes");
  }
  if (!doc.is_discarded() && !duplicate.empty()) {
    return BadField(what, "key " + Cut(nlohmann::json(duplicate)), "appears twice in one object",
                    "each key once");
  }
  if (doc.is_discarded()) return BadField(what, "the file", "is not JSON", "a JSON object");
  if (!doc.is_object()) {
    return BadField(what, "the file", "is " + Described(doc), "a JSON object");
  }
  const auto is_unsigned = [](const nlohmann::json& v) { return v.is_number_unsigned(); };
  const auto is_string = [](const nlohmann::json& v) { return v.is_string(); };
  const auto is_checksum = [](const nlohmann::json& v) { return IsLowerHex(v, 16); };
  const auto is_any = [](const nlohmann::json&) { return true; };
  const char* const kUnsigned = "an unsigned integer";
  Manifest m;
  GRIDSYNC_ASSIGN_OR_RETURN(const nlohmann::json* step,
                            Field(doc, what, "step", is_unsigned, kUnsigned));
  GRIDSYNC_ASSIGN_OR_RETURN(const nlohmann::json* part,
                            Field(doc, what, "part", is_string, "a string"));
  GRIDSYNC_ASSIGN_OR_RETURN(const nlohmann::json* shape,
                            Field(doc, what, "shape", is_any, "any JSON value"));
  GRIDSYNC_ASSIGN_OR_RETURN(const nlohmann::json* bytes,
                            Field(doc, what, "bytes", is_unsigned, kUnsigned));
  GRIDSYNC_ASSIGN_OR_RETURN(
      const nlohmann::json* sum,
      Field(doc, what, "fnv1a64", is_checksum, "a string of 16 lowercase hex digits"));
  m.step = step->get<uint64_t>();
  m.part = part->get<std::string>();
  m.shape = *shape;
  m.bytes = bytes->get<uint64_t>();
  m.fnv1a64 = sum->get<std::string>();
  // Optional: manifests written before runs were named have none.
  if (const auto it = doc.find("run"); it != doc.end()) {
    if (!it->is_string() || !IsRunId(it->get_ref<const std::string&>())) {
      return BadField(what, "run", "is " + Described(*it), "up to 64 lowercase hex digits");
    }
    m.run = it->get<std::string>();
  }
  // Optional: manifests written without CURVE have none.
  if (const auto it = doc.find("mac"); it != doc.end()) {
    if (!IsLowerHex(*it, 64))
      return BadField(what, "mac", "is " + Described(*it), "64 lowercase hex digits");
    m.mac = it->get<std::string>();
  }
  return m;
}

Status CheckRegularIfPresent(const std::string& path) {
  struct stat info {};
  if (::stat(path.c_str(), &info) != 0 || S_ISREG(info.st_mode)) return Status::OK();
  return Status::Corruption(path + " is " + FileKindName(info.st_mode) +
                            ", where gridsync writes a file (damaged)");
}

Result<Manifest> ReadManifest(const std::string& json_path) {
  GRIDSYNC_RETURN_IF_ERROR(CheckRegularIfPresent(json_path));
  GRIDSYNC_ASSIGN_OR_RETURN(const uint64_t size, FileSize(json_path));
  if (size > kMaxManifestBytes) {
    return BadField(json_path, "the file", fmt::format("holds {} bytes", size),
                    fmt::format("at most {}", kMaxManifestBytes));
  }
  GRIDSYNC_ASSIGN_OR_RETURN(const std::string text, ReadFileOfSize(json_path, size));
  return DecodeManifest(text, json_path);
}

std::string MacFieldsOf(const Manifest& manifest) {
  return MacFields(manifest.step, manifest.part, manifest.shape, manifest.bytes, manifest.fnv1a64,
                   manifest.run);
}

Status CheckManifestMac(const Manifest& manifest, const std::string& json_path,
                        const std::string& bin_path, std::string_view data,
                        const CheckpointMacKey& key) {
  // Without a MAC nothing is computed.
  if (manifest.mac.empty()) return CheckManifestMacIs(manifest, json_path, bin_path, "");
  return CheckManifestMacIs(manifest, json_path, bin_path, key.Mac(MacFieldsOf(manifest), data));
}

Status CheckManifestMacIs(const Manifest& manifest, const std::string& json_path,
                          const std::string& bin_path, std::string_view mac) {
  // Under CURVE a part must prove who wrote it: one without a MAC was
  // written without CURVE (or had its MAC removed), one whose MAC differs
  // was changed, or written with other keys, since.
  // Damage, as a wrong MAC is (set aside, and the next older step
  // tried): whoever can strip the field could otherwise make a forged
  // step stand, and every process refuse it at start.
  if (manifest.mac.empty()) {
    return Status::Corruption(
        json_path +
        ": no mac, while security.curve is on (written with security.mode \"off\", by a "
        "gridsync from before checkpoint MACs, or its mac removed); allowed: files written by "
        "this job's processes under CURVE (resume files without one with security.mode "
        "\"off\", on a trusted network)");
  }
  if (!CheckpointMacKey::SameMac(mac, manifest.mac)) {
    return Status::Corruption(
        json_path + ": its mac does not match the manifest and " + bin_path +
        " (changed since they were written, or written with other keys); allowed: files "
        "written by this job's processes with the keys of security.keys_dir");
  }
  return Status::OK();
}

}  // namespace gridsync::checkpoint_manifest
