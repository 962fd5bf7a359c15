#include "common/wire/curve.h"

#include <sodium.h>
#include <spdlog/fmt/fmt.h>
#include <spdlog/spdlog.h>
#include <sys/stat.h>

#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <memory>
#include <sstream>
#include <vector>

#include "common/file_bytes.h"

namespace gridsync::wire {
namespace {

bool IsZ85Key(const std::string& text) {
  if (text.size() != 40) return false;
  uint8_t raw[32];
  return zmq_z85_decode(raw, text.c_str()) != nullptr;
}

// A key file is a few lines (keygen writes under 200 bytes); a bigger one,
// or one that is no regular file (a FIFO, /dev/zero), is refused before it
// is opened: reading either whole hung check-config and took gigabytes.
constexpr uint64_t kMaxKeyFileBytes = 4096;

Result<std::vector<std::string>> ReadLines(const std::string& path) {
  struct stat st {};
  if (::stat(path.c_str(), &st) != 0) {
    return Status::NotFound("cannot read key file " + path + ": " + std::strerror(errno) +
                            "; allowed: a file written by `gridsync keygen`");
  }
  if (!S_ISREG(st.st_mode)) {
    return Status::InvalidArgument("key file " + path + " is " + FileKindName(st.st_mode) +
                                   "; allowed: a regular file written by `gridsync keygen`");
  }
  const auto size = static_cast<uint64_t>(st.st_size);
  if (size > kMaxKeyFileBytes) {
    return Status::InvalidArgument("key file " + path + " holds " + std::to_string(size) +
                                   " bytes; allowed: at most " + std::to_string(kMaxKeyFileBytes) +
                                   ", as `gridsync keygen` writes");
  }
  GRIDSYNC_ASSIGN_OR_RETURN(const std::string text, ReadFileOfSize(path, size));
  std::vector<std::string> lines;
  std::istringstream in(text);
  for (std::string line; std::getline(in, line) && lines.size() < 8;) {
    if (!line.empty() && line.back() == '\r') line.pop_back();
    if (!line.empty() && line[0] != '#') lines.push_back(line);
  }
  return lines;
}

// Public keys decide who a shard and the coordinator admit: a file, or its
// folder, that others may write lets them add themselves.
Status CheckNotWritableByOthers(const std::string& path) {
  struct stat st {};
  if (::stat(path.c_str(), &st) != 0) return Status::OK();  // reported by its reader
  if ((st.st_mode & 0022) != 0) {
    return Status::InvalidArgument(fmt::format(
        "{}: writable by others (mode {:04o}), who could put their own key in place; allowed: "
        "writable by its owner only (such as 0644 for a public key, 0700 for the folder)",
        path, st.st_mode & 0777));
  }
  return Status::OK();
}

}  // namespace

Result<CurveKeyPair> GenerateCurveKeyPair() {
  char pub[41] = {}, sec[41] = {};
  if (zmq_curve_keypair(pub, sec) != 0) {
    return Status::Unsupported(std::string("zmq_curve_keypair failed: ") +
                               zmq_strerror(zmq_errno()) + " (libzmq built without CURVE?)");
  }
  return CurveKeyPair{pub, sec};
}

Status WriteCurveKeyPair(const std::string& dir, const std::string& name,
                         const CurveKeyPair& keys) {
  std::error_code ec;
  std::filesystem::create_directories(dir, ec);
  if (ec) return Status::IOError("cannot create " + dir + ": " + ec.message());
  ::chmod(dir.c_str(), 0700);
  const std::string key = dir + "/" + name + ".key";
  const std::string pub = dir + "/" + name + ".pub";
  {
    // Created 0600 before the secret is written.
    const mode_t old = ::umask(0077);
    std::ofstream out(key, std::ios::trunc);
    ::umask(old);
    out << "# gridsync CURVE key pair for role " << name << ": public, then secret (keep private)\n"
        << keys.public_z85 << "\n"
        << keys.secret_z85 << "\n";
    if (!out) return Status::IOError("cannot write " + key);
  }
  std::ofstream out(pub, std::ios::trunc);
  out << "# gridsync CURVE public key for role " << name << "\n" << keys.public_z85 << "\n";
  if (!out) return Status::IOError("cannot write " + pub);
  return Status::OK();
}

Result<CurveKeyPair> LoadCurveKeyPair(const std::string& dir, const std::string& name) {
  const std::string path = dir + "/" + name + ".key";
  GRIDSYNC_ASSIGN_OR_RETURN(auto lines, ReadLines(path));
  if (lines.size() != 2 || !IsZ85Key(lines[0]) || !IsZ85Key(lines[1])) {
    return Status::InvalidArgument(path +
                                   ": not a key pair; allowed: two Z85 keys of 40 "
                                   "characters (public, then secret), as `gridsync keygen` writes");
  }
  struct stat st {};
  if (::stat(path.c_str(), &st) == 0 && (st.st_mode & 0077) != 0) {
    return Status::InvalidArgument(path + ": the secret key is readable by others (mode " +
                                   fmt::format("{:04o}", st.st_mode & 0777) +
                                   "); allowed: 0600 (chmod 600 " + path + ")");
  }
  // The public half must be the secret's: a pair with its lines swapped, or
  // halves from two pairs, passed here and failed at the first handshake.
  char derived[41] = {};
  if (zmq_curve_public(derived, lines[1].c_str()) != 0 || lines[0] != derived) {
    return Status::InvalidArgument(path +
                                   ": the first key is not the public key of the second (swapped "
                                   "lines, or halves of two pairs); allowed: a pair as `gridsync "
                                   "keygen` writes it, public then secret");
  }
  // And the role's public file, which the other side admits, must name it.
  const std::string pub = dir + "/" + name + ".pub";
  if (std::filesystem::exists(pub)) {
    GRIDSYNC_ASSIGN_OR_RETURN(const std::string listed, LoadCurvePublicKey(dir, name));
    if (listed != lines[0]) {
      return Status::InvalidArgument(path + ": its public key is not the one " + pub +
                                     " holds, which the others admit role " + name +
                                     " by; allowed: the pair and the .pub `gridsync keygen` "
                                     "wrote together");
    }
  }
  return CurveKeyPair{lines[0], lines[1]};
}

Result<std::string> LoadCurvePublicKey(const std::string& dir, const std::string& name) {
  const std::string path = dir + "/" + name + ".pub";
  GRIDSYNC_RETURN_IF_ERROR(CheckNotWritableByOthers(dir));
  GRIDSYNC_RETURN_IF_ERROR(CheckNotWritableByOthers(path));
  GRIDSYNC_ASSIGN_OR_RETURN(auto lines, ReadLines(path));
  if (lines.size() != 1 || !IsZ85Key(lines[0])) {
    return Status::InvalidArgument(path +
                                   ": not a public key; allowed: one Z85 key of 40 "
                                   "characters, as `gridsync keygen` writes");
  }
  return lines[0];
}

namespace {

Status InKeysDir(const Status& s) { return Status(s.code(), "security.keys_dir: " + s.message()); }

// The public keys of `roles` that dir holds (absent files are skipped).
Result<std::map<std::string, std::string>> PresentPublicKeys(
    const std::string& dir, std::initializer_list<const char*> roles) {
  std::map<std::string, std::string> keys;
  for (const char* role : roles) {
    if (!std::filesystem::exists(dir + "/" + role + ".pub")) continue;
    auto key = LoadCurvePublicKey(dir, role);
    if (!key.ok()) return InKeysDir(key.status());
    keys[role] = *key;
  }
  return keys;
}

}  // namespace

Result<CurveSettings> CurveSettingsFor(const Config& config, const std::string& role) {
  CurveSettings settings;
  if (!config.security.curve) return settings;
  settings.on = true;
  const std::string& dir = config.security.keys_dir;
  auto own = LoadCurveKeyPair(dir, role);
  if (!own.ok()) return InKeysDir(own.status());
  settings.own = *own;
  if (role == "shard") {
    GRIDSYNC_ASSIGN_OR_RETURN(auto clients, PresentPublicKeys(dir, {"worker", "observer"}));
    // A key listed for both roles is a worker's (the map keeps the first).
    for (const char* client : {"worker", "observer"}) {
      if (const auto it = clients.find(client); it != clients.end()) {
        settings.allowed_z85.emplace(it->second, client);
      }
    }
    if (settings.allowed_z85.empty()) {
      return Status::NotFound("security.keys_dir: " + dir +
                              " holds neither worker.pub nor observer.pub, so no client could "
                              "connect; allowed: the public keys `gridsync keygen` wrote");
    }
  } else {
    auto server = LoadCurvePublicKey(dir, "shard");
    if (!server.ok()) return InKeysDir(server.status());
    settings.server_public_z85 = *server;
  }
  return settings;
}

Result<std::optional<std::string>> OwnCurveSecretFor(const Config& config,
                                                     const std::string& role) {
  if (!config.security.curve) return std::optional<std::string>();
  auto own = LoadCurveKeyPair(config.security.keys_dir, role);
  if (!own.ok()) return InKeysDir(own.status());
  return std::optional<std::string>(std::move(own->secret_z85));
}

Result<std::optional<CheckpointMacKey>> CheckpointMacKeyFor(const Config& config,
                                                            const std::string& role) {
  GRIDSYNC_ASSIGN_OR_RETURN(const std::optional<std::string> secret,
                            OwnCurveSecretFor(config, role));
  if (!secret) return std::optional<CheckpointMacKey>();
  GRIDSYNC_ASSIGN_OR_RETURN(CheckpointMacKey key, CheckpointMacKey::FromCurveSecret(*secret));
  return std::optional<CheckpointMacKey>(std::move(key));
}

namespace {

bool Z85ToRaw(const std::string& z85, uint8_t raw[32]) {
  return z85.size() == 40 && zmq_z85_decode(raw, z85.c_str()) != nullptr;
}

}  // namespace

Result<ControlAuth> ControlAuthFor(const Config& config, const std::string& role) {
  ControlAuth auth;
  if (!config.security.curve) return auth;
  auth.on = true;
  const std::string& dir = config.security.keys_dir;
  auto own = LoadCurveKeyPair(dir, role);
  if (!own.ok()) return InKeysDir(own.status());
  auth.own = *own;
  if (role == "coordinator") {
    // Under nccl no shard runs, so none registers: shard.pub is not read,
    // as no worker reads it either (check-config and the coordinator
    // refused a damaged one the workers started with: a hostile probe).
    const bool shards = config.distributed.gradient_sync != GradientSyncMode::kNccl;
    GRIDSYNC_ASSIGN_OR_RETURN(auth.role_public,
                              shards ? PresentPublicKeys(dir, {"shard", "worker", "observer"})
                                     : PresentPublicKeys(dir, {"worker", "observer"}));
  } else {
    auto coordinator = LoadCurvePublicKey(dir, "coordinator");
    if (!coordinator.ok()) return InKeysDir(coordinator.status());
    auth.coordinator_public = *coordinator;
  }
  return auth;
}

std::string RandomBytes(size_t n) {
  static const int initialised = sodium_init();  // thread-safe once; >= 0 is fine
  (void)initialised;
  std::string out(n, '\0');
  randombytes_buf(out.data(), n);
  return out;
}

Status BoxChallenge(const ControlAuth& auth, const std::string& challenge, std::string* nonce,
                    std::string* box) {
  uint8_t pk[32], sk[32];
  if (!Z85ToRaw(auth.coordinator_public, pk) || !Z85ToRaw(auth.own.secret_z85, sk)) {
    return Status::InvalidArgument("control-plane keys are not Z85 keys");
  }
  *nonce = RandomBytes(crypto_box_NONCEBYTES);
  box->assign(challenge.size() + crypto_box_MACBYTES, '\0');
  if (crypto_box_easy(reinterpret_cast<uint8_t*>(box->data()),
                      reinterpret_cast<const uint8_t*>(challenge.data()), challenge.size(),
                      reinterpret_cast<const uint8_t*>(nonce->data()), pk, sk) != 0) {
    return Status::Internal("crypto_box_easy failed");
  }
  return Status::OK();
}

Status OpenChallenge(const ControlAuth& auth, const std::string& role, const std::string& challenge,
                     const std::string& nonce, const std::string& box) {
  const auto key = auth.role_public.find(role);
  if (key == auth.role_public.end()) {
    return Status::InvalidArgument("no public key for role " + role + " in security.keys_dir");
  }
  uint8_t pk[32], sk[32];
  if (!Z85ToRaw(key->second, pk) || !Z85ToRaw(auth.own.secret_z85, sk)) {
    return Status::Internal("control-plane keys are not Z85 keys");
  }
  if (nonce.size() != crypto_box_NONCEBYTES ||
      box.size() != challenge.size() + crypto_box_MACBYTES) {
    return Status::InvalidArgument(
        fmt::format("auth: nonce of {} bytes and box of {} bytes; allowed: {} and {}", nonce.size(),
                    box.size(), crypto_box_NONCEBYTES, challenge.size() + crypto_box_MACBYTES));
  }
  std::string opened(challenge.size(), '\0');
  if (crypto_box_open_easy(reinterpret_cast<uint8_t*>(opened.data()),
                           reinterpret_cast<const uint8_t*>(box.data()), box.size(),
                           reinterpret_cast<const uint8_t*>(nonce.data()), pk, sk) != 0 ||
      sodium_memcmp(opened.data(), challenge.data(), challenge.size()) != 0) {
    return Status::InvalidArgument("auth: the proof does not open with role " + role +
                                   "'s public key for this connection's challenge (wrong key, "
                                   "or a replayed proof)");
  }
  return Status::OK();
}

Status ApplyCurveServer(zmq::socket_t& socket, const CurveSettings& settings) {
  if (!settings.on) return Status::OK();
  try {
    socket.set(zmq::sockopt::zap_domain, "gridsync");
    socket.set(zmq::sockopt::curve_server, true);
    socket.set(zmq::sockopt::curve_secretkey, settings.own.secret_z85);
  } catch (const zmq::error_t& e) {
    return Status::Unsupported(std::string("CURVE server: ") + e.what());
  }
  return Status::OK();
}

Status ApplyCurveClient(zmq::socket_t& socket, const CurveSettings& settings) {
  if (!settings.on) return Status::OK();
  try {
    socket.set(zmq::sockopt::curve_serverkey, settings.server_public_z85);
    socket.set(zmq::sockopt::curve_publickey, settings.own.public_z85);
    socket.set(zmq::sockopt::curve_secretkey, settings.own.secret_z85);
  } catch (const zmq::error_t& e) {
    return Status::Unsupported(std::string("CURVE client: ") + e.what());
  }
  return Status::OK();
}

std::string CurveRoleOf(const zmq::message_t& received) {
  // zmq_msg_gets takes a non-const message; it only reads its metadata.
  const char* role = zmq_msg_gets(const_cast<zmq_msg_t*>(received.handle()), "User-Id");
  return role == nullptr ? std::string() : std::string(role);
}

ZapHandler::ZapHandler(zmq::context_t& context, std::map<std::string, std::string> allowed_z85,
                       std::string who)
    : socket_(context, zmq::socket_type::rep),
      allowed_(std::move(allowed_z85)),
      who_(std::move(who)) {
  socket_.set(zmq::sockopt::linger, 0);
  socket_.set(zmq::sockopt::rcvtimeo, 100);
  socket_.bind("inproc://zeromq.zap.01");
  thread_ = std::thread([this] { Serve(); });
}

ZapHandler::~ZapHandler() {
  stop_ = true;
  if (thread_.joinable()) thread_.join();
}

void ZapHandler::Serve() {
  while (!stop_) {
    std::vector<zmq::message_t> request;
    try {
      zmq::message_t part;
      if (!socket_.recv(part)) continue;  // timeout: check stop_
      bool more = part.more();
      request.push_back(std::move(part));
      while (more) {
        zmq::message_t next;
        (void)socket_.recv(next);
        more = next.more();
        request.push_back(std::move(next));
      }
    } catch (const zmq::error_t&) {
      if (stop_) return;
      continue;
    }
    // RFC 27: version, request id, domain, address, identity, mechanism,
    // then the mechanism's credentials (CURVE: the client's 32-byte key).
    auto text = [&](size_t i) {
      return i < request.size() ? request[i].to_string() : std::string();
    };
    std::string status = "400", reason;
    const std::string mechanism = text(5);
    std::string client = "-", role;
    if (request.size() < 6 || text(0) != "1.0") {
      reason = "malformed ZAP request";
    } else if (mechanism != "CURVE") {
      reason = "mechanism " + mechanism + "; allowed: CURVE";
    } else if (request.size() < 7 || request[6].size() != 32) {
      reason = "CURVE credentials missing";
    } else {
      char z85[41] = {};
      zmq_z85_encode(z85, static_cast<const uint8_t*>(request[6].data()), 32);
      client = z85;
      if (const auto it = allowed_.find(client); it != allowed_.end()) {
        status = "200";
        role = it->second;
      } else {
        reason =
            "client key " + client + " is not listed (allowed: the workers' and observers' keys)";
      }
    }
    if (status != "200") {
      ++refused_;
      if (refusal_log_.Allow())
        spdlog::warn("{}: refused a connection from {}: {}", who_, text(3), reason);
    }
    std::vector<std::string> reply = {"1.0", text(1), status, status == "200" ? "OK" : reason,
                                      role,  ""};
    try {
      for (size_t i = 0; i < reply.size(); ++i) {
        socket_.send(zmq::buffer(reply[i]),
                     i + 1 < reply.size() ? zmq::send_flags::sndmore : zmq::send_flags::none);
      }
    } catch (const zmq::error_t&) {
    }
  }
}

Result<ControlSession> ControlSession::Derive(const ControlAuth& auth,
                                              const std::string& peer_public_z85,
                                              const std::string& challenge, bool coordinator_side) {
  uint8_t pk[32], sk[32], shared[crypto_box_BEFORENMBYTES];
  if (!Z85ToRaw(peer_public_z85, pk) || !Z85ToRaw(auth.own.secret_z85, sk)) {
    return Status::Internal("control-plane keys are not Z85 keys");
  }
  if (crypto_box_beforenm(shared, pk, sk) != 0) {
    return Status::InvalidArgument("control plane: the peer's public key is unusable");
  }
  // key = BLAKE2b(shared secret, challenge, a label): new for every connection.
  static constexpr char kLabel[] = "gridsync control plane v1";
  crypto_generichash_state state;
  ControlSession session;
  crypto_generichash_init(&state, nullptr, 0, session.key_.size());
  crypto_generichash_update(&state, shared, sizeof(shared));
  crypto_generichash_update(&state, reinterpret_cast<const uint8_t*>(challenge.data()),
                            challenge.size());
  crypto_generichash_update(&state, reinterpret_cast<const uint8_t*>(kLabel), sizeof(kLabel) - 1);
  crypto_generichash_final(&state, session.key_.data(), session.key_.size());
  sodium_memzero(shared, sizeof(shared));
  sodium_memzero(sk, sizeof(sk));
  session.send_direction_ = coordinator_side ? 1 : 2;
  session.receive_direction_ = coordinator_side ? 2 : 1;
  return session;
}

namespace {

std::array<uint8_t, crypto_secretbox_NONCEBYTES> FrameNonce(uint8_t direction, uint64_t count) {
  std::array<uint8_t, crypto_secretbox_NONCEBYTES> nonce{};
  nonce[0] = direction;
  for (int i = 0; i < 8; ++i) nonce[8 + i] = static_cast<uint8_t>(count >> (8 * i));
  return nonce;
}

}  // namespace

std::vector<uint8_t> ControlSession::Seal(const std::vector<uint8_t>& frame) {
  constexpr size_t kPrefix = 4;
  const size_t body = frame.size() - kPrefix;
  const size_t sealed = body + crypto_secretbox_MACBYTES;
  std::vector<uint8_t> out(kPrefix + sealed);
  const uint32_t length = static_cast<uint32_t>(sealed);
  for (size_t i = 0; i < kPrefix; ++i) out[i] = static_cast<uint8_t>(length >> (8 * i));
  const auto nonce = FrameNonce(send_direction_, sent_++);
  crypto_secretbox_easy(out.data() + kPrefix, frame.data() + kPrefix, body, nonce.data(),
                        key_.data());
  return out;
}

Result<std::vector<uint8_t>> ControlSession::Open(const uint8_t* body, size_t length) {
  if (length < crypto_secretbox_MACBYTES) {
    return Status::InvalidArgument(
        fmt::format("a sealed control-plane frame of {} bytes; allowed: at least {}", length,
                    crypto_secretbox_MACBYTES));
  }
  std::vector<uint8_t> out(length - crypto_secretbox_MACBYTES);
  const auto nonce = FrameNonce(receive_direction_, received_);
  if (crypto_secretbox_open_easy(out.data(), body, length, nonce.data(), key_.data()) != 0) {
    return Status::InvalidArgument(
        "a control-plane frame does not open with this connection's key (altered, injected, "
        "reordered or replayed, or a peer without the right key)");
  }
  ++received_;
  return out;
}

Status CheckRoleKeys(const Config& config, std::initializer_list<const char*> roles) {
  if (!config.security.curve) return Status::OK();
  for (const char* role : roles) {
    if (auto auth = ControlAuthFor(config, role); !auth.ok()) return auth.status();
    const bool data_plane = std::string_view(role) != "coordinator" &&
                            config.distributed.gradient_sync != GradientSyncMode::kNccl;
    if (!data_plane) continue;
    if (auto curve = CurveSettingsFor(config, role); !curve.ok()) return curve.status();
  }
  return Status::OK();
}

}  // namespace gridsync::wire
