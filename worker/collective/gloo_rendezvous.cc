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
#include <optional>
#include <random>
#include <set>
#include <string_view>
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
constexpr milliseconds kCheckTimeout{5000};

// While its mesh forms, a rank looks this often for a peer's failure of
// the attempt (one Store read).
constexpr milliseconds kPeerFailureLook{100};

// Adapter from our Store seam to the store Gloo's rendezvous wants. Keys get
// the attempt's prefix; values are bytes. Gloo expects failures as
// exceptions, so a failed Store call throws gloo::IoException, and its
// Status is kept in error() for the caller, which reports it without the
// exception detour.
//
// Waits go in slices of kPeerFailureLook, each followed by a look at the
// attempt's failure key: the coordinator's store serves one call at a time
// per client, so a wait as long as the timeout kept the caller from seeing
// a peer's failure, and a wait for a peer that gave up lasted the timeout.
// Every call runs under mu_, which Abandon takes: once the caller gave up
// on the attempt (its store may go away), no call reaches the store.
class GlooStoreAdapter : public gloo::rendezvous::Store {
 public:
  GlooStoreAdapter(gridsync::Store* store, std::string prefix, std::string failed_key,
                   Clock::time_point deadline)
      : store_(store),
        prefix_(std::move(prefix)),
        failed_key_(std::move(failed_key)),
        deadline_(deadline) {}

  // Waits for a call in flight (at most one slice), then refuses the rest.
  void Abandon() {
    std::lock_guard<std::mutex> lock(mu_);
    abandoned_ = true;
  }

  // The key's value now, when the attempt is not abandoned and it is set.
  std::optional<std::string> Peek(const std::string& key) {
    std::lock_guard<std::mutex> lock(mu_);
    if (abandoned_) return std::nullopt;
    auto value = store_->Get({key}, milliseconds(0));
    if (!value.ok()) return std::nullopt;
    return value->front();
  }

  void set(const std::string& key, const std::vector<char>& data) override {
    std::unique_lock<std::mutex> lock(mu_);
    FailIfAbandoned();
    Status status = store_->Set(prefix_ + key, std::string(data.begin(), data.end()));
    if (!status.ok()) Fail(status);
  }

  std::vector<char> get(const std::string& key) override {
    const std::string value = WaitFor({prefix_ + key}, deadline_).front();
    return std::vector<char>(value.begin(), value.end());
  }

  // Gloo's kNoTimeout (0): the attempt's deadline.
  void wait(const std::vector<std::string>& keys) override { wait(keys, milliseconds(0)); }

  void wait(const std::vector<std::string>& keys,
            const std::chrono::milliseconds& timeout) override {
    std::vector<std::string> prefixed;
    prefixed.reserve(keys.size());
    for (const auto& key : keys) prefixed.push_back(prefix_ + key);
    // Gloo passes kNoTimeout (0) for "no timeout": the attempt's deadline.
    WaitFor(prefixed,
            timeout.count() > 0 ? std::min(deadline_, Clock::now() + timeout) : deadline_);
  }

  const Status& error() const { return error_; }

 private:
  std::vector<std::string> WaitFor(const std::vector<std::string>& keys, Clock::time_point until) {
    for (;;) {
      std::unique_lock<std::mutex> lock(mu_);
      FailIfAbandoned();
      const auto left = std::chrono::duration_cast<milliseconds>(until - Clock::now());
      auto values = store_->Get(keys, std::clamp(left, milliseconds(1), kPeerFailureLook));
      if (values.ok()) return std::move(values).value();
      if (values.status().code() != StatusCode::kTimeout || Clock::now() >= until)
        Fail(values.status());
      auto failed = store_->Get({failed_key_}, milliseconds(0));
      if (failed.ok()) Fail(Status::IOError(failed->front() + " failed this attempt"));
    }
  }

  // Under mu_.
  void FailIfAbandoned() {
    if (abandoned_) Fail(Status::IOError("the rendezvous gave up on this attempt"));
  }

  [[noreturn]] void Fail(const Status& status) {
    error_ = status;
    throw gloo::IoException(status.ToString());
  }

  gridsync::Store* store_;
  const std::string prefix_;
  const std::string failed_key_;
  const Clock::time_point deadline_;
  std::mutex mu_;
  bool abandoned_ = false;  // guarded by mu_
  Status error_;            // written by Gloo's calls, on the helper thread only
};

