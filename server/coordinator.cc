// The coordinator engine (coordinator_engine.h): listening, the serving
// thread and its heartbeat, stats, stopping.
//
// Thread safety: see coordinator_engine.h.
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
  // Shutdown closes every socket and timer, so run() returns by itself once
  // the aborted handlers have run; stop() is the fallback.
  if (thread_done_.get_future().wait_for(std::chrono::seconds(5)) != std::future_status::ready) {
    spdlog::warn("coordinator: handlers still running 5 s after Stop(); stopping the io_context");
    io_.stop();
  }
  thread_.join();
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
  auto connections = connections_;
  for (const auto& conn : connections) Close(conn, "coordinator stopping");
  connections_.clear();
  spdlog::info("coordinator on {} stopped", address_);
}

}  // namespace coordinator_engine

Result<std::unique_ptr<Coordinator>> Coordinator::Start(const CoordinatorOptions& options) {
  auto impl = std::make_unique<coordinator_engine::CoordinatorImpl>(options);
  GRIDSYNC_RETURN_IF_ERROR(impl->Listen());
  impl->Launch();
  return std::unique_ptr<Coordinator>(std::move(impl));
}

}  // namespace gridsync
