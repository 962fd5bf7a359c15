#include "common/checkpoint_mac_key.h"

#include <sodium.h>

#include <cstdint>

namespace gridsync {

namespace {

// Distinguishes this key from any other use of the same secret.
constexpr std::string_view kKeyContext = "gridsync checkpoint key v1";
constexpr size_t kZ85SecretChars = 40;  // 32 bytes in Z85

}  // namespace

Result<CheckpointMacKey> CheckpointMacKey::FromCurveSecret(std::string_view secret_z85) {
  if (secret_z85.size() != kZ85SecretChars) {
    return Status::InvalidArgument("a CURVE secret key of " + std::to_string(secret_z85.size()) +
                                   " characters; allowed: 40 (Z85, as gridsync keygen writes)");
  }
  // Safe to call again and from any thread; it picks BLAKE2b's kernel.
  if (sodium_init() < 0) return Status::Internal("libsodium failed to initialise");
  CheckpointMacKey key;
  // The Z85 text is a one-to-one spelling of the 32 secret bytes, so it
  // keys the derivation as they would.
  crypto_generichash(key.key_.data(), key.key_.size(),
                     reinterpret_cast<const unsigned char*>(kKeyContext.data()), kKeyContext.size(),
                     reinterpret_cast<const unsigned char*>(secret_z85.data()), secret_z85.size());
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
