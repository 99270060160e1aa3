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

#include "tests/nn/kernels/tiled_conv_reference.h"

namespace cosmoflow {
namespace {

using convref::ConvCase;
using convref::ConvProblem;

void CheckAllPasses(const ConvProblem& p, int tile) {
  const ConvCase& k = p.k;
  std::vector<float> y(size_t(k.n) * p.dst.n_stride, 0.f), dx(size_t(k.n) * p.src.n_stride, 0.f);
  std::vector<float> gw(p.w.size()), gb(k.f);
  const int fwd_tile = tile > 0 ? tile : FftConv3d::TileFor(p.Forward());
  FftConv3d fwd(p.Forward(), fwd_tile, p.src, p.dst);
  fwd.SetWeights(p.w.data());
  fwd.Forward(p.x.data(), y.data(), p.bias.data(), 0.1f);
  convref::ExpectForward(p, y, 2e-5, "fft");
  FftConv3d bwd(p.BackwardData(), tile > 0 ? tile : FftConv3d::TileFor(p.BackwardData()), p.dst, p.src);
  bwd.SetWeights(p.w.data(), true);
  bwd.Forward(p.dy.data(), dx.data(), nullptr, -1.f);
  convref::ExpectBackwardData(p, dx, 2e-5, "fft");
  fwd.BackwardWeights(p.x.data(), p.dy.data(), gw.data(), gb.data());
  convref::ExpectBackwardWeights(p, gw, gb, 2e-5, "fft");
}

TEST(FftConvTest, AllPassesMatchNaiveLoops) {
  const ConvCase cases[] = {
      {2, 3, 5, 9, 4, false, 0, 0}, {1, 2, 3, 10, 3, true, 1, 0},  {2, 8, 8, 7, 2, false, 2, 0},
      {1, 4, 6, 11, 3, false, 0, 6}, {2, 8, 16, 12, 4, true, 2, 8}, {1, 5, 4, 13, 4, false, 1, 9},
  };
  for (const ConvCase& c : cases) {
    SCOPED_TRACE(convref::Name(c));
    CheckAllPasses(ConvProblem(c), c.tile);
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
  const ConvCase c{2, 16, 32, 30, 4, false, 1, 24};
  const ConvProblem p(c);
  const Conv3dShape s{c.n, c.c, c.f, c.side, p.out, c.k, p.pad};
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
    Conv3dShape s{4, c, f, side, side - 3, 4, 0};
    const int t = FftConv3d::ChooseTile(s);
    ASSERT_GT(t, 0) << c << " -> " << f;
    EXPECT_GT(FftConv3d::FlopRatio(s, t), 3.0) << "tile " << t;
  }
  // A 1-channel 3^3 conv gains nothing.
  EXPECT_EQ(FftConv3d::ChooseTile(Conv3dShape{4, 1, 1, 32, 30, 3, 0}), 0);
}

}  // namespace
}  // namespace cosmoflow
