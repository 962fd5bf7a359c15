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
  MlpBackward(shape, w, xm, &ws, c, &dw, &dx);

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

// n inputs in [-1, 1] and output gradients in [-dy_scale, dy_scale].
void RandomInputs(const MlpShape& shape, int n, uint64_t seed, float dy_scale, Matrix* x,
                  Matrix* dy) {
  std::mt19937_64 rng(seed);
  std::uniform_real_distribution<float> dist(-1.0f, 1.0f);
  x->resize(shape.input_width, n);
  dy->resize(shape.output_width, n);
  for (Eigen::Index i = 0; i < x->size(); ++i) x->data()[i] = dist(rng);
  for (Eigen::Index i = 0; i < dy->size(); ++i) dy->data()[i] = dy_scale * dist(rng);
}

// Each case runs on both GEMM engines (kernels/cpu/gemm.h); the engine is
// process-wide, so every test restores the automatic choice.
class MlpEngineTest : public ::testing::TestWithParam<GemmEngine> {
 protected:
  void SetUp() override {
    if (GetParam() == GemmEngine::kOneDnn && !OneDnnAvailable())
      GTEST_SKIP() << "this build has no oneDNN (libdnnl-dev); Eigen runs every product";
    SetGemmEngine(GetParam());
  }
  void TearDown() override { SetGemmEngine(GemmEngine::kAuto); }
};

TEST_P(MlpEngineTest, FiniteDifferenceTwoHiddenLayers) { CheckGradients({32, 64, 2, 3}); }
TEST_P(MlpEngineTest, FiniteDifferenceNoHiddenLayer) { CheckGradients({8, 16, 0, 3}); }
TEST_P(MlpEngineTest, FiniteDifferenceDeep) { CheckGradients({6, 12, 4, 2}); }

// bf16 operands keep about 3 significant digits: the outputs and gradients
// follow fp32's within a few percent of their scale, and differ from them.
TEST_P(MlpEngineTest, Bf16FollowsFp32WithinItsPrecision) {
  const MlpShape shape{32, 64, 2, 3};
  const int n = 300;
  const MlpWeights w = MakeMlpWeights(shape, 5);
  Matrix x, dy;
  RandomInputs(shape, n, 6, 1.0f, &x, &dy);
  const ConstMatrixMap xm(x.data(), x.rows(), x.cols());
  Matrix y[2];
  MlpWeights dw[2] = {ZeroMlpWeights(shape), ZeroMlpWeights(shape)};
  Matrix dx[2] = {Matrix(shape.input_width, n), Matrix(shape.input_width, n)};
  for (int f = 0; f < 2; ++f) {
    const MatmulFormat format = f == 0 ? MatmulFormat::kFp32 : MatmulFormat::kBf16;
    MlpWorkspace ws;
    MlpForward(shape, w, xm, &ws, &y[f], format);
    MatrixMap dxm(dx[f].data(), dx[f].rows(), dx[f].cols());
    MlpBackward(shape, w, xm, &ws, dy, &dw[f], &dxm, format);
  }
  // Relative to the matrix's norm (a weight gradient sums 300 terms of
  // either sign, so single entries can cancel to near zero). Outputs follow
  // within bf16's 2^-8 several times over. Gradients below the last hidden
  // layer differ more: activations within bf16's error of zero switch their
  // ReLU, and each switch moves a whole term (measured ~6% here).
  auto relative = [](const Matrix& a, const Matrix& b) { return (a - b).norm() / a.norm(); };
  EXPECT_LE(relative(y[0], y[1]), 0.01f);
  EXPECT_GT(relative(y[0], y[1]), 0.0f) << "bf16 gave fp32's outputs: were operands rounded?";
  EXPECT_LE(relative(dx[0], dx[1]), 0.15f);
  EXPECT_LE(relative(dw[0].back(), dw[1].back()), 0.01f);
  for (size_t m = 0; m < dw[0].size(); ++m)
    EXPECT_LE(relative(dw[0][m], dw[1][m]), 0.15f) << "matrix " << m;
}

