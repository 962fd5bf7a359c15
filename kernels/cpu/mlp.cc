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
  for (int i = 0; i < shape.n_matrices(); ++i) w.push_back(Matrix::Zero(shape.rows(i), shape.cols(i)));
  return w;
}

namespace {

int Rows(const Matrix& m) { return static_cast<int>(m.rows()); }

// out (w.rows() x n) = w * in, in being w.cols() x n with leading dimension
// `ld_in`.
void Multiply(MatmulFormat format, const Matrix& w, const float* in, int ld_in, int n, float* out) {
  Gemm(format, Rows(w), n, static_cast<int>(w.cols()), {w.data(), Rows(w)}, {in, ld_in}, out,
       Rows(w), /*accumulate=*/false);
}

}  // namespace

void MlpForward(const MlpShape& shape, const MlpWeights& w, const ConstMatrixMap& x,
                MlpWorkspace* ws, Matrix* y, MatmulFormat format) {
  GRIDSYNC_CHECK_EQ(x.rows(), shape.input_width);
  const int hidden = shape.hidden_layers;
  const auto n = static_cast<int>(x.cols());
  ws->hidden.resize(hidden);
  const float* in = x.data();
  int ld_in = static_cast<int>(x.rows());
  for (int i = 0; i < hidden; ++i) {
    Matrix& h = ws->hidden[i];
    h.resize(shape.rows(i), n);
    Multiply(format, w[i], in, ld_in, n, h.data());
    h = h.cwiseMax(0.0f);
    in = h.data();
    ld_in = Rows(h);
  }
  y->resize(shape.rows(hidden), n);
  Multiply(format, w[hidden], in, ld_in, n, y->data());
}

void MlpBackward(const MlpShape& shape, const MlpWeights& w, const ConstMatrixMap& x,
                 MlpWorkspace* ws, const Matrix& dy, MlpWeights* dw, MatrixMap* dx,
                 MatmulFormat format) {
  const int hidden = shape.hidden_layers;
  const auto n = static_cast<int>(x.cols());
  GRIDSYNC_CHECK_EQ(dy.cols(), x.cols());
  // delta: dLoss/d(layer i's output), rows(i) x n.
  const float* delta = dy.data();
  for (int i = hidden; i >= 1; --i) {
    const Matrix& input = ws->hidden[i - 1];  // layer i's input, cols(i) x n
    const int rows = shape.rows(i), cols = shape.cols(i);
    // dW_i += delta * input^T
    Gemm(format, rows, cols, n, {delta, rows}, {input.data(), cols, /*transposed=*/true},
         (*dw)[i].data(), rows, /*accumulate=*/true);
    // prev = W_i^T * delta, then ReLU passes it where its output was positive.
    ws->prev_delta.resize(cols, n);
    Gemm(format, cols, n, rows, {w[i].data(), rows, /*transposed=*/true}, {delta, rows},
         ws->prev_delta.data(), cols, /*accumulate=*/false);
    ws->delta.resize(cols, n);
    const float* p = ws->prev_delta.data();
    const float* h = input.data();
    float* d = ws->delta.data();
    for (Eigen::Index k = 0; k < ws->delta.size(); ++k) d[k] = h[k] > 0.0f ? p[k] : 0.0f;
    delta = d;
  }
  const int rows = shape.rows(0), cols = shape.cols(0);
  Gemm(format, rows, cols, n, {delta, rows}, {x.data(), cols, /*transposed=*/true}, (*dw)[0].data(),
       rows, /*accumulate=*/true);
  GRIDSYNC_CHECK_EQ(dx->rows(), cols);
  Gemm(format, cols, n, rows, {w[0].data(), rows, /*transposed=*/true}, {delta, rows}, dx->data(),
       static_cast<int>(dx->rows()), /*accumulate=*/false);
}

}  // namespace gridsync::cpu
