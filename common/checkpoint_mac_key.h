// The key that authenticates a role's checkpoint files, and their MAC.
//
// Under CURVE (security.curve) every part's manifest carries a MAC of the
// part: BLAKE2b-256 (libsodium's crypto_generichash), keyed by a key derived
// from the CURVE secret of the role that writes the part (shard.key for the
// shards' parts, worker.key for the workers'), over the manifest's fields
// and the .bin's bytes (common/checkpoint_files.h). Whoever can write
// checkpoint.dir but cannot read the role's secret (gridsync keygen writes
// keys_dir 0700 and its .key files 0600) can no longer make or change
// files that load: a manifest whose step, part, run or size was edited, one
// step's files copied in as another's, or a state of their own with its
// checksum recomputed are refused. What a MAC cannot refuse is a replay of
// files the role itself wrote with the same keys: a whole step of another
// run (ps and hybrid parts name their run, but a resume takes the run from
// the files; nccl parts name none), or a step of an abandoned history of
// this run put back. Without CURVE there is no secret and no MAC: the FNV
// checksum finds damage, not forgery.
//
// Why keyed by the role's CURVE secret rather than a key of its own: every
// machine that runs a role already holds that secret (and only those
// machines), so no second secret needs making, copying and guarding.
//
// Thread safety: immutable once made; Mac may run on any thread.
#pragma once

#include <array>
#include <optional>
#include <string>
#include <string_view>

#include "common/status.h"

namespace gridsync {

class CheckpointMacKey {
 public:
  // The checkpoint key of the role whose CURVE secret key is `secret_z85`
  // (its Z85 text, 40 characters, as <role>.key holds it): every process of
  // the role derives the same key. InvalidArgument for another length.
  static Result<CheckpointMacKey> FromCurveSecret(std::string_view secret_z85);

  // The MAC of `fields` (the manifest's fields as checkpoint_files lays them
  // out) followed by `bin`, as 64 lowercase hex digits.
  std::string Mac(std::string_view fields, std::string_view bin) const;

  // Mac(fields, bin) of a .bin handed over in pieces, in order (a
  // checkpoint checked without holding it in memory): Add each, then
  // Finish once. Not thread-safe.
  class Hasher {
   public:
    Hasher(const CheckpointMacKey& key, std::string_view fields);
    void Add(std::string_view piece);
    std::string Finish();

   private:
    // libsodium's crypto_generichash_state, kept out of this header.
    alignas(64) std::array<unsigned char, 384> state_{};
  };

 private:
  CheckpointMacKey() = default;

 public:
  CheckpointMacKey(const CheckpointMacKey&) = default;
  CheckpointMacKey& operator=(const CheckpointMacKey&) = default;
  ~CheckpointMacKey();  // wipes the key

  // Whether `mac` (as Mac writes it) equals `expected`, in time that does
  // not depend on where they differ.
  static bool SameMac(std::string_view mac, std::string_view expected);

 private:
  std::array<unsigned char, 32> key_{};
};

// The key an optional holds, or null: what the checkpoint functions take
// (null: no MAC written or checked).
inline const CheckpointMacKey* KeyOrNull(const std::optional<CheckpointMacKey>& key) {
  return key ? &*key : nullptr;
}

}  // namespace gridsync
