// A 32-byte key for one use, derived from a role's CURVE secret: the
// checkpoint MAC key (common/checkpoint_mac_key.h) and the workers'
// collective key (worker/collective/collective_seal.h). Every machine that
// runs a role already holds its secret (and only those machines do), so no
// second secret needs making, copying and guarding; the context keeps the
// uses' keys apart.
//
// Thread safety: reentrant.
#pragma once

#include <array>
#include <string_view>

#include "common/status.h"

namespace gridsync {

// *key = BLAKE2b-256 of `context`, keyed by the secret's Z85 text (40
// characters, as <role>.key holds it; a one-to-one spelling of its 32
// bytes). InvalidArgument for another length, *key untouched.
Status DeriveFromCurveSecret(std::string_view context, std::string_view secret_z85,
                             std::array<unsigned char, 32>* key);

}  // namespace gridsync
