// The sealed Gloo collective (security.curve; worker/collective/
// collective_seal.h, sealed_ring.h): a message opens only under the key and
// for the route it was sealed for, a rank holding another worker.key cannot
// join a group, and the gradients cross the network encrypted (a capture of
// the loopback device sees the plain group's values and not the sealed
// group's). Every operation's results: collective_test's sealedgloo cases.
#include <arpa/inet.h>
#include <linux/if_ether.h>
#include <linux/if_packet.h>
#include <net/if.h>
#include <sys/socket.h>

#include <cstring>

#include "tests/collective_test_util.h"

namespace gridsync {
namespace {

TEST(CollectiveSealTest, OpensOnlyWhatWasSealedUnderItsKeyForItsRoute) {
  const auto seal = *CollectiveSeal::FromCurveSecret(std::string(40, 'w'));
  const CollectiveSeal session = seal.ForSession("flat attempt 0: ok 1, ok 2");
  const std::string plain = "gradients of one ring step";
  const CollectiveSeal::Route route{1, 2, 7, 3};
  std::vector<uint8_t> sealed(plain.size() + CollectiveSeal::kTagBytes);
  session.Seal(plain.data(), plain.size(), route, sealed.data());
  EXPECT_EQ(std::search(sealed.begin(), sealed.end(), plain.begin(), plain.end()), sealed.end())
      << "the plain bytes are on the wire";

  std::string opened(plain.size(), '\0');
  ASSERT_TRUE(session.Open(sealed.data(), sealed.size(), route, opened.data()).ok());
  EXPECT_EQ(opened, plain);

  // Another route (sender, receiver, operation, index, part), session or key.
  for (const CollectiveSeal::Route other :
       {CollectiveSeal::Route{2, 2, 7, 3}, CollectiveSeal::Route{1, 0, 7, 3},
        CollectiveSeal::Route{1, 2, 8, 3}, CollectiveSeal::Route{1, 2, 7, 4},
        CollectiveSeal::Route{1, 2, 7, 3, 1}}) {
    const Status refused = session.Open(sealed.data(), sealed.size(), other, opened.data());
    EXPECT_EQ(refused.code(), StatusCode::kCorruption) << refused.ToString();
    EXPECT_CONTAINS(refused.message(), "from rank " + std::to_string(other.sender) + " to rank " +
                                           std::to_string(other.receiver));
    EXPECT_CONTAINS(refused.message(), "failed its authentication");
  }
  EXPECT_FALSE(seal.Open(sealed.data(), sealed.size(), route, opened.data()).ok());
  EXPECT_FALSE(seal.ForSession("flat attempt 1: ok 1, ok 2")
                   .Open(sealed.data(), sealed.size(), route, opened.data())
                   .ok());
  const auto stranger = *CollectiveSeal::FromCurveSecret(std::string(40, 'x'));
  EXPECT_FALSE(stranger.ForSession("flat attempt 0: ok 1, ok 2")
                   .Open(sealed.data(), sealed.size(), route, opened.data())
                   .ok());
  // Any byte changed on the way, and a message cut short.
  for (size_t i = 0; i < sealed.size(); ++i) {
    std::vector<uint8_t> changed = sealed;
    changed[i] ^= 0x01;
    EXPECT_FALSE(session.Open(changed.data(), changed.size(), route, opened.data()).ok()) << i;
  }
  const Status short_one = session.Open(sealed.data(), 15, route, opened.data());
  EXPECT_EQ(short_one.code(), StatusCode::kCorruption) << short_one.ToString();

  const auto bad = CollectiveSeal::FromCurveSecret("short");
  EXPECT_EQ(bad.status().code(), StatusCode::kInvalidArgument) << bad.status().ToString();
}

// The mesh check and the group count their operations alike, so they build
// the same nonces: their keys must differ, or the check's messages and the
// group's first operation's would share key and nonce (a review found them
// sealed under one key).
TEST(CollectiveSealTest, AMeshChecksAndServesUnderKeysOfTheirOwn) {
  const auto workers = *CollectiveSeal::FromCurveSecret(std::string(40, 'w'));
  const SessionSeals mesh = SessionSeals::Of(workers, "gloo-attempt/flat 0/\nok 1\nok 2");
  const CollectiveSeal::Route first{0, 1, 1, 0};  // operation 1, message 0 of both
  const std::string plain = "the check's nonces";
  std::vector<uint8_t> check(plain.size() + CollectiveSeal::kTagBytes);
  std::vector<uint8_t> group(check.size());
  mesh.check.Seal(plain.data(), plain.size(), first, check.data());
  mesh.group.Seal(plain.data(), plain.size(), first, group.data());
  EXPECT_NE(check, group) << "one key and nonce for both";
  std::string opened(plain.size(), '\0');
  EXPECT_TRUE(mesh.check.Open(check.data(), check.size(), first, opened.data()).ok());
  EXPECT_FALSE(mesh.group.Open(check.data(), check.size(), first, opened.data()).ok())
      << "a check's message replayed into the group opens";
  // Another mesh (another attempt's words) shares neither key.
  const SessionSeals other = SessionSeals::Of(workers, "gloo-attempt/flat 1/\nok 1\nok 2");
  EXPECT_FALSE(other.group.Open(group.data(), group.size(), first, opened.data()).ok());
  EXPECT_FALSE(other.check.Open(check.data(), check.size(), first, opened.data()).ok());
}

// A rank whose worker.key differs cannot open its neighbours' messages: the
// group's check fails on every rank, naming the authentication, within the
// timeout; nothing hangs.
TEST(SealedGlooTest, ARankWithAnotherWorkerKeyCannotJoin) {
  HashStore store;
  const std::string group = UniqueGroup("stranger-key");
  std::vector<Status> results(2);
  const auto start = Clock::now();
  RunRanks(2, [&](int r) {
    GlooCollectiveOptions options;
    options.timeout = 4s;
    options.seal = TestSeal(r == 0 ? 'w' : 'x');
    results[static_cast<size_t>(r)] = NewGlooCollective(&store, r, 2, group, options).status();
  });
  EXPECT_LT(SecondsSince(start), 10.0);
  for (int r = 0; r < 2; ++r) {
    const Status& s = results[static_cast<size_t>(r)];
    EXPECT_FALSE(s.ok()) << "rank " << r;
    EXPECT_CONTAINS(s.message(), "failed its authentication");
  }
}

// Every packet on the loopback device while it runs (root or CAP_NET_RAW),
// searched for `needle`.
class LoopbackCapture {
 public:
  explicit LoopbackCapture(std::string needle) : needle_(std::move(needle)) {
    fd_ = ::socket(AF_PACKET, SOCK_RAW, htons(ETH_P_ALL));
    if (fd_ < 0) return;
    const int buffer = 16 << 20;
    (void)::setsockopt(fd_, SOL_SOCKET, SO_RCVBUF, &buffer, sizeof(buffer));
    sockaddr_ll at{};
    at.sll_family = AF_PACKET;
    at.sll_protocol = htons(ETH_P_ALL);
    at.sll_ifindex = static_cast<int>(if_nametoindex("lo"));
    if (::bind(fd_, reinterpret_cast<sockaddr*>(&at), sizeof(at)) != 0) {
      ::close(fd_);
      fd_ = -1;
      return;
    }
    thread_ = std::thread([this] { Read(); });
  }
  ~LoopbackCapture() {
    stop_ = true;
    if (thread_.joinable()) thread_.join();
    if (fd_ >= 0) ::close(fd_);
  }
  bool capturing() const { return fd_ >= 0; }
  // Waits for the packets already sent to be read, then says what was seen.
  bool Seen() {
    std::this_thread::sleep_for(300ms);
    return seen_.load();
  }
  size_t bytes() const { return bytes_.load(); }

