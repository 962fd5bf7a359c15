// gridsync-bench compress: the codec table (bench_compress.h), every codec
// on a real gradient: ratio, speed against memcpy, error, and the values that
// break a codec's contract.
//
// Thread safety: one thread.
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
#include "tools/bench_compress.h"
#include "worker/image_task.h"
#include "worker/model.h"
#include "worker/params_file.h"
#include "worker/sync/ps_session.h"
#include "worker/sync/train.h"

namespace gridsync::bench::compress {
namespace {

// ---------------------------------------------------------------------------
// Codec table.

// One step's push: grid values of the touched rows (level order), then the
// MLP gradients (table order).
struct StepGradient {
  std::vector<float> values;
  uint64_t grid_rows = 0;
  uint64_t row_id_bytes = 0;  // as wire::Encode sends them, one block per level
  uint64_t grid_values = 0;
  uint64_t mlp_values = 0;
};

float LoadF32(const uint8_t* p) {
  float v;
  std::memcpy(&v, p, sizeof(v));
  return v;
}

uint32_t LoadU32(const uint8_t* p) {
  uint32_t v;
  std::memcpy(&v, p, sizeof(v));
  return v;
}

bool SameBits(float a, float b) { return std::memcmp(&a, &b, sizeof(float)) == 0; }

// max |x| of a codec block (int8's and fp16's scales follow it).
double MaxAbs(const float* x, size_t n) {
  double max = 0;
  for (size_t i = 0; i < n; ++i) max = std::max(max, double{std::fabs(x[i])});
  return max;
}

// Values of x (decoded as d) that break the codec's contract in codec.h;
// payload and seed are the encoder's. See the file comment for each bound.
uint64_t CountWrong(const CodecOptions& options, const float* x, const float* d, size_t n,
                    const uint8_t* payload, uint64_t seed) {
  uint64_t wrong = 0;
  switch (options.codec) {
    case Codec::kNone:
      for (size_t i = 0; i < n; ++i) wrong += !SameBits(x[i], d[i]);
      break;
    case Codec::kFp16:
      for (size_t begin = 0; begin < n; begin += options.block) {
        const size_t end = std::min<size_t>(n, begin + options.block);
        const double max = MaxAbs(x + begin, end - begin);
        for (size_t i = begin; i < end; ++i) {
          // Half an ulp: 2^-11 relative for normals, and among subnormals
          // 2^-25 of the scale that brings the block's largest to
          // [2^14, 2^15), at most 2^-38 of it. Only values near float's
          // end saturate (to 65504 * 2^112).
          const double a = std::fabs(x[i]);
          wrong +=
              a > 0x1.ffcp127
                  ? d[i] != std::copysign(0x1.ffcp127f, x[i])
                  : !(std::fabs(double{d[i]} - x[i]) <= std::max(a * 0x1.0p-11, max * 0x1.0p-38));
        }
      }
      break;
    case Codec::kBf16:
      for (size_t i = 0; i < n; ++i) {
        const double a = std::fabs(x[i]);
        wrong += !(std::fabs(double{d[i]} - x[i]) <= a * 0x1.0p-8 + 0x1.0p-134);
      }
      break;
    case Codec::kInt8:
      for (size_t begin = 0; begin < n; begin += options.block) {
        const size_t end = std::min<size_t>(n, begin + options.block);
        const double max = MaxAbs(x + begin, end - begin);
        // Half a quantisation step, with slack for the float arithmetic.
        const double bound = max / 254.0 * (1 + 1e-4);
        for (size_t i = begin; i < end; ++i) {
          wrong += !(std::fabs(double{d[i]} - x[i]) <= bound);
        }
      }
      break;
    case Codec::kQsgd: {
      const double s = std::ldexp(1.0, options.bits) - 1;
      const double unit = LoadF32(payload) / s;
      for (size_t i = 0; i < n; ++i) {
        const bool sign_ok = d[i] == 0 || std::signbit(d[i]) == std::signbit(x[i]);
        wrong += !(sign_ok && std::fabs(double{d[i]} - x[i]) <= unit * (1 + 1e-5));
      }
      break;
    }
    case Codec::kOnebit: {
      const float scale = LoadF32(payload);
      double mean = 0;
      for (size_t i = 0; i < n; ++i) mean += std::fabs(x[i]);
      mean /= static_cast<double>(n);
      wrong += !(std::fabs(scale - mean) <= 1e-6 * mean);
      for (size_t i = 0; i < n; ++i) wrong += d[i] != (x[i] >= 0.0f ? scale : -scale);
      break;
    }
    case Codec::kTopk: {
      const uint32_t k = LoadU32(payload);
      std::vector<char> kept(n, 0);
      double min_kept = INFINITY;
      for (uint32_t j = 0; j < k; ++j) {
        const uint32_t i = LoadU32(payload + 4 + 4 * size_t{j});
        if (i >= n) return n;  // decode would have refused it
        kept[i] = 1;
        min_kept = std::min(min_kept, double{std::fabs(x[i])});
      }
      wrong += k != KeptCount(options, n);
      for (size_t i = 0; i < n; ++i) {
        if (kept[i]) {
          wrong += !SameBits(d[i], x[i]);
        } else {
          // Dropped: zero, and no larger than anything kept.
          wrong += d[i] != 0.0f || std::fabs(x[i]) > min_kept;
        }
      }
      break;
    }
    case Codec::kRandomk: {
      const uint32_t k = KeptCount(options, n);
      std::vector<uint32_t> indices(k);
      cpu::RandomkIndices(seed, n, k, indices.data());
      std::vector<char> kept(n, 0);
      const float factor = static_cast<float>(static_cast<double>(n) / k);
      for (uint32_t i : indices) {
        kept[i] = 1;
        wrong += !SameBits(d[i], x[i] * factor);
      }
      for (size_t i = 0; i < n; ++i) wrong += !kept[i] && d[i] != 0.0f;
      break;
    }
  }
  return wrong;
}

Result<StepGradient> TakeStepGradient(const CompressArgs& args, const Config& config,
                                      const ImageTask& image) {
  TrainOptions options;
  options.quiet = true;
  options.write_png = false;
  std::fprintf(stderr, "training %d steps for a realistic gradient...\n", args.warm_steps);
  GRIDSYNC_ASSIGN_OR_RETURN(TrainReport report, TrainImage(config, image, options));
  HashGridModel& model = *report.model;
  const auto& t = config.training;
  const size_t batch = static_cast<size_t>(t.batch_size);
  std::vector<float> positions(batch * 2), targets(batch * 3);
  // The batch of the step after the warm-up: the next gradient a worker
  // would push.
  const uint64_t step = report.steps;
  image.SampleBatch(t.seed, step, 0, batch, positions.data(), targets.data());
  ThreadPool pool(t.threads);
  ModelGradients grads(model.layout(), model.mlp_shape());
  model.AccumulateGradients(positions.data(), targets.data(), batch, batch, 1.0f,
                            model.ActiveLevels(step), &grads, &pool);
  StepGradient out;
  for (uint32_t level = 0; level < model.layout().n_levels(); ++level) {
    SparseRows rows;
    grads.grid.Take(level, &rows);
    out.grid_rows += rows.size();
    out.row_id_bytes += wire::RowIdFrameBytes(rows.rows);
    out.values.insert(out.values.end(), rows.values.begin(), rows.values.end());
  }
  out.grid_values = out.values.size();
  for (const auto& m : grads.mlp)
    out.values.insert(out.values.end(), m.data(), m.data() + m.size());
  out.mlp_values = out.values.size() - out.grid_values;
  return out;
}

}  // namespace

int RunCodecTable(const CompressArgs& args) {
  std::vector<std::string> overrides = {
      "training.steps=" + std::to_string(args.warm_steps),
      "training.threads=" + std::to_string(args.threads),
      "training.log_every=0",
  };
  if (args.batch > 0) overrides.push_back("training.batch_size=" + std::to_string(args.batch));
  // The user's --set comes last, so it can change anything the flags set.
  overrides.insert(overrides.end(), args.overrides.begin(), args.overrides.end());
  auto config = LoadStandaloneConfig(args.config, overrides);
  if (!config.ok()) {
    std::fprintf(stderr, "%s\n", config.status().message().c_str());
    return kConfigErrorExitCode;
  }
  std::vector<CodecOptions> codecs;
  for (const auto& name : ListedCodecs(args)) {
    // --ratio and --bits go to the codecs that read them (set here, not as
    // overrides: the loaded config's own codec may read neither).
    CompressionConfig c = config->compression;
    c.codec = name;
    c.ratio = args.ratio;
    c.bits = args.bits;
    auto options = CodecFromConfig(c);
    if (!options.ok()) {
      std::fprintf(stderr, "%s\n", options.status().message().c_str());
      return kConfigErrorExitCode;
    }
    codecs.push_back(*options);
  }
  auto image = ImageTask::Load(config->task.image);
  if (!image.ok()) {
    std::fprintf(stderr, "%s\n", image.status().message().c_str());
    return kConfigErrorExitCode;
  }
  auto grad = TakeStepGradient(args, *config, *image);
  if (!grad.ok()) {
    std::fprintf(stderr, "taking the gradient failed: %s\n", grad.status().ToString().c_str());
    return 1;
  }
  const std::vector<float>& g = grad->values;
  const size_t n = g.size();
  if (n == 0 || n > kMaxCodecValues) {
    std::fprintf(stderr, "the gradient has %zu values; allowed: 1..%zu\n", n, kMaxCodecValues);
    return 1;
  }
  const size_t raw_bytes = n * sizeof(float);
  const uint64_t id_bytes = grad->row_id_bytes;
  const uint64_t seed = Mix64(config->training.seed);

  std::printf("# gridsync-bench compress: codec table on one step's pushed gradient\n");
  std::printf("%s\n", ModelLine(*config, *image).c_str());
  std::printf(
      "# gradient: step %d (after %d warm-up steps), batch %d; %llu touched grid rows -> "
      "%llu grid values + %llu MLP values = %zu float32 (%.2f MB), one payload\n",
      args.warm_steps, args.warm_steps, config->training.batch_size,
      static_cast<unsigned long long>(grad->grid_rows),
      static_cast<unsigned long long>(grad->grid_values),
      static_cast<unsigned long long>(grad->mlp_values), n, raw_bytes / 1e6);
  std::printf("# codecs: %s; encode seed %llu\n", CodecSettings(config->compression).c_str(),
              static_cast<unsigned long long>(seed));
  std::printf(
      "# wire_B = enc_B + %llu B of row ids (%.2f B per touched grid row: delta-varint or raw, "
      "whichever is smaller, one block per level, as wire::Encode sends them; the dense MLP "
      "tables send none)\n",
      static_cast<unsigned long long>(id_bytes),
      grad->grid_rows ? static_cast<double>(id_bytes) / grad->grid_rows : 0.0);
  std::printf(
      "# time: median of %d reps (+%d warm-up) of memcpy, encode, decode in turn, one "
      "thread, the buffer hot in cache as a fresh gradient is; GB/s = %zu B / time; enc/memcpy "
      "= encode GB/s / memcpy GB/s\n",
      args.reps, args.warmup, raw_bytes);

  Table table({{"codec", 8},
               {"count", 8},
               {"type", 5},
               {"enc_B", 9},
               {"ratio", 7},
               {"wire_B", 9},
               {"wire_ratio", 10},
               {"enc_us", 9},
               {"dec_us", 9},
               {"memcpy_us", 9},
               {"enc_GB/s", 8},
               {"dec_GB/s", 8},
               {"memcpy_GB/s", 11},
               {"enc/memcpy", 10},
               {"rel_l2", 9},
               {"cosine", 8},
               {"target", 14},
               {"#wrong", 7}});
  table.PrintHeader();

  std::vector<float> copy(n), decoded(n);
  uint64_t total_wrong = 0;
  int failures = 0;
  const uint64_t none_wire = raw_bytes + id_bytes;
  std::vector<std::string> target_notes;
  for (const CodecOptions& options : codecs) {
    const std::string name(CodecName(options.codec));
    const size_t enc_bytes = EncodedSize(options, n);
    std::vector<uint8_t> payload(enc_bytes);
    std::vector<double> t_copy, t_enc, t_dec;
    Status status;
    for (int rep = 0; rep < args.warmup + args.reps && status.ok(); ++rep) {
      const auto t0 = Clock::now();
      std::memcpy(copy.data(), g.data(), raw_bytes);
      ClobberMemory(copy.data());
      const auto t1 = Clock::now();
      cpu::Encode(options, g.data(), n, seed, payload.data());
      ClobberMemory(payload.data());
      const auto t2 = Clock::now();
      status = cpu::Decode(options, payload.data(), enc_bytes, n, seed, decoded.data());
      ClobberMemory(decoded.data());
      const auto t3 = Clock::now();
      if (rep < args.warmup) continue;
      t_copy.push_back(Seconds(t0, t1));
      t_enc.push_back(Seconds(t1, t2));
      t_dec.push_back(Seconds(t2, t3));
    }
    uint64_t wrong = n;
    double rel_l2 = NAN, cosine = NAN;
    if (!status.ok()) {
      std::fprintf(stderr, "%s: decode failed: %s\n", name.c_str(), status.ToString().c_str());
      ++failures;
    } else {
      wrong = CountWrong(options, g.data(), decoded.data(), n, payload.data(), seed);
      double err = 0, gg = 0, dd = 0, gd = 0;
      for (size_t i = 0; i < n; ++i) {
        const double a = g[i], b = decoded[i];
        err += (b - a) * (b - a);
        gg += a * a;
        dd += b * b;
        gd += a * b;
      }
      rel_l2 = std::sqrt(err / gg);
      cosine = gd / std::sqrt(gg * dd);
    }
    total_wrong += wrong;
    const double enc_s = Median(t_enc), dec_s = Median(t_dec), copy_s = Median(t_copy);
    const double enc_gbps = raw_bytes / enc_s / 1e9, dec_gbps = raw_bytes / dec_s / 1e9;
    const double copy_gbps = raw_bytes / copy_s / 1e9;
    const double of_memcpy = enc_gbps / copy_gbps;
    // The targets, on encode speed relative to memcpy.
    double target = 0;
    if (options.codec == Codec::kOnebit || options.codec == Codec::kInt8) target = 0.25;
    if (options.codec == Codec::kTopk && options.ratio == kTopkTargetRatio) target = 0.10;
    std::string target_cell = "-";
    if (target > 0) {
      const bool met = of_memcpy >= target;
      target_cell = Fmt(">=%.2f:", target) + (met ? "met" : "MISSED");
      target_notes.push_back(name + " " + Fmt("%.3f", of_memcpy) + Fmt(" (>= %.2f: ", target) +
                             (met ? "met)" : "MISSED)"));
    }
    const uint64_t wire = enc_bytes + id_bytes;
    table.AddRow({name, std::to_string(n), "float", std::to_string(enc_bytes),
                  Fmt("%.2f", static_cast<double>(raw_bytes) / enc_bytes), std::to_string(wire),
                  Fmt("%.2f", static_cast<double>(none_wire) / wire), Fmt("%.1f", enc_s * 1e6),
                  Fmt("%.1f", dec_s * 1e6), Fmt("%.1f", copy_s * 1e6), Fmt("%.2f", enc_gbps),
                  Fmt("%.2f", dec_gbps), Fmt("%.2f", copy_gbps), Fmt("%.3f", of_memcpy),
                  Fmt("%.3e", rel_l2), Fmt("%.5f", cosine), target_cell, std::to_string(wrong)});
  }
  std::string notes;
  for (const auto& note : target_notes) notes += (notes.empty() ? "" : "; ") + note;
  std::printf("# targets (encode / memcpy): %s\n",
              notes.empty() ? "none in this run" : notes.c_str());
  std::printf("# #wrong total: %llu\n", static_cast<unsigned long long>(total_wrong));

  const std::string csv = args.csv.empty() ? "out/compress_codecs.csv" : args.csv;
  const std::string png = args.png.empty() ? "out/compress_codecs.png" : args.png;
  const bool csv_written = WriteCsvReport(table, csv);
  int rc = failures > 0 || total_wrong > 0 || !csv_written ? 1 : 0;
  std::ostringstream gp;
  gp << "set terminal pngcairo size 1400,560 font ',10'\n"
     << "set output " << GnuplotQuote(png) << "\n"
     << "set datafile separator ','\n"
     << "set multiplot layout 1,2 title "
     << GnuplotQuote("gridsync codecs on one step's gradient (" + std::to_string(n) +
                     " floats), one thread")
     << "\n"
     << "set style data histograms\nset style histogram clustered gap 1\n"
     << "set style fill solid 0.85 border -1\nset xtics rotate by -30\nset grid ytics\n"
     << "set title 'throughput (median)'\nset ylabel 'GB/s of float32 input'\nset logscale y\n"
     << "set format y '%g'\nset key top left\n"
     << "plot " << GnuplotQuote(csv) << " every ::1 using " << table.ColumnOf("enc_GB/s")
     << ":xtic(1) title 'encode', '' every ::1 using " << table.ColumnOf("dec_GB/s")
     << " title 'decode', '' every ::1 using " << table.ColumnOf("memcpy_GB/s")
     << " title 'memcpy (limit)'\n"
     << "set title 'relative L2 error ||d - g|| / ||g|| (none: 0, not drawn)'\n"
     << "unset ylabel\nset yrange [1e-4:*]\nset format y '%g'\n"
     << "plot " << GnuplotQuote(csv) << " every ::1 using (column(" << table.ColumnOf("rel_l2")
     << ") > 0 ? column(" << table.ColumnOf("rel_l2") << ") : 1/0):xtic(1) notitle\n"
     << "unset multiplot\n";
  if (!RunGnuplot(gp.str(), png)) rc = 1;
  return rc;
}

}  // namespace gridsync::bench::compress
