// dropout: the same mask forward and backward, a new one per training step, identity at inference.
#include <gtest/gtest.h>

#include <memory>
#include <string>

#include "tests/nn/test_util.h"

namespace cosmoflow {
namespace {

using namespace cosmoflow::testing;  // NOLINT

TEST(DropoutTest, MasksAndScalesConsistentlyForwardAndBackward) {
  // 1x1 conv (weight 1, bias 0) -> flatten -> dropout 0.5 -> dense 64 with identity weights.
  ModelSpec spec = MakeSpec(1, 4, {ConvL(1, 1), FlattenL(), DropoutL(0.5f), DenseL(64)}, 64);
  const int batch = 8;
  auto net = MakeNet(spec, batch, true);
  ASSERT_TRUE(net);
  auto& ps = net->parameters();
  ps[0].value[0] = 1.f;
  ps[1].value[0] = 0.f;
  std::fill(ps[2].value, ps[2].value + ps[2].numel(), 0.f);
  for (int i = 0; i < 64; ++i) ps[2].value[i * 64 + i] = 1.f;
  std::fill(ps[3].value, ps[3].value + 64, 0.f);
  net->ParametersUpdated();
  auto x = RandomVector(64 * batch, 21, 0.5f, 1.5f);
  std::vector<float> y(64 * batch), ones(64 * batch, 1.f);
  net->Forward(x.data(), y.data());
  int dropped = 0;
  double sum_out = 0;
  for (int i = 0; i < 64 * batch; ++i) {
    if (y[i] == 0.f) {
      ++dropped;
    } else {
      EXPECT_NEAR(y[i], 2.f * x[i], 1e-5f);
    }
    sum_out += y[i];
  }
  EXPECT_GT(dropped, 64 * batch * 0.4);
  EXPECT_LT(dropped, 64 * batch * 0.6);
  net->Backward(ones.data());
  // d/dw of the 1x1 conv = sum of 2*mask*x = sum of outputs: the backward mask is the forward mask.
  EXPECT_NEAR(ps[0].grad[0], sum_out, 1e-3 * sum_out);
  EXPECT_NEAR(ps[1].grad[0], 2.0 * (64 * batch - dropped), 1e-3);
  // A second training forward draws a different mask.
  std::vector<float> y2(64 * batch);
  net->Forward(x.data(), y2.data());
  EXPECT_NE(y, y2);
  // Inference: dropout is the identity.
  auto inf = MakeNet(spec, batch, false);
  ASSERT_TRUE(inf);
  ASSERT_TRUE(inf->LoadParameters(net->ExportParameters()).ok());
  inf->Forward(x.data(), y.data());
  for (int i = 0; i < 64 * batch; ++i) EXPECT_NEAR(y[i], x[i], 1e-6f);
}

}  // namespace
}  // namespace cosmoflow
