#include "core/nn/spec.h"

#include <gtest/gtest.h>

#include <cmath>
#include <vector>

namespace cosmoflow {
namespace {

TEST(SpecTest, BuiltinParameterCountsMatchThePapers) {
  auto sc18 = BuiltinSpec("sc18");
  ASSERT_TRUE(sc18.ok()) << sc18.status().ToString();
  EXPECT_EQ(sc18->NumParameters(), 7041443);
  // 21.3 GFLOP forward per sample, as the CosmoFlow paper and the peer count them.
  EXPECT_NEAR(sc18->ForwardFlops() / 1e9, 21.3, 0.05);
  auto mlperf = BuiltinSpec("mlperf");
  ASSERT_TRUE(mlperf.ok()) << mlperf.status().ToString();
  EXPECT_EQ(mlperf->NumParameters(), 8907556);
  EXPECT_EQ(mlperf->input_channels, 4);
  EXPECT_EQ(mlperf->outputs.size(), 4u);
}

TEST(SpecTest, EveryBuiltinValidatesAndRoundTripsThroughJson) {
  for (const auto& name : BuiltinSpecNames()) {
    auto spec = BuiltinSpec(name);
    ASSERT_TRUE(spec.ok()) << name;
    ASSERT_TRUE(spec->Validate().ok()) << name << ": " << spec->Validate().ToString();
    auto back = ModelSpec::FromJson(spec->ToJson());
    ASSERT_TRUE(back.ok()) << name << ": " << back.status().ToString();
    EXPECT_EQ(back->ToJson(), spec->ToJson());
    EXPECT_EQ(back->NumParameters(), spec->NumParameters());
    EXPECT_EQ(back->layers.size(), spec->layers.size());
    EXPECT_EQ(back->outputs.size(), spec->outputs.size());
  }
  EXPECT_FALSE(BuiltinSpec("nope").ok());
}

TEST(SpecTest, BadSpecsAreRefusedNamingTheLayer) {
  ModelSpec s = *BuiltinSpec("tiny32");
  {
    ModelSpec b = s;
    b.layers[3].filters = 0;
    Status st = b.Validate();
    ASSERT_FALSE(st.ok());
    EXPECT_NE(st.message().find("layer 3 (conv3d)"), std::string::npos) << st.message();
    EXPECT_NE(st.message().find("filters"), std::string::npos) << st.message();
  }
  {
    ModelSpec b = s;
    b.layers[0].kernel = 40;  // larger than the 32^3 input
    Status st = b.Validate();
    ASSERT_FALSE(st.ok());
    EXPECT_NE(st.message().find("layer 0 (conv3d)"), std::string::npos) << st.message();
  }
  {
    ModelSpec b = s;
    b.layers.back().units = 5;  // 5 units but 3 outputs
    Status st = b.Validate();
    ASSERT_FALSE(st.ok());
    EXPECT_NE(st.message().find("outputs"), std::string::npos) << st.message();
  }
  {
    ModelSpec b = s;
    b.input_side = 0;
    EXPECT_FALSE(b.Validate().ok());
  }
  {
    // Dense before flatten.
    ModelSpec b = s;
    b.layers.insert(b.layers.begin(), LayerSpec{});
    b.layers[0].type = LayerType::kDense;
    b.layers[0].units = 4;
    Status st = b.Validate();
    ASSERT_FALSE(st.ok());
    EXPECT_NE(st.message().find("layer 0 (dense)"), std::string::npos) << st.message();
  }
  // JSON-level errors name the layer and the field.
  auto r = ModelSpec::FromJson(R"({"input_channels":1,"input_side":8,"outputs":[{"name":"a"}],
      "layers":[{"type":"conv3d","filters":2,"kernel":3},{"type":"warp_drive"}]})");
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("layer 1"), std::string::npos) << r.status().message();
  EXPECT_NE(r.status().message().find("warp_drive"), std::string::npos);
  r = ModelSpec::FromJson(R"({"input_channels":1,"input_side":8,"outputs":[{"name":"a"}],
      "layers":[{"type":"conv3d","filters":"two","kernel":3}]})");
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("filters"), std::string::npos) << r.status().message();
  EXPECT_FALSE(ModelSpec::FromJson("{not json").ok());
  EXPECT_FALSE(ModelSpec::FromJson("[]").ok());
  r = ModelSpec::FromJson(R"({"input_channels":1,"input_side":8,"outputs":[{"name":"a"}],
      "input_transform":"sqrt","layers":[{"type":"flatten"},{"type":"dense","units":1}]})");
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("'sqrt'"), std::string::npos) << r.status().message();
}

