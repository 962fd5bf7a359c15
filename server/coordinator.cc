// The coordinator engine (coordinator_engine.h): listening, the serving
// thread and its heartbeat, stats, stopping.
//
// Thread safety: see coordinator_engine.h.
#include <fcntl.h>
#include <sys/file.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <filesystem>

#include "common/checkpoint_run.h"
#include "server/coordinator_engine.h"

namespace gridsync {
namespace coordinator_engine {

Status CoordinatorImpl::Listen() {
  if (options_.max_message_bytes < 8) {
    return Status::InvalidArgument(
        fmt::format("coordinator: max_message_bytes {} is too small; allowed: >= 8",
                    options_.max_message_bytes));
  }
  ErrorCode ec;
  tcp::endpoint endpoint;
  auto address = asio::ip::make_address(options_.bind_host, ec);
  if (!ec) {
    endpoint = tcp::endpoint(address, options_.port);
  } else {
    tcp::resolver resolver(io_);
    auto results = resolver.resolve(options_.bind_host, std::to_string(options_.port), ec);
    if (ec || results.empty()) {
      return Status::IOError(fmt::format("coordinator: cannot resolve bind address '{}': {}",
                                         options_.bind_host, ec ? ec.message() : "no addresses"));
    }
    endpoint = results.begin()->endpoint();
  }
  auto fail = [&](const char* step) {
    return Status::IOError(fmt::format("coordinator: cannot listen on {}:{} ({} failed): {}",
                                       options_.bind_host, options_.port, step, ec.message()));
  };
  if (acceptor_.open(endpoint.protocol(), ec); ec) return fail("open");
  if (acceptor_.set_option(tcp::acceptor::reuse_address(true), ec); ec) return fail("SO_REUSEADDR");
  if (acceptor_.bind(endpoint, ec); ec) return fail("bind");
  if (acceptor_.listen(asio::socket_base::max_listen_connections, ec); ec) return fail("listen");
  auto local = acceptor_.local_endpoint(ec);
  if (ec) return fail("getsockname");
  port_ = local.port();
  address_ = fmt::format("{}:{}", local.address().to_string(), port_);
  return Status::OK();
}

Status CoordinatorImpl::Restore() {
  if (options_.state_file.empty()) return Status::OK();
  const std::string& path = options_.state_file;
  {
    // One coordinator per state file: a second one (another launch, a unit
    // next to it) would overwrite the job the first keeps.
    std::error_code ec;
    const auto folder = std::filesystem::path(path).parent_path();
    if (!folder.empty()) std::filesystem::create_directories(folder, ec);
    const std::string lock = path + ".lock";
    lock_fd_ = ::open(lock.c_str(), O_CREAT | O_RDWR | O_CLOEXEC, 0640);
    if (lock_fd_ < 0) {
      return Status::IOError(fmt::format(
          "coordinator: cannot keep its state in {}: cannot open {}: {}; allowed: a folder it "
          "can write (checkpoint.dir)",
          path, lock, std::strerror(errno)));
    }
    if (::flock(lock_fd_, LOCK_EX | LOCK_NB) != 0) {
      return Status::IOError(fmt::format(
          "coordinator: another coordinator keeps its job in {} (it holds {}); allowed: one "
          "coordinator per checkpoint.dir",
          path, lock));
    }
  }
  std::optional<CoordinatorState> loaded;
  if (!options_.fresh_state) {
    GRIDSYNC_ASSIGN_OR_RETURN(loaded, LoadCoordinatorState(path));
  }
  if (loaded && (loaded->expected_shards != map_.expected_shards ||
                 loaded->expected_workers != map_.expected_workers)) {
    // Another cluster's shape cannot rejoin its job, and its checkpoints are
    // no job's of this coordinator: job 1, so that the parts holding them
    // refuse to start afresh over them (CheckFreshStartAgainst).
    spdlog::warn(
        "coordinator: {} holds job {} of a cluster of {} shards and {} workers; this one expects "
        "{} and {}, so it cannot rejoin that job: starting at job 1 as if new",
        path, loaded->job, loaded->expected_shards, loaded->expected_workers, map_.expected_shards,
        map_.expected_workers);
    loaded.reset();
  }
  if (loaded) {
    map_.job = loaded->job;
    map_.epoch = loaded->epoch;
    map_.resume_step = loaded->resume_step;
    training_started_ = loaded->training_started;
    job_done_ = loaded->job_done;
    for (const auto& [key, value] : loaded->checkpoints) KvPut(key, value);
    if (!loaded->run.empty()) KvPut(RunKey(map_.job), loaded->run);
    // Every member left with the previous run: what Cleanup does when the
    // last worker leaves, the job stays open only with a step to rejoin.
    if (training_started_ && !job_done_ && JobHasCompleteStep()) {
      spdlog::warn(
          "coordinator: restored job {} (epoch {}) from {}: its training was under way and it "
          "has a complete checkpoint, so restarted shards and workers rejoin it from its newest "
          "complete step",
          map_.job, map_.epoch, path);
    } else if (training_started_) {
      spdlog::info("coordinator: job {} in {} {}; starting job {}", map_.job, path,
                   job_done_ ? "ended" : "has no complete checkpoint to rejoin from", map_.job + 1);
      AdvanceJob();
    } else {
      spdlog::info("coordinator: restored job {} from {} (its training had not started)", map_.job,
                   path);
    }
  }
  // Written now: a folder that cannot be written fails here, not later.
  persisted_ = PersistentState();
  if (Status saved = SaveCoordinatorState(path, *persisted_); !saved.ok()) {
    return Status::IOError("coordinator: cannot keep its state in " + path + ": " +
                           saved.message() + "; allowed: a folder it can write (checkpoint.dir)");
  }
  if (!loaded) {
    spdlog::info("coordinator: starting at job 1; its job is kept in {}{}", path,
                 options_.fresh_state ? " (--fresh: what it held is forgotten)" : "");
  }
  return Status::OK();
}

void CoordinatorImpl::AdvanceJob() {
  // The ended job's checkpoint registry and run identity: no later job reads
  // them (a job's parts read only their own job's keys, and a fresh start
  // of job 2 on is checked against the files, CoordinatorKnowsCheckpoints),
  // and a long-running coordinator serving job after job would otherwise
  // keep a few keys per job until its store's key bound refused the next
  // job's.
  // So are the reasons its parts gave for not joining (kCannotJoinPrefix).
  for (const std::string& prefix : {CheckpointKey(map_.job, ""), RunKey(map_.job) + "/",
                                    RunKey(map_.job), std::string(kCannotJoinPrefix)}) {
    auto it = kv_.lower_bound(prefix);
    while (it != kv_.end() && it->first.rfind(prefix, 0) == 0 &&
           (prefix.back() == '/' || it->first == prefix)) {
      it = KvErase(it);
    }
  }
  ++map_.job;
  map_.epoch = 0;
  map_.resume_step = 0;
  training_started_ = false;
  job_done_ = false;
}

CoordinatorState CoordinatorImpl::PersistentState() const {
  CoordinatorState s;
  s.job = map_.job;
  s.epoch = map_.epoch;
  s.resume_step = map_.resume_step;
  s.training_started = training_started_;
  s.job_done = job_done_;
  s.expected_shards = map_.expected_shards;
  s.expected_workers = map_.expected_workers;
  // What the cluster's parts published, as a restart reads it back; anything
  // else a client wrote under the prefix is left out.
  const std::string prefix = CheckpointKey(map_.job, "");
  for (auto it = kv_.lower_bound(prefix); it != kv_.end() && it->first.rfind(prefix, 0) == 0;
       ++it) {
    if (IsPartEntry(it->first, it->second)) s.checkpoints.emplace(it->first, it->second);
  }
  if (const auto run = kv_.find(RunKey(map_.job)); run != kv_.end() && IsRunId(run->second)) {
    s.run = run->second;
  }
  return s;
}

void CoordinatorImpl::Persist() {
  // Shutting down, every member leaves: that is no state to come back to.
  if (options_.state_file.empty() || shutting_down_) return;
  CoordinatorState state = PersistentState();
  if (persisted_ && state == *persisted_) return;
  // The same state failed already: no write (and fsync) per reply on a full
  // disk; the next change tries again.
  if (unsaved_ && state == *unsaved_) return;
  Status saved;
  try {
    saved = SaveCoordinatorState(options_.state_file, state);
  } catch (const std::exception& e) {
    saved = Status::Internal(e.what());
  }
  if (saved.ok()) {
    persist_error_.clear();
    unsaved_.reset();
    persisted_ = std::move(state);
    return;
  }
  // The file on disk no longer says what this coordinator serves: removed,
  // so that a restart starts as new (and the fresh-start guard protects the
  // checkpoints) instead of reopening a job this one left. Serving goes on.
  persisted_.reset();
  unsaved_ = std::move(state);
  std::error_code ec;
  std::filesystem::remove(options_.state_file, ec);
  if (saved.message() != persist_error_) {
    persist_error_ = saved.message();
    spdlog::error("coordinator: cannot keep its state in {}: {}; {}: a restart would forget job {}",
                  options_.state_file, saved.message(),
                  ec ? "the old file could not be removed either (" + ec.message() + ")"
                     : "the old file is removed",
                  map_.job);
  }
}

void CoordinatorImpl::Heartbeat() {
  heartbeats_.fetch_add(1, std::memory_order_relaxed);
  heartbeat_timer_.expires_after(std::chrono::milliseconds(250));
  heartbeat_timer_.async_wait([this](const ErrorCode& ec) {
    if (!ec && !shutting_down_) Heartbeat();
  });
}

Result<CoordinatorStats> CoordinatorImpl::stats(std::chrono::milliseconds timeout) {
  auto promise = std::make_shared<std::promise<CoordinatorStats>>();
  auto future = promise->get_future();
  asio::post(io_, [this, promise] {
    CoordinatorStats s = counts_;
    s.generation = map_.generation;
    s.job = map_.job;
    s.epoch = map_.epoch;
    s.shards = static_cast<uint32_t>(map_.shards.size());
    s.workers = static_cast<uint32_t>(map_.workers.size());
    s.expected_shards = map_.expected_shards;
    s.expected_workers = map_.expected_workers;
    s.connections = connections_.size();
    s.barrier_waiting = 0;
    for (const auto& [name, barrier] : barriers_) s.barrier_waiting += barrier.waiters.size();
    s.barriers = barriers_.size();
    s.pending_bytes = pending_bytes_;
    s.queued_bytes = queued_bytes_;
    for (const auto& conn : connections_) s.queued_requests += conn->queued.size();
    promise->set_value(s);
  });
  if (future.wait_for(timeout) != std::future_status::ready) {
    return Status::Timeout("coordinator: its serving thread did not answer within " +
                           std::to_string(timeout.count()) + " ms");
  }
  return future.get();
}

void CoordinatorImpl::Launch() {
  Accept();
  Heartbeat();
  thread_ = std::thread([this] {
    for (;;) {
      try {
        io_.run();
        break;
      } catch (const std::exception& e) {
        // Handlers are guarded; this is a last resort so the server lives on.
        spdlog::error("coordinator: io_context: {}", e.what());
      } catch (...) {
        spdlog::error("coordinator: io_context: unknown exception");
      }
    }
    thread_done_.set_value();
  });
}

void CoordinatorImpl::Stop() {
  std::lock_guard<std::mutex> lock(stop_mu_);
  if (!thread_.joinable()) return;
  asio::post(io_, [this] { Guard(nullptr, "shutdown", [&] { Shutdown(); }); });
  // Shutdown cancels every timer and half-closes every socket, so run()
  // returns by itself once the connections' lingering ended: at each peer's
  // EOF, 500 ms after its replies were written, or at kStopLinger for a
  // peer that does not read them. stop() is the fallback.
  if (thread_done_.get_future().wait_for(std::chrono::seconds(5)) != std::future_status::ready) {
    spdlog::warn(
        "coordinator: handlers still running 5 s after Stop() (a handler that does not "
        "return?); stopping the io_context");
    io_.stop();
  }
  thread_.join();
  spdlog::info("coordinator on {} stopped", address_);
}

void CoordinatorImpl::Shutdown() {
  shutting_down_ = true;
  ErrorCode ignored;
  acceptor_.close(ignored);
  accept_retry_.cancel();
  heartbeat_timer_.cancel();
  auto cancel = [](std::vector<std::shared_ptr<Waiter>>& waiters) {
    for (auto& w : waiters) {
      w->done = true;
      w->timer.cancel();
    }
    waiters.clear();
  };
  cancel(map_waiters_);
  cancel(kv_waiters_);
  for (auto& [name, barrier] : barriers_) cancel(barrier.waiters);
  // Each connection half-closes and lingers (Linger) rather than closing at
  // once: a reply still queued here or unsent in the kernel reaches its
  // peer. A barrier's release replies to every member at once, and the
  // launcher that stops this coordinator got its reply first; closed at
  // once, a socket with unread input is reset and the kernel drops what it
  // held, so another node's launcher lost its reply and exited 1 for a job
  // that had finished (a hostile network probe). Lingering ends at each
  // peer's EOF or 500 ms after its replies were written; whatever a peer
  // that does not read leaves is closed at kStopLinger.
  auto connections = connections_;
  for (const auto& conn : connections) {
    if (conn->closed || conn->closing) continue;  // refused: lingering already
    conn->closing = true;
    conn->linger_reason = "coordinator stopping";
    if (!conn->writing) Linger(conn);  // else once its outbox is written (WriteNext)
  }
  if (connections_.empty()) return;  // else Close cancels the timer once the last is closed
  stop_timer_.expires_after(kStopLinger);
  stop_timer_.async_wait([this](const ErrorCode&) {
    Guard(nullptr, "shutdown", [&] {
      auto left = connections_;
      size_t unsent = 0;
      for (const auto& conn : left) unsent += conn->outbox_bytes;
      if (!left.empty()) {
        spdlog::info(
            "coordinator: closing {} connection(s) whose peers did not take their last "
            "replies within {} ms of the stop ({} bytes unsent)",
            left.size(), kStopLinger.count(), unsent);
      }
      for (const auto& conn : left) Close(conn, "coordinator stopped");
    });
  });
}

}  // namespace coordinator_engine

Result<std::unique_ptr<Coordinator>> Coordinator::Start(const CoordinatorOptions& options) {
  auto impl = std::make_unique<coordinator_engine::CoordinatorImpl>(options);
  // Listening first: a coordinator that cannot take its port never touches
  // the state file of the one that has it.
  GRIDSYNC_RETURN_IF_ERROR(impl->Listen());
  GRIDSYNC_RETURN_IF_ERROR(impl->Restore());
  impl->Launch();
  return std::unique_ptr<Coordinator>(std::move(impl));
}

}  // namespace gridsync
