// A GPU's utilisation and memory through NVML, loaded at run time
// (libnvidia-ml.so.1 comes with the driver, not the toolkit): a machine
// without a GPU or driver simply has none, and nothing links against it.
//
// Thread safety: NVML's calls are thread-safe; Open once, Read from any thread.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>

namespace gridsync {

struct GpuSample {
  double utilization = 0;  // 0..1, the driver's last sampling period
  uint64_t memory_used = 0, memory_total = 0;
};

class GpuStats {
 public:
  // Device `index` as NVML counts it (all of the machine's devices); null
  // when NVML or the device is missing (`why` says which).
  static std::unique_ptr<GpuStats> Open(unsigned index, std::string* why);
  ~GpuStats();
  std::optional<GpuSample> Read() const;

 private:
  struct Api;
  explicit GpuStats(std::unique_ptr<Api> api);
  std::unique_ptr<Api> api_;
};

}  // namespace gridsync
