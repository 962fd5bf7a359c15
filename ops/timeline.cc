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
  std::unique_ptr<TimelineWriter> writer(new TimelineWriter(file, path, pid));
  std::fputs("[\n", file);
  nlohmann::json meta = {{"name", "process_name"},
                         {"ph", "M"},
                         {"pid", pid},
                         {"tid", 0},
                         {"args", {{"name", process}}}};
  writer->Write(meta.dump());
  return writer;
}

TimelineWriter::TimelineWriter(std::FILE* file, std::string path, uint32_t pid)
    : file_(file),
      path_(std::move(path)),
      pid_(pid),
      steady_origin_(std::chrono::steady_clock::now()),
      wall_origin_us_(std::chrono::duration_cast<std::chrono::microseconds>(
                          std::chrono::system_clock::now().time_since_epoch())
                          .count()) {}

TimelineWriter::~TimelineWriter() {
  if (const Status closed = Close(); !closed.ok())
    std::fprintf(stderr, "%s\n", closed.message().c_str());
}

int64_t TimelineWriter::Micros(std::chrono::steady_clock::time_point t) const {
  return wall_origin_us_ +
         std::chrono::duration_cast<std::chrono::microseconds>(t - steady_origin_).count();
}

void TimelineWriter::Write(const std::string& event) {
  // Callers hold mu_ (or own the writer alone, in Open).
  if (file_ == nullptr) return;
  errno = 0;
  if ((std::fputs(first_ ? "" : ",\n", file_) == EOF || std::fputs(event.c_str(), file_) == EOF) &&
      write_error_ == 0)
    write_error_ = errno != 0 ? errno : EIO;
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

Status TimelineWriter::Close() {
  std::lock_guard<std::mutex> lock(mu_);
  if (file_ == nullptr) return closed_;
  std::fputs("\n]\n", file_);
  // stdio keeps the first error of any write (ferror); fclose flushes the
  // rest, which fails on a full disk too.
  errno = 0;
  const bool failed_before = std::ferror(file_) != 0 || write_error_ != 0;
  const bool closed = std::fclose(file_) == 0;
  const int error = write_error_ != 0 ? write_error_ : errno;
  file_ = nullptr;
  if (!failed_before && closed) return closed_;
  closed_ =
      Status::IOError("--timeline " + path_ + ": cannot write the timeline" +
                      (error != 0 ? std::string(": ") + std::strerror(error) : std::string()) +
                      "; the file is incomplete");
  return closed_;
}

}  // namespace gridsync
