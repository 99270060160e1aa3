// Naive double-precision references for the tiled fp32 convolution kernels (FFT-tiled, Winograd):
// a random problem in a chosen layout, and the forward (bias, leaky ReLU 0.1), backward-data and
// backward-weights results it should give, in the kernels' own output layouts.
#pragma once

#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <random>
#include <string>
#include <vector>

#include "core/nn/kernels/conv_geometry.h"

namespace cosmoflow::convref {

struct ConvCase {
  int n, c, f, side, k;
  bool same;
  int layout;  // 0 planar, 1 channels-last, 2 blocked by 8 (channels multiples of 8), 3 blocked by 16
  int tile;    // the kernel's tile where it has a choice (0: its own)
};

inline std::string Name(const ConvCase& k) {
  return "n" + std::to_string(k.n) + " c" + std::to_string(k.c) + " f" + std::to_string(k.f) + " s" +
         std::to_string(k.side) + " k" + std::to_string(k.k) + (k.same ? " same" : " valid") + " layout" +
         std::to_string(k.layout) + " tile" + std::to_string(k.tile);
}

inline ActivationLayout LayoutOf(int kind, int64_t channels, int64_t voxels) {
  if (kind == 0) return ActivationLayout::Planar(channels, voxels);
  if (kind == 1) return ActivationLayout::ChannelsLast(channels, voxels);
  return ActivationLayout::Blocked(channels, voxels, kind == 2 ? 8 : 16);
}

inline std::vector<float> Random(size_t n, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::uniform_real_distribution<float> u(-1.f, 1.f);
  std::vector<float> v(n);
  for (auto& x : v) x = u(rng);
  return v;
}

struct ConvProblem {
  ConvCase k;
  int out = 0, pad = 0;
  ActivationLayout src, dst;
  std::vector<float> x, w, bias, dy;
  explicit ConvProblem(const ConvCase& c) : k(c) {
    out = c.same ? c.side : c.side - c.k + 1;
    pad = c.same ? (c.k - 1) / 2 : 0;
    src = LayoutOf(c.layout, c.c, int64_t{c.side} * c.side * c.side);
    dst = LayoutOf(c.layout, c.f, int64_t{out} * out * out);
    x = Random(size_t(c.n) * src.n_stride, 1);
    w = Random(size_t(c.f) * c.c * c.k * c.k * c.k, 2);
    bias = Random(c.f, 3);
    dy = Random(size_t(c.n) * dst.n_stride, 4);
  }
  // The forward problem, and backward-data's as a correlation from F to C channels.
  Conv3dShape Forward() const { return {k.n, k.c, k.f, k.side, out, k.k, pad}; }
  Conv3dShape BackwardData() const { return {k.n, k.f, k.c, out, k.side, k.k, k.k - 1 - pad}; }
  float X(int n, int c, int d, int h, int w_) const {
    if (d < 0 || h < 0 || w_ < 0 || d >= k.side || h >= k.side || w_ >= k.side) return 0.f;
    return x[src.Offset(n, c, (int64_t{d} * k.side + h) * k.side + w_)];
  }
  float W(int f, int c, int a, int b, int e) const { return w[((int64_t{f} * k.c + c) * k.k + a) * k.k * k.k + b * k.k + e]; }
  float DY(int n, int f, int d, int h, int w_) const { return dy[dst.Offset(n, f, (int64_t{d} * out + h) * out + w_)]; }
};

// Every output against the reference, to tol times `scale` (the square root of the number of
// terms each sums, the growth of a random-sign sum).
inline void ExpectForward(const ConvProblem& p, const std::vector<float>& y, double tol, const std::string& what) {
  const ConvCase& k = p.k;
  const double scale = std::sqrt(double(k.c) * k.k * k.k * k.k);
  for (int n = 0; n < k.n; ++n)
    for (int f = 0; f < k.f; ++f)
      for (int d = 0; d < p.out; ++d)
        for (int h = 0; h < p.out; ++h)
          for (int w = 0; w < p.out; ++w) {
            double s = p.bias[f];
            for (int c = 0; c < k.c; ++c)
              for (int a = 0; a < k.k; ++a)
                for (int b = 0; b < k.k; ++b)
                  for (int e = 0; e < k.k; ++e) s += double(p.X(n, c, d + a - p.pad, h + b - p.pad, w + e - p.pad)) * p.W(f, c, a, b, e);
            s = s > 0 ? s : 0.1 * s;
            ASSERT_NEAR(y[p.dst.Offset(n, f, (int64_t{d} * p.out + h) * p.out + w)], s, tol * scale)
                << "forward " << what << " " << Name(k);
          }
}

inline void ExpectBackwardData(const ConvProblem& p, const std::vector<float>& dx, double tol, const std::string& what) {
  const ConvCase& k = p.k;
  const double scale = std::sqrt(double(k.f) * k.k * k.k * k.k);
  for (int n = 0; n < k.n; ++n)
    for (int c = 0; c < k.c; ++c)
      for (int d = 0; d < k.side; ++d)
        for (int h = 0; h < k.side; ++h)
          for (int w = 0; w < k.side; ++w) {
            double ref = 0;
            for (int f = 0; f < k.f; ++f)
              for (int a = 0; a < k.k; ++a)
                for (int b = 0; b < k.k; ++b)
                  for (int e = 0; e < k.k; ++e) {
                    const int od = d - a + p.pad, oh = h - b + p.pad, ow = w - e + p.pad;
                    if (od < 0 || oh < 0 || ow < 0 || od >= p.out || oh >= p.out || ow >= p.out) continue;
                    ref += double(p.DY(n, f, od, oh, ow)) * p.W(f, c, a, b, e);
                  }
            ASSERT_NEAR(dx[p.src.Offset(n, c, (int64_t{d} * k.side + h) * k.side + w)], ref, tol * scale)
                << "backward-data " << what << " " << Name(k);
          }
}

inline void ExpectBackwardWeights(const ConvProblem& p, const std::vector<float>& gw, const std::vector<float>& gb,
                                  double tol, const std::string& what) {
  const ConvCase& k = p.k;
  const double scale = std::sqrt(double(k.n) * p.out * p.out * p.out);
  for (int f = 0; f < k.f; ++f) {
    double b = 0;
    for (int n = 0; n < k.n; ++n)
      for (int v = 0; v < p.out * p.out * p.out; ++v) b += p.dy[p.dst.Offset(n, f, v)];
    ASSERT_NEAR(gb[f], b, tol * scale) << "bias gradient " << what << " " << Name(k);
    for (int c = 0; c < k.c; ++c)
      for (int a = 0; a < k.k; ++a)
        for (int bb = 0; bb < k.k; ++bb)
          for (int e = 0; e < k.k; ++e) {
            double ref = 0;
            for (int n = 0; n < k.n; ++n)
              for (int d = 0; d < p.out; ++d)
                for (int h = 0; h < p.out; ++h)
                  for (int w = 0; w < p.out; ++w)
                    ref += double(p.DY(n, f, d, h, w)) * p.X(n, c, d + a - p.pad, h + bb - p.pad, w + e - p.pad);
            ASSERT_NEAR(gw[((int64_t{f} * k.c + c) * k.k + a) * k.k * k.k + bb * k.k + e], ref, tol * scale)
                << "weight gradient " << what << " " << Name(k);
          }
  }
}

}  // namespace cosmoflow::convref
