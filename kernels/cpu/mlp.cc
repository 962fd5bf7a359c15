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

void MlpForward(const MlpShape& shape, const MlpWeights& w, const ConstMatrixMap& x,
                MlpWorkspace* ws, Matrix* y) {
  GRIDSYNC_CHECK_EQ(x.rows(), shape.input_width);
  const int hidden = shape.hidden_layers;
  ws->hidden.resize(hidden);
  for (int i = 0; i < hidden; ++i) {
    Matrix& h = ws->hidden[i];
    if (i == 0) {
      h.noalias() = w[0] * x;
    } else {
      h.noalias() = w[i] * ws->hidden[i - 1];
    }
    h = h.cwiseMax(0.0f);
  }
  if (hidden == 0) {
    y->noalias() = w[0] * x;
  } else {
    y->noalias() = w[hidden] * ws->hidden[hidden - 1];
  }
}

void MlpBackward(const MlpShape& shape, const MlpWeights& w, const ConstMatrixMap& x,
                 const MlpWorkspace& ws, const Matrix& dy, MlpWeights* dw, MatrixMap* dx) {
  const int hidden = shape.hidden_layers;
  Matrix delta = dy;
  Matrix prev_delta;
  for (int i = hidden; i >= 1; --i) {
    (*dw)[i].noalias() += delta * ws.hidden[i - 1].transpose();
    prev_delta.noalias() = w[i].transpose() * delta;
    // ReLU passes the gradient where its output was positive.
    delta = prev_delta.cwiseProduct((ws.hidden[i - 1].array() > 0.0f).cast<float>().matrix());
  }
  (*dw)[0].noalias() += delta * x.transpose();
  dx->noalias() = w[0].transpose() * delta;
}

}  // namespace gridsync::cpu
