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
  crypto_generichash_state state;
  std::array<unsigned char, 32> mac{};
  crypto_generichash_init(&state, key_.data(), key_.size(), mac.size());
  // The fields' length first: no split of fields + bin into two other
  // strings hashes the same.
  unsigned char length[8];
  uint64_t n = fields.size();
  for (unsigned char& byte : length) {
    byte = static_cast<unsigned char>(n & 0xff);
    n >>= 8;
  }
  crypto_generichash_update(&state, length, sizeof(length));
  crypto_generichash_update(&state, reinterpret_cast<const unsigned char*>(fields.data()),
                            fields.size());
  crypto_generichash_update(&state, reinterpret_cast<const unsigned char*>(bin.data()), bin.size());
  crypto_generichash_final(&state, mac.data(), mac.size());
  std::string hex(2 * mac.size() + 1, '\0');  // and its terminating NUL
  sodium_bin2hex(hex.data(), hex.size(), mac.data(), mac.size());
  hex.pop_back();
  return hex;
}

}  // namespace gridsync
