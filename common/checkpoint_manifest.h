// A checkpoint part's manifest (<dir>/step-<s>/<part>.json): its format,
// written and read in one place, the decode boundary of the files a process
// reads back at restart (common/checkpoint_files.h says what the files are
// and how they are written and checked).
//
// The manifest names the part's step, part, shape, byte count, FNV-1a 64
// checksum of the .bin, its run and, under CURVE, a MAC of all that and the
// .bin (common/checkpoint_mac_key.h). Decoding trusts no byte: the size is
// checked before the file is read, nesting is bounded while parsing, a key
// twice in one object is refused, and each field is checked for presence
// and type; every refusal is Corruption naming the file and the field.
//
// Thread safety: free functions without shared state.
#pragma once

#include <cstdint>
#include <nlohmann/json.hpp>
#include <string>
#include <string_view>

#include "common/checkpoint_mac_key.h"
#include "common/status.h"

namespace gridsync::checkpoint_manifest {

// A checkpoint's manifest, as WriteCheckpointPart writes it.
struct Manifest {
  uint64_t step = 0;
  std::string part;
  nlohmann::json shape;
  uint64_t bytes = 0;
  std::string fnv1a64;
  std::string run;  // "": written before runs were named
  std::string mac;  // "": written without CURVE (common/checkpoint_mac_key.h)
};

// The manifest of part `part` of step `step` whose .bin holds `data`; with a
// key, its MAC too.
std::string EncodeManifest(uint64_t step, const std::string& part, const nlohmann::json& shape,
                           std::string_view data, const std::string& run,
                           const CheckpointMacKey* key);

// The manifest in `text` (the file `what`, for the errors).
Result<Manifest> DecodeManifest(std::string_view text, const std::string& what);

// OK unless `path` is there and no regular file (a folder, a FIFO, a
// device, or a link to one): Corruption naming its kind. gridsync writes
// regular files, so such a manifest or .bin is damage, passed over and set
// aside like a bad checksum (a manifest that was a folder refused the
// whole resume, exit 3, with an intact older step; the same .bin kept its
// step, and the shard failed at start).
Status CheckRegularIfPresent(const std::string& path);

// The manifest at `json_path`, its size checked first, from the file
// system: nothing is read, nor memory taken, for a file larger than any
// manifest (kMaxManifestBytes).
Result<Manifest> ReadManifest(const std::string& json_path);

// Whether `manifest`'s MAC (read from `json_path`) proves that `key`'s role
// wrote it with `data`, the .bin at `bin_path`: Corruption when it has none
// or it differs, i.e. damage the rejoins and the resume set aside.
Status CheckManifestMac(const Manifest& manifest, const std::string& json_path,
                        const std::string& bin_path, std::string_view data,
                        const CheckpointMacKey& key);
// The same check with the MAC already computed (`mac`: the key's Hasher fed
// MacFieldsOf(manifest) and the .bin, read in pieces).
Status CheckManifestMacIs(const Manifest& manifest, const std::string& json_path,
                          const std::string& bin_path, std::string_view mac);
// What a part's MAC covers besides its .bin: the manifest's trusted fields.
std::string MacFieldsOf(const Manifest& manifest);

// A refusal of field `field` of the manifest `what`: "<what>: <field>
// <problem>; allowed: <allowed> (...)".
Status BadField(const std::string& what, const std::string& field, const std::string& problem,
                const std::string& allowed);

// A JSON value for an error message, cut short: a forged manifest's shape
// may be as large as the file.
std::string Cut(const nlohmann::json& value);

}  // namespace gridsync::checkpoint_manifest
