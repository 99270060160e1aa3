// The FFT-tiled convolution against naive double loops: forward (with bias and leaky ReLU),
// backward-data (the flipped, transposed correlation) and backward-weights, for kernels 2, 3 and 4,
// VALID and SAME padding, and the planar, channels-last and blocked layouts.
#include "core/nn/kernels/fft_conv.h"

#include <gtest/gtest.h>
#include <omp.h>

#include <cmath>
#include <random>
#include <string>
#include <vector>

namespace cosmoflow {
namespace {

struct Case {
  int n, c, f, side, k;
  bool same;
  int layout;  // 0 planar, 1 channels-last, 2 blocked by 8 (channels multiples of 8)
  int tile;    // 0: FftConv3d::ChooseTile's
};

std::string Name(const Case& k) {
  return "n" + std::to_string(k.n) + " c" + std::to_string(k.c) + " f" + std::to_string(k.f) + " s" +
         std::to_string(k.side) + " k" + std::to_string(k.k) + (k.same ? " same" : " valid") + " layout" +
         std::to_string(k.layout) + " tile" + std::to_string(k.tile);
}

ActivationLayout LayoutOf(int kind, int64_t channels, int64_t voxels) {
  if (kind == 0) return ActivationLayout::Planar(channels, voxels);
  if (kind == 1) return ActivationLayout::ChannelsLast(channels, voxels);
  return ActivationLayout::Blocked(channels, voxels, 8);
}

std::vector<float> Random(size_t n, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::uniform_real_distribution<float> u(-1.f, 1.f);
  std::vector<float> v(n);
  for (auto& x : v) x = u(rng);
  return v;
}

struct Problem {
  Case k;
  int out = 0, pad = 0;
  ActivationLayout src, dst;
  std::vector<float> x, w, bias, dy;
  explicit Problem(const Case& c) : k(c) {
    out = c.same ? c.side : c.side - c.k + 1;
    pad = c.same ? (c.k - 1) / 2 : 0;
    src = LayoutOf(c.layout, c.c, int64_t{c.side} * c.side * c.side);
    dst = LayoutOf(c.layout, c.f, int64_t{out} * out * out);
    x = Random(size_t(c.n) * src.n_stride, 1);
    w = Random(size_t(c.f) * c.c * c.k * c.k * c.k, 2);
    bias = Random(c.f, 3);
    dy = Random(size_t(c.n) * dst.n_stride, 4);
  }
  float X(int n, int c, int d, int h, int w_) const {
    if (d < 0 || h < 0 || w_ < 0 || d >= k.side || h >= k.side || w_ >= k.side) return 0.f;
    return x[src.Offset(n, c, (int64_t{d} * k.side + h) * k.side + w_)];
  }
  float W(int f, int c, int a, int b, int e) const { return w[((int64_t{f} * k.c + c) * k.k + a) * k.k * k.k + b * k.k + e]; }
  float DY(int n, int f, int d, int h, int w_) const { return dy[dst.Offset(n, f, (int64_t{d} * out + h) * out + w_)]; }
};

double RefForward(const Problem& p, int n, int f, int d, int h, int w) {
  double s = p.bias[f];
  for (int c = 0; c < p.k.c; ++c)
    for (int a = 0; a < p.k.k; ++a)
      for (int b = 0; b < p.k.k; ++b)
        for (int e = 0; e < p.k.k; ++e) s += double(p.X(n, c, d + a - p.pad, h + b - p.pad, w + e - p.pad)) * p.W(f, c, a, b, e);
  return s > 0 ? s : 0.1 * s;
}

void ExpectClose(double got, double want, double scale, const std::string& what) {
  ASSERT_NEAR(got, want, 2e-5 * scale) << what;
}

void CheckForward(const Problem& p, int tile) {
  const Case& k = p.k;
  FftConvShape s{k.n, k.c, k.f, k.side, p.out, k.k, p.pad};
  FftConv3d conv(s, tile, p.src, p.dst);
  conv.SetWeights(p.w.data());
  std::vector<float> y(size_t(k.n) * p.dst.n_stride, 0.f);
  conv.Forward(p.x.data(), y.data(), p.bias.data(), 0.1f);
  const double scale = std::sqrt(double(k.c) * k.k * k.k * k.k);
  for (int n = 0; n < k.n; ++n)
    for (int f = 0; f < k.f; ++f)
      for (int d = 0; d < p.out; ++d)
        for (int h = 0; h < p.out; ++h)
          for (int w = 0; w < p.out; ++w)
            ExpectClose(y[p.dst.Offset(n, f, (int64_t{d} * p.out + h) * p.out + w)], RefForward(p, n, f, d, h, w), scale,
                        "forward " + Name(k));
}

void CheckBackwardData(const Problem& p, int tile) {
  const Case& k = p.k;
  // dx = full correlation of dy with the flipped kernel: an FFT conv from F to C channels.
  FftConvShape s{k.n, k.f, k.c, p.out, k.side, k.k, k.k - 1 - p.pad};
  FftConv3d conv(s, tile > 0 ? tile : FftConv3d::TileFor(s), p.dst, p.src);
  conv.SetWeights(p.w.data(), true);
  std::vector<float> dx(size_t(k.n) * p.src.n_stride, 0.f);
  conv.Forward(p.dy.data(), dx.data(), nullptr, -1.f);
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
            ExpectClose(dx[p.src.Offset(n, c, (int64_t{d} * k.side + h) * k.side + w)], ref, scale,
                        "backward-data " + Name(k));
          }
}

void CheckBackwardWeights(const Problem& p, int tile) {
  const Case& k = p.k;
  FftConvShape s{k.n, k.c, k.f, k.side, p.out, k.k, p.pad};
  FftConv3d conv(s, tile, p.src, p.dst);
  std::vector<float> gw(p.w.size()), gb(k.f);
  conv.BackwardWeights(p.x.data(), p.dy.data(), gw.data(), gb.data());
  const double scale = std::sqrt(double(k.n) * p.out * p.out * p.out);
  for (int f = 0; f < k.f; ++f) {
    double b = 0;
    for (int n = 0; n < k.n; ++n)
      for (int v = 0; v < p.out * p.out * p.out; ++v) b += p.dy[p.dst.Offset(n, f, v)];
    ExpectClose(gb[f], b, scale, "bias gradient " + Name(k));
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
            ExpectClose(gw[((int64_t{f} * k.c + c) * k.k + a) * k.k * k.k + bb * k.k + e], ref, scale,
                        "weight gradient " + Name(k));
          }
  }
}

