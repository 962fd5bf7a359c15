// The MLP's matrix products on the CPU: C = op(A) op(B), or C += op(A) op(B),
// column-major, with the operands read as fp32 or rounded to bfloat16.
//
// Two engines behind one call, chosen at run time:
//   - oneDNN's matmul (when the build found it): it JIT-compiles for the
//     CPU it runs on (AVX2, AVX-512, AMX), so the default x86-64-v3 build
//     still uses AVX-512 and AMX where the host has them. bf16 goes to oneDNN
//     only where the CPU multiplies bf16 natively (AVX-512 BF16 or AMX).
//   - Eigen: the portable twin, and the reference the tests compare with.
// Both compute the same thing: fp32 operands (or operands rounded to bf16
// first, round to nearest even, whose products are exact in fp32), products
// summed in fp32. Only the order of the sums differs, so results agree to
// a few ulps of the sum, not bit for bit; within one process every call
// with the same shape takes the same engine, so runs stay reproducible.
//
// Thread safety: Gemm may be called from many threads at once; each call
// runs on its calling thread only (oneDNN is told to use one thread, so
// the callers' ThreadPool decides the parallelism). SetGemmEngine is for
// tools and tests, before any Gemm call they make.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

namespace gridsync::cpu {

// The format the operands are multiplied in; products are summed in fp32.
enum class MatmulFormat { kFp32, kBf16 };

enum class GemmEngine { kAuto, kEigen, kOneDnn };

// One operand: a column-major matrix at `data` with leading dimension `ld`,
// read transposed when `transposed`.
struct GemmOperand {
  const float* data = nullptr;
  int ld = 0;
  bool transposed = false;
};

// C (m x n, leading dimension ldc) = op(A) (m x k) * op(B) (k x n), or
// C += when `accumulate`.
void Gemm(MatmulFormat format, int m, int n, int k, const GemmOperand& a, const GemmOperand& b,
          float* c, int ldc, bool accumulate);

// Forces the engine (kAuto: oneDNN where it serves the format, else Eigen).
// kOneDnn where oneDNN cannot serve a format falls back to Eigen.
void SetGemmEngine(GemmEngine engine);

// The engine Gemm uses for `format` now, in words ("oneDNN 2.6.3
// (brg:avx512_core_amx_bf16)", "Eigen 3.4.0").
std::string GemmEngineName(MatmulFormat format);

// Whether this build has oneDNN and the CPU multiplies bf16 natively.
bool OneDnnAvailable();
bool NativeBf16Available();

// bf16 bits of n floats: round to nearest even, overflow to infinity, NaN
// kept (made quiet), as the CPU's vcvtneps2bf16 does. One vectorised loop.
void ToBf16Bits(const float* in, size_t n, uint16_t* out);

// Rounds n floats to the nearest bf16 value as ToBf16Bits does, kept as
// floats: the operands the bf16 format multiplies.
void RoundToBf16(const float* in, size_t n, float* out);

const char* MatmulFormatName(MatmulFormat format);

}  // namespace gridsync::cpu
