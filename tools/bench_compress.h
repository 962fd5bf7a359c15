// gridsync-bench compress (bench_compress.cc): what its two modes share.
// The arguments, the table printed row by row (and written as CSV), and the
// helpers for configs, gnuplot and medians. The codec table is
// bench_compress_table.cc, the --train sweep bench_compress_train.cc.
// Internal to gridsync-bench.
//
// Thread safety: one thread.
#pragma once

#include <spdlog/spdlog.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <memory>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "common/cluster_map.h"
#include "common/config.h"
#include "common/coordinator_client.h"
#include "common/counter_rng.h"
#include "common/sharding.h"
#include "common/status.h"
#include "common/thread_pool.h"
#include "common/wire/message.h"
#include "kernels/cpu/codec.h"
#include "server/coordinator.h"
#include "server/in_process_cluster.h"
#include "server/ps_shard.h"
#include "spec/run_spec.h"
#include "tools/bench.h"
#include "tools/bench_stats.h"
#include "worker/image_task.h"
#include "worker/model.h"
#include "worker/params_file.h"
#include "worker/sync/ps_session.h"
#include "worker/sync/train.h"

namespace gridsync::bench::compress {

using Clock = std::chrono::steady_clock;

inline constexpr int kTrainDefaultBatch = 4096;
inline constexpr double kTopkTargetRatio = 0.01;  // the topk target is stated for 1%
inline constexpr const char* kTableCodecsDefault = "none,fp16,bf16,int8,qsgd,onebit,topk,randomk";
inline constexpr const char* kTrainCodecsDefault = "none,fp16,int8,onebit,topk,randomk,qsgd";

struct CompressArgs {
  std::string config = "configs/local.json";
  std::vector<std::string> overrides;
  bool train = false;
  std::vector<std::string> codecs;  // empty: the mode's default list
  double ratio = 0.01;
  int bits = 4;
  int batch = 0;  // 0: training.batch_size for the table, kTrainDefaultBatch for --train
  int threads = 1;
  // Codec table.
  int warm_steps = 20;
  int reps = 20;
  int warmup = 3;
  // --train.
  int steps = 2000;
  int shards = 2;
  int workers = 2;
  int min_bytes = 1024;
  int rounds = 1;   // every codec once a round; medians over rounds
  // Training seeds, each run every round (empty: the config's training.seed
  // alone). A run's final PSNR moves with the seed (up to 1 dB at 2000
  // steps), so one seed's difference between codecs can be that noise.
  std::vector<uint64_t> seeds;
  std::string csv;  // empty: out/compress_codecs.csv (table) or out/compress.csv (--train)
  std::string png;  // likewise .png
};

// Keeps the compiler from dropping a memcpy whose destination is never read.
inline void ClobberMemory(const void* p) { asm volatile("" : : "r"(p) : "memory"); }

// Rows of whitespace-separated fields with fixed widths, so a --train row
// can be printed as soon as its run ends; the same cells go to the CSV.
struct Column {
  const char* name;
  int width;
};

class Table {
 public:
  explicit Table(std::vector<Column> columns) : columns_(std::move(columns)) {}

  void PrintHeader() const {
    std::string line = "#";
    for (size_t i = 0; i < columns_.size(); ++i) line += Cell(i, columns_[i].name);
    std::printf("%s\n", line.c_str());
  }
  void AddRow(std::vector<std::string> cells) {
    std::string line = " ";
    for (size_t i = 0; i < cells.size(); ++i) line += Cell(i, cells[i]);
    std::printf("%s\n", line.c_str());
    std::fflush(stdout);
    rows_.push_back(std::move(cells));
  }
  // 1-based CSV column of `name`, for gnuplot's `using`.
  int ColumnOf(const std::string& name) const {
    for (size_t i = 0; i < columns_.size(); ++i) {
      if (name == columns_[i].name) return static_cast<int>(i) + 1;
    }
    return 0;
  }
  size_t rows() const { return rows_.size(); }

  Status WriteCsv(const std::string& path) const {
    std::ostringstream out;
    for (size_t i = 0; i < columns_.size(); ++i) out << (i ? "," : "") << columns_[i].name;
    out << "\n";
    for (const auto& row : rows_) {
      for (size_t i = 0; i < row.size(); ++i) out << (i ? "," : "") << row[i];
      out << "\n";
    }
    return WriteText(path, out.str());
  }

  static Status WriteText(const std::string& path, const std::string& text) {
    const auto parent = std::filesystem::path(path).parent_path();
    std::error_code ec;
    if (!parent.empty()) std::filesystem::create_directories(parent, ec);
    std::ofstream out(path);
    out << text;
    if (!out) return Status::IOError("cannot write " + path);
    return Status::OK();
  }

 private:
  // The first column (the codec) is left-aligned, numbers right-aligned.
  std::string Cell(size_t i, const std::string& text) const {
    const int w = columns_[i].width;
    char buf[128];
    if (i == 0) {
      std::snprintf(buf, sizeof(buf), " %-*s", w, text.c_str());
    } else {
      std::snprintf(buf, sizeof(buf), " %*s", w, text.c_str());
    }
    return buf;
  }

  std::vector<Column> columns_;
  std::vector<std::vector<std::string>> rows_;
};

double Seconds(Clock::time_point start, Clock::time_point end);

std::string Fmt(const char* format, double value);

std::vector<std::string> SplitList(const std::string& text);
// The codecs a run compares: --codecs, else the table's or --train's
// default list.
std::vector<std::string> ListedCodecs(const CompressArgs& args);

// One --codecs entry: a codec, and under --train optionally "+ef" or "-ef"
// after it, which turns compression.error_feedback on or off for that row
// whatever the config resolves, so that a codec runs with and without it
// side by side ("--codecs none,fp16,fp16+ef").
struct CodecEntry {
  std::string codec;
  std::string error_feedback;  // "", "true" or "false"
};
CodecEntry ParseCodecEntry(const std::string& entry);

// A path inside a gnuplot single-quoted string ('' is a quote there).
std::string GnuplotQuote(const std::string& text);

// Runs gnuplot on `script`. A missing gnuplot is not a failure of the
// benchmark (the numbers are on stdout and in the CSV): it is said and the
// PNG skipped. Returns false only when gnuplot ran and failed.
bool RunGnuplot(const std::string& script, const std::string& png);

// The config with `overrides`, then --ratio/--bits/--min-bytes where the
// overrides' codec reads them, then the user's --set.
Result<Config> LoadConfig(const CompressArgs& args, std::vector<std::string> overrides);

std::string ModelLine(const Config& config, const ImageTask& image);

std::string CodecSettings(const CompressionConfig& c);

// Writes the table's CSV and says where (or why not), as a '#' line.
bool WriteCsvReport(const Table& table, const std::string& path);

// The codec table (the mode without --train) and the --train sweep.
int RunCodecTable(const CompressArgs& args);
int RunTrainSweep(const CompressArgs& args);

}  // namespace gridsync::bench::compress
