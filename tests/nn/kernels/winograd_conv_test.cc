// The Winograd-tiled convolution against naive double loops: forward (with bias and leaky ReLU),
// backward-data (the flipped, transposed correlation) and backward-weights, for kernels 2 to 4,
// VALID and SAME padding, channel counts that do and do not fill 16-lane groups, and the planar,
// channels-last and blocked layouts; bit-reproducibility for a fixed thread count.
#include "core/nn/kernels/winograd_conv.h"

#include <gtest/gtest.h>
#include <omp.h>

#include <vector>

#include "tests/nn/kernels/tiled_conv_reference.h"

namespace cosmoflow {
namespace {

using convref::ConvCase;
using convref::ConvProblem;

// Winograd's transforms amplify fp32 rounding (most for k = 2, whose output tile is 5^3): the bound
// is 2.5x the FFT path's.
constexpr double kTol = 5e-5;

struct Results {
  std::vector<float> y, dx, gw, gb;
};

Results RunAllPasses(const ConvProblem& p) {
  const ConvCase& k = p.k;
  Results r{std::vector<float>(size_t(k.n) * p.dst.n_stride, 0.f), std::vector<float>(size_t(k.n) * p.src.n_stride, 0.f),
            std::vector<float>(p.w.size()), std::vector<float>(k.f)};
  WinogradConv3d fwd(p.Forward(), p.src, p.dst);
  fwd.SetWeights(p.w.data());
  fwd.Forward(p.x.data(), r.y.data(), p.bias.data(), 0.1f);
  WinogradConv3d bwd(p.BackwardData(), p.dst, p.src);
  bwd.SetWeights(p.w.data(), true);
  bwd.Forward(p.dy.data(), r.dx.data(), nullptr, -1.f);
  fwd.BackwardWeights(p.x.data(), p.dy.data(), r.gw.data(), r.gb.data());
  return r;
}

TEST(WinogradConvTest, AllPassesMatchNaiveLoops) {
  const ConvCase cases[] = {
      {2, 3, 5, 9, 4, false, 0, 0},  {1, 2, 3, 10, 3, true, 1, 0},  {2, 8, 8, 7, 2, false, 2, 0},
      {1, 4, 6, 11, 2, true, 0, 0},  {2, 16, 16, 12, 4, true, 3, 0}, {1, 5, 4, 13, 4, false, 1, 0},
      {1, 32, 16, 9, 3, false, 1, 0}, {1, 17, 40, 8, 4, false, 0, 0}, {1, 16, 80, 7, 3, true, 3, 0},
  };
  for (const ConvCase& c : cases) {
    SCOPED_TRACE(convref::Name(c));
    const ConvProblem p(c);
    const Results r = RunAllPasses(p);
    convref::ExpectForward(p, r.y, kTol, "winograd");
    convref::ExpectBackwardData(p, r.dx, kTol, "winograd");
    convref::ExpectBackwardWeights(p, r.gw, r.gb, kTol, "winograd");
  }
}

TEST(WinogradConvTest, RefusesKernelsItHasNoTileFor) {
  EXPECT_EQ(WinogradConv3d::OutputTile(1), 0);
  EXPECT_EQ(WinogradConv3d::OutputTile(5), 0);
  EXPECT_EQ(WinogradConv3d::OutputTile(4), 3);
  const ConvProblem p(ConvCase{1, 2, 2, 8, 4, false, 0, 0});
  Conv3dShape s = p.Forward();
  s.kernel = 7;
  EXPECT_THROW(WinogradConv3d(s, p.src, p.dst), std::invalid_argument);
}

// Forward tiles are independent, so any thread count gives the same bits; the weight gradient's
// per-thread sums are added in thread order, so a fixed thread count gives the same bits.
TEST(WinogradConvTest, BitReproducible) {
  const ConvProblem p(ConvCase{2, 16, 32, 14, 4, false, 1, 0});
  const int saved = omp_get_max_threads();
  omp_set_num_threads(1);
  const Results one = RunAllPasses(p);
  omp_set_num_threads(2);
  const Results two = RunAllPasses(p), again = RunAllPasses(p);
  omp_set_num_threads(saved);
  EXPECT_EQ(one.y, two.y);
  EXPECT_EQ(one.dx, two.dx);
  EXPECT_EQ(two.gw, again.gw);
  EXPECT_EQ(two.gb, again.gb);
  convref::ExpectBackwardWeights(p, two.gw, two.gb, kTol, "winograd, 2 threads");
}

TEST(WinogradConvTest, SavesWorkOnSc18AndMlperfShapes) {
  // sc18's two 4^3 convolutions (16 -> 32 at 63^3, 32 -> 64 at 30^3) and a 3^3 SAME one of
  // mlperf's, batch 4: the modelled multiply-adds, transforms included, several times fewer.
  EXPECT_GT(WinogradConv3d::FlopRatio(Conv3dShape{4, 16, 32, 63, 60, 4, 0}), 3.0);
  EXPECT_GT(WinogradConv3d::FlopRatio(Conv3dShape{4, 32, 64, 30, 27, 4, 0}), 3.0);
  EXPECT_GT(WinogradConv3d::FlopRatio(Conv3dShape{4, 32, 64, 32, 32, 3, 1}), 2.0);
}

}  // namespace
}  // namespace cosmoflow
