#include "trainer/options.h"

#include <gtest/gtest.h>

#include <fstream>

namespace cosmoflow {
namespace {

StatusOr<TrainerOptions> Parse(std::vector<std::string> args, bool* help = nullptr) {
  std::vector<char*> argv = {const_cast<char*>("cosmoflow-train")};
  for (auto& a : args) argv.push_back(a.data());
  bool h = false;
  auto r = ParseTrainerOptions(static_cast<int>(argv.size()), argv.data(), &h);
  if (help) *help = h;
  return r;
}

TEST(TrainerOptionsTest, ParsesFlagsBothSpellingsAndRecipeDefaults) {
  auto o = Parse({"--train=/d", "--out", "/o", "--batch=8", "--recipe=sc18", "--augment", "--lr",
                  "0.01", "--decay-epochs=3,6", "--decay-factors=0.5,0.1", "--shuffle=shard",
                  "--augment-shift", "--bn-statistics-batches", "16"});
  ASSERT_TRUE(o.ok()) << o.status().ToString();
  EXPECT_EQ(o->train_path, "/d");
  EXPECT_EQ(o->out_dir, "/o");
  EXPECT_EQ(o->batch, 8);
  EXPECT_TRUE(o->augment);
  EXPECT_TRUE(o->augment_shift);
  EXPECT_EQ(o->bn_statistics_batches, 16);
  EXPECT_EQ(o->optimizer, "adam");  // the sc18 recipe's optimizer
  EXPECT_DOUBLE_EQ(o->lr.base_lr, 0.01);
  EXPECT_EQ(o->lr.decay_epochs, (std::vector<double>{3, 6}));
  EXPECT_EQ(o->shuffle, ShuffleMode::kShard);
  EXPECT_EQ(o->calibration, "power-edge");
  auto edge = Parse({"--train=/d", "--out=/o", "--calibration=power-edge"});
  ASSERT_TRUE(edge.ok()) << edge.status().ToString();
  EXPECT_EQ(edge->calibration, "power-edge");
  auto forms = Parse({"--train=/d", "--out=/o", "--calibration=power-joint"});
  ASSERT_TRUE(forms.ok()) << forms.status().ToString();
  EXPECT_EQ(forms->calibration, "power-joint");
  auto m = Parse({"--train=/d", "--out=/o"});
  ASSERT_TRUE(m.ok());
  EXPECT_EQ(m->optimizer, "sgd");
}

TEST(TrainerOptionsTest, NonsenseIsRejectedNamingTheFlag) {
  struct Case {
    std::vector<std::string> args;
    std::string needle;
  } cases[] = {
      {{"--train=/d", "--out=/o", "--batch=zero"}, "--batch=zero: not an integer"},
      {{"--train=/d", "--out=/o", "--batch=0"}, "--batch=0: out of range"},
      {{"--train=/d", "--out=/o", "--frobnicate=1"}, "unknown flag --frobnicate"},
      {{"--train=/d", "--out=/o", "--precision=fp8"}, "--precision=fp8"},
      {{"--train=/d", "--out=/o", "--lr=-1"}, "--lr=-1: out of range"},
      {{"--train=/d", "--out=/o", "--augment=maybe"}, "--augment=maybe"},
      {{"--train=/d", "--out=/o", "--augment-shift=2"}, "--augment-shift=2"},
      {{"--train=/d", "--out=/o", "--bn-statistics-batches=-1"}, "--bn-statistics-batches=-1"},
      {{"--train=/d", "--out=/o", "--calibration=joint"}, "--calibration=joint"},
      {{"--out=/o"}, "--train is required"},
      {{"--train=/d"}, "--out is required"},
      {{"--train=/d", "--out=/o", "stray"}, "unexpected argument 'stray'"},
      {{"--train=/d", "--out=/o", "--epochs"}, "--epochs needs a value"},
      {{"--train=/d", "--out=/o", "--config=/nonexistent.json"}, "cannot open"},
  };
  for (const auto& c : cases) {
    auto o = Parse(c.args);
    ASSERT_FALSE(o.ok()) << c.needle;
    EXPECT_NE(o.status().message().find(c.needle), std::string::npos) << o.status().message();
  }
  bool help = false;
  EXPECT_TRUE(Parse({"--help"}, &help).ok());
  EXPECT_TRUE(help);
  EXPECT_NE(UsageText().find("--checkpoint-every"), std::string::npos);
}

TEST(TrainerOptionsTest, ConfigFileIsReadAndFlagsOverrideIt) {
  const std::string path = ::testing::TempDir() + "/trainer_options_test.json";
  {
    std::ofstream f(path);
    f << R"({"train": "/cfg", "out": "/out", "batch": 2, "augment": true, "decay-epochs": [4, 8],
             "decay-factors": [0.5, 0.25]})";
  }
  auto o = Parse({"--config=" + path, "--batch=16"});
  ASSERT_TRUE(o.ok()) << o.status().ToString();
  EXPECT_EQ(o->train_path, "/cfg");
  EXPECT_EQ(o->batch, 16);
  EXPECT_TRUE(o->augment);
  EXPECT_EQ(o->lr.decay_epochs, (std::vector<double>{4, 8}));
  {
    std::ofstream f(path);
    f << R"({"train": "/cfg", "out": "/out", "bogus": 1})";
  }
  auto bad = Parse({"--config=" + path});
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.status().message().find("unknown key 'bogus'"), std::string::npos);
}

}  // namespace
}  // namespace cosmoflow
