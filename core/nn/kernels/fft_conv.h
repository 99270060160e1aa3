// FFT-tiled 3D convolution (overlap-save), fp32, stride 1: the forward pass, and through it the
// backward-data pass, and the backward-weights pass.
//
// The correlation y[n][f][o] = sum_c sum_i x[n][c][o + i - pad] w[f][c][i] (o, i 3-D) is computed
// on tiles: the output is cut into tiles of To^3 voxels; each reads an input tile of T^3 voxels
// (T = To + k - 1, zero outside the input), whose real FFT times the conjugate FFT of the weights
// (zero-padded to T^3), summed over input channels, is the FFT of the tile's output (circular
// correlation, exact on the To^3 voxels that do not wrap). Per frequency this is a small complex
// matrix product (tiles x C) x (C x F); it runs on split real/imaginary arrays, vectorised across
// 16 frequencies, with 2 x 2 complex accumulators in registers. The weight gradient is the
// correlation of input and output-gradient tiles, accumulated over tiles in the frequency domain
// and transformed back once per (f, c) pair.
//
// Cost per tile: (C + F) FFTs of T^3 points and T^2 (T/2 + 1) C F complex multiply-adds, against
// 2 k^3 C F To^3 flops directly: several times fewer for k = 3, 4 and tens of channels.
//
// Layouts: any oneDNN layout expressible as strides with one channel block (plain NCDHW,
// channels-last NDHWC, or nCdhw8c / nCdhw16c when the channels fill whole blocks).
// Threads: OpenMP over blocks of tiles, each thread with its own buffers; the weight gradient's
// per-thread partial sums are added in thread order, so results are bit-reproducible for a fixed
// thread count. FFTW plans are made once (FFTW_ESTIMATE, deterministic) at construction.
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include "core/nn/kernels/conv_geometry.h"

namespace cosmoflow {

class FftConv3d {
 public:
  // The tile side T minimising the modelled cost, or 0 when FFT tiling would not save work.
  static int ChooseTile(const Conv3dShape& s);
  // ChooseTile's tile, or where FFT tiling saves nothing the smallest tile that fits the kernel
  // (forced runs); 0 when the spectra would exceed the memory cap.
  static int TileFor(const Conv3dShape& s);
  // Direct flops / modelled FFT-path cost with tile T, in product-flop units (an FFT flop counts as
  // several: the rule's measure of the gain).
  static double FlopRatio(const Conv3dShape& s, int tile);

  FftConv3d(const Conv3dShape& shape, int tile, const ActivationLayout& src, const ActivationLayout& dst);
  ~FftConv3d();
  FftConv3d(const FftConv3d&) = delete;
  FftConv3d& operator=(const FftConv3d&) = delete;

  // w: filters x in_channels x k^3, plain (OIDHW). With flip_transpose, w is the kernel of the
  // convolution whose backward-data this is: in_channels x filters x k^3, used transposed and
  // flipped in space. Call after every change of the weights.
  void SetWeights(const float* w, bool flip_transpose = false);
  // dst = correlation(src, w) (+ bias[f] if bias) then leaky ReLU with slope alpha when alpha >= 0.
  void Forward(const float* src, float* dst, const float* bias, float alpha) const;
  // Weight and bias gradients from src (src layout) and diff_dst (dst layout): overwrites
  // grad_w (filters x in_channels x k^3 plain) and grad_b (filters; skipped when null).
  void BackwardWeights(const float* src, const float* diff_dst, float* grad_w, float* grad_b) const;

  int tile() const { return t_; }
  int64_t WorkspaceBytes() const;

 private:
  struct Plans;
  struct ThreadBuffers;
  void Gather(const float* x, const ActivationLayout& layout, int channels, int side, int64_t tile, bool input,
              float* real) const;
  void InputSpectra(const float* src, int64_t first, int count, ThreadBuffers& b) const;
  int64_t TilesPerSample() const { return int64_t{nt_} * nt_ * nt_; }

  Conv3dShape s_;
  int t_ = 0, to_ = 0, nt_ = 0;
  int64_t tv_ = 0;   // T^3 real values per tile
  int64_t tfp_ = 0;  // complex values per tile spectrum, padded to a multiple of 16
  int threads_ = 1;
  int tiles_per_block_ = 4;
  ActivationLayout src_, dst_;
  std::unique_ptr<Plans> plans_;
  std::unique_ptr<ThreadBuffers[]> buffers_;
};

}  // namespace cosmoflow
