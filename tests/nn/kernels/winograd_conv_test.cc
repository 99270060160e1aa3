// The Winograd-tiled convolution against naive double loops: forward (with bias and leaky ReLU),
// backward-data (the flipped, transposed correlation) and backward-weights, for kernels 2 to 4,
// VALID and SAME padding, channel counts that do and do not fill 16-lane groups, and the planar,
// channels-last and blocked layouts; bit-reproducibility for a fixed thread count; bf16 tensors
// giving exactly the fp32 path's results on the same (bf16-valued) inputs, rounded once.
#include "core/nn/kernels/winograd_conv.h"

#include <gtest/gtest.h>
#include <omp.h>

#include <vector>

#include "core/nn/network_internal.h"
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

std::vector<uint16_t> ToBf16(const std::vector<float>& v) {
  std::vector<uint16_t> out(v.size());
  for (size_t i = 0; i < v.size(); ++i) out[i] = nn_internal::F32ToBf16(v[i]);
  return out;
}

std::vector<float> Widen(const std::vector<uint16_t>& v) {
  std::vector<float> out(v.size());
  for (size_t i = 0; i < v.size(); ++i) out[i] = nn_internal::Bf16ToF32(v[i]);
  return out;
}

// With bf16 tensors the kernel widens the inputs and rounds the outputs; in between it is the fp32
// kernel. So on inputs that bf16 holds exactly, every output is the fp32 path's rounded to nearest
// even, and the weight gradient (fp32) is the fp32 path's, bit for bit, in every layout (the fast
// contiguous gather and the per-lane one) and at the output's edge tiles.
TEST(WinogradConvTest, Bf16TensorsGiveTheFp32ResultsOnTheSameInputsRoundedOnce) {
  const ConvCase cases[] = {
      {2, 16, 32, 11, 4, false, 1, 0}, {1, 16, 16, 9, 3, true, 3, 0}, {1, 5, 20, 8, 3, true, 0, 0},
      {2, 8, 8, 7, 2, false, 2, 0},
  };
  for (const ConvCase& c : cases) {
    SCOPED_TRACE(convref::Name(c));
    ConvProblem p(c);
    p.x = Widen(ToBf16(p.x));  // bf16-valued inputs, so both paths see the same numbers
    p.dy = Widen(ToBf16(p.dy));
    const Results want = RunAllPasses(p);

    const std::vector<uint16_t> x = ToBf16(p.x), dy = ToBf16(p.dy);
    std::vector<uint16_t> y(want.y.size(), 0), dx(want.dx.size(), 0);
    std::vector<float> gw(want.gw.size()), gb(want.gb.size());
    WinogradConv3d fwd(p.Forward(), p.src, p.dst, WinogradConv3d::Io::kBf16);
    fwd.SetWeights(p.w.data());
    fwd.Forward(x.data(), y.data(), p.bias.data(), 0.1f);
    WinogradConv3d bwd(p.BackwardData(), p.dst, p.src, WinogradConv3d::Io::kBf16);
    bwd.SetWeights(p.w.data(), true);
    bwd.Forward(dy.data(), dx.data(), nullptr, -1.f);
    fwd.BackwardWeights(x.data(), dy.data(), gw.data(), gb.data());

    EXPECT_EQ(y, ToBf16(want.y));
    EXPECT_EQ(dx, ToBf16(want.dx));
    EXPECT_EQ(gw, want.gw);
    EXPECT_EQ(gb, want.gb);
    // And against the double reference, within fp32's bound plus one bf16 rounding of the output:
    // half an ulp, at most 2^-8 of a value, and values here reach 3x the bound's scale.
    convref::ExpectForward(p, Widen(y), kTol + 3.0 / 256, "winograd bf16");
    convref::ExpectBackwardData(p, Widen(dx), kTol + 3.0 / 256, "winograd bf16");
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
