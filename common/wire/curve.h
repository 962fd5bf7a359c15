// CURVE keys for the data plane (ZeroMQ's CurveZMQ: Curve25519 key exchange,
// authenticated encryption of every frame) and the ZAP handler a shard runs
// to admit only listed client keys.
//
// Keys are per role: keys_dir holds <role>.key (public and secret key, Z85,
// mode 0600) and <role>.pub (public key only) for the roles shard, worker
// and observer; `gridsync keygen DIR` writes them. A machine needs the
// secret file of the roles it runs and the .pub files of its peers. A shard
// admits workers and observers; a worker trusts shards by shard.pub.
//
// Thread safety: the functions are reentrant; a ZapHandler serves on its own
// thread and is stopped by its destructor.
#pragma once

#include <array>
#include <atomic>
#include <initializer_list>
#include <map>
#include <optional>
#include <set>
#include <string>
#include <thread>
#include <zmq.hpp>

#include "common/checkpoint_mac_key.h"
#include "common/config.h"
#include "common/logging.h"
#include "common/status.h"

namespace gridsync::wire {

struct CurveKeyPair {
  std::string public_z85;  // 40 characters
  std::string secret_z85;  // 40 characters
};

Result<CurveKeyPair> GenerateCurveKeyPair();
// Writes dir/name.key (0600) and dir/name.pub, creating dir (0700).
Status WriteCurveKeyPair(const std::string& dir, const std::string& name, const CurveKeyPair& keys);
// Reads dir/name.key, or dir/name.pub (public key only; secret left empty).
Result<CurveKeyPair> LoadCurveKeyPair(const std::string& dir, const std::string& name);
Result<std::string> LoadCurvePublicKey(const std::string& dir, const std::string& name);

// What a data-plane socket needs: on, its own key pair, and (clients) the
// server's public key or (servers) the client keys to admit.
struct CurveSettings {
  bool on = false;
  CurveKeyPair own;
  std::string server_public_z85;  // client side
  // Server side: the client keys to admit, each with its role ("worker",
  // "observer"), which ZAP hands ZeroMQ as the connection's User-Id, so
  // that every message a client sends names the role its key proves.
  std::map<std::string, std::string> allowed_z85;
};

// The role a CURVE client's key proved (its ZAP User-Id), read from a
// message it sent; empty without CURVE.
std::string CurveRoleOf(const zmq::message_t& received);

// The settings of a process of `role` ("shard", "worker" or "observer")
// under config.security: off unless security.curve; a shard loads
// shard.key and admits worker.pub and observer.pub (each when present, at
// least one); the others load <role>.key and trust shard.pub.
Result<CurveSettings> CurveSettingsFor(const Config& config, const std::string& role);

// The secret of `role`'s own key pair (<keys_dir>/<role>.key, Z85) under
// config.security: none without security.curve; errors name security.keys_dir.
Result<std::optional<std::string>> OwnCurveSecretFor(const Config& config, const std::string& role);

// The key that authenticates `role`'s checkpoint files ("shard" or
// "worker": common/checkpoint_mac_key.h) under config.security: none without
// security.curve; else derived from <keys_dir>/<role>.key, the secret the
// role's processes load for their connections anyway. Made once per process
// and passed down to its checkpoint reads and writes.
Result<std::optional<CheckpointMacKey>> CheckpointMacKeyFor(const Config& config,
                                                            const std::string& role);

// The control plane's key-based challenge (security.curve), with the same
// role keys plus coordinator.key: a client proves its role by boxing the
// coordinator's random challenge with the role's secret key
// (crypto_box: X25519 + XSalsa20-Poly1305, the primitives of CurveZMQ).
struct ControlAuth {
  bool on = false;
  CurveKeyPair own;                                // the client's role key, or the coordinator's
  std::string coordinator_public;                  // client side: coordinator.pub
  std::map<std::string, std::string> role_public;  // coordinator side: role -> .pub
};
// role: "shard", "worker", "observer" (a client) or "coordinator".
Result<ControlAuth> ControlAuthFor(const Config& config, const std::string& role);
// OK when each of `roles` ("coordinator", "shard", "worker") would load its
// keys (control plane, and data plane but under nccl, which has none) as
// the process loads them at its start; the first error otherwise. OK
// without security.curve. One check for check-config, `gridsync launch`
// (the roles it starts here) and the worker (before its image loads), so
// that a key file they would refuse fails them all with exit 2 and the
// same words.
Status CheckRoleKeys(const Config& config, std::initializer_list<const char*> roles);
// The client's proof for `challenge`: (nonce, box), or an error.
Status BoxChallenge(const ControlAuth& auth, const std::string& challenge, std::string* nonce,
                    std::string* box);
// The coordinator's check of a proof claimed for `role`.
Status OpenChallenge(const ControlAuth& auth, const std::string& role, const std::string& challenge,
                     const std::string& nonce, const std::string& box);
std::string RandomBytes(size_t n);

// The control plane after a proof: every frame is sealed (XSalsa20-Poly1305,
// crypto_secretbox) under a key both ends derive from their long-term keys
// (X25519 of the role key and the coordinator key) and the connection's
// random challenge, so it is secret, and a frame altered, injected,
// reordered or replayed (from this or an earlier connection) fails to open
// and ends the connection. Nonces count frames per direction. Only the real
// coordinator can derive the key, so the client also learns who answers.
//
// Thread safety: one per connection, used by its reader and writer in turn.
class ControlSession {
 public:
  // Coordinator side: the role's public key. Client side: coordinator.pub.
  static Result<ControlSession> Derive(const ControlAuth& auth, const std::string& peer_public_z85,
                                       const std::string& challenge, bool coordinator_side);
  static constexpr size_t kOverhead = 16;  // crypto_secretbox_MACBYTES

  // A frame (length prefix + body) sealed: the new prefix, then the sealed body.
  std::vector<uint8_t> Seal(const std::vector<uint8_t>& frame);
  // A sealed body (no prefix) opened, or an error when it does not open.
  Result<std::vector<uint8_t>> Open(const uint8_t* body, size_t length);

 private:
  std::array<uint8_t, 32> key_{};
  uint8_t send_direction_ = 0, receive_direction_ = 0;
  uint64_t sent_ = 0, received_ = 0;
};

// Applies the settings to a socket before bind/connect.
Status ApplyCurveServer(zmq::socket_t& socket, const CurveSettings& settings);
Status ApplyCurveClient(zmq::socket_t& socket, const CurveSettings& settings);

// ZeroMQ's authentication protocol (ZAP, RFC 27) for one context: admits a
// CURVE client only when its public key is listed, with the key's role as
// the connection's User-Id, refuses everything else, and logs refusals
// with `who` (for example "shard 0") within a LogBudget (a peer with an
// unlisted key reconnecting in a loop wrote a line per try: a review).
class ZapHandler {
 public:
  ZapHandler(zmq::context_t& context, std::map<std::string, std::string> allowed_z85,
             std::string who);
  ~ZapHandler();
  ZapHandler(const ZapHandler&) = delete;
  ZapHandler& operator=(const ZapHandler&) = delete;
  uint64_t refused() const { return refused_.load(); }

 private:
  void Serve();
  zmq::socket_t socket_;
  std::map<std::string, std::string> allowed_;  // key -> role
  std::string who_;
  std::atomic<bool> stop_{false};
  std::atomic<uint64_t> refused_{0};
  LogBudget refusal_log_{"refused CURVE connections"};  // Serve's thread only
  std::thread thread_;
};

}  // namespace gridsync::wire
