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

// The same for an operand already in bf16 (its bits, as ToBf16Bits writes).
struct Bf16Operand {
  const uint16_t* data = nullptr;
  int ld = 0;
  bool transposed = false;
};

// C (m x n, leading dimension ldc) = op(A) (m x k) * op(B) (k x n), or
// C += when `accumulate`. kBf16 rounds the operands to bf16 first.
void Gemm(MatmulFormat format, int m, int n, int k, const GemmOperand& a, const GemmOperand& b,
          float* c, int ldc, bool accumulate);

// The same with operands in bf16 already (a caller that keeps its operands
// in bf16 converts each once, not once per product): the products summed in
// fp32. Eigen's twin widens the operands to fp32 (exactly) and multiplies.
void GemmBf16(int m, int n, int k, const Bf16Operand& a, const Bf16Operand& b, float* c, int ldc,
              bool accumulate);

// The product in bf16: C = Bf16Bits(op(A) op(B)), or with `relu`
// Bf16Bits(ReLU(op(A) op(B))) (a hidden layer's activations), the fp32 sums
// rounded once. oneDNN does the ReLU and the rounding in its kernel's
// epilogue (which may flush a subnormal to zero); Eigen's twin sums into
// fp32, then rounds. The twins may differ by one bf16 step where the two
// sums straddle a rounding boundary.
void GemmBf16Out(int m, int n, int k, const Bf16Operand& a, const Bf16Operand& b, uint16_t* c,
                 int ldc, bool relu);

// Forces the engine (kAuto: oneDNN where it serves the format, else Eigen).
// kOneDnn where oneDNN cannot serve a format falls back to Eigen.
void SetGemmEngine(GemmEngine engine);

// The engine Gemm uses for `format` now, in words ("oneDNN 2.6.3
// (brg:avx512_core_amx_bf16)", "Eigen 3.4.0").
std::string GemmEngineName(MatmulFormat format);

// Whether this build has oneDNN and the CPU multiplies bf16 natively.
bool OneDnnAvailable();
bool NativeBf16Available();

// bf16 bits of a float: round to nearest even, overflow to infinity, NaN
// kept (made quiet), as the CPU's vcvtneps2bf16 does, except that
// denormals are kept here where the instruction flushes them to zero.
// Branch-free, so that loops calling it vectorise.
inline uint16_t Bf16Bits(float x) {
  uint32_t bits;
  __builtin_memcpy(&bits, &x, sizeof(bits));
  const uint32_t rounded = (bits + 0x7FFFu + ((bits >> 16) & 1u)) >> 16;
  const uint32_t quiet_nan = (bits >> 16) | 0x0040u;
  return static_cast<uint16_t>((bits & 0x7FFFFFFFu) > 0x7F800000u ? quiet_nan : rounded);
}

// Bf16Bits of n floats.
void ToBf16Bits(const float* in, size_t n, uint16_t* out);

// The bf16 gradient back-propagated through a ReLU whose bf16 output was
// h: grad[i] stays where h[i], read as the float its bits hold, is above 0
// (a NaN is not) and becomes 0 elsewhere.
void MaskByRelu(const uint16_t* h, size_t n, uint16_t* grad);

// Rounds n floats to the nearest bf16 value as ToBf16Bits does, kept as
// floats: the operands the bf16 format multiplies.
void RoundToBf16(const float* in, size_t n, float* out);

const char* MatmulFormatName(MatmulFormat format);

}  // namespace gridsync::cpu
