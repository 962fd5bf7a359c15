// Sealing the Gloo collective's messages under CURVE: every message a rank
// sends a ring neighbour is encrypted and authenticated with
// XChaCha20-Poly1305 (libsodium's crypto_aead_xchacha20poly1305_ietf).
//
// Why: under gradient_sync "nccl" on CPU hosts the workers' gradients go
// worker to worker through Gloo's TCP pairs, which neither encrypt nor
// authenticate (a hostile probe saw 30 MB a step of gradients in the clear
// with security.mode "curve"). Debian's Gloo has no TLS transport, so the
// collective seals its own messages instead (worker/collective/sealed_ring.h
// runs the algorithms over them).
//
// Keys: the workers' key is derived from the worker role's CURVE secret
// (worker.key), which every worker machine already holds and only they do
// (as the checkpoint MAC key is, common/checkpoint_mac_key.h). Each formed
// mesh then seals under keys derived from it and the nonces the ranks
// published for that attempt of the rendezvous (SessionSeals: one for the
// mesh check, one for the group), so no two meshes, attempts, runs or uses
// share a key. Every worker holds the same worker.key, so a worker can pose
// as any rank; the seal keeps out whoever does not hold it.
//
// Nonces: a message's 24-byte nonce is not sent; sender and receiver both
// build it from (sender rank, receiver rank, the group's operation count,
// the message's index within the operation, the part). A session sends each such
// tuple once, so no nonce repeats under a key, and a message replayed from
// another operation, step or pair, or from another session, fails its
// authentication. The cost on the wire is the 16-byte tag a message.
//
// Thread safety: immutable once made; Seal and Open may run on any thread.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <string_view>

#include "common/status.h"

namespace gridsync {

class CollectiveSeal {
 public:
  static constexpr size_t kTagBytes = 16;  // Poly1305: what a message grows by

  // The workers' key, from the worker role's CURVE secret (its Z85 text, 40
  // characters, as worker.key holds it). InvalidArgument for another length.
  static Result<CollectiveSeal> FromCurveSecret(std::string_view secret_z85);

  // The key of one formed mesh: this key with `session` (the group, the
  // attempt and every rank's published nonce) hashed in.
  CollectiveSeal ForSession(std::string_view session) const;

  // Where a message goes: nonce and associated data are built from it.
  struct Route {
    uint32_t sender = 0;
    uint32_t receiver = 0;
    uint64_t operation = 0;  // the group's operation count
    uint32_t index = 0;      // the message's index within the operation
    uint32_t part = 0;       // the part of a message sealed in parts
  };

  // out (n + kTagBytes bytes) = plain sealed for `route`.
  void Seal(const void* plain, size_t n, const Route& route, uint8_t* out) const;
  // plain (sealed_n - kTagBytes bytes) = sealed opened for `route`;
  // Corruption when it was not sealed under this key for this route (bytes
  // changed on the way, another key, or a message of another operation,
  // step or pair), naming the route. `plain` may be written either way.
  Status Open(const uint8_t* sealed, size_t sealed_n, const Route& route, void* plain) const;

  CollectiveSeal(const CollectiveSeal&) = default;
  CollectiveSeal& operator=(const CollectiveSeal&) = default;
  ~CollectiveSeal();  // wipes the key

 private:
  CollectiveSeal() = default;
  std::array<unsigned char, 32> key_{};
};

// One formed mesh's two keys: its check (the rendezvous's all-reduce of
// nonces) and the group's operations. Apart, since both count operations
// from 1 and build the same nonces: under one key the check's messages and
// the group's first operation's would share key and nonce (a review).
struct SessionSeals {
  CollectiveSeal check;
  CollectiveSeal group;
  // The keys of the mesh `session` describes, under the workers' key.
  static SessionSeals Of(const CollectiveSeal& workers, std::string_view session);
};

}  // namespace gridsync