// The engines are twins: in either format, oneDNN's outputs and gradients
// follow Eigen's to fp32 rounding of their sums (same operands, the sums in
// another order), on a chunk of the size the model uses, with gradients as
// small as training's (the loss's 1/batch).
void CheckEnginesAgree(const MlpShape& shape) {
  const int n = 2048;
  const MlpWeights w = MakeMlpWeights(shape, 7);
  Matrix x, dy;
  RandomInputs(shape, n, 8, 1e-6f, &x, &dy);
  const ConstMatrixMap xm(x.data(), x.rows(), x.cols());
  for (MatmulFormat format : {MatmulFormat::kFp32, MatmulFormat::kBf16}) {
    SCOPED_TRACE(MatmulFormatName(format));
    Matrix y[2], dx[2];
    MlpWeights dw[2];
    for (int e = 0; e < 2; ++e) {
      SetGemmEngine(e == 0 ? GemmEngine::kEigen : GemmEngine::kOneDnn);
      MlpWorkspace ws;
      MlpForward(shape, w, xm, &ws, &y[e], format);
      dw[e] = ZeroMlpWeights(shape);
      dx[e].resize(shape.input_width, n);
      MatrixMap dxm(dx[e].data(), dx[e].rows(), dx[e].cols());
      MlpBackward(shape, w, xm, &ws, dy, &dw[e], &dxm, format);
    }
    SetGemmEngine(GemmEngine::kAuto);
    auto relative = [](const Matrix& a, const Matrix& b) { return (a - b).norm() / a.norm(); };
    // fp32: reordered sums. bf16: an activation whose two sums straddle a
    // bf16 rounding boundary rounds one step (2^-8) apart and carries it on.
    const float tolerance = format == MatmulFormat::kFp32 ? 1e-5f : 1e-3f;
    EXPECT_LE(relative(y[0], y[1]), tolerance);
    EXPECT_LE(relative(dx[0], dx[1]), tolerance);
    for (size_t m = 0; m < dw[0].size(); ++m)
      EXPECT_LE(relative(dw[0][m], dw[1][m]), tolerance) << "matrix " << m;
  }
}

TEST(MlpTest, EnginesAgreeInEveryFormat) {
  if (!OneDnnAvailable()) GTEST_SKIP() << "this build has no oneDNN (libdnnl-dev)";
  if (!NativeBf16Available())
    std::printf("no native bf16 here: the bf16 half compares Eigen's twin with itself\n");
  CheckEnginesAgree({32, 64, 2, 3});
  CheckEnginesAgree({8, 16, 0, 3});
}

// The backward pass reads what its forward call left in the workspace;
// continuing another call (other inputs, weights or format) is a bug that
// stops the process rather than return wrong gradients.
TEST(MlpDeathTest, BackwardChecksItContinuesItsForwardCall) {
  const MlpShape shape{8, 16, 1, 3};
  const MlpWeights w = MakeMlpWeights(shape, 3);
  Matrix x = Matrix::Ones(shape.input_width, 5), other = x, dy = Matrix::Ones(3, 5);
  Matrix dx_store(shape.input_width, 5);
  MatrixMap dx(dx_store.data(), dx_store.rows(), dx_store.cols());
  MlpWeights dw = ZeroMlpWeights(shape);
  MlpWorkspace ws;
  Matrix y;
  MlpForward(shape, w, ConstMatrixMap(x.data(), x.rows(), x.cols()), &ws, &y, MatmulFormat::kBf16);
  const ConstMatrixMap other_x(other.data(), other.rows(), other.cols());
  EXPECT_DEATH(MlpBackward(shape, w, other_x, &ws, dy, &dw, &dx, MatmulFormat::kBf16), "ws->x");
  const ConstMatrixMap same_x(x.data(), x.rows(), x.cols());
  EXPECT_DEATH(MlpBackward(shape, w, same_x, &ws, dy, &dw, &dx, MatmulFormat::kFp32), "format");
  const MlpWeights copy = w;
  EXPECT_DEATH(MlpBackward(shape, copy, same_x, &ws, dy, &dw, &dx, MatmulFormat::kBf16), "weights");
  MlpBackward(shape, w, same_x, &ws, dy, &dw, &dx, MatmulFormat::kBf16);  // its own call: fine
}

INSTANTIATE_TEST_SUITE_P(Engines, MlpEngineTest,
                         ::testing::Values(GemmEngine::kEigen, GemmEngine::kOneDnn),
                         [](const auto& test) {
                           return std::string(test.param == GemmEngine::kEigen ? "Eigen"
                                                                               : "OneDnn");
                         });

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
