#include "common/curve_derived_key.h"

#include <sodium.h>

#include <string>

namespace gridsync {

Status DeriveFromCurveSecret(std::string_view context, std::string_view secret_z85,
                             std::array<unsigned char, 32>* key) {
  constexpr size_t kZ85SecretChars = 40;  // 32 bytes in Z85
  if (secret_z85.size() != kZ85SecretChars) {
    return Status::InvalidArgument("a CURVE secret key of " + std::to_string(secret_z85.size()) +
                                   " characters; allowed: 40 (Z85, as gridsync keygen writes)");
  }
  // Safe to call again and from any thread; it picks BLAKE2b's kernel.
  if (sodium_init() < 0) return Status::Internal("libsodium failed to initialise");
  crypto_generichash(key->data(), key->size(),
                     reinterpret_cast<const unsigned char*>(context.data()), context.size(),
                     reinterpret_cast<const unsigned char*>(secret_z85.data()), secret_z85.size());
  return Status::OK();
}

}  // namespace gridsync
