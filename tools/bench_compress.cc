// gridsync-bench compress: which gradient codec to use on a link. Two parts,
// both on the image task's real model (--config, --set):
//
// Codec table (default). The model trains standalone for --warm-steps steps
// (TrainImage), so the gradient has the structure of a training run rather
// than of the initialisation; then one more step's gradient is taken on a
// batch of the global batch size (training.batch_size, or --batch): per
// grid level the touched rows (GridGradient::Take), their values
// concatenated in level order, then the MLP weight gradients in table order.
// That buffer is what a worker pushes in one step, and it goes through each
// codec of kernels/cpu/codec.h as ONE payload (a real push encodes one per
// table and shard, a few header bytes more each).
//   - ratio = raw value bytes (4 x count) / encoded bytes;
//   - wire_B = encoded bytes + the row-id frames of the touched grid rows
//     (delta-varint or raw, whichever is smaller, as wire::Encode sends
//     them beside every codec's payload), the MLP tables are dense and send
//     none; wire_ratio compares with none's wire_B. For sparse codecs (topk,
//     randomk) the ids dominate, which is the point of the column;
//   - time: per repetition, in turn, one memcpy of the buffer (the limit: a
//     codec reads the same bytes and writes fewer), one Encode and one Decode,
//     so that the host's background load (this bench often shares its cores
//     with compilers) hits all three alike; the median over --reps after
//     --warmup untimed ones. GB/s = 4 x count / median time (1 GB = 1e9 B),
//     for decode too (its output is those bytes);
//   - rel_l2 = ||d - g|| / ||g|| and cosine(d, g) of the decoded gradient d
//     against the original g, in double;
//   - target: onebit and int8 encode at >= 25% of memcpy, topk at a ratio of
//     1% at >= 10% (the targets; "-" for the other codecs);
//   - #wrong (correctness, every run): the values that break the codec's
//     documented contract (codec.h): none bit-exact; fp16 and bf16 within half
//     an ulp of their format; int8 within half a step (block max / 254); qsgd
//     within one level (norm / s) with the sign kept; onebit exactly
//     +-scale by sign, the scale being mean |g|; topk exactly the k largest
//     |g| and zero elsewhere; randomk exactly g * n / k at the seed's indices
//     and zero elsewhere. A decode that fails counts every value.
//
// --train. For each of --codecs (none first, so the others can be compared
// with it as they finish) a ps-mode cluster runs in this process, as
// tests/ps_test.cc builds one: the real coordinator (port 0), --shards real
// PsShards each registered through its own CoordinatorClient, and --workers
// threads in TrainImagePs, with bsp, the same seeds and data for every codec,
// compression.min_bytes = --min-bytes, and error feedback and ps.optimizer
// as the config resolves them for the codec (columns ef and adam; --set
// overrides them for every codec, and an entry "CODEC+ef" or "CODEC-ef"
// for its own row, so that one run compares both). Rows: rank 0's
// final PSNR, its difference from none's, the bytes each worker pushed and
// pulled per step (mean over workers, as PsClient counts them: whole
// messages of the training steps; PsSession resets the counters after rank
// 0's one-off initial push), rank 0's training and communication seconds and the wall time
// of the run. #wrong counts failed workers, shards that did not apply every
// step and a non-finite PSNR. --batch defaults to 4096 here (not the
// config's 16384) so that the 2000-step default stays affordable on a small
// host; the wall time is reported so the cost of raising it is known.
//
// Output: '#' lines are comments (settings, the header row, summaries);
// every other stdout line is one row of whitespace-separated fields. The
// same rows go to a CSV (--csv) and a gnuplot PNG (--png): the table plots
// throughput bars and the error, --train plots PSNR against bytes pushed
// per step. Without gnuplot the PNG is skipped with a note, not an error.
// Exit code: 0 when everything ran and #wrong is 0 (meeting the targets is
// reported, not required), 1 on a failure or any #wrong, 2 on bad arguments.
#include "tools/bench_compress.h"

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

#include "common/cli_parse.h"
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

