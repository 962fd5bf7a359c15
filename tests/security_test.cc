// The data plane under CURVE (security.curve): a shard admits only the
// listed client keys through its ZAP handler; unknown keys, NULL and PLAIN
// clients and clients that trust the wrong server key get nothing; good
// workers train. Keys come from `gridsync keygen`'s format (wire/curve.h).
// The control plane's side is control_auth_test.cc.
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <thread>

#include "common/wire/curve.h"
#include "server/in_process_cluster.h"
#include "tests/curve_test_keys.h"
#include "tests/ps_test_util.h"
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
using testing::MakeKeys;
using testing::SecureConfig;

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

}  // namespace
}  // namespace gridsync
