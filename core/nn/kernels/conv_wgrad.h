// Weight and bias gradients of a stride-1 3D convolution on channels-last (ndhwc) fp32 tensors:
// input channels a multiple of 16 and filters a multiple of 4, or 4 channels and filters a multiple
// of 16; any kernel size and padding.
//
// Why: oneDNN 2.6 has no direct 3D backward-weights kernel for AVX2. For ndhwc (the layout whose
// forward and backward-data kernels are direct) it runs im2col + gemm; the blocked layouts fall
// back to its reference loops. In the accuracy study's network that made conv1's backward-weights
// alone a large share of a training step. This kernel is the weight gradient
// written as what it is, for each of the K^3 taps a matmul dW_tap (F x C) += dY^T (F x P) X_tap (P x C)
// over the P output positions, accumulated in registers (4 filters x 16 input channels, or 4
// channels x 16 filters)
// one output plane at a time, so the plane's input and gradient stay in L1/L2.
//
// Layouts: src N x S^3 x C, diff_dst N x O^3 x F (ndhwc, any alignment); grad_w plain OIDHW
// (F x C x K^3), grad_b F.
// Instruction set: AVX2 + FMA (ymm), chosen at compile time; Supported() is false in a build
// without them.
// Threading: OpenMP over output planes; per-thread partial gradients are summed in thread order, so
// results are bit-reproducible for a fixed thread count.
#pragma once

#include <cstdint>
#include <vector>

namespace cosmoflow {

class ChannelsLastWeightGrad {
 public:
  static bool Supported(int in_channels, int filters, int stride);

  // side: input S; out_side: O; pad_left: zeros before the first voxel on each axis.
  ChannelsLastWeightGrad(int batch, int in_channels, int filters, int side, int kernel, int pad_left,
                         int out_side);

  // Overwrites grad_w and grad_b.
  void Run(const float* src, const float* diff_dst, float* grad_w, float* grad_b);

 private:
  int n_, c_, f_, s_, k_, pl_, o_;
  int threads_;
  std::vector<float> storage_;  // per-thread partials [K^3][F][C] + [F], 64-byte aligned
  float* partial_ = nullptr;
  int64_t partial_stride_ = 0;
};

}  // namespace cosmoflow
