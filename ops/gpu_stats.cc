#include "ops/gpu_stats.h"

#include <dlfcn.h>

namespace gridsync {

// The few NVML entry points used, with their C ABI (nvml.h is not shipped
// with the toolkit here).
struct GpuStats::Api {
  struct Utilization {
    unsigned gpu, memory;
  };
  struct Memory {
    unsigned long long total, free, used;
  };
  using Device = void*;
  void* library = nullptr;
  int (*init)() = nullptr;
  int (*shutdown)() = nullptr;
  int (*handle_by_index)(unsigned, Device*) = nullptr;
  int (*utilization)(Device, Utilization*) = nullptr;
  int (*memory)(Device, Memory*) = nullptr;
  Device device = nullptr;
};

std::unique_ptr<GpuStats> GpuStats::Open(unsigned index, std::string* why) {
  auto api = std::make_unique<Api>();
  api->library = dlopen("libnvidia-ml.so.1", RTLD_NOW | RTLD_LOCAL);
  if (api->library == nullptr) {
    *why = "NVML (libnvidia-ml.so.1) not found: no NVIDIA driver";
    return nullptr;
  }
  auto sym = [&](const char* name) { return dlsym(api->library, name); };
  api->init = reinterpret_cast<int (*)()>(sym("nvmlInit_v2"));
  api->shutdown = reinterpret_cast<int (*)()>(sym("nvmlShutdown"));
  api->handle_by_index =
      reinterpret_cast<int (*)(unsigned, Api::Device*)>(sym("nvmlDeviceGetHandleByIndex_v2"));
  api->utilization = reinterpret_cast<int (*)(Api::Device, Api::Utilization*)>(
      sym("nvmlDeviceGetUtilizationRates"));
  api->memory =
      reinterpret_cast<int (*)(Api::Device, Api::Memory*)>(sym("nvmlDeviceGetMemoryInfo"));
  if (!api->init || !api->shutdown || !api->handle_by_index || !api->utilization || !api->memory) {
    *why = "NVML lacks an entry point gridsync uses";
    dlclose(api->library);
    return nullptr;
  }
  if (api->init() != 0) {
    *why = "NVML did not initialise (no device or driver)";
    dlclose(api->library);
    return nullptr;
  }
  if (api->handle_by_index(index, &api->device) != 0) {
    *why = "no GPU " + std::to_string(index);
    api->shutdown();
    dlclose(api->library);
    return nullptr;
  }
  return std::unique_ptr<GpuStats>(new GpuStats(std::move(api)));
}

GpuStats::GpuStats(std::unique_ptr<Api> api) : api_(std::move(api)) {}

GpuStats::~GpuStats() {
  api_->shutdown();
  dlclose(api_->library);
}

std::optional<GpuSample> GpuStats::Read() const {
  Api::Utilization u{};
  Api::Memory m{};
  if (api_->utilization(api_->device, &u) != 0 || api_->memory(api_->device, &m) != 0)
    return std::nullopt;
  return GpuSample{u.gpu / 100.0, m.used, m.total};
}

}  // namespace gridsync