milliseconds Left(Clock::time_point deadline) {
  return std::max(milliseconds(1),
                  std::chrono::duration_cast<milliseconds>(deadline - Clock::now()));
}

// Every peer with the address it advertised, and what to check.
std::string PeersAt(Store* store, const std::string& hosts_prefix, int rank, int size) {
  std::string peers;
  for (int r = 0; r < size; ++r) {
    if (r == rank) continue;
    auto host = store->Get({hosts_prefix + std::to_string(r)}, milliseconds(0));
    peers += fmt::format("{}rank {} at {}", peers.empty() ? "" : ", ", r,
                         host.ok() ? host->front() : std::string("(never joined)"));
  }
  return "peers: " + peers +
         "; check that each peer's address is reachable from this host "
         "(distributed.nodes[].host, --host, GRIDSYNC_SOCKET_IFNAME)";
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
  mesh->adapter = std::make_shared<GlooStoreAdapter>(store, prefix, failed_key, deadline);
  std::thread([mesh, rank, size, options, timeout, what, listening, prefix] {
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
      // that did not join (look, do not wait; nothing once abandoned).
      std::vector<int> missing;
      for (int r = 0; r < size; ++r) {
        if (r != rank && !mesh->adapter->Peek(prefix + std::to_string(r))) missing.push_back(r);
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
      gave_up = Status::Timeout(fmt::format(
          "{}: the connections were not all up within {} (timeout {} + {} slack), listening on "
          "{}; {}",
          what, FormatSeconds(options.timeout + kConnectSlack), FormatSeconds(options.timeout),
          FormatSeconds(kConnectSlack), listening, PeersAt(store, hosts_prefix, rank, size)));
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

// A rank's word on a stage of an attempt: "ok <nonce>" (or "ok"), or
// "retry <why>" (this attempt failed on that rank; another may not). A rank
// that gives up for good (a peer never joined, or the time is up) says so
// under the attempt's "final" key instead.
constexpr std::string_view kOk = "ok";
constexpr std::string_view kRetry = "retry ";

// Every rank's word under `tag`, waiting for the last until the deadline
// plus the slack, and at least kWordsFloor: ranks that formed a mesh reach
// each stage within moments of each other, and one that gave up on a word
// another then read would leave them disagreeing. A rank that gave up for
// good says so under `final_key`, which ends the wait with its words (it
// may never give the word waited for: a peer that never joined).
constexpr milliseconds kWordsFloor{2000};
constexpr milliseconds kWordsSlice{200};
Result<std::vector<std::string>> Words(Store* store, const std::string& tag,
                                       const std::string& final_key, int size,
                                       const std::string& what, Clock::time_point deadline) {
  std::vector<std::string> keys;
  for (int r = 0; r < size; ++r) keys.push_back(tag + std::to_string(r));
  const auto until = std::max(Clock::now() + kWordsFloor, deadline + kConnectSlack);
  for (;;) {
    const auto left = std::chrono::duration_cast<milliseconds>(until - Clock::now());
    auto words = store->Get(keys, std::clamp(left, milliseconds(1), kWordsSlice));
    if (words.ok()) return words;
    if (words.status().code() != StatusCode::kTimeout) return words.status().WithContext(what);
    if (auto final = store->Get({final_key}, milliseconds(0)); final.ok())
      return Status::Timeout(what + ": " + final->front());
    if (Clock::now() < until) continue;
    std::vector<int> silent;
    for (int r = 0; r < size; ++r)
      if (!store->Get({keys[static_cast<size_t>(r)]}, milliseconds(0)).ok()) silent.push_back(r);
    return Status(words.status().code(),
                  fmt::format("{}: ranks {} did not say how their connections went within the "
                              "timeout: {}",
                              what, FormatRanks(silent), words.status().message()));
  }
}

// The ranks whose word is not ok, with their words ("" when all are ok).
std::string FailedWords(const std::vector<std::string>& words) {
  std::string failed;
  for (size_t r = 0; r < words.size(); ++r) {
    const std::string_view word = words[r];
    if (word.substr(0, kOk.size()) == kOk) continue;
    const std::string_view why =
        word.substr(0, kRetry.size()) == kRetry ? word.substr(kRetry.size()) : word;
    failed += fmt::format("{}rank {}: {}", failed.empty() ? "" : "; ", r, why);
  }
  return failed;
}

// The check of a formed mesh: every rank's nonce, summed around the ring
// (the pairs every all-reduce uses), comes back as each rank published it.
// A stranger on another pair fails the first operation that uses it, at
// its timeout.
Status CheckMesh(Collective& check, const std::vector<std::string>& words) {
  const auto size = static_cast<size_t>(check.size());
  std::vector<uint64_t> nonces(size, 0);
  for (size_t r = 0; r < size; ++r) {
    try {
      nonces[r] = std::stoull(words[r].substr(kOk.size()));
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
  const milliseconds check_timeout = std::min(kCheckTimeout, options.timeout);
  std::string failed;
  int attempts = 0;
  while (attempts < kMaxAttempts) {
    const int attempt = attempts++;
    // Each attempt's keys apart: Gloo's addresses (the first attempt's where
    // they always were) and the ranks' words. A space cannot be in a group
    // name (node names refuse it), so no group's keys are another's.
    const std::string prefix =
        attempt == 0 ? "gloo/" + group + "/" : fmt::format("gloo/{} attempt {}/", group, attempt);
    const std::string tag = fmt::format("gloo-attempt/{} {}/", group, attempt);
    auto mesh = ConnectMesh(store, rank, size, prefix, tag + "failed", hosts_prefix, what, options,
                            listening, deadline);
    if (!mesh.ok()) {
      // Peers still forming this attempt's mesh stop waiting on this rank.
      (void)store->Set(tag + "failed", fmt::format("rank {}", rank));
      // A peer that never joined, or the time is up: no attempt mends it.
      // Said before leaving, so that the others need not wait it out.
      const bool final = mesh.status().code() == StatusCode::kTimeout;
      if (final) {
        (void)store->Set(tag + "final",
                         fmt::format("rank {} gave up: {}", rank, mesh.status().message()));
        return mesh.status();
      }
      (void)store->Set(tag + std::to_string(rank), std::string(kRetry) + mesh.status().message());
    } else {
      GRIDSYNC_RETURN_IF_ERROR(
          store->Set(tag + std::to_string(rank), fmt::format("{} {}", kOk, nonce))
              .WithContext(what));
    }
    GRIDSYNC_ASSIGN_OR_RETURN(const std::vector<std::string> words,
                              Words(store, tag, tag + "final", size, what, deadline));
    failed = FailedWords(words);
    if (failed.empty()) {
      // A sealed group seals this mesh under a key of its own: the attempt
      // and every rank's nonce hashed into the workers' key.
      std::optional<SessionSeals> session;
      if (options.seal) {
        std::string described = tag;
        for (const std::string& word : words) described += "\n" + word;
        session = SessionSeals::Of(*options.seal, described);
      }
      const CollectiveSeal* check_seal = session ? &session->check : nullptr;
      const CollectiveSeal* seal = session ? &session->group : nullptr;
      // Every rank connected: does every pair of the ring carry its rank's
      // sums? (A short timeout: a few floats, at once on every rank.) Sealed,
      // a stranger on a pair fails it at once.
      auto check =
          gloo_internal::MakeGlooCollective(rank, size, group, check_timeout, *mesh, check_seal);
      const Status checked = CheckMesh(*check, words);
      GRIDSYNC_RETURN_IF_ERROR(
          store
              ->Set(tag + "checked/" + std::to_string(rank),
                    checked.ok() ? std::string(kOk) : std::string(kRetry) + checked.message())
              .WithContext(what));
      GRIDSYNC_ASSIGN_OR_RETURN(
          const std::vector<std::string> checks,
          Words(store, tag + "checked/", tag + "final", size, what, deadline));
      failed = FailedWords(checks);
      if (failed.empty()) {
        return gloo_internal::MakeGlooCollective(rank, size, group, options.timeout,
                                                 std::move(mesh).value(), seal);
      }
      failed = "the check of the connections failed: " + failed;
    }
    if (Clock::now() >= deadline) break;
    if (attempts < kMaxAttempts) {
      spdlog::warn("{}: attempt {} of {} failed ({}); connecting again on fresh ports", what,
                   attempts, kMaxAttempts, failed);
    }
  }
  return Status::IOError(fmt::format(
      "{}: the connections failed on {} attempt{} ({}); {}, and that no stranger connects to "
      "the pairs' listeners",
      what, attempts, attempts == 1 ? "" : "s", failed, PeersAt(store, hosts_prefix, rank, size)));
}

}  // namespace gridsync