TEST(FftConvTest, AllPassesMatchNaiveLoops) {
  const Case cases[] = {
      {2, 3, 5, 9, 4, false, 0, 0}, {1, 2, 3, 10, 3, true, 1, 0},  {2, 8, 8, 7, 2, false, 2, 0},
      {1, 4, 6, 11, 3, false, 0, 6}, {2, 8, 16, 12, 4, true, 2, 8}, {1, 5, 4, 13, 4, false, 1, 9},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(Name(c));
    Problem p(c);
    FftConvShape s{c.n, c.c, c.f, c.side, p.out, c.k, p.pad};
    const int tile = c.tile > 0 ? c.tile : FftConv3d::TileFor(s);
    CheckForward(p, tile);
    CheckBackwardData(p, c.tile);
    CheckBackwardWeights(p, tile);
  }
}

// Every thread's buffers are its own heap allocations, and FFTW applies the plan made on thread
// 0's to them. Between constructions the heap is fragmented (as when kernel measurement builds and
// drops candidates), so the buffers land at unrelated places; two threads must still give one
// thread's results. (With re and im of a spectrum allocated apart, thread 1's arrays had another
// im - re distance than the planned ones, and FFTW read through a wild pointer.)
TEST(FftConvTest, TwoThreadsMatchOneWhereverTheHeapPutsTheirBuffers) {
  // sc18's second conv in miniature (16 -> 32, 4^3, channels-last), tile 24 as at full size:
  // the shape whose transforms FFTW runs through its buffered copies.
  const Case c{2, 16, 32, 30, 4, false, 1, 24};
  Problem p(c);
  const FftConvShape s{c.n, c.c, c.f, c.side, p.out, c.k, p.pad};
  const int tile = c.tile;
  const int saved = omp_get_max_threads();
  auto run = [&](std::vector<float>* y, std::vector<float>* gw, std::vector<float>* gb) {
    FftConv3d conv(s, tile, p.src, p.dst);
    conv.SetWeights(p.w.data());
    y->assign(size_t(c.n) * p.dst.n_stride, 0.f);
    gw->assign(p.w.size(), 0.f);
    gb->assign(c.f, 0.f);
    conv.Forward(p.x.data(), y->data(), p.bias.data(), 0.1f);
    conv.BackwardWeights(p.x.data(), p.dy.data(), gw->data(), gb->data());
  };
  omp_set_num_threads(1);
  std::vector<float> y1, gw1, gb1;
  run(&y1, &gw1, &gb1);
  omp_set_num_threads(2);
  std::mt19937 rng(7);
  std::vector<std::vector<char>> junk;
  const double scale = std::sqrt(double(c.n) * p.out * p.out * p.out);
  for (int round = 0; round < 12; ++round) {
    for (int i = 0; i < 24; ++i) junk.emplace_back(1024 + rng() % (256 * 1024), char(1));
    for (size_t i = round % 3; i < junk.size(); i += 3) std::vector<char>().swap(junk[i]);
    std::vector<float> y2, gw2, gb2;
    run(&y2, &gw2, &gb2);
    for (size_t i = 0; i < y1.size(); ++i) ASSERT_NEAR(y2[i], y1[i], 1e-5f * (1 + std::fabs(y1[i]))) << "output " << i << " round " << round;
    for (size_t i = 0; i < gw1.size(); ++i) ASSERT_NEAR(gw2[i], gw1[i], 2e-5 * scale) << "weight gradient " << i << " round " << round;
    for (int f = 0; f < c.f; ++f) ASSERT_NEAR(gb2[f], gb1[f], 2e-5 * scale) << "bias gradient " << f;
  }
  omp_set_num_threads(saved);
}

TEST(FftConvTest, ChoosesATileThatSavesWorkOnSc18Shapes) {
  // sc18's two 4^3 convolutions (16 -> 32 at 63^3, 32 -> 64 at 30^3), batch 4.
  for (auto [c, f, side] : {std::tuple{16, 32, 63}, std::tuple{32, 64, 30}}) {
    FftConvShape s{4, c, f, side, side - 3, 4, 0};
    const int t = FftConv3d::ChooseTile(s);
    ASSERT_GT(t, 0) << c << " -> " << f;
    EXPECT_GT(FftConv3d::FlopRatio(s, t), 3.0) << "tile " << t;
  }
  // A 1-channel 3^3 conv gains nothing.
  EXPECT_EQ(FftConv3d::ChooseTile(FftConvShape{4, 1, 1, 32, 30, 3, 0}), 0);
}

}  // namespace
}  // namespace cosmoflow
