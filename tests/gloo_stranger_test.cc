// A stranger at Gloo's listeners during the rendezvous: Gloo's TCP pairs
// listen on a port of their own while the mesh forms and take the first
// connection that comes, with no identity check. A hostile probe that
// connected first, sending nothing, ended the job in 10 runs of 11. The
// rendezvous now tries again on fresh ports and checks each mesh with an
// all-reduce of nonces (worker/collective/gloo_rendezvous.cc).
//
// The stranger here is made to win: the Store that carries the ranks'
// addresses lets it connect to every new listener on 127.0.0.1 before it
// hands a rank its peer's address, on the first attempt only.
#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <fstream>
#include <set>
#include <sstream>

#include "tests/collective_test_util.h"

namespace gridsync {
namespace {

// Ports of the sockets listening on 127.0.0.1 (/proc/net/tcp, state 0A).
std::set<uint16_t> LoopbackListeners() {
  std::set<uint16_t> ports;
  std::ifstream in("/proc/net/tcp");
  std::string line;
  std::getline(in, line);  // the header
  while (std::getline(in, line)) {
    std::istringstream fields(line);
    std::string slot, local, remote, state;
    fields >> slot >> local >> remote >> state;
    if (state != "0A" || local.rfind("0100007F:", 0) != 0) continue;
    ports.insert(static_cast<uint16_t>(std::stoul(local.substr(9), nullptr, 16)));
  }
  return ports;
}

// Connects to 127.0.0.1:port and keeps the socket, sending nothing.
int ConnectTo(uint16_t port) {
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  if (fd < 0) return -1;
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(port);
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  if (::connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0) {
    ::close(fd);
    return -1;
  }
  return fd;
}

// A HashStore through which a stranger pre-empts the first attempt: before
// a rank reads a peer's Gloo address under "gloo/<group>/<r>" (the peer has
// made its pairs' listeners by then), the stranger connects to every
// listener on 127.0.0.1 that was not there when the store was made.
class StrangerStore : public Store {
 public:
  explicit StrangerStore(std::string group)
      : before_(LoopbackListeners()), prefix_("gloo/" + std::move(group) + "/") {}
  ~StrangerStore() override {
    for (int fd : held_) ::close(fd);
  }

  Status Set(const std::string& key, const std::string& value) override {
    return inner_.Set(key, value);
  }

  Result<std::vector<std::string>> Get(const std::vector<std::string>& keys,
                                       std::chrono::milliseconds timeout) override {
    auto values = inner_.Get(keys, timeout);
    bool peers_address = false;
    for (const auto& key : keys) peers_address = peers_address || key.rfind(prefix_, 0) == 0;
    if (values.ok() && peers_address) {
      std::lock_guard<std::mutex> lock(mu_);
      for (uint16_t port : LoopbackListeners()) {
        if (before_.count(port) != 0 || taken_.count(port) != 0) continue;
        const int fd = ConnectTo(port);
        if (fd < 0) continue;
        taken_.insert(port);
        held_.push_back(fd);
      }
    }
    return values;
  }

  size_t taken() {
    std::lock_guard<std::mutex> lock(mu_);
    return taken_.size();
  }

 private:
  HashStore inner_;
  const std::set<uint16_t> before_;
  const std::string prefix_;
  std::mutex mu_;
  std::set<uint16_t> taken_;  // guarded by mu_
  std::vector<int> held_;     // guarded by mu_
};

TEST(GlooRendezvous, AStrangerAtTheListenersCostsAnAttemptNotTheGroup) {
  for (const int size : {2, 3}) {
    SCOPED_TRACE("ranks: " + std::to_string(size));
    const std::string group = UniqueGroup("stranger");
    StrangerStore store(group);
    std::vector<std::optional<Result<std::unique_ptr<Collective>>>> made(static_cast<size_t>(size));
    const auto start = Clock::now();
    RunRanks(size, [&](int r) {
      GlooCollectiveOptions options;
      options.timeout = 10s;
      made[static_cast<size_t>(r)].emplace(NewGlooCollective(&store, r, size, group, options));
    });
    EXPECT_GT(store.taken(), 0u) << "the stranger took no listener: this test proves nothing";
    EXPECT_LT(SecondsSince(start), 10.0) << "the retry waited out the timeout";
    for (int r = 0; r < size; ++r) {
      ASSERT_TRUE(made[static_cast<size_t>(r)]->ok())
          << "rank " << r << ": " << made[static_cast<size_t>(r)]->status().ToString();
    }
    // And the group works: every rank's sum is every rank's values'.
    std::vector<Status> sums(static_cast<size_t>(size));
    std::vector<std::vector<float>> data(static_cast<size_t>(size));
    RunRanks(size, [&](int r) {
      auto& d = data[static_cast<size_t>(r)];
      d.assign(1000, static_cast<float>(r + 1));
      sums[static_cast<size_t>(r)] = (**made[static_cast<size_t>(r)])->AllReduceSum(d.data(), 1000);
    });
    const float expected = static_cast<float>(size * (size + 1) / 2);
    for (int r = 0; r < size; ++r) {
      ASSERT_TRUE(sums[static_cast<size_t>(r)].ok()) << sums[static_cast<size_t>(r)].ToString();
      EXPECT_EQ(data[static_cast<size_t>(r)][0], expected);
      EXPECT_EQ(data[static_cast<size_t>(r)][999], expected);
    }
  }
}

}  // namespace
}  // namespace gridsync
