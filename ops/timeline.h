// A Chrome trace (the JSON array format that chrome://tracing and Perfetto
// load), written as events happen, in the manner of Horovod's timeline:
// --timeline FILE on a worker records its step phases, on a shard its
// applies. Timestamps are wall-clock microseconds, so the files of several
// processes (one machine, or clocks kept by NTP) line up when loaded
// together. A process that dies leaves a file without its closing bracket,
// which both viewers still load.
//
// Thread safety: every method may be called from any thread.
#pragma once

#include <chrono>
#include <cstdint>
#include <cstdio>
#include <map>
#include <memory>
#include <mutex>
#include <string>

#include "common/status.h"

namespace gridsync {

class TimelineWriter {
 public:
  // Creates (truncates) `path`; `process` names the process in the viewer
  // (e.g. "worker 0"), `pid` keeps processes apart.
  static Result<std::unique_ptr<TimelineWriter>> Open(const std::string& path,
                                                      const std::string& process, uint32_t pid);
  // Closes it, printing Close's error to stderr when there is one.
  ~TimelineWriter();

  // A span ("X" event) from `begin` lasting `seconds`, on thread lane `lane`.
  void Span(const std::string& name, std::chrono::steady_clock::time_point begin, double seconds,
            uint32_t lane = 0, const std::map<std::string, double>& args = {});
  // A counter ("C" event): plotted as a graph (loss, PSNR, bytes).
  void Counter(const std::string& name, std::chrono::steady_clock::time_point at, double value);
  // Writes the closing bracket; later events are dropped. IOError naming the
  // file when any write failed (a full disk, /dev/full): the file is not
  // the whole timeline. Later calls return the first call's status (an
  // observer closes it when training ends; the worker asks again to exit).
  Status Close();

 private:
  TimelineWriter(std::FILE* file, std::string path, uint32_t pid);
  int64_t Micros(std::chrono::steady_clock::time_point t) const;
  void Write(const std::string& event);

  std::mutex mu_;
  std::FILE* file_;
  const std::string path_;
  const uint32_t pid_;
  // steady_clock -> wall clock, fixed once.
  const std::chrono::steady_clock::time_point steady_origin_;
  const int64_t wall_origin_us_;
  bool first_ = true;
  int write_error_ = 0;  // errno of the first failed write
  Status closed_;        // what Close returned
};

}  // namespace gridsync
