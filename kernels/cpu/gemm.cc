#include "kernels/cpu/gemm.h"

#include <Eigen/Core>
#include <algorithm>
#include <atomic>
#include <bit>
#include <vector>

#include "common/check.h"
#include "kernels/cpu/gemm_onednn.h"

namespace gridsync::cpu {
namespace {

std::atomic<GemmEngine> g_engine{GemmEngine::kAuto};

using Matrix = Eigen::Matrix<float, Eigen::Dynamic, Eigen::Dynamic, Eigen::ColMajor>;
using ConstStridedMap = Eigen::Map<const Matrix, 0, Eigen::OuterStride<>>;
using StridedMap = Eigen::Map<Matrix, 0, Eigen::OuterStride<>>;

// The shape of an operand as stored, when op(X) is rows x cols: rows x
// cols, or cols x rows when it is read transposed.
struct StoredShape {
  int rows, cols;
  StoredShape(bool transposed, int op_rows, int op_cols)
      : rows(transposed ? op_cols : op_rows), cols(transposed ? op_rows : op_cols) {}
  size_t size() const { return size_t(rows) * size_t(cols); }
};

ConstStridedMap Stored(const GemmOperand& x, int rows, int cols) {
  const StoredShape s(x.transposed, rows, cols);
  return ConstStridedMap(x.data, s.rows, s.cols, Eigen::OuterStride<>(x.ld));
}

// An operand's stored matrix (op(X) is rows x cols) converted to bf16 into
// `out`, densely (leading dimension: its stored rows).
Bf16Operand Bf16Copy(const GemmOperand& x, int rows, int cols, std::vector<uint16_t>* out) {
  const StoredShape s(x.transposed, rows, cols);
  out->resize(s.size());
  if (x.ld == s.rows) {
    ToBf16Bits(x.data, out->size(), out->data());
  } else {
    for (int j = 0; j < s.cols; ++j)
      ToBf16Bits(x.data + size_t(j) * size_t(x.ld), size_t(s.rows),
                 out->data() + size_t(j) * size_t(s.rows));
  }
  return Bf16Operand{out->data(), s.rows, x.transposed};
}

// A bf16 operand widened to fp32 (exact), densely.
GemmOperand Widened(const Bf16Operand& x, int rows, int cols, std::vector<float>* out) {
  const StoredShape s(x.transposed, rows, cols);
  out->resize(s.size());
  for (int j = 0; j < s.cols; ++j) {
    const uint16_t* from = x.data + size_t(j) * size_t(x.ld);
    float* to = out->data() + size_t(j) * size_t(s.rows);
    for (int i = 0; i < s.rows; ++i) to[i] = std::bit_cast<float>(uint32_t{from[i]} << 16);
  }
  return GemmOperand{out->data(), s.rows, x.transposed};
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

void ToBf16Bits(const float* in, size_t n, uint16_t* out) {
  for (size_t i = 0; i < n; ++i) out[i] = Bf16Bits(in[i]);
}

void MaskByRelu(const uint16_t* h, size_t n, uint16_t* grad) {
  // The test is on h's bits as a signed 16-bit integer (above 0 and at most
  // +inf's 0x7F80: positive and not NaN), which GCC vectorises 16 values an
  // instruction. Masking fp32 sums with h widened to a float, then
  // rounding, took 43 us for a 64 x 2048 chunk, twice in each chunk's
  // backward pass (x86-64-v3, an AMD EPYC, 2026-12-06).
  for (size_t i = 0; i < n; ++i) {
    const auto bits = static_cast<int16_t>(h[i]);
    grad[i] = bits > 0 && bits <= 0x7F80 ? grad[i] : uint16_t{0};
  }
}

void RoundToBf16(const float* in, size_t n, float* out) {
  for (size_t i = 0; i < n; ++i) out[i] = std::bit_cast<float>(uint32_t{Bf16Bits(in[i])} << 16);
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

namespace {

// Every leading dimension covers its stored matrix's rows.
template <typename Operand>
void CheckShape(int m, int n, int k, const Operand& a, const Operand& b, int ldc) {
  GRIDSYNC_CHECK(m >= 0 && n >= 0 && k >= 0);
  // Values, not std::max's references to temporaries: the check macro
  // holds on to what it is given.
  const int a_rows = std::max(1, a.transposed ? k : m);
  const int b_rows = std::max(1, b.transposed ? n : k);
  const int c_rows = std::max(1, m);
  GRIDSYNC_CHECK_GE(a.ld, a_rows);
  GRIDSYNC_CHECK_GE(b.ld, b_rows);
  GRIDSYNC_CHECK_GE(ldc, c_rows);
}

// The products with nothing to multiply (an empty C, or k = 0: C = 0 or C
// unchanged); true when it dealt with the call.
bool Empty(int m, int n, int k, float* c, int ldc, bool accumulate) {
  if (m == 0 || n == 0) return true;
  if (k != 0) return false;
  if (!accumulate)
    for (int j = 0; j < n; ++j) std::fill_n(c + size_t(j) * size_t(ldc), m, 0.0f);
  return true;
}

}  // namespace

void Gemm(MatmulFormat format, int m, int n, int k, const GemmOperand& a, const GemmOperand& b,
          float* c, int ldc, bool accumulate) {
  CheckShape(m, n, k, a, b, ldc);
  if (Empty(m, n, k, c, ldc, accumulate)) return;
  if (format == MatmulFormat::kBf16) {
    thread_local std::vector<uint16_t> a16, b16;
    return GemmBf16(m, n, k, Bf16Copy(a, m, k, &a16), Bf16Copy(b, k, n, &b16), c, ldc, accumulate);
  }
  if (UseOneDnn(format) && onednn::Gemm(m, n, k, a, b, c, ldc, accumulate)) return;
  EigenGemm(m, n, k, a, b, c, ldc, accumulate);
}

void GemmBf16(int m, int n, int k, const Bf16Operand& a, const Bf16Operand& b, float* c, int ldc,
              bool accumulate) {
  CheckShape(m, n, k, a, b, ldc);
  if (Empty(m, n, k, c, ldc, accumulate)) return;
  if (UseOneDnn(MatmulFormat::kBf16) && onednn::GemmBf16(m, n, k, a, b, c, ldc, accumulate)) return;
  // Without native bf16: the operands widened, multiplied in fp32 (bf16 x
  // bf16 products are exact in fp32, as the native instructions' are).
  thread_local std::vector<float> a32, b32;
  EigenGemm(m, n, k, Widened(a, m, k, &a32), Widened(b, k, n, &b32), c, ldc, accumulate);
}

void GemmBf16Out(int m, int n, int k, const Bf16Operand& a, const Bf16Operand& b, uint16_t* c,
                 int ldc, bool relu) {
  CheckShape(m, n, k, a, b, ldc);
  if (UseOneDnn(MatmulFormat::kBf16) && m > 0 && n > 0 && k > 0 &&
      onednn::GemmBf16Out(m, n, k, a, b, c, ldc, relu))
    return;
  thread_local std::vector<float> sums;
  sums.resize(size_t(std::max(1, m)) * size_t(n));
  GemmBf16(m, n, k, a, b, sums.data(), std::max(1, m), /*accumulate=*/false);
  for (int j = 0; j < n; ++j) {
    const float* from = sums.data() + size_t(j) * size_t(m);
    uint16_t* to = c + size_t(j) * size_t(ldc);
    for (int i = 0; i < m; ++i) to[i] = Bf16Bits(relu && !(from[i] > 0.0f) ? 0.0f : from[i]);
  }
}

}  // namespace gridsync::cpu
