// MLP: finite-difference checks of the weight and input gradients.
#include <cmath>
#include <random>
#include <vector>

#include <gtest/gtest.h>

#include "kernels/cpu/mlp.h"

namespace gridsync::cpu {
namespace {

// L = sum(c * y). `pattern` receives which ReLUs were active, so that a
// difference quotient across a kink (where L is not differentiable) can be
// told apart from a wrong gradient.
double Loss(const MlpShape& shape, const MlpWeights& w, const Matrix& x, const Matrix& c,
            std::vector<bool>* pattern) {
  MlpWorkspace ws;
  Matrix y;
  ConstMatrixMap xm(x.data(), x.rows(), x.cols());
  MlpForward(shape, w, xm, &ws, &y);
  pattern->clear();
  for (const auto& h : ws.hidden) {
    for (Eigen::Index i = 0; i < h.size(); ++i) pattern->push_back(h.data()[i] > 0.0f);
  }
  double loss = 0;
  for (Eigen::Index i = 0; i < y.size(); ++i) loss += double{y.data()[i]} * c.data()[i];
  return loss;
}

void CheckGradients(const MlpShape& shape) {
  const int n = 17;
  MlpWeights w = MakeMlpWeights(shape, 11);
  std::mt19937_64 rng(12);
  std::uniform_real_distribution<float> dist(-1.0f, 1.0f);
  Matrix x(shape.input_width, n), c(shape.output_width, n);
  for (Eigen::Index i = 0; i < x.size(); ++i) x.data()[i] = dist(rng);
  for (Eigen::Index i = 0; i < c.size(); ++i) c.data()[i] = dist(rng);

  MlpWorkspace ws;
  Matrix y;
  ConstMatrixMap xm(x.data(), x.rows(), x.cols());
  MlpForward(shape, w, xm, &ws, &y);
  MlpWeights dw = ZeroMlpWeights(shape);
  Matrix dx_store(shape.input_width, n);
  MatrixMap dx(dx_store.data(), dx_store.rows(), dx_store.cols());
  MlpBackward(shape, w, xm, ws, c, &dw, &dx);

  std::vector<bool> base_pattern, up_pattern, down_pattern;
  Loss(shape, w, x, c, &base_pattern);
  const float eps = 1e-3f;
  int checked = 0, kinks = 0;
  for (size_t m = 0; m < w.size(); ++m) {
    for (Eigen::Index k = 0; k < w[m].size(); k += 5) {
      const float saved = w[m].data()[k];
      w[m].data()[k] = saved + eps;
      const double up = Loss(shape, w, x, c, &up_pattern);
      w[m].data()[k] = saved - eps;
      const double down = Loss(shape, w, x, c, &down_pattern);
      w[m].data()[k] = saved;
      if (up_pattern != base_pattern || down_pattern != base_pattern) {
        ++kinks;
        continue;
      }
      const double numeric = (up - down) / (2 * eps);
      EXPECT_NEAR(dw[m].data()[k], numeric, 2e-2 * std::max(1.0, std::fabs(numeric)))
          << "matrix " << m << " element " << k;
      ++checked;
    }
  }
  for (Eigen::Index k = 0; k < x.size(); k += 3) {
    const float saved = x.data()[k];
    x.data()[k] = saved + eps;
    const double up = Loss(shape, w, x, c, &up_pattern);
    x.data()[k] = saved - eps;
    const double down = Loss(shape, w, x, c, &down_pattern);
    x.data()[k] = saved;
    if (up_pattern != base_pattern || down_pattern != base_pattern) {
      ++kinks;
      continue;
    }
    const double numeric = (up - down) / (2 * eps);
    EXPECT_NEAR(dx_store.data()[k], numeric, 2e-2 * std::max(1.0, std::fabs(numeric))) << "input " << k;
    ++checked;
  }
  EXPECT_GT(checked, 50);
  EXPECT_LT(kinks, checked / 10) << "too many difference quotients crossed a ReLU kink";
}

TEST(MlpTest, FiniteDifferenceTwoHiddenLayers) { CheckGradients({32, 64, 2, 3}); }
TEST(MlpTest, FiniteDifferenceNoHiddenLayer) { CheckGradients({8, 16, 0, 3}); }
TEST(MlpTest, FiniteDifferenceDeep) { CheckGradients({6, 12, 4, 2}); }

TEST(MlpTest, XavierInitBoundsAndShapes) {
  const MlpShape shape{32, 64, 2, 3};
  const MlpWeights w = MakeMlpWeights(shape, 1);
  ASSERT_EQ(w.size(), 3u);
  EXPECT_EQ(w[0].rows(), 64);
  EXPECT_EQ(w[0].cols(), 32);
  EXPECT_EQ(w[2].rows(), 3);
  EXPECT_EQ(shape.n_params(), 64 * 32 + 64 * 64 + 3 * 64);
  const float bound0 = std::sqrt(6.0f / 96.0f);
  EXPECT_LE(w[0].cwiseAbs().maxCoeff(), bound0);
  EXPECT_GT(w[0].cwiseAbs().maxCoeff(), 0.9f * bound0);
  EXPECT_TRUE(w[0].isApprox(MakeMlpWeights(shape, 1)[0]));
  EXPECT_FALSE(w[0].isApprox(MakeMlpWeights(shape, 2)[0]));
}

}  // namespace
}  // namespace gridsync::cpu
