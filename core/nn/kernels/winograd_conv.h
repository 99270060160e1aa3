// Winograd-tiled 3D convolution F(m^3, k^3), stride 1, fp32 arithmetic on fp32 or bf16 tensors: the
// forward pass, and through it the backward-data pass, and the backward-weights pass.
//
// The correlation y[n][f][o] = sum_c sum_i x[n][c][o + i - pad] w[f][c][i] (Conv3dShape) is cut
// into output tiles of m^3 voxels, each reading an input tile of a^3 voxels (a = m + k - 1 = 6:
// m = 3 for k = 4, 4 for k = 3, 5 for k = 2; the kernel sides the specs use). In one dimension y = A^T [(G w) . (B^T x)] with
// Toom-Cook matrices on the points 0, 1, -1, 1/2, -1/2 and infinity (B^T a x a, G a x k, A^T m x a);
// in three the transforms apply along each axis. Per transformed point (a^3 of them) the sum over
// input channels is a real matrix product (tiles x C) x (C x F), run from registers, vectorised
// over 16 filters; the transforms are vectorised over 16 channels. A 4^3 kernel then costs 216
// products per 27 outputs and channel pair instead of 1,728.
//
// The weight gradient is the correlation F(k^3, m^3) of input and output-gradient tiles: the input
// tiles' transform is the forward's (B^T), the output-gradient tiles' transform is A (the forward's
// output transform, transposed), the products are summed over tiles (a matrix product whose inner
// dimension is the tiles) and G^T turns the a^3 sums into the k^3 taps once per (f, c).
//
// The transforms use the points' +- symmetry (a row for -a is the even part minus the odd part of
// the row for +a): about half the multiply-adds of dense 6 x 6 products.
// Accuracy: at sc18's and mlperf's shapes the forward and backward-data passes are within 1-4e-5
// of the largest output and the weight gradient within 9e-5 (bench/engine/conv_accuracy; oneDNN's
// fp32 kernels: up to 2.3e-5); the tests bound the error at 5e-5 of a random-sign sum's scale.
// bf16 tensors (Io::kBf16: src, dst and diff_dst as bf16 bit patterns, weights and gradients fp32)
// are widened as tiles are gathered and rounded (to nearest even) as outputs are stored; the
// arithmetic stays fp32, so the result is the fp32 convolution of the bf16 inputs, rounded once.
// Layouts: any ActivationLayout. Threads: OpenMP over blocks of tiles, each thread with its own
// buffers; the weight gradient's per-thread partial sums are added in thread order, so results are
// bit-reproducible for a fixed thread count. Workspaces are allocated at construction (the weight
// gradient's per-thread sums at the first BackwardWeights), never per step.
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include "core/nn/kernels/conv_geometry.h"

namespace cosmoflow {

class WinogradConv3d {
 public:
  static constexpr int kPoints = 6;  // a: transformed points per axis
  // The output tile side for a kernel side k (a - k + 1), or 0 when k is outside [2, 4].
  static int OutputTile(int kernel);
  // Whether the kernel takes the problem: a kernel side with an output tile, and transformed
  // weights (a^3 x C x F floats, as are each thread's weight-gradient sums) within
  // kMaxTransformedBytes: wide layers of small cubes (mlperf's last convs) would need several
  // times their weights' memory, and gain nothing.
  static constexpr int64_t kMaxTransformedBytes = int64_t{16} << 20;
  static bool Supports(const Conv3dShape& s);
  // Output tiles of one pass over the batch (0 when the kernel side has no tile).
  static int64_t Tiles(const Conv3dShape& s);
  // Direct flops / the Winograd path's multiply-add flops (transforms included): the rule's measure.
  static double FlopRatio(const Conv3dShape& s);
  // Whether this build's per-point products run the AVX-512 micro-kernel (6 rows x 64 filters from
  // registers). Without AVX-512 (an AVX2 build) they run 6 x 16, and sc18's 4^3 convs still run
  // slower than oneDNN's AVX2 direct kernels (docs/benchmarks.md): the rule then leaves Winograd out.
  static bool Avx512MicroKernel();

  enum class Io { kF32, kBf16 };  // the element type of src, dst and diff_dst

  WinogradConv3d(const Conv3dShape& shape, const ActivationLayout& src, const ActivationLayout& dst,
                 Io io = Io::kF32);
  ~WinogradConv3d();
  WinogradConv3d(const WinogradConv3d&) = delete;
  WinogradConv3d& operator=(const WinogradConv3d&) = delete;

  // w: filters x in_channels x k^3, plain (OIDHW). With flip_transpose, w is the kernel of the
  // convolution whose backward-data this is: in_channels x filters x k^3, used transposed and
  // flipped in space. Call after every change of the weights.
  void SetWeights(const float* w, bool flip_transpose = false);
  // dst = correlation(src, w) (+ bias[f] if bias) then leaky ReLU with slope alpha when alpha >= 0.
  // src and dst hold floats, or bf16 bit patterns (uint16) with Io::kBf16.
  void Forward(const void* src, void* dst, const float* bias, float alpha) const;
  // Weight and bias gradients from src (src layout) and diff_dst (dst layout), both of the Io type:
  // overwrites grad_w (filters x in_channels x k^3 plain, fp32) and grad_b (filters; skipped when null).
  void BackwardWeights(const void* src, const void* diff_dst, float* grad_w, float* grad_b) const;

  int tile() const { return m_; }
  int64_t WorkspaceBytes() const;

 private:
  struct Buffers;
  struct TileOrigin {
    int64_t n;
    int d, h, w;  // output voxel of the tile's corner
  };
  TileOrigin Origin(int64_t tile) const;
  // T: float, or uint16_t for bf16 bit patterns.
  template <class T>
  void ForwardT(const T* src, T* dst, const float* bias, float alpha) const;
  template <class T>
  void BackwardWeightsT(const T* src, const T* diff_dst, float* grad_w, float* grad_b) const;
  template <class T>
  void InputTransform(const T* src, int64_t tile, int slot, Buffers& b) const;
  template <class T>
  void OutputGradientTransform(const T* diff_dst, int64_t tile, int slot, Buffers& b, double* bias_sum) const;
  template <class T>
  void OutputTransform(int64_t tile, int slot, const float* bias, float alpha, T* dst, Buffers& b) const;

  Conv3dShape s_;
  Io io_ = Io::kF32;
  int m_ = 0, nt_ = 0;
  int cp_ = 0, fp_ = 0;  // channels and filters rounded up to 16
  int tiles_per_block_ = 8;
  int threads_ = 1;
  ActivationLayout src_, dst_;
  std::vector<float> bt_, at_, g_;  // B^T (a x a), A^T (m x a), G (a x k), row-major
  std::unique_ptr<Buffers[]> buffers_;
  float* u_ = nullptr;  // transformed weights, [a^3][cp][fp]
  std::vector<float> u_storage_;
};

}  // namespace cosmoflow
