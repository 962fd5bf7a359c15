// The control plane under CURVE's keys (security.curve): the coordinator
// admits a role only after its key-based challenge is answered with that
// role's secret, logs wrong-key loops within a budget, frees the slot of a
// connection that never proves a key, and seals every frame after the proof.
// The data plane's side is security_test.cc.
#include <capnp/message.h>
#include <capnp/serialize.h>
#include <gtest/gtest.h>
#include <spdlog/sinks/ostream_sink.h>
#include <spdlog/spdlog.h>

#include <filesystem>
#include <sstream>
#include <thread>

#include "common/coordinator_client.h"
#include "common/wire/curve.h"
#include "common/wire/gridsync.capnp.h"
#include "server/coordinator.h"
#include "tests/curve_test_keys.h"
#include "tests/raw_coord_connection.h"
#include "tests/test_util.h"

namespace gridsync {
namespace {

namespace fs = std::filesystem;
using namespace std::chrono_literals;
using testing::MakeKeys;
using testing::SecureConfig;

// authHello on a raw connection: the challenge.
std::string AuthHello(testing::RawConnection& c) {
  capnp::MallocMessageBuilder m;
  auto r = m.initRoot<wire::schema::CoordRequest>();
  r.setRequestId(1);
  r.setAuthHello();
  EXPECT_TRUE(c.Send(testing::FrameOf(m)));
  auto reply = c.ReadReply(3s);
  EXPECT_TRUE(reply.decoded && !reply.is_error) << reply.text;
  return reply.challenge;
}

// auth on a raw connection: the error text ("" when accepted).
std::string SendAuth(testing::RawConnection& c, wire::schema::Role role, const std::string& nonce,
                     const std::string& box) {
  capnp::MallocMessageBuilder m;
  auto r = m.initRoot<wire::schema::CoordRequest>();
  r.setRequestId(2);
  auto a = r.initAuth();
  a.setRole(role);
  a.setNonce(kj::arrayPtr(reinterpret_cast<const kj::byte*>(nonce.data()), nonce.size()));
  a.setBox(kj::arrayPtr(reinterpret_cast<const kj::byte*>(box.data()), box.size()));
  if (!c.Send(testing::FrameOf(m))) return "no reply";
  auto reply = c.ReadReply(3s);
  if (!reply.decoded) return "no reply";
  return reply.is_error ? reply.text : "";
}

// A coordinator that requires a key proof (its key from config's keys_dir).
// A coordinator of one shard and one worker, unless `options` says otherwise.
CoordinatorOptions OneShardOneWorker() {
  CoordinatorOptions options;
  options.expected_shards = 1;
  options.expected_workers = 1;
  return options;
}

std::unique_ptr<Coordinator> StartSecureCoordinator(const Config& config,
                                                    CoordinatorOptions options) {
  auto server_auth = wire::ControlAuthFor(config, "coordinator");
  EXPECT_TRUE(server_auth.ok()) << server_auth.status().ToString();
  if (!server_auth.ok()) return nullptr;
  options.auth = *server_auth;
  auto coordinator = Coordinator::Start(options);
  EXPECT_TRUE(coordinator.ok()) << coordinator.status().ToString();
  return coordinator.ok() ? std::move(coordinator).value() : nullptr;
}

TEST(SecurityTest, CoordinatorAdmitsOnlyProvenRoles) {
  const std::string dir = MakeKeys();
  const Config config = SecureConfig(dir);
  auto coordinator = StartSecureCoordinator(config, OneShardOneWorker());
  ASSERT_TRUE(coordinator);
  const uint16_t port = coordinator->port();
  RegisterInfo shard_info;
  shard_info.role = Role::kShard;
  shard_info.requested_rank = 0;
  shard_info.tables = {{"t", 16, 2}};

  // No authentication: refused before anything is read or changed.
  auto anonymous = CoordinatorClient::Connect("127.0.0.1", port, 2s);
  ASSERT_TRUE(anonymous.ok());
  auto refused = (*anonymous)->Register(shard_info, 2s);
  ASSERT_FALSE(refused.ok());
  EXPECT_NE(refused.status().message().find("unauthenticated"), std::string::npos)
      << refused.status().ToString();

  // A worker's key cannot take a shard's place.
  auto worker_auth = *wire::ControlAuthFor(config, "worker");
  auto as_worker = CoordinatorClient::Connect("127.0.0.1", port, 2s, worker_auth, Role::kWorker);
  ASSERT_TRUE(as_worker.ok()) << as_worker.status().ToString();
  auto wrong_role = (*as_worker)->Register(shard_info, 2s);
  ASSERT_FALSE(wrong_role.ok());
  EXPECT_NE(wrong_role.status().message().find("register as worker only"), std::string::npos)
      << wrong_role.status().ToString();
  // Claiming the shard role with the worker's key fails the proof.
  auto claims_shard = CoordinatorClient::Connect("127.0.0.1", port, 2s, worker_auth, Role::kShard);
  ASSERT_FALSE(claims_shard.ok());
  EXPECT_NE(claims_shard.status().message().find("does not open"), std::string::npos)
      << claims_shard.status().ToString();

  // A replayed proof: valid for one connection's challenge, refused on another.
  std::string nonce, box;
  {
    testing::RawConnection first(port);
    const std::string challenge = AuthHello(first);
    ASSERT_EQ(challenge.size(), 32u);
    ASSERT_TRUE(wire::BoxChallenge(worker_auth, challenge, &nonce, &box).ok());
    EXPECT_EQ(SendAuth(first, wire::schema::Role::WORKER, nonce, box), "");
  }
  {
    testing::RawConnection second(port);
    (void)AuthHello(second);
    const std::string replay = SendAuth(second, wire::schema::Role::WORKER, nonce, box);
    EXPECT_NE(replay.find("replayed"), std::string::npos) << replay;
  }

  // The real shard, with its own key, registers; the worker too.
  auto shard_auth = *wire::ControlAuthFor(config, "shard");
  auto shard = CoordinatorClient::Connect("127.0.0.1", port, 2s, shard_auth, Role::kShard);
  ASSERT_TRUE(shard.ok()) << shard.status().ToString();
  auto registered = (*shard)->Register(shard_info, 2s);
  ASSERT_TRUE(registered.ok()) << registered.status().ToString();
  RegisterInfo worker_info = shard_info;
  worker_info.role = Role::kWorker;
  auto worker = (*as_worker)->Register(worker_info, 2s);
  ASSERT_TRUE(worker.ok()) << worker.status().ToString();
  auto map = (*shard)->GetMap(true, 2s);
  ASSERT_TRUE(map.ok()) << map.status().ToString();
  EXPECT_EQ(map->shards.size(), 1u);
  EXPECT_EQ(map->workers.size(), 1u);
  fs::remove_all(dir);
}

// A hostile probe looped `gridsync monitor` with another cluster's keys:
// the coordinator wrote a warning per connection (500 in 11 s) outside the
// refusal budget. Wrong keys are refused, each told why, within the budget.
TEST(SecurityTest, WrongKeyLoopsAreLoggedWithinTheBudget) {
  const std::string dir = MakeKeys();
  const std::string other = MakeKeys("other-keys");
  const Config config = SecureConfig(dir);
  auto coordinator = StartSecureCoordinator(config, OneShardOneWorker());
  ASSERT_TRUE(coordinator);
  std::ostringstream log;
  auto previous = spdlog::default_logger();
  spdlog::set_default_logger(std::make_shared<spdlog::logger>(
      "wrong-keys", std::make_shared<spdlog::sinks::ostream_sink_mt>(log)));
  const auto wrong = *wire::ControlAuthFor(SecureConfig(other), "observer");
  constexpr int kTries = 100;
  int told = 0;
  for (int i = 0; i < kTries; ++i) {
    auto refused =
        CoordinatorClient::Connect("127.0.0.1", coordinator->port(), 2s, wrong, Role::kObserver);
    if (!refused.ok() &&
        refused.status().message().find("failed to authenticate as observer") != std::string::npos)
      ++told;
  }
  coordinator.reset();
  spdlog::set_default_logger(previous);
  EXPECT_EQ(told, kTries) << "every wrong key is told why";
  const std::string text = log.str();
  const auto lines = std::count(text.begin(), text.end(), '\n');
  // The budget's 20 a window (two windows on a slow host), their summary and
  // the coordinator's own lines; and at least one refusal named.
  EXPECT_LE(lines, 45) << text;
  EXPECT_NE(text.find("failed to authenticate as observer"), std::string::npos) << text;
  fs::remove_all(dir);
  fs::remove_all(other);
}

// Issue (review): authHello, then silence, held a connection slot forever
// (the read deadline only covers a message in flight), so 512 such peers
// locked every shard and worker out even with CURVE on. The key proof must
// now complete within read_timeout of the connect; proven connections stay.
TEST(SecurityTest, AConnectionThatNeverProvesAKeyLosesItsSlot) {
  const std::string dir = MakeKeys();
  const Config config = SecureConfig(dir);
  CoordinatorOptions options;
  options.read_timeout = 400ms;
  auto coordinator = StartSecureCoordinator(config, options);
  ASSERT_TRUE(coordinator);
  const uint16_t port = coordinator->port();
  auto worker_auth = *wire::ControlAuthFor(config, "worker");
  auto proven = CoordinatorClient::Connect("127.0.0.1", port, 2s, worker_auth, Role::kWorker);
  ASSERT_TRUE(proven.ok()) << proven.status().ToString();

  testing::RawConnection silent(port);
  ASSERT_EQ(AuthHello(silent).size(), 32u);
  auto reply = silent.ReadReply(5s);
  ASSERT_TRUE(reply.decoded) << "eof " << reply.eof << ", timeout " << reply.timeout;
  EXPECT_EQ(reply.code, static_cast<uint32_t>(StatusCode::kTimeout)) << reply.text;
  EXPECT_NE(reply.text.find("no key proof within 400 ms"), std::string::npos) << reply.text;
  EXPECT_TRUE(silent.WaitForClose(3s));

  // Well past the deadline, the proven connection still serves.
  std::this_thread::sleep_for(200ms);
  EXPECT_TRUE((*proven)->Heartbeat().ok());
  EXPECT_TRUE((*proven)->Set("still", "here").ok());
  fs::remove_all(dir);
}

// After the proof every control-plane frame is sealed under a key of this
// connection: a plaintext request is refused (the connection closes), a
// sealed one is answered sealed, and a frame altered, replayed, reflected
// or from another connection's key does not open.
TEST(SecurityTest, ControlPlaneFramesAreSealedAfterTheProof) {
  const std::string dir = MakeKeys();
  Config config;
  config.security.curve = true;
  config.security.keys_dir = dir;
  auto server_auth = *wire::ControlAuthFor(config, "coordinator");
  auto worker_auth = *wire::ControlAuthFor(config, "worker");

  // The session alone.
  const std::string challenge(32, 'c');
  auto client = wire::ControlSession::Derive(worker_auth, worker_auth.coordinator_public, challenge,
                                             /*coordinator_side=*/false);
  auto server = wire::ControlSession::Derive(server_auth, server_auth.role_public.at("worker"),
                                             challenge, /*coordinator_side=*/true);
  ASSERT_TRUE(client.ok() && server.ok());
  std::vector<uint8_t> frame = {16, 0, 0, 0};
  for (uint8_t i = 0; i < 16; ++i) frame.push_back(i);
  const std::vector<uint8_t> sealed = client->Seal(frame);
  ASSERT_EQ(sealed.size(), frame.size() + wire::ControlSession::kOverhead);
  EXPECT_EQ(sealed[0], 16 + wire::ControlSession::kOverhead) << "the prefix counts the sealed body";
  auto opened = server->Open(sealed.data() + 4, sealed.size() - 4);
  ASSERT_TRUE(opened.ok()) << opened.status().ToString();
  EXPECT_EQ(*opened, std::vector<uint8_t>(frame.begin() + 4, frame.end()));
  EXPECT_FALSE(server->Open(sealed.data() + 4, sealed.size() - 4).ok()) << "a replayed frame";
  std::vector<uint8_t> next = client->Seal(frame);
  next[10] ^= 1;
  EXPECT_FALSE(server->Open(next.data() + 4, next.size() - 4).ok()) << "an altered frame";
  const std::vector<uint8_t> own = client->Seal(frame);
  EXPECT_FALSE(client->Open(own.data() + 4, own.size() - 4).ok()) << "a reflected frame";
  auto other = wire::ControlSession::Derive(server_auth, server_auth.role_public.at("worker"),
                                            std::string(32, 'd'), true);
  ASSERT_TRUE(other.ok());
  const std::vector<uint8_t> fresh = client->Seal(frame);
  EXPECT_FALSE(other->Open(fresh.data() + 4, fresh.size() - 4).ok()) << "another connection's key";

  // On the wire.
  CoordinatorOptions options = OneShardOneWorker();
  options.auth = server_auth;
  auto coordinator = Coordinator::Start(options);
  ASSERT_TRUE(coordinator.ok()) << coordinator.status().ToString();
  const uint16_t port = (*coordinator)->port();
  auto get_map = [] {
    capnp::MallocMessageBuilder m;
    auto r = m.initRoot<wire::schema::CoordRequest>();
    r.setRequestId(3);
    r.initGetMap();
    return testing::FrameOf(m);
  };
  auto prove = [&](testing::RawConnection& c) -> Result<wire::ControlSession> {
    const std::string ch = AuthHello(c);
    std::string nonce, box;
    GRIDSYNC_RETURN_IF_ERROR(wire::BoxChallenge(worker_auth, ch, &nonce, &box));
    if (!SendAuth(c, wire::schema::Role::WORKER, nonce, box).empty())
      return Status::InvalidArgument("auth refused");
    return wire::ControlSession::Derive(worker_auth, worker_auth.coordinator_public, ch, false);
  };
  {
    testing::RawConnection plain(port);
    ASSERT_TRUE(prove(plain).ok());
    ASSERT_TRUE(plain.Send(get_map()));
    EXPECT_TRUE(plain.WaitForClose(3s)) << "a plaintext request after the proof must end it";
  }
  {
    testing::RawConnection raw(port);
    auto session = prove(raw);
    ASSERT_TRUE(session.ok()) << session.status().ToString();
    const std::string request = get_map();
    const std::vector<uint8_t> sealed_request =
        session->Seal(std::vector<uint8_t>(request.begin(), request.end()));
    ASSERT_TRUE(raw.Send(std::string(sealed_request.begin(), sealed_request.end())));
    std::string header, body;
    const auto deadline = std::chrono::steady_clock::now() + 3s;
    ASSERT_EQ(raw.Read(4, &header, deadline), testing::RawConnection::Outcome::kData);
    uint32_t length = 0;
    std::memcpy(&length, header.data(), 4);
    ASSERT_LT(length, 1u << 20);
    ASSERT_EQ(raw.Read(length, &body, deadline), testing::RawConnection::Outcome::kData);
    auto reply = session->Open(reinterpret_cast<const uint8_t*>(body.data()), body.size());
    ASSERT_TRUE(reply.ok()) << "the reply is not sealed with this connection's key";
    std::vector<capnp::word> words(reply->size() / 8);
    std::memcpy(words.data(), reply->data(), reply->size());
    capnp::FlatArrayMessageReader reader(
        kj::ArrayPtr<const capnp::word>(words.data(), words.size()));
    auto root = reader.getRoot<wire::schema::CoordReply>();
    EXPECT_EQ(root.getRequestId(), 3u);
    EXPECT_TRUE(root.isMap());
  }
  // And a real client works through it all.
  auto good = CoordinatorClient::Connect("127.0.0.1", port, 2s, worker_auth, Role::kWorker);
  ASSERT_TRUE(good.ok()) << good.status().ToString();
  auto map = (*good)->GetMap(false, 0ms);
  ASSERT_TRUE(map.ok()) << map.status().ToString();
  EXPECT_EQ(map->expected_workers, 1u);
  fs::remove_all(dir);
}

}  // namespace
}  // namespace gridsync
