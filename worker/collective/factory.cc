#include "worker/collective/factory.h"

#include <spdlog/fmt/fmt.h>

#include "worker/collective/gloo_collective.h"
#include "worker/collective/nccl_collective.h"

namespace gridsync {

Result<std::string> ResolveCollectiveKind(std::string_view kind) {
  if (kind == "gloo") return std::string("gloo");
  if (kind == "nccl" || kind == "auto") {
    std::string reason;
    if (NcclAvailable(&reason)) return std::string("nccl");
    if (kind == "auto") return std::string("gloo");
    return Status::Unsupported("collective backend 'nccl' cannot run here: " + reason);
  }
  return Status::InvalidArgument(
      fmt::format("unknown collective backend '{}' (allowed: auto, gloo, nccl)", kind));
}

Result<std::unique_ptr<Collective>> MakeCollective(std::string_view kind, Store* store, int rank, int size,
                                                   const std::string& group, std::chrono::milliseconds timeout,
                                                   const CollectiveEndpoint& endpoint) {
  if (kind != "auto" && kind != "gloo" && kind != "nccl") {
    return Status::InvalidArgument(
        fmt::format("unknown collective backend '{}' (allowed: auto, gloo, nccl)", kind));
  }
  // "nccl" asked for explicitly goes to the backend even without a device,
  // so that its error names the group and the rank.
  const bool nccl = kind == "nccl" || (kind == "auto" && NcclAvailable(nullptr));
  if (nccl) {
    NcclCollectiveOptions options;
    options.timeout = timeout;
    options.device = endpoint.cuda_device;
    return NewNcclCollective(store, rank, size, group, options);
  }
  GlooCollectiveOptions options;
  options.timeout = timeout;
  options.hostname = endpoint.hostname;
  options.interface = endpoint.interface;
  options.seal = endpoint.seal;
  return NewGlooCollective(store, rank, size, group, options);
}

}  // namespace gridsync
