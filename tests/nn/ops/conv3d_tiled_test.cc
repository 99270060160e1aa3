// conv3d's tiled candidates (FFT-tiled and Winograd) inside the network: forced for each pass, they
// run (asserted), agree with oneDNN's kernels and match finite differences; a whole small network
// trains to the same loss with direct and tiled kernels.
#include <gtest/gtest.h>

#include "core/nn/kernels/winograd_conv.h"
#include "tests/nn/test_util.h"

namespace cosmoflow {
namespace {

using namespace cosmoflow::testing;  // NOLINT

KernelOptions Forced(const std::string& algo) {
  return {{"conv.fwd", algo}, {"conv.bwd_data", algo}, {"conv.bwd_weights", algo}};
}
const KernelOptions kDirect = {{"conv.fwd", "onednn"}, {"conv.bwd_data", "onednn"}, {"conv.bwd_weights", "onednn"}};

// 2 -> 16 (k4 VALID) -> 16 (k3 SAME) -> 32 (k2 VALID) with leaky ReLUs and a pool: every kernel
// size the specs use, both paddings, blocked and planar layouts as oneDNN picks them.
ModelSpec TiledSpec() {
  return MakeSpec(2, 14, {ConvL(16, 4), LeakyL(0.1f), ConvL(16, 3, 1, true), LeakyL(0.1f), PoolL(false, 2),
                          ConvL(32, 2), LeakyL(0.1f), FlattenL(), DenseL(3)}, 3);
}

class Conv3dTiledTest : public ::testing::TestWithParam<const char*> {};

TEST_P(Conv3dTiledTest, ForcedRunsAndAgreesWithOneDnn) {
  const std::string algo = GetParam();
  ModelSpec spec = TiledSpec();
  ASSERT_TRUE(spec.Validate().ok()) << spec.Validate().ToString();
  OursAndOneDnn run = RunOursAndOneDnn(spec, 2, Forced(algo), kDirect, 61);
  ASSERT_TRUE(run.ours && run.onednn);
  const size_t convs = 3;
  if (CountKernel(*run.ours, "fwd", algo) == 0) GTEST_SKIP() << "no conv here has a layout the " << algo << " kernel reads";
  EXPECT_EQ(CountKernel(*run.ours, "fwd", algo), convs);
  EXPECT_EQ(CountKernel(*run.ours, "bwd_weights", algo), convs);
  EXPECT_EQ(CountKernel(*run.ours, "bwd_data", algo), convs - 1);  // not the first conv
  EXPECT_EQ(CountKernel(*run.onednn, "", algo), 0u);
  ExpectSameGradients(*run.ours, *run.onednn, 2e-4);
  // And the forward outputs.
  auto x = RandomVector(InputSize(spec) * 2, 62, 0.f, 2.f);
  std::vector<float> a(6), b(6);
  run.ours->Forward(x.data(), a.data());
  run.onednn->Forward(x.data(), b.data());
  for (int i = 0; i < 6; ++i) EXPECT_NEAR(a[i], b[i], 1e-4f * (1 + std::abs(b[i])));
}

TEST_P(Conv3dTiledTest, GradientsMatchFiniteDifferences) {
  ExpectGradientsMatchFiniteDifferences(TiledSpec(), 2, 16, 2e-3, 5, Forced(GetParam()));
}

TEST_P(Conv3dTiledTest, TrainsToTheSameLossAsDirectKernels) {
  // 40 SGD steps on a fixed regression problem: the losses of the two paths stay within 1%, and
  // training did reduce the loss.
  ModelSpec spec = TiledSpec();
  const int batch = 4;
  auto tiled = MakeTrainingNet(spec, batch, Forced(GetParam())), direct = MakeTrainingNet(spec, batch, kDirect);
  ASSERT_TRUE(tiled && direct);
  auto x = RandomVector(InputSize(spec) * batch, 71, 0.f, 2.f);
  auto target = RandomVector(batch * 3, 72, -0.5f, 0.5f);
  double first[2] = {0, 0}, last[2] = {0, 0};
  Network* nets[2] = {tiled.get(), direct.get()};
  for (int m = 0; m < 2; ++m) {
    std::vector<float> y(batch * 3), d(batch * 3);
    for (int step = 0; step < 40; ++step) {
      nets[m]->Forward(x.data(), y.data());
      double loss = 0;
      for (int i = 0; i < batch * 3; ++i) {
        loss += (y[i] - target[i]) * (y[i] - target[i]) / (batch * 3);
        d[i] = 2 * (y[i] - target[i]) / (batch * 3);
      }
      nets[m]->Backward(d.data());
      for (auto& p : nets[m]->parameters()) {
        for (int64_t i = 0; i < p.numel(); ++i) p.value[i] -= 0.005f * p.grad[i];
      }
      nets[m]->ParametersUpdated();
      if (step == 0) first[m] = loss;
      last[m] = loss;
    }
  }
  EXPECT_NEAR(last[0], last[1], 0.01 * last[1] + 1e-6) << GetParam() << " " << last[0] << " direct " << last[1];
  EXPECT_LT(last[1], 0.5 * first[1]);
}

// Winograd in a bf16 training network (bf16 tensors, fp32 arithmetic), forced in every pass: it
// runs, and its output and gradients are at least as close to the fp32 network's as those of
// oneDNN's bf16 kernels (relative L2 error per parameter tensor; both paths round the same
// activations to bf16, Winograd's convolutions themselves add no bf16 rounding).
TEST(Conv3dTiledBf16Test, WinogradIsAsCloseToFp32AsOneDnnBf16) {
  SKIP_WITHOUT_BF16();
  ModelSpec spec = TiledSpec();
  const int batch = 2;
  auto f32 = MakeNet(spec, batch, true, Precision::kFp32, 7, kDirect);
  auto wino = MakeNet(spec, batch, true, Precision::kBf16, 7, Forced("winograd"));
  auto direct = MakeNet(spec, batch, true, Precision::kBf16, 7, kDirect);
  ASSERT_TRUE(f32 && wino && direct);
  if (CountKernel(*wino, "fwd", "winograd") == 0) GTEST_SKIP() << "no conv here has a layout the Winograd kernel reads";
  EXPECT_EQ(CountKernel(*wino, "fwd", "winograd"), 3u);
  EXPECT_EQ(CountKernel(*wino, "bwd_weights", "winograd"), 3u);
  EXPECT_EQ(CountKernel(*wino, "bwd_data", "winograd"), 2u);
  auto x = RandomVector(InputSize(spec) * batch, 81, 0.f, 2.f);
  auto r = RandomVector(batch * 3, 82);
  std::vector<float> y[3];
  Network* nets[3] = {f32.get(), wino.get(), direct.get()};
  for (int i = 0; i < 3; ++i) {
    y[i].resize(batch * 3);
    nets[i]->Forward(x.data(), y[i].data());
    nets[i]->Backward(r.data());
  }
  const double out_wino = RelativeL2Error(y[1].data(), y[0].data(), batch * 3);
  const double out_direct = RelativeL2Error(y[2].data(), y[0].data(), batch * 3);
  EXPECT_GT(out_wino, 0.0);  // really ran in reduced precision
  EXPECT_LE(out_wino, 1.5 * out_direct + 2e-3) << "output";
  for (size_t pi = 0; pi < f32->parameters().size(); ++pi) {
    const Parameter& ref = f32->parameters()[pi];
    const double e_wino = RelativeL2Error(wino->parameters()[pi].grad, ref.grad, ref.numel());
    const double e_direct = RelativeL2Error(direct->parameters()[pi].grad, ref.grad, ref.numel());
    EXPECT_LE(e_wino, 1.5 * e_direct + 2e-3) << ref.name << ": winograd " << e_wino << ", onednn bf16 " << e_direct;
    EXPECT_LT(e_wino, 0.05) << ref.name;
  }
}

// The rule (no forcing, no measurement) takes Winograd in every pass of a stride-1 conv whose
// modelled flop ratio is at least 3 on enough tiles (the 16 -> 32 4^3 conv: 9^3 tiles per cube),
// and not for few input channels (padded to 16 lanes), a kernel side of 5, a stride of 2 or a small
// cube (the last conv: 4^3 tiles per cube); in bf16 the same, but only on a CPU without AMX. A
// build without AVX-512 never takes it (its micro-kernel there loses to oneDNN's AVX2 kernels).
TEST(Conv3dTiledRuleTest, TakesWinogradWhereItSavesWork) {
  ModelSpec spec = MakeSpec(2, 32, {ConvL(16, 3), LeakyL(0.1f), ConvL(32, 4), LeakyL(0.1f), ConvL(32, 5, 1, true),
                                    ConvL(32, 3, 2, true), ConvL(32, 3, 1, true), FlattenL(), DenseL(3)}, 3);
  ASSERT_TRUE(spec.Validate().ok()) << spec.Validate().ToString();
  auto net = MakeTrainingNet(spec, 2, {});
  ASSERT_TRUE(net);
  if (!WinogradConv3d::Avx512MicroKernel()) {
    EXPECT_EQ(CountKernel(*net, "", "winograd"), 0u) << "an AVX2 build: oneDNN's direct kernels";
    return;
  }
  if (CountKernel(*net, "fwd", "winograd") == 0) GTEST_SKIP() << "no conv here has a layout the Winograd kernel reads";
  for (const char* pass : {"fwd", "bwd_data", "bwd_weights"}) {
    EXPECT_EQ(CountKernel(*net, pass, "winograd"), 1u) << pass;
    EXPECT_EQ(CountKernel(*net, pass, "winograd", "conv1"), 1u) << pass << ": the 16 -> 32 4^3 conv";
  }
  if (!Bf16Supported()) return;
  auto net16 = MakeNet(spec, 2, true, Precision::kBf16);
  ASSERT_TRUE(net16);
  if (CpuHasAmxBf16()) {
    EXPECT_EQ(CountKernel(*net16, "", "winograd"), 0u) << "AMX: oneDNN's bf16 kernels";
  } else {
    for (const char* pass : {"fwd", "bwd_data", "bwd_weights"}) {
      EXPECT_EQ(CountKernel(*net16, pass, "winograd", "conv1"), 1u) << pass << ": bf16 without AMX";
      EXPECT_EQ(CountKernel(*net16, pass, "winograd"), 1u) << pass;
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Algorithms, Conv3dTiledTest, ::testing::Values("fft", "winograd"));

}  // namespace
}  // namespace cosmoflow
