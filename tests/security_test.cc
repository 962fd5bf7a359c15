// The data plane under CURVE (security.curve): a shard admits only the
// listed client keys through its ZAP handler; unknown keys, NULL and PLAIN
// clients and clients that trust the wrong server key get nothing; good
// workers train. Keys come from `gridsync keygen`'s format (wire/curve.h).
#include <capnp/message.h>
#include <capnp/serialize.h>
#include <gtest/gtest.h>
#include <spdlog/sinks/ostream_sink.h>
#include <spdlog/spdlog.h>
#include <sys/stat.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <sstream>
#include <thread>

#include "common/coordinator_client.h"
#include "common/wire/curve.h"
#include "common/wire/gridsync.capnp.h"
#include "server/coordinator.h"
#include "server/in_process_cluster.h"
#include "tests/ps_test_util.h"
#include "tests/raw_coord_connection.h"
#include "tests/test_util.h"
#include "tools/bench_shard_map.h"
#include "worker/params_file.h"
#include "worker/ps_client.h"
#include "worker/sync/ps_session.h"
#include "worker/sync/train.h"

namespace gridsync {
namespace {

namespace fs = std::filesystem;
using namespace std::chrono_literals;

std::string MakeKeys(const std::string& name = "keys") {
  const fs::path dir =
      fs::temp_directory_path() / ("gridsync-" + name + "-" + std::to_string(::getpid()));
  fs::remove_all(dir);
  for (const char* role : {"coordinator", "shard", "worker", "observer"}) {
    auto pair = wire::GenerateCurveKeyPair();
    EXPECT_TRUE(pair.ok()) << pair.status().ToString();
    EXPECT_TRUE(wire::WriteCurveKeyPair(dir.string(), role, *pair).ok());
  }
  return dir.string();
}

// Sends a stats request with these socket settings; true when a reply came.
bool StatsAnswered(const std::string& endpoint, const std::function<void(zmq::socket_t&)>& setup) {
  zmq::context_t context(1);
  zmq::socket_t socket(context, zmq::socket_type::dealer);
  socket.set(zmq::sockopt::linger, 0);
  setup(socket);
  socket.connect(endpoint);
  wire::OutHeader h;
  h.kind = wire::Kind::kStats;
  h.request_id = 3;
  auto frames = wire::Encode(h, {});
  if (!wire::SendMultipart(socket, frames).ok()) return false;
  return wire::ReceiveMultipart(socket, 1500, wire::Limits{}).ok();
}

TEST(SecurityTest, KeysRoundTripAndSecretFilesArePrivate) {
  const std::string dir = MakeKeys();
  auto shard = wire::LoadCurveKeyPair(dir, "shard");
  ASSERT_TRUE(shard.ok()) << shard.status().ToString();
  auto pub = wire::LoadCurvePublicKey(dir, "shard");
  ASSERT_TRUE(pub.ok());
  EXPECT_EQ(shard->public_z85, *pub);
  struct stat st {};
  ASSERT_EQ(::stat((dir + "/shard.key").c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 0777, 0600u);
  ::chmod((dir + "/worker.key").c_str(), 0644);
  auto loose = wire::LoadCurveKeyPair(dir, "worker");
  ASSERT_FALSE(loose.ok());
  EXPECT_NE(loose.status().message().find("(mode 0644); allowed: 0600 (chmod 600 " + dir +
                                          "/worker.key)"),
            std::string::npos)
      << loose.status().ToString();
  // The one check of check-config, launch and the worker: the roles it is
  // asked about, and nothing without CURVE.
  Config config;
  config.security.curve = true;
  config.security.keys_dir = dir;
  EXPECT_TRUE(wire::CheckRoleKeys(config, {"coordinator", "shard"}).ok());
  const Status worker = wire::CheckRoleKeys(config, {"coordinator", "worker"});
  EXPECT_NE(worker.message().find(dir + "/worker.key: the secret key is readable by others"),
            std::string::npos)
      << worker.ToString();
  config.security.curve = false;
  EXPECT_TRUE(wire::CheckRoleKeys(config, {"worker"}).ok());
  std::ofstream(dir + "/observer.pub") << "not a key\n";
  EXPECT_FALSE(wire::LoadCurvePublicKey(dir, "observer").ok());
  fs::remove_all(dir);
}

// Key files are input: what is no small regular file is refused before it
// is read (a probe's /dev/zero took gigabytes, a FIFO hung check-config),
// a pair must be one pair and match its .pub, and the public keys that
// decide who is admitted must not be writable by others.
TEST(SecurityTest, KeyFilesAreRefusedUnlessSmallRegularAndConsistent) {
  const std::string dir = MakeKeys();
  auto expect_refused = [&](const Status& status, const std::string& what) {
    ASSERT_FALSE(status.ok()) << what << " was taken";
    EXPECT_NE(status.message().find(what), std::string::npos) << status.ToString();
  };
  const std::string worker_key = dir + "/worker.key";
  const auto good_lines = [&] {
    std::ifstream in(worker_key);
    std::vector<std::string> lines;
    for (std::string line; std::getline(in, line);) lines.push_back(line);
    return lines;
  }();
  ASSERT_EQ(good_lines.size(), 3u);
  ASSERT_TRUE(wire::LoadCurveKeyPair(dir, "worker").ok());

  fs::rename(worker_key, worker_key + ".kept");
  fs::create_symlink("/dev/zero", worker_key);
  expect_refused(wire::LoadCurveKeyPair(dir, "worker").status(), "is a character device");
  fs::remove(worker_key);
  ASSERT_EQ(::mkfifo(worker_key.c_str(), 0600), 0);
  expect_refused(wire::LoadCurveKeyPair(dir, "worker").status(), "is a FIFO");
  fs::remove(worker_key);
  {
    std::ofstream big(worker_key);
    big << std::string(5000, '#') << "\n";
  }
  ::chmod(worker_key.c_str(), 0600);
  expect_refused(wire::LoadCurveKeyPair(dir, "worker").status(), "holds 5001 bytes");

  // Swapped halves, and another role's pair under this role's name.
  {
    std::ofstream swapped(worker_key, std::ios::trunc);
    swapped << good_lines[0] << "\n" << good_lines[2] << "\n" << good_lines[1] << "\n";
  }
  expect_refused(wire::LoadCurveKeyPair(dir, "worker").status(),
                 "the first key is not the public key of the second");
  fs::copy_file(dir + "/shard.key", worker_key, fs::copy_options::overwrite_existing);
  expect_refused(wire::LoadCurveKeyPair(dir, "worker").status(),
                 "its public key is not the one " + dir + "/worker.pub holds");
  fs::remove(worker_key);
  fs::rename(worker_key + ".kept", worker_key);
  ASSERT_TRUE(wire::LoadCurveKeyPair(dir, "worker").ok());

  ::chmod((dir + "/worker.pub").c_str(), 0666);
  expect_refused(wire::LoadCurvePublicKey(dir, "worker").status(),
                 "writable by others (mode 0666)");
  ::chmod((dir + "/worker.pub").c_str(), 0644);
  ::chmod(dir.c_str(), 0777);
  expect_refused(wire::LoadCurvePublicKey(dir, "worker").status(),
                 "writable by others (mode 0777)");
  ::chmod(dir.c_str(), 0700);
  EXPECT_TRUE(wire::LoadCurvePublicKey(dir, "worker").ok());
  fs::remove_all(dir);
}

// A config with CURVE on and the keys in `dir`.
// CURVE on, with the keys in dir, for a cluster with shards (under nccl the
// coordinator reads no shard.pub).
Config SecureConfig(const std::string& dir) {
  Config config;
  config.distributed.gradient_sync = GradientSyncMode::kPs;
  config.security.curve = true;
  config.security.keys_dir = dir;
  return config;
}

// A small ps cluster of `workers` workers under CURVE with the keys in dir.
Config CurveConfig(const std::string& dir, int workers) {
  Config config = testing::SmallDistributedConfig(workers, GradientSyncMode::kPs, 6);
  config.security = SecureConfig(dir).security;
  return config;
}

TEST(SecurityTest, OnlyListedKeysReachAShardAndGoodWorkersTrain) {
  const std::string dir = MakeKeys();
  auto servers = InProcessCluster::Start(CurveConfig(dir, 2));
  ASSERT_TRUE(servers.ok()) << servers.status().ToString();
  PsShard& shard = (*servers)->shard(0);
  const std::string endpoint = shard.endpoint();
  const auto shard_pub = *wire::LoadCurvePublicKey(dir, "shard");
  const auto observer = *wire::LoadCurveKeyPair(dir, "observer");

  // The observer's listed key gets an answer.
  EXPECT_TRUE(StatsAnswered(endpoint, [&](zmq::socket_t& s) {
    s.set(zmq::sockopt::curve_serverkey, shard_pub);
    s.set(zmq::sockopt::curve_publickey, observer.public_z85);
    s.set(zmq::sockopt::curve_secretkey, observer.secret_z85);
  }));
  const uint64_t refused_before = shard.refused_connections();
  // An unknown key: refused by the ZAP handler, which counts and logs it.
  const auto stranger = *wire::GenerateCurveKeyPair();
  EXPECT_FALSE(StatsAnswered(endpoint, [&](zmq::socket_t& s) {
    s.set(zmq::sockopt::curve_serverkey, shard_pub);
    s.set(zmq::sockopt::curve_publickey, stranger.public_z85);
    s.set(zmq::sockopt::curve_secretkey, stranger.secret_z85);
  }));
  EXPECT_GT(shard.refused_connections(), refused_before);
  // NULL (no security at all), PLAIN, and a client trusting another server key.
  EXPECT_FALSE(StatsAnswered(endpoint, [](zmq::socket_t&) {}));
  EXPECT_FALSE(StatsAnswered(endpoint, [](zmq::socket_t& s) {
    s.set(zmq::sockopt::plain_username, "worker");
    s.set(zmq::sockopt::plain_password, "guess");
  }));
  EXPECT_FALSE(StatsAnswered(endpoint, [&](zmq::socket_t& s) {
    s.set(zmq::sockopt::curve_serverkey, stranger.public_z85);
    s.set(zmq::sockopt::curve_publickey, observer.public_z85);
    s.set(zmq::sockopt::curve_secretkey, observer.secret_z85);
  }));
  // The observer's key (gridsync monitor's) reads stats and changes
  // nothing: a push, an init or a pull under it is refused, naming the role.
  // A hostile probe: an observer's push of worker 0's step 0 was applied,
  // and the real worker's was then refused as a second one.
  for (const wire::Kind kind : {wire::Kind::kPush, wire::Kind::kInit, wire::Kind::kPull}) {
    zmq::context_t context(1);
    zmq::socket_t socket(context, zmq::socket_type::dealer);
    socket.set(zmq::sockopt::linger, 0);
    socket.set(zmq::sockopt::curve_serverkey, shard_pub);
    socket.set(zmq::sockopt::curve_publickey, observer.public_z85);
    socket.set(zmq::sockopt::curve_secretkey, observer.secret_z85);
    socket.connect(endpoint);
    wire::OutHeader h;
    h.kind = kind;
    h.request_id = 11;
    wire::OutBlock b;
    b.table = 0;
    b.width = testing::SpecOf((*servers)->config()).model.tables[0].width;
    b.rows = {0};
    b.row_count = 1;
    if (kind != wire::Kind::kPull) b.values.assign(b.width, 0.5f);
    std::vector<wire::OutBlock> blocks;
    blocks.push_back(std::move(b));
    auto request = wire::Encode(h, std::move(blocks));
    ASSERT_TRUE(wire::SendMultipart(socket, request).ok());
    auto frames = wire::ReceiveMultipart(socket, 3000, wire::Limits{});
    ASSERT_TRUE(frames.ok()) << frames.status().ToString();
    auto reply = wire::Decode(*frames, {}, wire::Limits{});
    ASSERT_TRUE(reply.ok()) << reply.status().ToString();
    ASSERT_EQ(reply->kind, wire::Kind::kError) << wire::KindName(kind);
    EXPECT_NE(reply->error.message().find("the observer's"), std::string::npos)
        << reply->error.message();
  }
  EXPECT_EQ(shard.stats().pushes, 0u);
  // Refused handshakes close their connections, and the connection cap
  // counts them closed (else refusals would fill it). The cluster's own
  // workers have not connected yet.
  const auto deadline = std::chrono::steady_clock::now() + 5s;
  while (shard.open_connections() != 0 && std::chrono::steady_clock::now() < deadline) {
    std::this_thread::sleep_for(10ms);
  }
  EXPECT_EQ(shard.open_connections(), 0u);

  // Good workers (worker.key, trusting shard.pub) train.
  const ImageTask image = testing::SmallImage();
  std::vector<Result<TrainReport>> reports(2, Status::Internal("not run"));
  std::vector<std::thread> threads;
  for (int w = 0; w < 2; ++w) {
    threads.emplace_back([&, w] {
      WorkerOptions options;
      options.rank = w;
      options.train.quiet = true;
      options.train.write_png = false;
      reports[w] = TrainWorker((*servers)->config(), image, options);
    });
  }
  for (auto& t : threads) t.join();
  for (auto& r : reports) ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_EQ(shard.stats().applied_steps, 6u);
  fs::remove_all(dir);
}

// A client whose handshakes fail hears nothing from the shard, so its
// timeout must say why (a hostile probe's worker with the wrong shard.pub
// reported only "no pushAck from shards [0]"): a wrong server key, a key
// the shard does not admit, and nothing listening are told apart.
TEST(SecurityTest, AClientWhoseHandshakesFailIsToldWhy) {
  const std::string dir = MakeKeys();
  const std::vector<TableInfo> tables = {{"level0", 1000, 2}};
  auto partition = Partition::Make(tables, 1, ModelParallelDim::kRow);
  ASSERT_TRUE(partition.ok()) << partition.status().ToString();
  ShardOptions options;
  options.endpoint = "tcp://127.0.0.1:0";
  options.workers = 1;
  options.consistency = Consistency::kAsync;
  auto shard_curve = wire::CurveSettingsFor(SecureConfig(dir), "shard");
  ASSERT_TRUE(shard_curve.ok()) << shard_curve.status().ToString();
  options.curve = *shard_curve;
  auto shard = PsShard::Start(*partition, options);
  ASSERT_TRUE(shard.ok()) << shard.status().ToString();
  auto good = wire::CurveSettingsFor(SecureConfig(dir), "worker");
  ASSERT_TRUE(good.ok()) << good.status().ToString();
  const auto stranger = *wire::GenerateCurveKeyPair();

  // The push's error, with these client settings, against `endpoint`.
  // The last of `pushes` pushes' errors, each a Timeout: a later push may
  // find no connection up at all (after a ZAP refusal), and its send must
  // not wait forever (a hostile probe's worker did).
  auto push_error = [&](const wire::CurveSettings& curve, const std::string& endpoint,
                        int pushes = 1) {
    auto client = PsClient::Connect(bench::OneShardMap(endpoint, tables, 1), *partition, 0, 1,
                                    300ms, wire::Limits{}, curve);
    EXPECT_TRUE(client.ok()) << client.status().ToString();
    if (!client.ok()) return std::string();
    Status pushed;
    for (int p = 0; p < pushes; ++p) {
      pushed = (*client)->PushSkipped(p);
      EXPECT_EQ(pushed.code(), StatusCode::kTimeout) << pushed.ToString();
    }
    return pushed.ToString();
  };
  auto expect_words = [](const std::string& error, const std::vector<std::string>& words) {
    for (const auto& word : words)
      EXPECT_NE(error.find(word), std::string::npos) << "missing \"" << word << "\" in " << error;
  };

  wire::CurveSettings wrong_server = *good;
  wrong_server.server_public_z85 = stranger.public_z85;
  expect_words(push_error(wrong_server, (*shard)->endpoint()),
               {"no pushAck from shards [0", "failed their handshake and none completed",
                "security.keys_dir's shard.pub here is likely not its public key"});

  wire::CurveSettings unknown_client = *good;
  unknown_client.own = stranger;
  expect_words(push_error(unknown_client, (*shard)->endpoint(), /*pushes=*/3),
               {"it refused this process's key (ZAP status 400)"});

  // No security at all against a CURVE shard: ZeroMQ reports a mechanism
  // mismatch, or (when the shard hangs up first) no detail; both messages
  // name security.mode curve.
  expect_words(push_error(wire::CurveSettings{}, (*shard)->endpoint()),
               {"failed their handshake", "security.mode curve"});

  // A port nothing listens on: the shard's, once it is gone.
  const std::string gone = (*shard)->endpoint();
  shard->reset();
  expect_words(push_error(*good, gone), {"no TCP connection to shard 0 (" + gone + ") was ever"});
  fs::remove_all(dir);
}

// Under CURVE each frame crosses the wire in a MESSAGE box: what the shard
// counts as taken from a connection (wire::WireFrameBytes) must match it
// exactly, or the connection's unread bytes drift until it is cut off.
TEST(SecurityTest, WhatIsTakenUnderCurveMatchesTheWireExactly) {
  const std::string dir = MakeKeys();
  auto servers = InProcessCluster::Start(CurveConfig(dir, 1));
  ASSERT_TRUE(servers.ok()) << servers.status().ToString();
  PsShard& shard = (*servers)->shard(0);
  const auto observer = *wire::LoadCurveKeyPair(dir, "observer");
  zmq::context_t context(1);
  zmq::socket_t socket(context, zmq::socket_type::dealer);
  socket.set(zmq::sockopt::linger, 0);
  socket.set(zmq::sockopt::curve_serverkey, *wire::LoadCurvePublicKey(dir, "shard"));
  socket.set(zmq::sockopt::curve_publickey, observer.public_z85);
  socket.set(zmq::sockopt::curve_secretkey, observer.secret_z85);
  socket.connect(shard.endpoint());
  ASSERT_TRUE(ExchangeAssortedFrames(socket, 200));
  std::this_thread::sleep_for(60ms);  // a few sweeps
  // What is left: the greeting and the CURVE handshake's commands.
  EXPECT_GT(shard.largest_unread_bytes(), 64u);
  EXPECT_LT(shard.largest_unread_bytes(), 1024u);
  fs::remove_all(dir);
}

TEST(SecurityTest, MultiHostConfigsNeedKeysUnlessSecurityIsOff) {
  const std::string multi = R"({"distributed": {"enable": true, "world_size": 2,
      "master_addr": "10.0.0.1", "gradient_sync": "ps", "nodes": [
      {"name": "a", "host": "10.0.0.1"}, {"name": "b", "host": "10.0.0.2"}]})";
  auto refused = Config::Parse(multi + "}", "multi");
  ASSERT_FALSE(refused.ok());
  EXPECT_NE(refused.status().message().find("security.keys_dir"), std::string::npos);
  auto with_keys =
      Config::Parse(multi + R"(, "security": {"keys_dir": "/etc/gridsync/keys"}})", "k");
  ASSERT_TRUE(with_keys.ok()) << with_keys.status().ToString();
  EXPECT_TRUE(with_keys->security.curve);
  auto off = Config::Parse(multi + R"(, "security": {"mode": "off"}})", "off");
  ASSERT_TRUE(off.ok()) << off.status().ToString();
  EXPECT_FALSE(off->security.curve);
  auto local = Config::Parse(R"({"distributed": {"enable": true}})", "local");
  ASSERT_TRUE(local.ok());
  EXPECT_FALSE(local->security.curve);  // one machine, auto: loopback only
}

// ---- The control plane's key-based challenge ----

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
