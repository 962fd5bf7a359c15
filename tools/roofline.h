// The roofline of one training step on this machine, for gridsync-bench
// train: what the step must compute and move, at what this host can do.
//
// The step's work is modelled from the config, not counted by hardware
// counters: the MLP's GEMMs (forward, and the weight and input gradients),
// the encoding's interpolation forward and backward, Adam's arithmetic; the
// bytes every operand must move at least once (the grid rows a batch reads
// and scatters its gradient into, the lookup, the activations and their
// gradients, Adam's parameters, moments and gradients of the rows it
// touched). The peaks are measured here, now: a GEMM of the MLP's shape in
// the step's format (fp32 or bf16) through the engine the trainer uses
// (kernels/cpu/gemm.h: oneDNN's AVX-512 or AMX code where present, else
// Eigen) on `threads` threads, and a STREAM-style triad over
// arrays far larger than the caches. The roofline time is FLOPs / peak +
// bytes / bandwidth (compute and memory not overlapped: a bound a step can
// reach only by overlapping), and the fraction reached is that time over
// the measured step.
//
// Thread safety: the functions are independent; Measure* use `threads`
// threads of their own and should run on a quiet machine.
#pragma once

#include <cstdint>
#include <string>

#include "common/config.h"
#include "common/status.h"
#include "kernels/cpu/gemm.h"
#include "worker/image_task.h"

namespace gridsync::bench {

struct StepWork {
  double flops = 0;
  double bytes = 0;
  // The part of `bytes` that reads and writes grid rows (the forward's
  // corners, the backward scatter, Adam on the touched rows), counted at the
  // bytes a row holds.
  double grid_bytes = 0;
};

// What a step's touched grid rows occupy when memory moves whole 64-byte
// lines, measured on the step's real lookups.
struct GridLines {
  double rows = 0;         // touched grid rows a step, mean
  double wide_lines = 0;   // 64-byte lines of a features-wide float array holding them
  double count_lines = 0;  // lines of a 4-byte-per-row array (Adam's step counts)
  double bytes() const;    // the grid's traffic at lines (see MeasureGridLines)
};

// Samples the batches of `steps` of `config`'s run (the first, spread over
// training.steps), looks their positions up in the grid and counts the
// distinct rows and lines they touch. The grid's traffic at lines is then
// each such line of the parameters, the gradient, m and v (and of the step
// counts) read once and written back once a step: what a step moves when
// the caches keep every line it touches between its phases but none from
// one step to the next (levels small enough to stay cached cost less). With
// an eighth or more of a level's rows touched, most lines of its arrays
// hold a touched row, which is why the row-counted model is a bound no
// scattered step reaches.
Result<GridLines> MeasureGridLines(const Config& config, const ImageTask& image, int steps);

// The work of one step of `config` (its batch, encoding, MLP, precision),
// with `grid_rows` the grid rows the step's gradient touched (measured by
// the run: TrainReport::grid_rows_per_step).
StepWork ModelStepWork(const Config& config, double grid_rows);

// FLOP/s of a GEMM of the MLP's shape (hidden x hidden by hidden x batch)
// in `format` through cpu::Gemm, on `threads` threads, each on its own
// matrices; the best of 5 runs (a peak: noise only slows a run).
double MeasurePeakFlops(int hidden, int batch, int threads, cpu::MatmulFormat format);

// Bytes/s over 64 MiB arrays per thread: the best of 5 runs each of a
// triad a[i] = b[i] + s * c[i] and an update a[i] += s * c[i], each
// counting the bytes it reads and writes (3 x 4 per element, STREAM's
// count; the triad's write-allocate reads are not counted, see the .cc).
double MeasureBandwidth(int threads);

// "roofline (1 thread): ..." line for a step of `seconds`.
std::string RooflineLine(const StepWork& work, double peak_flops, double bandwidth, double seconds,
                         int threads);
// "roofline at 64-byte lines: ..." line: `work` with its grid bytes counted
// at lines instead.
std::string LineRooflineLine(const StepWork& work, const GridLines& lines, double peak_flops,
                             double bandwidth, double seconds);
// The step's bytes with the grid's counted at lines.
double LineBytes(const StepWork& work, const GridLines& lines);
// The fraction of the roofline a step of `seconds` reaches: its FLOPs at
// the peak plus `bytes` (work.bytes, or LineBytes) at the bandwidth, over
// the step.
double RooflineFraction(const StepWork& work, double bytes, double peak_flops, double bandwidth,
                        double seconds);

}  // namespace gridsync::bench
