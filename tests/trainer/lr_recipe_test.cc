#include "trainer/lr_recipe.h"

#include <gtest/gtest.h>

namespace cosmoflow {
namespace {

TEST(LrRecipeTest, MlperfScalesWarmsUpAndDecaysInSteps) {
  LrRecipeConfig c;  // base 0.001 at batch 64, warmup 4 epochs, x0.25 at 32, x0.125 at 64
  auto s =
      LrRecipeSchedule::Create(c, /*global_batch=*/256, /*steps_per_epoch=*/10, /*total=*/1000);
  ASSERT_TRUE(s.ok());
  EXPECT_DOUBLE_EQ(s->peak_lr(), 0.004);
  EXPECT_DOUBLE_EQ(s->At(0), 0.001);
  EXPECT_NEAR(s->At(20), 0.0025, 1e-12);  // half way through warmup
  EXPECT_DOUBLE_EQ(s->At(40), 0.004);
  EXPECT_DOUBLE_EQ(s->At(319), 0.004);
  EXPECT_DOUBLE_EQ(s->At(320), 0.001);
  EXPECT_DOUBLE_EQ(s->At(640), 0.0005);
}

TEST(LrRecipeTest, Sc18DecaysLinearlyToEndLr) {
  LrRecipeConfig c;
  c.recipe = LrRecipe::kSc18;
  c.base_lr = 0.002;
  c.end_lr = 0.0002;
  auto s = LrRecipeSchedule::Create(c, 8, 10, 100);
  ASSERT_TRUE(s.ok());
  EXPECT_DOUBLE_EQ(s->At(0), 0.002);
  EXPECT_NEAR(s->At(50), 0.0011, 1e-12);
  EXPECT_NEAR(s->At(100), 0.0002, 1e-12);
  EXPECT_DOUBLE_EQ(s->peak_lr(), 0.002);  // no batch scaling
  c.end_lr = 0.003;  // a "decay" that rises is refused
  EXPECT_FALSE(LrRecipeSchedule::Create(c, 8, 10, 100).ok());
}

TEST(LrRecipeTest, MlperfFractionalEpochsMapOntoSteps) {
  LrRecipeConfig c;
  c.warmup_epochs = 0.5;
  c.decay_epochs = {1.5};
  c.decay_factors = {0.5};
  auto s = LrRecipeSchedule::Create(c, /*global_batch=*/64, /*steps_per_epoch=*/7, /*total=*/70);
  ASSERT_TRUE(s.ok()) << s.status().ToString();
  EXPECT_DOUBLE_EQ(s->At(0), 0.001);     // peak = base at the base batch: a flat warmup
  EXPECT_DOUBLE_EQ(s->At(10), 0.001);    // epoch 1.43
  EXPECT_DOUBLE_EQ(s->At(11), 0.0005);   // epoch 1.57 >= 1.5
}

TEST(LrRecipeTest, BadConfigsAreRejectedWithTheFlagName) {
  LrRecipeConfig c;
  c.decay_epochs = {10, 5};
  c.decay_factors = {0.5, 0.1};
  auto s = LrRecipeSchedule::Create(c, 8, 10, 100);
  ASSERT_FALSE(s.ok());
  EXPECT_NE(s.status().message().find("--decay-epochs"), std::string::npos);
  c.decay_epochs = {10};
  EXPECT_FALSE(LrRecipeSchedule::Create(c, 8, 10, 100).ok());
  EXPECT_FALSE(ParseLrRecipe("cosine").ok());
}

}  // namespace
}  // namespace cosmoflow
