// The Gloo backend's rendezvous (gloo_collective.h): the ranks of a group
// connect a full mesh of Gloo's TCP pairs, finding each other through the
// Store, and check it before it carries anything.
//
// Why attempts and a check: Gloo's TCP pairs listen on a port of their own
// while the mesh forms and take the first connection that comes, with no
// identity check. A hostile probe that watched for the listeners and
// connected first, sending nothing, ended the job in 10 runs of 11 (the
// peer it pre-empted had its own connect refused, and its worker exited 1);
// the rank that took the stranger's connection went on with it. Now every
// rank says in the Store how its attempt went, under keys of the attempt;
// when all connected, an all-reduce of nonces each rank published there
// (which a stranger cannot read under `security: curve`, nor then add to
// the sums) checks every pair; and when any rank failed or the check did
// not add up, all of them connect again on fresh ports, up to kMaxAttempts
// times within the timeout. A rank whose connect waits on a peer that gave
// up on the attempt sees that peer's failure in the Store and gives up too.
// A rank that never joins still fails the others at the timeout, naming it.
//
// Thread safety: NewGlooCollective may be called from any thread.
#include <gloo/common/error.h>
#include <gloo/rendezvous/context.h>
#include <gloo/rendezvous/store.h>
#include <gloo/transport/tcp/device.h>
#include <spdlog/fmt/fmt.h>
#include <spdlog/spdlog.h>

#include <algorithm>
#include <atomic>
#include <condition_variable>
#include <mutex>
#include <random>
#include <set>
#include <thread>
#include <utility>
#include <vector>

#include "common/tcp_backoff.h"
#include "worker/collective/gloo_collective.h"
#include "worker/collective/gloo_internal.h"

namespace gridsync {
namespace {

using Clock = std::chrono::steady_clock;
using std::chrono::milliseconds;

// How long past its timeout a Gloo rendezvous may take before it is
// abandoned (stated in README and tested): Gloo's connect loop runs its own
// timers, which can end a little after ours.
constexpr milliseconds kConnectSlack{5000};

// Meshes tried before the rendezvous fails: a stranger racing for the
// listeners of every attempt is a flood, not a probe.
constexpr int kMaxAttempts = 8;

// The check of a formed mesh (one small all-reduce): at most this long, or
// the timeout if shorter.
constexpr milliseconds kCheckTimeout{10000};

// While its mesh forms, a rank looks this often for a peer's failure of
// the attempt (one Store read).
constexpr milliseconds kPeerFailureLook{100};

// Adapter from our Store seam to the store Gloo's rendezvous wants. Keys get
// the group's prefix; values are bytes. Gloo expects failures as exceptions,
// so a failed Store call throws gloo::IoException, and its Status is kept in
// error() for the caller, which reports it without the exception detour.
class GlooStoreAdapter : public gloo::rendezvous::Store {
 public:
  GlooStoreAdapter(gridsync::Store* store, std::string prefix, std::chrono::milliseconds timeout)
      : store_(store), prefix_(std::move(prefix)), timeout_(timeout) {}

  // The caller gave up on this attempt (its store may go away): Gloo's
  // further calls fail without touching it.
  void Abandon() { abandoned_.store(true, std::memory_order_release); }

  void set(const std::string& key, const std::vector<char>& data) override {
    FailIfAbandoned();
    Status status = store_->Set(prefix_ + key, std::string(data.begin(), data.end()));
    if (!status.ok()) Fail(status);
  }

  std::vector<char> get(const std::string& key) override {
    FailIfAbandoned();
    auto values = store_->Get({prefix_ + key}, timeout_);
    if (!values.ok()) Fail(values.status());
    const std::string& value = values->front();
    return std::vector<char>(value.begin(), value.end());
  }

  void wait(const std::vector<std::string>& keys) override { wait(keys, timeout_); }

  void wait(const std::vector<std::string>& keys,
            const std::chrono::milliseconds& timeout) override {
    FailIfAbandoned();
    std::vector<std::string> prefixed;
    prefixed.reserve(keys.size());
    for (const auto& key : keys) prefixed.push_back(prefix_ + key);
    // Gloo passes kNoTimeout (0) for "no timeout"; ours means "do not wait".
    auto values = store_->Get(prefixed, timeout.count() > 0 ? timeout : timeout_);
    if (!values.ok()) Fail(values.status());
  }

  const Status& error() const { return error_; }

 private:
  void FailIfAbandoned() {
    if (abandoned_.load(std::memory_order_acquire))
      Fail(Status::IOError("the rendezvous gave up on this attempt"));
  }