namespace gridsync::bench {
namespace compress {

double Seconds(Clock::time_point start, Clock::time_point end) {
  return std::chrono::duration<double>(end - start).count();
}

std::string Fmt(const char* format, double value) {
  char buf[64];
  std::snprintf(buf, sizeof(buf), format, value);
  return buf;
}

std::vector<std::string> SplitList(const std::string& text) {
  std::vector<std::string> out;
  std::stringstream in(text);
  for (std::string item; std::getline(in, item, ',');) {
    if (!item.empty()) out.push_back(item);
  }
  return out;
}

std::vector<std::string> ListedCodecs(const CompressArgs& args) {
  if (!args.codecs.empty()) return args.codecs;
  return SplitList(args.train ? kTrainCodecsDefault : kTableCodecsDefault);
}

CodecEntry ParseCodecEntry(const std::string& entry) {
  for (const auto& [suffix, value] : {std::pair{"+ef", "true"}, std::pair{"-ef", "false"}}) {
    const std::string_view tail(suffix);
    if (entry.size() > tail.size() && entry.ends_with(tail))
      return {entry.substr(0, entry.size() - tail.size()), value};
  }
  return {entry, ""};
}

// A path inside a gnuplot single-quoted string ('' is a quote there).
std::string GnuplotQuote(const std::string& text) {
  std::string out = "'";
  for (char c : text) out += c == '\'' ? std::string("''") : std::string(1, c);
  return out + "'";
}

// Runs gnuplot on `script`. A missing gnuplot is not a failure of the
// benchmark (the numbers are on stdout and in the CSV): it is said and the
// PNG skipped. Returns false only when gnuplot ran and failed.
bool RunGnuplot(const std::string& script, const std::string& png) {
  if (std::system("command -v gnuplot >/dev/null 2>&1") != 0) {
    std::printf(
        "# png: skipped, gnuplot not found (scripts/install-deps.sh installs gnuplot-nox)\n");
    return true;
  }
  const auto dir = std::filesystem::temp_directory_path();
  const auto path = dir / ("gridsync-bench-compress-" + std::to_string(getpid()) + ".gp");
  if (!Table::WriteText(path.string(), script).ok()) {
    std::fprintf(stderr, "cannot write the gnuplot script %s\n", path.c_str());
    return false;
  }
  const std::string cmd = "gnuplot " + GnuplotQuote(path.string()) + " 2>&1";
  const int rc = std::system(cmd.c_str());
  std::error_code ec;
  std::filesystem::remove(path, ec);
  if (rc != 0) {
    std::fprintf(stderr, "gnuplot failed (status %d) writing %s\n", rc, png.c_str());
    return false;
  }
  std::printf("# png: %s\n", png.c_str());
  return true;
}

Result<Config> LoadConfig(const CompressArgs& args, std::vector<std::string> overrides) {
  // --ratio, --bits and --min-bytes for the codec named in the overrides,
  // where it reads them: the config refuses a codec option that does nothing.
  std::string codec = "none";
  for (const auto& o : overrides) {
    if (o.starts_with("compression.codec=")) codec = o.substr(o.find('=') + 1);
  }
  if (codec == "topk" || codec == "randomk")
    overrides.push_back("compression.ratio=" + Fmt("%.17g", args.ratio));
  if (codec == "qsgd") overrides.push_back("compression.bits=" + std::to_string(args.bits));
  if (codec != "none")
    overrides.push_back("compression.min_bytes=" + std::to_string(args.min_bytes));
  // The user's --set comes last, so it can change anything the flags set.
  overrides.insert(overrides.end(), args.overrides.begin(), args.overrides.end());
  return Config::LoadFile(args.config, overrides);
}

std::string ModelLine(const Config& config, const ImageTask& image) {
  const auto& e = config.encoding;
  char buf[512];
  std::snprintf(buf, sizeof(buf),
                "# image %s (%dx%d); encoding %d levels x %d features, log2 T %d, base %d, scale "
                "%g; MLP %d x %d; lr %g; seed %llu",
                config.task.image.c_str(), image.width(), image.height(), e.n_levels,
                e.n_features_per_level, e.log2_hashmap_size, e.base_resolution, e.per_level_scale,
                config.network.n_hidden_layers, config.network.n_neurons,
                config.training.learning_rate,
                static_cast<unsigned long long>(config.training.seed));
  return buf;
}

std::string CodecSettings(const CompressionConfig& c) {
  char buf[256];
  std::snprintf(buf, sizeof(buf), "topk/randomk ratio %g; qsgd bits %d; int8 block %d", c.ratio,
                c.bits, c.block);
  return buf;
}

// Writes the table's CSV and says where (or why not), as a '#' line.
bool WriteCsvReport(const Table& table, const std::string& path) {
  if (auto status = table.WriteCsv(path); !status.ok()) {
    std::fprintf(stderr, "%s\n", status.ToString().c_str());
    return false;
  }
  std::printf("# csv: %s\n", path.c_str());
  return true;
}

}  // namespace compress

Runner AddCompressCommand(CLI::App* app) {
  auto args = std::make_shared<compress::CompressArgs>();
  auto* cmd = app->add_subcommand(
      "compress",
      "Gradient codecs on a real gradient: ratio, speed vs memcpy, error; --train: PSNR");
  cmd->add_option("-c,--config", args->config, "JSON config (encoding, network, training)");
  cmd->add_option("--set", args->overrides, "Override a config key (repeatable; applied last)");
  auto* train =
      cmd->add_flag("--train", args->train, "Train a ps-mode cluster per codec and compare PSNR");
  cmd->add_option("--codecs", args->codecs,
                  std::string("Codecs, comma-separated (default: ") +
                      compress::kTableCodecsDefault +
                      "; with --train: " + compress::kTrainCodecsDefault +
                      "; with --train a codec may end in +ef or -ef: error feedback on or off "
                      "for its row)")
      ->delimiter(',');
  auto* ratio = cmd->add_option("--ratio", args->ratio, "topk/randomk fraction of values kept")
                    ->check(gridsync::FiniteRange(0.0, 1.0));
  auto* bits = cmd->add_option("--bits", args->bits, "qsgd level bits")->check(CLI::Range(1, 8));
  cmd->add_option("--batch", args->batch,
                  "Global batch (default: training.batch_size; with --train: 4096)")
      ->check(CLI::PositiveNumber);
  cmd->add_option("--threads", args->threads, "Training threads per worker")
      ->check(CLI::PositiveNumber);
  cmd->add_option("--warm-steps", args->warm_steps, "Table: training steps before the gradient")
      ->check(CLI::PositiveNumber)
      ->excludes(train);
  cmd->add_option("--reps", args->reps, "Table: timed repetitions per codec (median)")
      ->check(CLI::PositiveNumber)
      ->excludes(train);
  cmd->add_option("--warmup", args->warmup, "Table: untimed repetitions first")
      ->check(CLI::NonNegativeNumber)
      ->excludes(train);
  cmd->add_option("--steps", args->steps, "--train: steps per codec")
      ->check(CLI::PositiveNumber)
      ->needs(train);
  cmd->add_option("--shards", args->shards, "--train: PS shards")
      ->check(CLI::Range(1, 256))
      ->needs(train);
  cmd->add_option("--workers", args->workers, "--train: workers")
      ->check(CLI::Range(1, 64))
      ->needs(train);
  cmd->add_option("--min-bytes", args->min_bytes,
                  "--train: blocks below this many bytes travel uncompressed")
      ->check(CLI::NonNegativeNumber)
      ->needs(train);
  cmd->add_option("--rounds", args->rounds,
                  "--train: runs of every codec, in turn (every other round in reverse order); "
                  "the row gives each column's median and train_x, the median of the rounds' "
                  "train_s ratios to none's")
      ->check(CLI::Range(1, 99))
      ->needs(train);
  cmd->add_option("--seeds", args->seeds,
                  "--train: training seeds (comma-separated), every codec run under each in "
                  "every round; psnr_dB is then the mean over seeds, dpsnr_dB the mean of each "
                  "seed's difference from none, and dpsnr_lo/dpsnr_hi their least and greatest "
                  "(a run's final PSNR moves with the seed; default: the config's "
                  "training.seed)")
      ->delimiter(',')
      ->expected(1, 16)
      ->needs(train);
  cmd->add_option("--csv", args->csv,
                  "CSV of the rows (default: out/compress_codecs.csv; with --train: "
                  "out/compress.csv)")
      ->check(OutputFile());
  cmd->add_option("--png", args->png,
                  "gnuplot PNG (default: out/compress_codecs.png; with --train: out/compress.png)")
      ->check(OutputFile());
  return [args, ratio, bits] {
    // A codec option no listed codec reads would do nothing (a probe's
    // "--codecs topk --bits 3"), as compression.bits with codec topk would.
    const auto codecs = compress::ListedCodecs(*args);
    const auto listed = [&codecs](const char* codec) {
      return std::any_of(codecs.begin(), codecs.end(), [codec](const std::string& entry) {
        return compress::ParseCodecEntry(entry).codec == codec;
      });
    };
    for (const std::string& entry : codecs) {
      if (args->train || compress::ParseCodecEntry(entry).error_feedback.empty()) continue;
      std::fprintf(stderr,
                   "--codecs %s: +ef and -ef choose error feedback for a training row; allowed: "
                   "with --train (the table measures the codecs alone)\n",
                   entry.c_str());
      return kConfigErrorExitCode;
    }
    if (ratio->count() > 0 && !listed("topk") && !listed("randomk")) {
      std::fprintf(stderr, "--ratio: no listed codec reads it; allowed: with topk or randomk\n");
      return kConfigErrorExitCode;
    }
    if (bits->count() > 0 && !listed("qsgd")) {
      std::fprintf(stderr, "--bits: no listed codec reads it; allowed: with qsgd\n");
      return kConfigErrorExitCode;
    }
    return args->train ? compress::RunTrainSweep(*args) : compress::RunCodecTable(*args);
  };
}

}  // namespace gridsync::bench
