#include "trainer/optimizer.h"

#include <gtest/gtest.h>

#include <cmath>

namespace cosmoflow {
namespace {

struct OneParam {
  std::vector<float> value{1.0f, -2.0f}, grad{0.5f, -1.0f};
  std::vector<Parameter> params;
  OneParam() {
    Parameter p;
    p.name = "w";
    p.shape = {2};
    p.value = value.data();
    p.grad = grad.data();
    params.push_back(p);
  }
};

TEST(TrainerOptimizerTest, SgdMomentumFollowsTheTextbookRule) {
  OneParam p;
  TrainerOptimizerConfig c;
  c.name = "sgd";
  c.momentum = 0.9;
  auto o = TrainerOptimizer::Create(c, p.params);
  ASSERT_TRUE(o.ok());
  (*o)->Step(p.params, 0.1);  // v = g; w -= 0.1 g
  EXPECT_FLOAT_EQ(p.value[0], 1.0f - 0.05f);
  (*o)->Step(p.params, 0.1);  // v = 0.9 g + g = 1.9 g
  EXPECT_FLOAT_EQ(p.value[0], 1.0f - 0.05f - 0.1f * 1.9f * 0.5f);
  auto state = (*o)->ExportState();
  ASSERT_EQ(state.size(), 1u);
  EXPECT_EQ(state[0].name, "sgd.momentum.w");
  EXPECT_FLOAT_EQ(state[0].data[1], -1.9f);
}

TEST(TrainerOptimizerTest, AdamFirstStepIsLrTimesSignAndStateRoundTrips) {
  OneParam p, q;
  TrainerOptimizerConfig c;
  c.name = "adam";
  auto a = TrainerOptimizer::Create(c, p.params);
  ASSERT_TRUE(a.ok());
  (*a)->Step(p.params, 0.01);
  EXPECT_NEAR(p.value[0], 1.0f - 0.01f, 1e-6);
  EXPECT_NEAR(p.value[1], -2.0f + 0.01f, 1e-6);
  // A second optimizer loaded with the first one's state continues identically.
  auto b = TrainerOptimizer::Create(c, q.params);
  ASSERT_TRUE((*b)->LoadState((*a)->ExportState()).ok());
  q.value = p.value;
  q.params[0].value = q.value.data();
  p.grad = {0.3f, 0.2f};
  q.grad = p.grad;
  (*a)->Step(p.params, 0.01);
  (*b)->Step(q.params, 0.01);
  EXPECT_EQ(p.value, q.value);
  // State of the wrong shape or optimizer is refused, naming the tensor.
  auto sgd_state = std::vector<NamedTensor>{{"sgd.momentum.w", {2}, {0, 0}}};
  Status s = (*b)->LoadState(sgd_state);
  ASSERT_FALSE(s.ok());
  EXPECT_NE(s.message().find("adam.m.w"), std::string::npos);
  EXPECT_FALSE(TrainerOptimizer::Create(TrainerOptimizerConfig{"lamb"}, p.params).ok());
}

}  // namespace
}  // namespace cosmoflow
