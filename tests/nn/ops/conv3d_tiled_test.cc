// conv3d's tiled candidates (FFT-tiled and Winograd) inside the network: forced for each pass, they
// run (asserted), agree with oneDNN's kernels and match finite differences; a whole small network
// trains to the same loss with direct and tiled kernels.
#include <gtest/gtest.h>

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

// The rule (no forcing, no measurement) takes Winograd in every pass of a stride-1 fp32 conv whose
// modelled flop ratio is at least 3 on enough tiles (the 16 -> 32 4^3 conv: 9^3 tiles per cube),
// and not for few input channels (padded to 16 lanes), a kernel side of 5, a stride of 2, a small
// cube (the last conv: 4^3 tiles per cube) or bf16.
TEST(Conv3dTiledRuleTest, TakesWinogradWhereItSavesWork) {
  ModelSpec spec = MakeSpec(2, 32, {ConvL(16, 3), LeakyL(0.1f), ConvL(32, 4), LeakyL(0.1f), ConvL(32, 5, 1, true),
                                    ConvL(32, 3, 2, true), ConvL(32, 3, 1, true), FlattenL(), DenseL(3)}, 3);
  ASSERT_TRUE(spec.Validate().ok()) << spec.Validate().ToString();
  auto net = MakeTrainingNet(spec, 2, {});
  ASSERT_TRUE(net);
  if (CountKernel(*net, "fwd", "winograd") == 0) GTEST_SKIP() << "no conv here has a layout the Winograd kernel reads";
  for (const char* pass : {"fwd", "bwd_data", "bwd_weights"}) {
    EXPECT_EQ(CountKernel(*net, pass, "winograd"), 1u) << pass;
    EXPECT_EQ(CountKernel(*net, pass, "winograd", "conv1"), 1u) << pass << ": the 16 -> 32 4^3 conv";
  }
  NetworkOptions bf16;
  bf16.batch = 2;
  bf16.training = true;
  bf16.precision = Precision::kBf16;
  auto net16 = Network::Create(spec, bf16);
  ASSERT_TRUE(net16.ok()) << net16.status().ToString();
  EXPECT_EQ(CountKernel(**net16, "", "winograd"), 0u);
}

INSTANTIATE_TEST_SUITE_P(Algorithms, Conv3dTiledTest, ::testing::Values("fft", "winograd"));

}  // namespace
}  // namespace cosmoflow
