#include "worker/collective/collective_seal.h"

#include <sodium.h>
#include <spdlog/fmt/fmt.h>

#include "common/curve_derived_key.h"

namespace gridsync {

namespace {

// Distinguishes this key from any other use of the same secret (the
// checkpoint MAC key is derived from it too, under its own context).
constexpr std::string_view kKeyContext = "gridsync collective key v1";

using Nonce = std::array<unsigned char, crypto_aead_xchacha20poly1305_ietf_NPUBBYTES>;

// Little-endian fields of the route, zero-padded to the nonce's 24 bytes.
Nonce NonceOf(const CollectiveSeal::Route& route) {
  Nonce nonce{};
  size_t at = 0;
  const auto put = [&](uint64_t value, size_t bytes) {
    for (size_t i = 0; i < bytes; ++i) nonce[at++] = static_cast<unsigned char>(value >> (8 * i));
  };
  put(route.sender, 4);
  put(route.receiver, 4);
  put(route.operation, 8);
  put(route.index, 4);
  put(route.part, 4);
  return nonce;
}

}  // namespace

Result<CollectiveSeal> CollectiveSeal::FromCurveSecret(std::string_view secret_z85) {
  CollectiveSeal seal;
  GRIDSYNC_RETURN_IF_ERROR(DeriveFromCurveSecret(kKeyContext, secret_z85, &seal.key_));
  return seal;
}

CollectiveSeal CollectiveSeal::ForSession(std::string_view session) const {
  CollectiveSeal derived;
  crypto_generichash(derived.key_.data(), derived.key_.size(),
                     reinterpret_cast<const unsigned char*>(session.data()), session.size(),
                     key_.data(), key_.size());
  return derived;
}

SessionSeals SessionSeals::Of(const CollectiveSeal& workers, std::string_view session) {
  const CollectiveSeal mesh = workers.ForSession(session);
  return {mesh.ForSession("check"), mesh.ForSession("group")};
}

CollectiveSeal::~CollectiveSeal() { sodium_memzero(key_.data(), key_.size()); }

void CollectiveSeal::Seal(const void* plain, size_t n, const Route& route, uint8_t* out) const {
  const Nonce nonce = NonceOf(route);
  unsigned long long written = 0;
  crypto_aead_xchacha20poly1305_ietf_encrypt(out, &written,
                                             static_cast<const unsigned char*>(plain), n, nullptr,
                                             0, nullptr, nonce.data(), key_.data());
}

Status CollectiveSeal::Open(const uint8_t* sealed, size_t sealed_n, const Route& route,
                            void* plain) const {
  const auto what = [&] {
    return fmt::format(
        "a collective message from rank {} to rank {} (operation {}, message {}, part {})",
        route.sender, route.receiver, route.operation, route.index, route.part);
  };
  if (sealed_n < kTagBytes) {
    return Status::Corruption(
        fmt::format("{}: {} bytes, shorter than its {}-byte tag", what(), sealed_n, kTagBytes));
  }
  const Nonce nonce = NonceOf(route);
  unsigned long long opened = 0;
  if (crypto_aead_xchacha20poly1305_ietf_decrypt(static_cast<unsigned char*>(plain), &opened,
                                                 nullptr, sealed, sealed_n, nullptr, 0,
                                                 nonce.data(), key_.data()) != 0) {
    return Status::Corruption(fmt::format(
        "{} failed its authentication: changed on the way, sealed under another key (another "
        "worker.key, run or mesh) or sent for another operation; allowed: messages the group's "
        "ranks sealed for this one",
        what()));
  }
  return Status::OK();
}

}  // namespace gridsync
