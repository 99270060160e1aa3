// The fused first block (1-channel conv + leaky ReLU + average pool) against the reference, finite
// differences and the same block as separate oneDNN ops; the channels-last switch after it.
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

TEST(FusedFirstBlockTest, FusedAndGenericPathsAgree) {
  if (!FirstBlockKernel::Supported(32, 16, 3, 1, false, 2))
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

// fp32 training runs channels-last after the fused first block when oneDNN has real kernels for it
// (PreferredConvSrcLayout): the numbers must not depend on the layout.
TEST(FusedFirstBlockTest, ChannelsLastAndBlockedLayoutsAgree) {
  if (!FirstBlockKernel::Supported(32, 16, 3, 1, false, 2))
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
