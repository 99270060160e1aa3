// The fused first block (conv on 1-4 channels + leaky ReLU + average or max pool) against the
// reference, finite differences and the same block as separate oneDNN ops; the channels-last
// switch after it.
#include "core/nn/kernels/first_block.h"
#include <gtest/gtest.h>

#include <memory>
#include <string>

#include "tests/nn/test_util.h"

namespace cosmoflow {
namespace {

using namespace cosmoflow::testing;  // NOLINT

TEST(FusedFirstBlockTest, FirstBlockMatchesReferenceAndFiniteDifferences) {
  struct Case {
    int side, filters, kernel;
  };
  for (Case c : {Case{10, 16, 3}, Case{11, 4, 3}, Case{11, 8, 4}, Case{9, 5, 2}}) {
    SCOPED_TRACE("side " + std::to_string(c.side) + " filters " + std::to_string(c.filters) + " kernel " +
                 std::to_string(c.kernel));
    ModelSpec spec = MakeSpec(1, c.side,
                              {ConvL(c.filters, c.kernel), LeakyL(0.01f), PoolL(false, 2), ConvL(3, 2),
                               LeakyL(0.01f), FlattenL(), DenseL(3)},
                              3);
    ExpectForwardMatchesReference(spec, 2, 1e-4);
    ExpectGradientsMatchFiniteDifferences(spec, 2);
  }
}

// Several input channels, SAME padding, more than one group of 16 filters, max pooling (MLPerf's
// block), pools that do not divide the conv output, and a leaky slope of 0 (plain ReLU).
TEST(FusedFirstBlockTest, MultiChannelSameAndMaxPoolMatchReferenceAndFiniteDifferences) {
  struct Case {
    int channels, side, filters, kernel;
    bool same, max;
    int pool;
    float alpha;
  };
  for (Case c : {Case{4, 8, 32, 3, true, true, 2, 0.3f}, Case{4, 9, 16, 3, true, false, 2, 0.01f},
                 Case{2, 9, 20, 2, true, true, 3, 0.3f}, Case{3, 10, 5, 4, false, true, 2, 0.f},
                 Case{1, 11, 24, 3, false, false, 2, 0.1f}}) {
    SCOPED_TRACE("channels " + std::to_string(c.channels) + " side " + std::to_string(c.side) + " filters " +
                 std::to_string(c.filters) + " kernel " + std::to_string(c.kernel) + (c.same ? " same" : " valid") +
                 (c.max ? " max" : " avg") + " pool " + std::to_string(c.pool));
    ModelSpec spec = MakeSpec(c.channels, c.side,
                              {ConvL(c.filters, c.kernel, 1, c.same), LeakyL(c.alpha), PoolL(c.max, c.pool),
                               ConvL(3, 2), LeakyL(0.01f), FlattenL(), DenseL(3)},
                              3);
    ASSERT_TRUE(spec.Validate().ok()) << spec.Validate().ToString();
    auto net = MakeNet(spec, 2, true);
    ASSERT_TRUE(net);
    if (std::string(FirstBlockKernel::Isa()) != "none") {
      EXPECT_EQ(CountKernel(*net, "bwd_weights", "fused"), 1u);
    }
    ExpectForwardMatchesReference(spec, 2, 1e-4);
    ExpectGradientsMatchFiniteDifferences(spec, 2);
  }
}

TEST(FusedFirstBlockTest, FusedAndGenericPathsAgree) {
  if (std::string(FirstBlockKernel::Isa()) == "none")
    GTEST_SKIP() << "the fused first block is built only for AVX-512 or AVX2 targets (this build has neither)";
  ModelSpec spec = *BuiltinSpec("tiny32");
  spec.layers.erase(spec.layers.begin() + 11);  // no dropout: both paths must give the same numbers
  const int batch = 2;
  auto x = RandomVector(InputSize(spec) * batch, 11, 0.f, 2.f);
  auto r = RandomVector(batch * 3, 12);
  std::vector<float> y_fused(batch * 3), y_generic(batch * 3);
  auto fused = MakeNet(spec, batch, true);
  auto generic = MakeTrainingNet(spec, batch, {{"first_block", "onednn"}});
  ASSERT_TRUE(fused && generic);
  EXPECT_EQ(CountKernel(*fused, "fwd", "fused"), 1u);
  EXPECT_EQ(CountKernel(*generic, "fwd", "fused"), 0u);
  fused->Forward(x.data(), y_fused.data());
  generic->Forward(x.data(), y_generic.data());
  for (int i = 0; i < batch * 3; ++i) EXPECT_NEAR(y_fused[i], y_generic[i], 1e-4f * (1 + std::abs(y_generic[i])));
  fused->Backward(r.data());
  generic->Backward(r.data());
  ExpectSameGradients(*fused, *generic);
}

// MLPerf's first block (4 channels, SAME, 32 filters, max pool) at 64^3: the fused kernel and
// oneDNN's separate ops give the same outputs and gradients.
TEST(FusedFirstBlockTest, MlperfBlockFusedAndGenericPathsAgree) {
  if (std::string(FirstBlockKernel::Isa()) == "none")
    GTEST_SKIP() << "the fused first block is built only for AVX-512 or AVX2 targets (this build has neither)";
  ModelSpec spec = *BuiltinSpec("mlperf64");
  for (auto& l : spec.layers) {
    if (l.type == LayerType::kDropout) l.rate = 0.f;  // both paths must give the same numbers
  }
  const int batch = 2, outputs = 4;
  auto x = RandomVector(InputSize(spec) * batch, 41, 0.f, 2.f);
  auto r = RandomVector(batch * outputs, 42);
  std::vector<float> y_fused(batch * outputs), y_generic(batch * outputs);
  auto fused = MakeNet(spec, batch, true);
  auto generic = MakeTrainingNet(spec, batch, {{"first_block", "onednn"}});
  ASSERT_TRUE(fused && generic);
  EXPECT_EQ(CountKernel(*fused, "bwd_weights", "fused"), 1u);
  EXPECT_EQ(CountKernel(*generic, "fwd", "fused"), 0u);
  fused->Forward(x.data(), y_fused.data());
  generic->Forward(x.data(), y_generic.data());
  for (int i = 0; i < batch * outputs; ++i) {
    EXPECT_NEAR(y_fused[i], y_generic[i], 1e-4f * (1 + std::abs(y_generic[i])));
  }
  fused->Backward(r.data());
  generic->Backward(r.data());
  // The two paths round the conv outputs differently, so the few max-pool windows (here and in the
  // later blocks) whose two largest values lie within rounding route their gradient to different
  // voxels: measured differences of 2e-4 to 6e-4 of a tensor's largest gradient element.
  ExpectSameGradients(*fused, *generic, 1e-3);
}

// The rule: fused wherever supported in fp32; in bf16 (AMX or AVX512-BF16) oneDNN keeps a
// multi-channel block whose conv output is under 16 MiB per sample (the study network's 4 x 32^3
// block) but never a 1-channel one (oneDNN's 1-channel bf16 conv is slow); forcing either way wins.
TEST(FusedFirstBlockTest, RuleKeepsOneDnnOnlyForSmallMultiChannelBf16Blocks) {
  if (std::string(FirstBlockKernel::Isa()) == "none")
    GTEST_SKIP() << "the fused first block is built only for AVX-512 or AVX2 targets (this build has neither)";
  const auto study = MakeSpec(4, 32, {ConvL(16, 3, 1, true), LeakyL(0.01f), PoolL(false, 2), ConvL(32, 3, 1, true),
                                      LeakyL(0.01f), FlattenL(), DenseL(3)}, 3);
  const auto one_channel = MakeSpec(1, 32, {ConvL(16, 3), LeakyL(0.01f), PoolL(false, 2), ConvL(16, 3),
                                            LeakyL(0.01f), FlattenL(), DenseL(3)}, 3);
  auto fp32 = MakeTrainingNet(study, 2, {});
  ASSERT_TRUE(fp32);
  EXPECT_EQ(CountKernel(*fp32, "fwd", "fused"), 1u);
  if (!Bf16Supported()) GTEST_SKIP() << "no bf16 on this CPU: the bf16 half of the rule cannot run";
  auto bf16 = MakeNet(study, 2, true, Precision::kBf16);
  auto bf16_forced = MakeNet(study, 2, true, Precision::kBf16, 1, {{"first_block", "fused"}});
  auto bf16_one = MakeNet(one_channel, 2, true, Precision::kBf16);
  ASSERT_TRUE(bf16 && bf16_forced && bf16_one);
  EXPECT_EQ(CountKernel(*bf16, "fwd", "fused"), 0u);
  EXPECT_EQ(CountKernel(*bf16_forced, "fwd", "fused"), 1u);
  EXPECT_EQ(CountKernel(*bf16_one, "fwd", "fused"), 1u);
}

// fp32 training runs channels-last after the fused first block when oneDNN has real kernels for it
// (PreferredConvSrcLayout): the numbers must not depend on the layout.
TEST(FusedFirstBlockTest, ChannelsLastAndBlockedLayoutsAgree) {
  if (std::string(FirstBlockKernel::Isa()) == "none")
    GTEST_SKIP() << "the fused first block is built only for AVX-512 or AVX2 targets (this build has neither)";
  // sc18's first two blocks at 36^3: 36 -> conv3 34 -> pool 17 -> conv4 14 -> pool 7 -> conv3 5.
  ModelSpec spec = MakeSpec(1, 36, {ConvL(16, 3), LeakyL(0.01f), PoolL(false, 2), ConvL(32, 4), LeakyL(0.01f),
                                    PoolL(false, 2), ConvL(16, 3), LeakyL(0.01f), FlattenL(), DenseL(3)}, 3);
  ASSERT_TRUE(spec.Validate().ok()) << spec.Validate().ToString();
  const int batch = 2;
  auto x = RandomVector(InputSize(spec) * batch, 31, 0.f, 2.f);
  auto r = RandomVector(batch * 3, 32);
  std::unique_ptr<Network> nets[2] = {MakeNet(spec, batch, true),
                                      MakeTrainingNet(spec, batch, {{"conv.layout", "no_channels_last"}})};
  ASSERT_TRUE(nets[0] && nets[1]);
  std::vector<float> y[2] = {std::vector<float>(batch * 3), std::vector<float>(batch * 3)};
  std::string reports[2];
  for (int m = 0; m < 2; ++m) {
    nets[m]->SetProfiling(true);
    nets[m]->Forward(x.data(), y[m].data());
    nets[m]->Backward(r.data());
    reports[m] = nets[m]->ProfileReport();
  }
  // With AVX-512 the default network did switch to channels-last (oneDNN's brgemm forward runs only
  // on ndhwc; it has no AVX2 brgemm convolution).
  if (std::string(FirstBlockKernel::Isa()) == "avx512") {
    EXPECT_NE(reports[0].find("brgconv"), std::string::npos) << reports[0];
  }
  EXPECT_EQ(reports[1].find("brgconv"), std::string::npos) << reports[1];
  EXPECT_NE(reports[0].find("first_block"), std::string::npos) << reports[0];
  for (int i = 0; i < batch * 3; ++i) EXPECT_NEAR(y[0][i], y[1][i], 1e-4f * (1 + std::abs(y[1][i])));
  ExpectSameGradients(*nets[0], *nets[1]);
  // 8 elements per tensor: the double reference of this 36^3 net is slow and the point here is the
  // layout switch.
  ExpectGradientsMatchFiniteDifferences(spec, batch, 8);
}

}  // namespace
}  // namespace cosmoflow
