#include "kernels/cpu/mlp.h"

#include <cmath>
#include <random>

#include "common/check.h"

namespace gridsync::cpu {

MlpWeights MakeMlpWeights(const MlpShape& shape, uint64_t seed) {
  std::mt19937_64 rng(seed);
  MlpWeights w;
  for (int i = 0; i < shape.n_matrices(); ++i) {
    const float bound = std::sqrt(6.0f / static_cast<float>(shape.rows(i) + shape.cols(i)));
    std::uniform_real_distribution<float> dist(-bound, bound);
    Matrix m(shape.rows(i), shape.cols(i));
    for (Eigen::Index k = 0; k < m.size(); ++k) m.data()[k] = dist(rng);
    w.push_back(std::move(m));
  }
  return w;
}

MlpWeights ZeroMlpWeights(const MlpShape& shape) {
  MlpWeights w;
  for (int i = 0; i < shape.n_matrices(); ++i)
    w.push_back(Matrix::Zero(shape.rows(i), shape.cols(i)));
  return w;
}

namespace {

int Rows(const Matrix& m) { return static_cast<int>(m.rows()); }

// out (w.rows() x n) = w * in in fp32, in being w.cols() x n with leading
// dimension `ld_in`.
void Multiply(const Matrix& w, const float* in, int ld_in, int n, float* out) {
  Gemm(MatmulFormat::kFp32, Rows(w), n, static_cast<int>(w.cols()), {w.data(), Rows(w)},
       {in, ld_in}, out, Rows(w), /*accumulate=*/false);
}

void ForwardBf16(const MlpShape& shape, const MlpWeights& w, const ConstMatrixMap& x,
                 MlpWorkspace* ws, Matrix* y) {
  const int hidden = shape.hidden_layers;
  const auto n = static_cast<int>(x.cols());
  ws->weights16.resize(w.size());
  for (size_t i = 0; i < w.size(); ++i) {
    ws->weights16[i].resize(size_t(w[i].size()));
    ToBf16Bits(w[i].data(), ws->weights16[i].size(), ws->weights16[i].data());
  }
  ws->x16.resize(size_t(x.size()));
  ToBf16Bits(x.data(), ws->x16.size(), ws->x16.data());
  ws->hidden.clear();
  ws->hidden16.resize(hidden);
  const uint16_t* in = ws->x16.data();
  int ld_in = shape.input_width;
  for (int i = 0; i < hidden; ++i) {
    const int rows = shape.rows(i);
    ws->hidden16[i].resize(size_t(rows) * size_t(n));
    GemmBf16Out(rows, n, shape.cols(i), {ws->weights16[i].data(), rows}, {in, ld_in},
                ws->hidden16[i].data(), rows, /*relu=*/true);
    in = ws->hidden16[i].data();
    ld_in = rows;
  }
  const int out = shape.rows(hidden);
  y->resize(out, n);
  GemmBf16(out, n, shape.cols(hidden), {ws->weights16[hidden].data(), out}, {in, ld_in}, y->data(),
           out, /*accumulate=*/false);
}

void BackwardBf16(const MlpShape& shape, MlpWorkspace* ws, const Matrix& dy, MlpWeights* dw,
                  MatrixMap* dx) {
  const int hidden = shape.hidden_layers;
  const auto n = static_cast<int>(dy.cols());
  // dy apart from the hidden layers' gradients: sharing their buffer, it
  // shrank it to the output's rows (3 for an image) and the next layer grew
  // it back, zero-filling the difference in every chunk.
  ws->dy16.resize(size_t(dy.size()));
  ToBf16Bits(dy.data(), size_t(dy.size()), ws->dy16.data());
  const uint16_t* delta = ws->dy16.data();
  int next = 0;
  for (int i = hidden; i >= 1; --i) {
    const uint16_t* input = ws->hidden16[i - 1].data();  // layer i's input, cols(i) x n
    const uint16_t* weights = ws->weights16[i].data();
    const int rows = shape.rows(i), cols = shape.cols(i);
    GemmBf16(rows, cols, n, {delta, rows}, {input, cols, /*transposed=*/true}, (*dw)[i].data(),
             rows,
             /*accumulate=*/true);
    // prev = W_i^T * delta, rounded to bf16 as the product's epilogue
    // writes it, then kept where the ReLU's output was positive: half the
    // bytes of fp32 sums masked and rounded after, in one pass less.
    std::vector<uint16_t>& prev = ws->delta16[next];
    next ^= 1;
    prev.resize(size_t(cols) * size_t(n));
    GemmBf16Out(cols, n, rows, {weights, rows, /*transposed=*/true}, {delta, rows}, prev.data(),
                cols, /*relu=*/false);
    MaskByRelu(input, prev.size(), prev.data());
    delta = prev.data();
  }
  const int rows = shape.rows(0), cols = shape.cols(0);
  GemmBf16(rows, cols, n, {delta, rows}, {ws->x16.data(), cols, /*transposed=*/true},
           (*dw)[0].data(), rows, /*accumulate=*/true);
  GemmBf16(cols, n, rows, {ws->weights16[0].data(), rows, /*transposed=*/true}, {delta, rows},
           dx->data(), static_cast<int>(dx->rows()), /*accumulate=*/false);
}

}  // namespace

void MlpForward(const MlpShape& shape, const MlpWeights& w, const ConstMatrixMap& x,
                MlpWorkspace* ws, Matrix* y, MatmulFormat format) {
  GRIDSYNC_CHECK_EQ(x.rows(), shape.input_width);
  GRIDSYNC_CHECK_EQ(w.size(), size_t(shape.n_matrices()));
  ws->format = format;
  ws->x = x.data();
  ws->n = x.cols();
  ws->weights.clear();
  for (const Matrix& m : w) ws->weights.push_back(m.data());
  if (format == MatmulFormat::kBf16) return ForwardBf16(shape, w, x, ws, y);
  const int hidden = shape.hidden_layers;
  const auto n = static_cast<int>(x.cols());
  ws->hidden.resize(hidden);
  const float* in = x.data();
  int ld_in = static_cast<int>(x.rows());
  for (int i = 0; i < hidden; ++i) {
    Matrix& h = ws->hidden[i];
    h.resize(shape.rows(i), n);
    Multiply(w[i], in, ld_in, n, h.data());
    h = h.cwiseMax(0.0f);
    in = h.data();
    ld_in = Rows(h);
  }
  y->resize(shape.rows(hidden), n);
  Multiply(w[hidden], in, ld_in, n, y->data());
}

void MlpBackward(const MlpShape& shape, const MlpWeights& w, const ConstMatrixMap& x,
                 MlpWorkspace* ws, const Matrix& dy, MlpWeights* dw, MatrixMap* dx,
                 MatmulFormat format) {
  GRIDSYNC_CHECK_EQ(dy.cols(), x.cols());
  GRIDSYNC_CHECK_EQ(dx->rows(), shape.cols(0));
  GRIDSYNC_CHECK_EQ(dx->cols(), x.cols());
  // The workspace must be the forward call's on these inputs and weights:
  // its activations (and in bf16 its converted operands) are what is read.
  GRIDSYNC_CHECK(ws->format == format);
  GRIDSYNC_CHECK_EQ(ws->n, x.cols());
  GRIDSYNC_CHECK(ws->x == x.data());
  GRIDSYNC_CHECK_EQ(ws->weights.size(), w.size());
  for (size_t i = 0; i < w.size(); ++i) GRIDSYNC_CHECK(ws->weights[i] == w[i].data());
  // bf16: the forward pass kept every operand in bf16, x included.
  if (format == MatmulFormat::kBf16) return BackwardBf16(shape, ws, dy, dw, dx);
  constexpr MatmulFormat kFp32 = MatmulFormat::kFp32;
  const int hidden = shape.hidden_layers;
  const auto n = static_cast<int>(x.cols());
  // delta: dLoss/d(layer i's output), rows(i) x n.
  const float* delta = dy.data();
  for (int i = hidden; i >= 1; --i) {
    const Matrix& input = ws->hidden[i - 1];  // layer i's input, cols(i) x n
    const int rows = shape.rows(i), cols = shape.cols(i);
    // dW_i += delta * input^T
    Gemm(kFp32, rows, cols, n, {delta, rows}, {input.data(), cols, /*transposed=*/true},
         (*dw)[i].data(), rows, /*accumulate=*/true);
    // prev = W_i^T * delta, then ReLU passes it where its output was positive.
    ws->prev_delta.resize(cols, n);
    Gemm(kFp32, cols, n, rows, {w[i].data(), rows, /*transposed=*/true}, {delta, rows},
         ws->prev_delta.data(), cols, /*accumulate=*/false);
    ws->delta.resize(cols, n);
    const float* p = ws->prev_delta.data();
    const float* h = input.data();
    float* d = ws->delta.data();
    for (Eigen::Index k = 0; k < ws->delta.size(); ++k) d[k] = h[k] > 0.0f ? p[k] : 0.0f;
    delta = d;
  }
  const int rows = shape.rows(0), cols = shape.cols(0);
  Gemm(kFp32, rows, cols, n, {delta, rows}, {x.data(), cols, /*transposed=*/true}, (*dw)[0].data(),
       rows, /*accumulate=*/true);
  Gemm(kFp32, cols, n, rows, {w[0].data(), rows, /*transposed=*/true}, {delta, rows}, dx->data(),
       static_cast<int>(dx->rows()), /*accumulate=*/false);
}

}  // namespace gridsync::cpu
