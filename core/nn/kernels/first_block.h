// The first block of the CosmoFlow networks as one fused kernel: a conv3d on few input channels
// (stride 1, VALID or SAME) + leaky ReLU + average or max pooling. sc18's block (1 channel, VALID,
// 16 filters, average pool) and mlperf's (4 channels, SAME, 32 filters, max pool) both fit.
//
// Why: a convolution of 1-4 input channels is oneDNN's slowest layer in every precision (its
// backward-weights runs far below the machine's peak), and its output (16-32 channels at the full
// input resolution) is the network's largest tensor, which the pooling then reads and, in the
// backward pass, writes again as its gradient. Fusing conv, activation and pooling means neither
// tensor exists: forward writes only the pooled output (P^3 times smaller) plus, when training, a
// 16-bit sign mask per conv voxel and filter group (average pool) or one byte per pooled output
// and filter (max pool: the window index of the maximum and its sign); backward-weights rebuilds
// dLoss/dconv row by row from the pooled gradient and those bytes and accumulates the weight
// gradients in registers (a matmul over input patches). The gradient of the input is never computed.
//
// Layouts: input  N x C x S^3 fp32 (plain NCDHW, the network's input);
//          output N x F x Q^3 in blocks of CS channels, fp32 or bf16: element (n, f, voxel) at
//          ((n * ceil(F/CS) + f / CS) * Q^3 + voxel) * CS + f % CS, Q = O / P with O the conv's
//          output side. CS = F is oneDNN's ndhwc, CS = 8 (F <= 8) or 16 its nCdhw8c / nCdhw16c
//          (padding channels written as zeros): the network picks whichever the next convolution
//          prefers. CS = 0 means planar NCDHW. diff of the output in the same layout and type.
// Weights/grads: plain OIDHW (F, C, K, K, K) fp32 and bias (F) fp32, read/written directly.
// Padding: SAME pads with zeros (pad_left before the first voxel on each axis, the rest after):
//          each sample is copied into a zero-bordered planar buffer (one sample's worth).
// Instruction sets: AVX-512 (16 filters per zmm) or AVX2 + FMA (two ymm), chosen at compile time.
// Threading: OpenMP over output rows; per-thread partial gradients are summed in thread order, so
// results are bit-reproducible for a fixed thread count.
#pragma once

#include <cstdint>
#include <vector>

namespace cosmoflow {

struct FirstBlockShape {
  int batch = 1;
  int channels = 1;  // C: 1-4
  int side = 0;      // S
  int filters = 0;   // F: 1-32
  int kernel = 0;    // K: 1-5
  int pad_left = 0;  // 0 for VALID
  int out_side = 0;  // O: S - K + 1 for VALID, S for SAME
  float alpha = 0.f; // leaky ReLU slope; >= 0 with a max pool (the activation must be monotonic)
  int pool = 2;      // P: window and stride
  bool max_pool = false;
};

class FirstBlockKernel {
 public:
  // False when the build targets neither AVX-512 nor AVX2 + FMA (the kernel's two instruction sets)
  // or the shape is outside the contract above: the network then runs the block as separate
  // oneDNN primitives. Construct and call the others only when this is true.
  static bool Supported(const FirstBlockShape& shape);
  static const char* Isa();  // "avx512", "avx2", or "none"

  FirstBlockKernel(const FirstBlockShape& shape, bool bf16_out, bool training, int channel_stride);

  int pooled_side() const { return q_; }
  double ConvFlops() const;  // 2 * K^3 * C * F * O^3 * batch (the conv part, as ForwardFlops counts)
  // Bytes the kernel holds besides its output: training masks, the padded sample, partials.
  int64_t WorkspaceBytes() const;

  // dst: as described above (fp32 or bf16 as constructed). Records masks when training.
  void Forward(const float* src, const float* weights, const float* bias, void* dst);
  // diff_dst: dLoss/d(pooled output), same layout and type as dst. Overwrites grad_w and grad_b.
  void BackwardWeights(const float* src, const void* diff_dst, float* grad_w, float* grad_b);

 private:
  const float* Sample(const float* src, int ni);  // the sample's channels, padded if SAME
  void PackWeights(const float* weights, const float* bias);
  void ForwardRow(const float* x, int ni, int qd, int qh, float* pacc, float* pidx, void* dst);
  void PoolConvRow(const float* x, int ni, int d, int h, int g, float* pacc, float* pidx);
  void StorePooledRow(int ni, int qd, int qh, int g, float* pacc, const float* pidx, void* dst);
  void BackwardRow(const float* x, const void* diff_dst, int ni, int d, int h, float* dconv, float* partial,
                   float* bias_acc);
  void DconvRow(const void* diff_dst, int ni, int d, int h, int g, float* dconv, float* bias_acc);

  FirstBlockShape sh_;
  int n_, c_, s_, f_, g_, k_, p_, cs_, o_, q_, ps_;  // g_: filter groups of 16; ps_: padded side
  float alpha_;
  bool bf16_, training_, padded_input_;
  int threads_;
  std::vector<uint16_t> mask_;  // average pool: [N][(QP)^3][G] bit = conv output of filter > 0
  std::vector<uint8_t> codes_;  // max pool: [N][Q^3][G][16] window index | 0x80 if the max > 0
  std::vector<float> padded_;   // SAME: one sample [C][PS^3], zero borders
  std::vector<float> storage_;  // one allocation, carved into the 64-byte aligned arrays below
  float* wt_ = nullptr;         // [G][C][K^3][16] weights, tap-major, zero-padded filters
  float* bias16_ = nullptr;     // [G][16]
  float* partial_ = nullptr;    // [threads][G * C * K^3 * 16 + G * 16] per-thread gradient partials
  float* scratch_ = nullptr;    // [threads][3 * QP * 16] pooled-row and dconv-row buffers
  int64_t scratch_stride_ = 0, partial_stride_ = 0;
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