  [[noreturn]] void Fail(const Status& status) {
    error_ = status;
    throw gloo::IoException(status.ToString());
  }

  gridsync::Store* store_;
  const std::string prefix_;
  const std::chrono::milliseconds timeout_;
  std::atomic<bool> abandoned_{false};
  Status error_;
};

milliseconds Left(Clock::time_point deadline) {
  return std::max(milliseconds(1),
                  std::chrono::duration_cast<milliseconds>(deadline - Clock::now()));
}

// One attempt's mesh, on a helper thread so that the call returns by the
// deadline plus kConnectSlack whatever Gloo does, or as soon as a peer says
// in the Store that it failed the attempt (`failed_key`). On either, the
// helper is abandoned: it holds only state it shares.
Result<std::shared_ptr<gloo::rendezvous::Context>> ConnectMesh(
    Store* store, int rank, int size, const std::string& prefix, const std::string& failed_key,
    const std::string& hosts_prefix, const std::string& what, const GlooCollectiveOptions& options,
    const std::string& listening, Clock::time_point deadline) {
  struct Mesh {
    std::shared_ptr<GlooStoreAdapter> adapter;
    std::shared_ptr<gloo::rendezvous::Context> context;
    Status status;
    std::mutex mu;
    std::condition_variable done_cv;
    bool done = false;
    bool abandoned = false;  // the caller gave up: its store may be gone
  };
  const milliseconds timeout = Left(deadline);
  auto mesh = std::make_shared<Mesh>();
  mesh->adapter = std::make_shared<GlooStoreAdapter>(store, prefix, timeout);
  std::thread([mesh, rank, size, options, timeout, what, listening, prefix, store] {
    const auto started = Clock::now();
    Status status;
    try {
      gloo::transport::tcp::attr attr;
      if (!options.interface.empty()) {
        attr.iface = options.interface;
      } else {
        attr.hostname = options.hostname;
      }
      auto device = gloo::transport::tcp::CreateDevice(attr);
      auto context = std::make_shared<gloo::rendezvous::Context>(rank, size);
      context->setTimeout(timeout);
      // The sockets connectFullMesh makes are the pairs' (Gloo keeps their
      // descriptors to itself): they are the ones not open before it.
      std::set<uint64_t> before;
      for (const OpenTcpSocket& s : OpenTcpSockets()) before.insert(s.inode);
      context->connectFullMesh(*mesh->adapter, device);
      // A collective's wait ends at the timeout with no second chance:
      // after an outage its pairs resend within RetransmitCapFor of the
      // link's return, not on TCP's doubled timer (common/tcp_backoff.h).
      const auto cap = RetransmitCapFor(options.timeout);
      for (const OpenTcpSocket& s : OpenTcpSockets()) {
        if (before.count(s.inode) != 0) continue;
        (void)CapRetransmitBackoff(s.fd, cap);  // an older kernel keeps its backoff
      }
      std::lock_guard<std::mutex> lock(mesh->mu);
      mesh->context = std::move(context);
    } catch (...) {
      {
        std::lock_guard<std::mutex> lock(mesh->mu);
        if (mesh->abandoned) return;
      }
      // Which peers never published their addresses? Those are the ranks
      // that did not join (timeout 0: look, do not wait).
      std::vector<int> missing;
      for (int r = 0; r < size; ++r) {
        if (r != rank && !store->Get({prefix + std::to_string(r)}, milliseconds(0)).ok()) {
          missing.push_back(r);
        }
      }
      const std::string where = fmt::format(
          "{} failed after {} (timeout {}, listening on {}){}", what,
          FormatSeconds(std::chrono::duration_cast<milliseconds>(Clock::now() - started)),
          FormatSeconds(timeout), listening,
          missing.empty() ? "" : "; ranks that did not join: " + FormatRanks(missing));
      if (!mesh->adapter->error().ok()) {
        // The store failed (typically a timeout naming the missing key):
        // keep its code.
        status = Status(mesh->adapter->error().code(),
                        fmt::format("{}: {}", where, mesh->adapter->error().message()));
      } else {
        status = gloo_internal::StatusFromCurrentException(where);
      }
    }
    std::lock_guard<std::mutex> lock(mesh->mu);
    mesh->status = std::move(status);
    mesh->done = true;
    mesh->done_cv.notify_all();
  }).detach();

  const auto limit = deadline + kConnectSlack;
  std::unique_lock<std::mutex> lock(mesh->mu);
  while (!mesh->done_cv.wait_for(lock, kPeerFailureLook, [&] { return mesh->done; })) {
    Status gave_up;
    if (Clock::now() >= limit) {
      // Name every peer with the address it advertised.
      std::string peers;
      for (int r = 0; r < size; ++r) {
        if (r == rank) continue;
        auto host = store->Get({hosts_prefix + std::to_string(r)}, milliseconds(0));
        peers += fmt::format("{}rank {} at {}", peers.empty() ? "" : ", ", r,
                             host.ok() ? host->front() : std::string("(never joined)"));
      }
      gave_up = Status::Timeout(fmt::format(
          "{}: the connections were not all up within {} (timeout {} + {} slack), listening on "
          "{}; peers: {}; check that each peer's address is reachable from this host "
          "(distributed.nodes[].host, --host, GRIDSYNC_SOCKET_IFNAME)",
          what, FormatSeconds(options.timeout + kConnectSlack), FormatSeconds(options.timeout),
          FormatSeconds(kConnectSlack), listening, peers));
    } else {
      lock.unlock();
      auto failed = store->Get({failed_key}, milliseconds(0));
      lock.lock();
      if (mesh->done) break;
      if (failed.ok())
        gave_up = Status::IOError(fmt::format("{}: {} failed this attempt", what, failed->front()));
    }
    if (gave_up.ok()) continue;
    mesh->abandoned = true;
    mesh->adapter->Abandon();
    return gave_up;
  }
  if (!mesh->status.ok()) return mesh->status;
  return mesh->context;
}

// A 63-bit nonce as three floats of 21 bits each (exact in a float sum).
constexpr int kNonceParts = 3;
void NonceParts(uint64_t nonce, float* out) {
  for (int i = 0; i < kNonceParts; ++i)
    out[i] = static_cast<float>((nonce >> (21 * i)) & ((uint64_t{1} << 21) - 1));
}

// Every rank's word on an attempt's `stage` ("ok <nonce>" or a failure),
// waiting for the last until the deadline (plus the slack).
Result<std::vector<std::string>> Words(Store* store, const std::string& tag, int size,
                                       const std::string& what, Clock::time_point deadline) {
  std::vector<std::string> keys;
  for (int r = 0; r < size; ++r) keys.push_back(tag + std::to_string(r));
  auto words = store->Get(keys, Left(deadline + kConnectSlack));
  if (words.ok()) return words;
  std::vector<int> silent;
  for (int r = 0; r < size; ++r)
    if (!store->Get({keys[static_cast<size_t>(r)]}, milliseconds(0)).ok()) silent.push_back(r);
  return Status(words.status().code(),
                fmt::format("{}: ranks {} did not say how their connections went within the "
                            "timeout: {}",
                            what, FormatRanks(silent), words.status().message()));
}

// The ranks whose word is not "ok ..." and their words; empty when all are.
std::string FailedWords(const std::vector<std::string>& words) {
  std::string failed;
  for (size_t r = 0; r < words.size(); ++r) {
    if (words[r].rfind("ok", 0) == 0) continue;
    failed += fmt::format("{}rank {}: {}", failed.empty() ? "" : "; ", r, words[r]);
  }
  return failed;
}

// The check of a formed mesh: every rank's nonce, summed through every
// pair, comes back as each rank published it.
Status CheckMesh(Collective& check, const std::vector<std::string>& words) {
  const auto size = static_cast<size_t>(check.size());
  std::vector<uint64_t> nonces(size, 0);
  for (size_t r = 0; r < size; ++r) {
    try {
      nonces[r] = std::stoull(words[r].substr(3));
    } catch (const std::exception&) {
      return Status::InvalidArgument(
          fmt::format("rank {}'s word '{}' holds no nonce", r, words[r]));
    }
  }
  std::vector<float> sums(size * kNonceParts, 0.0f);
  NonceParts(nonces[static_cast<size_t>(check.rank())],
             sums.data() + static_cast<size_t>(check.rank()) * kNonceParts);
  GRIDSYNC_RETURN_IF_ERROR(check.AllReduceSum(sums.data(), sums.size()));
  for (size_t r = 0; r < size; ++r) {
    float expected[kNonceParts];
    NonceParts(nonces[r], expected);
    if (!std::equal(expected, expected + kNonceParts, sums.data() + r * kNonceParts)) {
      return Status::IOError(fmt::format(
          "the check's sum of rank {}'s nonce came back wrong: a connection of the mesh is not "
          "to its rank",
          r));
    }
  }
  return Status::OK();
}

}  // namespace

Result<std::unique_ptr<Collective>> NewGlooCollective(Store* store, int rank, int size,
                                                      const std::string& group,
                                                      const GlooCollectiveOptions& options) {
  gloo_internal::IgnoreSigpipe();
  const std::string what =
      fmt::format("gloo rendezvous of group '{}' (rank {} of {})", group, rank, size);
  if (store == nullptr) return Status::InvalidArgument(what + ": no store given");
  if (size < 1 || rank < 0 || rank >= size) {
    return Status::InvalidArgument(
        fmt::format("{}: rank must be in 0..size-1 and size at least 1", what));
  }
  if (group.empty()) return Status::InvalidArgument(what + ": the group name is empty");
  if (options.timeout.count() <= 0) {
    return Status::InvalidArgument(
        fmt::format("{}: timeout must be positive, got {} ms", what, options.timeout.count()));
  }
  if (options.hostname.empty() && options.interface.empty()) {
    return Status::InvalidArgument(what + ": set a hostname or an interface to listen on");
  }

  const std::string listening =
      options.interface.empty() ? options.hostname : "interface " + options.interface;
  // Our address under our own key, so that a connect that never completes
  // can name the peers' addresses (Gloo's own keys hold binary sockaddrs).
  const std::string hosts_prefix = "gloo-hosts/" + group + "/";
  GRIDSYNC_RETURN_IF_ERROR(
      store->Set(hosts_prefix + std::to_string(rank), listening).WithContext(what));
  std::random_device entropy;
  const uint64_t nonce =
      ((uint64_t{entropy()} << 32) | entropy()) & ((uint64_t{1} << (21 * kNonceParts)) - 1);
  const auto deadline = Clock::now() + options.timeout;
  Status failure;
  int attempts = 0;
  for (int attempt = 0; attempt < kMaxAttempts; ++attempt) {
    ++attempts;
    // Each attempt's keys apart: Gloo's addresses (the first attempt's where
    // they always were) and the ranks' words on it.
    const std::string prefix =
        attempt == 0 ? "gloo/" + group + "/" : fmt::format("gloo/{}#{}/", group, attempt);
    const std::string tag = fmt::format("gloo-attempt/{}/{}/", group, attempt);
    auto mesh = ConnectMesh(store, rank, size, prefix, tag + "failed", hosts_prefix, what, options,
                            listening, deadline);
    if (!mesh.ok()) {
      (void)store->Set(tag + "failed", fmt::format("rank {}", rank));
      // A peer that never joined, or the time is up: no attempt mends it.
      if (mesh.status().code() == StatusCode::kTimeout) return mesh.status();
    }
    GRIDSYNC_RETURN_IF_ERROR(store
                                 ->Set(tag + std::to_string(rank), mesh.ok()
                                                                       ? fmt::format("ok {}", nonce)
                                                                       : mesh.status().message())
                                 .WithContext(what));
    GRIDSYNC_ASSIGN_OR_RETURN(const std::vector<std::string> words,
                              Words(store, tag, size, what, deadline));
    std::string failed = FailedWords(words);
    if (failed.empty()) {
      // Every rank connected: does every pair carry its rank's sums?
      const milliseconds check_timeout =
          std::min({kCheckTimeout, options.timeout, std::max(Left(deadline), milliseconds(1000))});
      auto check = gloo_internal::MakeGlooCollective(rank, size, group, check_timeout, *mesh);
      const Status checked = CheckMesh(*check, words);
      GRIDSYNC_RETURN_IF_ERROR(store
                                   ->Set(tag + "checked/" + std::to_string(rank),
                                         checked.ok() ? std::string("ok") : checked.message())
                                   .WithContext(what));
      GRIDSYNC_ASSIGN_OR_RETURN(const std::vector<std::string> checks,
                                Words(store, tag + "checked/", size, what, deadline));
      failed = FailedWords(checks);
      if (failed.empty()) {
        return gloo_internal::MakeGlooCollective(rank, size, group, options.timeout,
                                                 std::move(mesh).value());
      }
      failure =
          Status::IOError(fmt::format("{}: the check of the connections failed: {}", what, failed));
    } else {
      failure = mesh.ok() ? Status::IOError(fmt::format("{}: {}", what, failed)) : mesh.status();
    }
    if (attempt + 1 < kMaxAttempts && Clock::now() < deadline) {
      spdlog::warn("{} (attempt {} of {}); connecting again on fresh ports", failure.message(),
                   attempt + 1, kMaxAttempts);
    }
    if (Clock::now() >= deadline) break;
  }
  return Status(failure.code(),
                fmt::format("{} (after {} attempt{} on fresh ports within the timeout: is a "
                            "stranger connecting to the pairs' listeners?)",
                            failure.message(), attempts, attempts == 1 ? "" : "s"));
}

}  // namespace gridsync
