// A small fully connected network, as tiny-cuda-nn's FullyFusedMLP: ReLU
// hidden layers of equal width, a linear output layer, no biases (the hash
// encoding supplies the offsets). CPU forward and backward; the products go
// through kernels/cpu/gemm.h (oneDNN where present, else Eigen) in the
// format given: fp32, or operands rounded to bf16 and summed in fp32.
//
// Matrices are column-major with one column per sample, so the encoding's
// sample-major feature buffer is the input matrix without a copy.
//
// Thread safety: Forward/Backward are const on the weights they are given
// and write only to caller-owned outputs; call them concurrently on
// disjoint column ranges with separate workspaces.
#pragma once

#include <Eigen/Core>
#include <cstdint>
#include <vector>

#include "kernels/cpu/gemm.h"
#include "kernels/mlp_shape.h"

namespace gridsync::cpu {

using Matrix = Eigen::Matrix<float, Eigen::Dynamic, Eigen::Dynamic, Eigen::ColMajor>;
using ConstMatrixMap = Eigen::Map<const Matrix>;
using MatrixMap = Eigen::Map<Matrix>;

using ::gridsync::MlpShape;  // kernels/mlp_shape.h

// Weights W[i] of shape rows(i) x cols(i).
using MlpWeights = std::vector<Matrix>;

// Xavier-uniform weights U(+-sqrt(6 / (fan_in + fan_out))), reproducible
// from `seed`.
MlpWeights MakeMlpWeights(const MlpShape& shape, uint64_t seed);
MlpWeights ZeroMlpWeights(const MlpShape& shape);

struct MlpWorkspace {
  std::vector<Matrix> hidden;  // fp32: post-ReLU activations of each hidden layer
  Matrix delta, prev_delta;    // fp32's backward pass's, kept to reuse their memory
  // bf16: every operand converted once (weights, input, activations, the
  // back-propagated gradients), not once per product it enters.
  std::vector<std::vector<uint16_t>> weights16, hidden16;
  std::vector<uint16_t> x16, dy16, delta16[2];
  // What the forward call was made with, so that MlpBackward can check
  // that it continues that call.
  MatmulFormat format = MatmulFormat::kFp32;
  const float* x = nullptr;
  int64_t n = -1;
  std::vector<const float*> weights;
};

// x: input_width x n. Writes y: output_width x n.
void MlpForward(const MlpShape& shape, const MlpWeights& w, const ConstMatrixMap& x,
                MlpWorkspace* ws, Matrix* y, MatmulFormat format = MatmulFormat::kFp32);

// Adds the weight gradient to *dw and writes dx (input_width x n), given
// dy = dLoss/dy and the workspace of the matching forward call, made in the
// same format (its activations are read; its backward buffers are
// overwritten). bf16 reads the weights and x as the forward call converted
// them.
void MlpBackward(const MlpShape& shape, const MlpWeights& w, const ConstMatrixMap& x,
                 MlpWorkspace* ws, const Matrix& dy, MlpWeights* dw, MatrixMap* dx,
                 MatmulFormat format = MatmulFormat::kFp32);

}  // namespace gridsync::cpu