 private:
  void Read() {
    std::vector<char> packet(1 << 17);
    while (!stop_) {
      pollfd p{fd_, POLLIN, 0};
      if (::poll(&p, 1, 50) <= 0) continue;
      const ssize_t n = ::recv(fd_, packet.data(), packet.size(), 0);
      if (n <= 0) continue;
      bytes_ += static_cast<size_t>(n);
      if (std::search(packet.begin(), packet.begin() + n, needle_.begin(), needle_.end()) !=
          packet.begin() + n) {
        seen_ = true;
      }
    }
  }
  std::string needle_;
  int fd_ = -1;
  std::thread thread_;
  std::atomic<bool> stop_{false};
  std::atomic<bool> seen_{false};
  std::atomic<size_t> bytes_{0};
};

// The values of an all-reduce of 2 ranks on loopback: a capture sees them in
// a plain Gloo group (so the capture works) and never in a sealed one.
TEST(SealedGlooTest, TheValuesDoNotCrossTheNetworkInTheClear) {
  // 16 bytes that are 4 finite floats, as every rank's input.
  const std::string marker = "gridsync-plain!!";
  std::vector<float> pattern(4);
  std::memcpy(pattern.data(), marker.data(), marker.size());
  for (const Backend backend : {Backend::kGloo, Backend::kSealedGloo}) {
    SCOPED_TRACE(BackendName(backend));
    LoopbackCapture capture(marker);
    if (!capture.capturing()) {
      GTEST_SKIP() << "cannot capture the loopback device (an AF_PACKET socket needs root or "
                      "CAP_NET_RAW): "
                   << std::strerror(errno);
    }
    HashStore store;
    auto ranks = MakeGroup(backend, 2, 10s, UniqueGroup("capture"), &store);
    ASSERT_EQ(ranks.size(), 2u);
    std::vector<std::vector<float>> data(2);
    RunRanks(2, [&](int r) {
      auto& mine = data[static_cast<size_t>(r)];
      for (int i = 0; i < 16384; ++i) mine.insert(mine.end(), pattern.begin(), pattern.end());
      EXPECT_TRUE(ranks[static_cast<size_t>(r)]->AllReduceSum(mine.data(), mine.size()).ok());
    });
    EXPECT_EQ(data[0], data[1]);
    EXPECT_EQ(data[0][0], 2 * pattern[0]);
    const bool seen = capture.Seen();
    EXPECT_GT(capture.bytes(), 2 * 16384 * sizeof(float)) << "the capture saw too little";
    if (backend == Backend::kGloo) {
      EXPECT_TRUE(seen) << "the capture cannot see a plain group's values";
    } else {
      EXPECT_FALSE(seen) << "a sealed group's values crossed the network in the clear";
    }
  }
}

}  // namespace
}  // namespace gridsync