TEST(SpecTest, EveryInputTransformRoundTripsThroughJson) {
  for (const char* name : {"none", "log1p", "divide_by_mean", "overdensity"}) {
    auto r = ModelSpec::FromJson(std::string(R"({"input_channels":1,"input_side":8,"input_transform":")") +
                                 name + R"(","outputs":[{"name":"a"}],
        "layers":[{"type":"flatten"},{"type":"dense","units":1}]})");
    ASSERT_TRUE(r.ok()) << name << ": " << r.status().ToString();
    EXPECT_STREQ(InputTransformName(r->input_transform), name);
    auto back = ModelSpec::FromJson(r->ToJson());
    ASSERT_TRUE(back.ok()) << name;
    EXPECT_EQ(back->input_transform, r->input_transform) << name;
  }
}

TEST(SpecTest, InputTransforms) {
  int16_t counts[6] = {0, 1, 3, 2, 2, 2};
  float out[6];
  ApplyInputTransform(InputTransform::kLog1p, counts, 6, 3, out);
  EXPECT_FLOAT_EQ(out[0], 0.f);
  EXPECT_FLOAT_EQ(out[2], std::log1p(3.f));
  ApplyInputTransform(InputTransform::kDivideByMean, counts, 6, 3, out);
  // channel 0 mean 4/3, channel 1 mean 2
  EXPECT_FLOAT_EQ(out[1], 0.75f);
  EXPECT_FLOAT_EQ(out[4], 1.f);
  ApplyInputTransform(InputTransform::kOverdensity, counts, 6, 3, out);
  EXPECT_FLOAT_EQ(out[0], -1.f);
  EXPECT_FLOAT_EQ(out[1], -0.25f);
  EXPECT_FLOAT_EQ(out[2], 1.25f);
  EXPECT_FLOAT_EQ(out[4], 0.f);
  const int16_t empty[3] = {0, 0, 0};  // an empty channel: -1 everywhere, not NaN
  ApplyInputTransform(InputTransform::kOverdensity, empty, 3, 3, out);
  EXPECT_FLOAT_EQ(out[1], -1.f);
  ApplyInputTransform(InputTransform::kNone, counts, 6, 3, out);
  EXPECT_FLOAT_EQ(out[2], 3.f);
  // log1p of int16 counts comes from a table: the same bits as std::log1p for every int16 value
  // (negative ones included: -1 -> -inf, below -1 NaN; the server refuses those before).
  std::vector<int16_t> all(65536);
  for (int i = 0; i < 65536; ++i) all[i] = static_cast<int16_t>(i - 32768);
  std::vector<float> logs(all.size());
  ApplyInputTransform(InputTransform::kLog1p, all.data(), int64_t(all.size()), 0, logs.data());
  for (int i = 0; i < 65536; ++i) {
    const float want = std::log1p(static_cast<float>(all[i]));
    if (std::isnan(want)) {
      ASSERT_TRUE(std::isnan(logs[i])) << all[i];
    } else {
      ASSERT_EQ(logs[i], want) << all[i];
    }
  }
  auto outs = CosmoFlowOutputs(4);
  ASSERT_EQ(outs.size(), 4u);
  EXPECT_EQ(outs[3].name, "H0");
  EXPECT_FLOAT_EQ(outs[0].offset - outs[0].scale, 0.25f);
}

}  // namespace
}  // namespace cosmoflow
