#include "ops/timeline.h"

#include <cerrno>
#include <cstring>
#include <nlohmann/json.hpp>

namespace gridsync {

Result<std::unique_ptr<TimelineWriter>> TimelineWriter::Open(const std::string& path,
                                                             const std::string& process,
                                                             uint32_t pid) {
  std::FILE* file = std::fopen(path.c_str(), "w");
  if (file == nullptr) {
    return Status::IOError("--timeline " + path + ": " + std::strerror(errno) +
                           "; allowed: a writable file path");
  }
  std::unique_ptr<TimelineWriter> writer(new TimelineWriter(file, pid));
  std::fputs("[\n", file);
  nlohmann::json meta = {{"name", "process_name"},
                         {"ph", "M"},
                         {"pid", pid},
                         {"tid", 0},
                         {"args", {{"name", process}}}};
  writer->Write(meta.dump());
  return writer;
}

TimelineWriter::TimelineWriter(std::FILE* file, uint32_t pid)
    : file_(file),
      pid_(pid),
      steady_origin_(std::chrono::steady_clock::now()),
      wall_origin_us_(std::chrono::duration_cast<std::chrono::microseconds>(
                          std::chrono::system_clock::now().time_since_epoch())
                          .count()) {}

TimelineWriter::~TimelineWriter() { Close(); }

int64_t TimelineWriter::Micros(std::chrono::steady_clock::time_point t) const {
  return wall_origin_us_ +
         std::chrono::duration_cast<std::chrono::microseconds>(t - steady_origin_).count();
}

void TimelineWriter::Write(const std::string& event) {
  // Callers hold mu_ (or own the writer alone, in Open).
  if (file_ == nullptr) return;
  std::fputs(first_ ? "" : ",\n", file_);
  std::fputs(event.c_str(), file_);
  first_ = false;
}

void TimelineWriter::Span(const std::string& name, std::chrono::steady_clock::time_point begin,
                          double seconds, uint32_t lane,
                          const std::map<std::string, double>& args) {
  nlohmann::json event = {{"name", name},        {"ph", "X"},
                          {"pid", pid_},         {"tid", lane},
                          {"ts", Micros(begin)}, {"dur", static_cast<int64_t>(seconds * 1e6)}};
  if (!args.empty()) event["args"] = args;
  std::lock_guard<std::mutex> lock(mu_);
  Write(event.dump());
}

void TimelineWriter::Counter(const std::string& name, std::chrono::steady_clock::time_point at,
                             double value) {
  nlohmann::json event = {{"name", name}, {"ph", "C"},        {"pid", pid_},
                          {"tid", 0},     {"ts", Micros(at)}, {"args", {{name, value}}}};
  std::lock_guard<std::mutex> lock(mu_);
  Write(event.dump());
}

void TimelineWriter::Close() {
  std::lock_guard<std::mutex> lock(mu_);
  if (file_ == nullptr) return;
  std::fputs("\n]\n", file_);
  std::fclose(file_);
  file_ = nullptr;
}

}  // namespace gridsync
