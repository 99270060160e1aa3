// The first block of the SC18-style networks as one fused kernel: 1-channel VALID conv3d (stride 1,
// up to 16 filters) + leaky ReLU + average pooling.
//
// Why: the 1-channel convolution is oneDNN's slowest layer in every precision (its backward-weights
// runs far below the machine's peak, and bf16 is slower than fp32 there), and its 16 x 126^3 output
// is the largest tensor of the network. Fusing conv, activation and pooling means that tensor is
// never written: forward writes only the pooled output (8x smaller) and a 16-bit sign mask per conv
// voxel; backward-weights rebuilds dLoss/dconv on the fly from the pooled gradient and the mask and
// accumulates the 27 weight gradients in registers (a matmul over input patches). The gradient of the
// input cube is never computed.
//
// Layouts: input  N x 1 x S^3 fp32 (plain);
//          output channels last with a channel stride CS in [F, 16]: N x Q^3 x CS, fp32 or bf16,
//          Q = (S-K+1)/P; lanes F..CS-1 are written as zeros. CS = F is oneDNN's ndhwc, CS = 8 or
//          16 its nCdhw8c / nCdhw16c with one channel block (padded): the network picks whichever
//          the next convolution prefers (oneDNN 2.6 falls back to ref:any for a training conv on
//          ndhwc, while inference prefers ndhwc). CS = 0 means planar NCDHW (what a training conv
//          with fewer than 16 input channels wants).
//          diff of the output in the same layout and type.
// Weights/grads: plain OIDHW (F,1,K,K,K) fp32 and bias (F) fp32, read/written directly.
// Instruction sets: AVX-512 (16 filters per zmm) or AVX2 + FMA (two ymm), chosen at compile time.
// Threading: OpenMP over output rows; per-thread partial gradients are summed in thread order, so
// results are bit-reproducible for a fixed thread count.
#pragma once

#include <cstdint>
#include <vector>

namespace cosmoflow {

class FirstBlockKernel {
 public:
  // False when the build targets neither AVX-512 nor AVX2 + FMA (the kernel's two instruction sets):
  // the network then runs the block as separate oneDNN primitives. Construct and call the others
  // only when this is true.
  static bool Supported(int side, int filters, int kernel, int stride, bool same_padding, int pool);
  static const char* Isa();  // "avx512", "avx2", or "none"

  FirstBlockKernel(int batch, int side, int filters, int kernel, float alpha, int pool, bool bf16_out,
                   bool training, int channel_stride);

  int pooled_side() const { return q_; }
  double ConvFlops() const;  // 2 * K^3 * F * O^3 * batch (the conv part, as ForwardFlops counts)

  // dst: N x Q^3 x CS (fp32 or bf16 as constructed). Records the ReLU masks when training.
  void Forward(const float* src, const float* weights, const float* bias, void* dst);
  // diff_dst: dLoss/d(pooled output), same layout and type as dst. Overwrites grad_w and grad_b.
  void BackwardWeights(const float* src, const float* weights, const float* bias, const void* diff_dst,
                       float* grad_w, float* grad_b);

 private:
  int n_, s_, f_, k_, p_, cs_, o_, q_;
  float alpha_;
  bool bf16_, training_;
  int threads_;
  std::vector<uint16_t> mask_;     // [N][Q*P][Q*P][Q*P] bit f = conv output of filter f > 0
  std::vector<float> storage_;     // one allocation, carved into the 64-byte aligned arrays below
  float* wt_ = nullptr;            // [K^3][16] weights, tap-major, zero-padded filters
  float* partial_ = nullptr;       // [threads][K^3 * 16 + 16] per-thread gradient partials
  float* scratch_ = nullptr;       // [threads][Q*P * 16] pooled-row / dconv-row buffers
  int64_t scratch_stride_ = 0;
};

// Weight and bias gradients of the network's first convolution when it has a few input channels
// (MLPerf-style 4-channel cubes): stride 1, 1-4 input channels, exactly 16 filters, kernel 1-5, any
// padding, fp32, channels-last (ndhwc) src and diff_dst. Why: oneDNN 2.6 has no direct 3D
// backward-weights kernel for AVX2 and runs this as im2col + gemm, a large share of the accuracy
// study's training step. This reuses the first block's weight-gradient micro-kernel (a
// small matmul of each conv row's input patches by its row of 16 filter gradients) on a zero-padded
// planar copy of the input. Same instruction sets, threading and determinism as FirstBlockKernel.
class FirstConvWeightGrad {
 public:
  static bool Supported(int in_channels, int filters, int kernel, int stride);

  // side: input S; out_side: O; pad_left: zeros before the first voxel on each axis.
  FirstConvWeightGrad(int batch, int in_channels, int side, int kernel, int pad_left, int out_side);

  // src: N x S^3 x C (ndhwc); diff_dst: N x O^3 x 16 (ndhwc, 64-byte aligned), the gradient of the
  // conv output. Overwrites grad_w (plain OIDHW, 16 x C x K^3) and grad_b (16).
  void Run(const float* src, const float* diff_dst, float* grad_w, float* grad_b);

 private:
  int n_, c_, s_, k_, pl_, o_, ps_;  // ps_: padded side O + K - 1
  int threads_;
  std::vector<float> padded_;   // [N][C][PS^3], zero where padding
  std::vector<float> storage_;  // per-thread partials [C][K^3][16] + [16], 64-byte aligned
  float* partial_ = nullptr;
  int64_t partial_stride_ = 0;
};

}  // namespace cosmoflow
