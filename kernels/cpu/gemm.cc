#include "kernels/cpu/gemm.h"

#include <Eigen/Core>
#include <algorithm>
#include <atomic>
#include <bit>
#include <vector>

#include "kernels/cpu/gemm_onednn.h"

namespace gridsync::cpu {
namespace {

std::atomic<GemmEngine> g_engine{GemmEngine::kAuto};

using Matrix = Eigen::Matrix<float, Eigen::Dynamic, Eigen::Dynamic, Eigen::ColMajor>;
using ConstStridedMap = Eigen::Map<const Matrix, 0, Eigen::OuterStride<>>;
using StridedMap = Eigen::Map<Matrix, 0, Eigen::OuterStride<>>;

// An operand's stored matrix (op(X) is rows x cols): as stored it is
// rows x cols, or cols x rows when read transposed.
ConstStridedMap Stored(const GemmOperand& x, int rows, int cols) {
  return x.transposed ? ConstStridedMap(x.data, cols, rows, Eigen::OuterStride<>(x.ld))
                      : ConstStridedMap(x.data, rows, cols, Eigen::OuterStride<>(x.ld));
}

// Copies an operand's stored matrix rounded to bf16 into `buffer`, densely
// (leading dimension: its stored rows); returns the operand that reads it.
GemmOperand RoundedCopy(const GemmOperand& x, int rows, int cols, std::vector<float>* buffer) {
  const int stored_rows = x.transposed ? cols : rows;
  const int stored_cols = x.transposed ? rows : cols;
  buffer->resize(size_t(stored_rows) * size_t(stored_cols));
  for (int j = 0; j < stored_cols; ++j)
    RoundToBf16(x.data + size_t(j) * size_t(x.ld), size_t(stored_rows),
                buffer->data() + size_t(j) * size_t(stored_rows));
  return GemmOperand{buffer->data(), stored_rows, x.transposed};
}

template <typename A, typename B>
void Product(const A& a, const B& b, StridedMap* c, bool accumulate) {
  if (accumulate) {
    c->noalias() += a * b;
  } else {
    c->noalias() = a * b;
  }
}

void EigenGemm(int m, int n, int k, const GemmOperand& a, const GemmOperand& b, float* c, int ldc,
               bool accumulate) {
  const ConstStridedMap sa = Stored(a, m, k);
  const ConstStridedMap sb = Stored(b, k, n);
  StridedMap sc(c, m, n, Eigen::OuterStride<>(ldc));
  if (a.transposed && b.transposed) return Product(sa.transpose(), sb.transpose(), &sc, accumulate);
  if (a.transposed) return Product(sa.transpose(), sb, &sc, accumulate);
  if (b.transposed) return Product(sa, sb.transpose(), &sc, accumulate);
  Product(sa, sb, &sc, accumulate);
}

bool UseOneDnn(MatmulFormat format) {
  const GemmEngine engine = g_engine.load(std::memory_order_relaxed);
  if (engine == GemmEngine::kEigen || !OneDnnAvailable()) return false;
  // bf16 on a CPU without native bf16 would be oneDNN's emulation, slower
  // than rounding the operands for the fp32 engine.
  return format == MatmulFormat::kFp32 || NativeBf16Available();
}

}  // namespace

namespace {

// Branch-free, so that GCC vectorises the loops that call it.
inline uint32_t Bf16Of(float x) {
  const uint32_t bits = std::bit_cast<uint32_t>(x);
  const uint32_t rounded = (bits + 0x7FFFu + ((bits >> 16) & 1u)) >> 16;
  const uint32_t quiet_nan = (bits >> 16) | 0x0040u;
  return (bits & 0x7FFFFFFFu) > 0x7F800000u ? quiet_nan : rounded;
}

}  // namespace

void ToBf16Bits(const float* in, size_t n, uint16_t* out) {
  for (size_t i = 0; i < n; ++i) out[i] = static_cast<uint16_t>(Bf16Of(in[i]));
}

void RoundToBf16(const float* in, size_t n, float* out) {
  for (size_t i = 0; i < n; ++i) out[i] = std::bit_cast<float>(Bf16Of(in[i]) << 16);
}

const char* MatmulFormatName(MatmulFormat format) {
  return format == MatmulFormat::kBf16 ? "bf16" : "fp32";
}

void SetGemmEngine(GemmEngine engine) { g_engine.store(engine, std::memory_order_relaxed); }

bool OneDnnAvailable() { return onednn::Available(); }
bool NativeBf16Available() { return onednn::NativeBf16(); }

std::string GemmEngineName(MatmulFormat format) {
  if (UseOneDnn(format)) return onednn::EngineName(format);
  return "Eigen " + std::to_string(EIGEN_WORLD_VERSION) + "." +
         std::to_string(EIGEN_MAJOR_VERSION) + "." + std::to_string(EIGEN_MINOR_VERSION) +
         (format == MatmulFormat::kBf16 ? " (operands rounded to bf16)" : "");
}

void Gemm(MatmulFormat format, int m, int n, int k, const GemmOperand& a, const GemmOperand& b,
          float* c, int ldc, bool accumulate) {
  if (m == 0 || n == 0) return;
  if (k == 0) {
    if (!accumulate)
      for (int j = 0; j < n; ++j) std::fill_n(c + size_t(j) * size_t(ldc), m, 0.0f);
    return;
  }
  if (UseOneDnn(format) && onednn::Gemm(format, m, n, k, a, b, c, ldc, accumulate)) return;
  if (format == MatmulFormat::kFp32) return EigenGemm(m, n, k, a, b, c, ldc, accumulate);
  // bf16 without native bf16: the operands rounded, multiplied in fp32
  // (bf16 x bf16 products are exact in fp32, as the native instructions').
  thread_local std::vector<float> a_rounded, b_rounded;
  const GemmOperand ra = RoundedCopy(a, m, k, &a_rounded);
  const GemmOperand rb = RoundedCopy(b, k, n, &b_rounded);
  EigenGemm(m, n, k, ra, rb, c, ldc, accumulate);
}

}  // namespace gridsync::cpu
