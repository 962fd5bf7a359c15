#include "common/checkpoint_mac_key.h"

#include <sodium.h>

#include <cstdint>

#include "common/curve_derived_key.h"

namespace gridsync {

namespace {

// Distinguishes this key from any other use of the same secret.
constexpr std::string_view kKeyContext = "gridsync checkpoint key v1";

}  // namespace

Result<CheckpointMacKey> CheckpointMacKey::FromCurveSecret(std::string_view secret_z85) {
  CheckpointMacKey key;
  GRIDSYNC_RETURN_IF_ERROR(DeriveFromCurveSecret(kKeyContext, secret_z85, &key.key_));
  return key;
}

CheckpointMacKey::~CheckpointMacKey() { sodium_memzero(key_.data(), key_.size()); }

bool CheckpointMacKey::SameMac(std::string_view mac, std::string_view expected) {
  return mac.size() == expected.size() &&
         sodium_memcmp(mac.data(), expected.data(), mac.size()) == 0;
}

std::string CheckpointMacKey::Mac(std::string_view fields, std::string_view bin) const {
  Hasher hasher(*this, fields);
  hasher.Add(bin);
  return hasher.Finish();
}

namespace {

static_assert(sizeof(crypto_generichash_state) <= 384 && alignof(crypto_generichash_state) <= 64,
              "CheckpointMacKey::Hasher::state_ holds a crypto_generichash_state");
constexpr size_t kMacBytes = 32;

crypto_generichash_state* StateIn(std::array<unsigned char, 384>& storage) {
  return reinterpret_cast<crypto_generichash_state*>(storage.data());
}

}  // namespace

CheckpointMacKey::Hasher::Hasher(const CheckpointMacKey& key, std::string_view fields) {
  crypto_generichash_init(StateIn(state_), key.key_.data(), key.key_.size(), kMacBytes);
  // The fields' length first: no split of fields + bin into two other
  // strings hashes the same.
  unsigned char length[8];
  uint64_t n = fields.size();
  for (unsigned char& byte : length) {
    byte = static_cast<unsigned char>(n & 0xff);
    n >>= 8;
  }
  crypto_generichash_update(StateIn(state_), length, sizeof(length));
  Add(fields);
}

void CheckpointMacKey::Hasher::Add(std::string_view piece) {
  crypto_generichash_update(StateIn(state_), reinterpret_cast<const unsigned char*>(piece.data()),
                            piece.size());
}

std::string CheckpointMacKey::Hasher::Finish() {
  std::array<unsigned char, kMacBytes> mac{};
  crypto_generichash_final(StateIn(state_), mac.data(), mac.size());
  sodium_memzero(state_.data(), state_.size());
  std::string hex(2 * mac.size() + 1, '\0');  // and its terminating NUL
  sodium_bin2hex(hex.data(), hex.size(), mac.data(), mac.size());
  hex.pop_back();
  return hex;
}

}  // namespace gridsync
