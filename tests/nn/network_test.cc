// The oneDNN network against the naive double reference (forward) and finite differences (backward).
#include "core/nn/network.h"

#include <gtest/gtest.h>

#include <memory>
#include <numeric>
#include <string>

#include "core/nn/kernels/first_block.h"
#include "tests/nn/test_util.h"

namespace cosmoflow {
namespace {

using namespace cosmoflow::testing;  // NOLINT

TEST(NetworkTest, SmallNetworksMatchReference) {
  for (const char* name : {"tiny32", "small64"}) {
    SCOPED_TRACE(name);
    ExpectForwardMatchesReference(*BuiltinSpec(name), 2, 2e-4);
  }
}

TEST(NetworkTest, Mlperf64MatchesReference) { ExpectForwardMatchesReference(*BuiltinSpec("mlperf64"), 1, 2e-4); }

TEST(NetworkTest, Sc18LayersOnSmallInputMatchReference) {
  // The sc18 layer stack on 108^3, the smallest input it accepts (the conv tail ends at 1^3, so
  // dense0 has 256 inputs instead of 2048): every sc18 layer shape but 40% of the reference cost.
  ModelSpec spec = *BuiltinSpec("sc18");
  spec.input_side = 108;
  ASSERT_TRUE(spec.Validate().ok()) << spec.Validate().ToString();
  ExpectForwardMatchesReference(spec, 1, 2e-4);
}

TEST(NetworkTest, TinyEndToEndGradientCheck) {
  ModelSpec spec = *BuiltinSpec("tiny32");
  spec.layers.erase(spec.layers.begin() + 11);  // dropout draws a new mask per forward
  ExpectGradientsMatchFiniteDifferences(spec, 2, 6);
}

TEST(NetworkTest, ParameterCountsOfTheBuiltinNetworks) {
  for (auto [name, count] : {std::pair<const char*, int64_t>{"sc18", 7041443}, {"mlperf", 8907556}}) {
    auto net = MakeNet(*BuiltinSpec(name), 1, false);
    ASSERT_TRUE(net);
    int64_t n = 0;
    for (const auto& p : net->parameters()) n += p.numel();
    EXPECT_EQ(n, count) << name;
    EXPECT_EQ(net->parameters().front().name, "conv0.weights");
    EXPECT_EQ(net->parameters().back().name, std::string("dense") + (name[0] == 's' ? "2" : "2") + ".bias");
  }
}

TEST(NetworkTest, Bf16ForwardWithinToleranceOfFp32) {
  SKIP_WITHOUT_BF16();
  // Stated tolerance: |bf16 - fp32| <= 0.03 * max|fp32 output| + 0.01 per output (bf16 keeps 8
  // mantissa bits, ~0.4% per rounding, accumulated over the layers).
  for (const char* name : {"tiny32", "small64", "mlperf64"}) {
    SCOPED_TRACE(name);
    ModelSpec spec = *BuiltinSpec(name);
    const int batch = 2;
    auto f32 = MakeNet(spec, batch, false, Precision::kFp32, 7);
    auto b16 = MakeNet(spec, batch, false, Precision::kBf16, 7);
    ASSERT_TRUE(f32 && b16);
    RandomizeBiases(*f32, 8);
    ASSERT_TRUE(b16->LoadParameters(f32->ExportParameters()).ok());
    auto x = RandomVector(InputSize(spec) * batch, 9, 0.f, 2.f);
    const int p = static_cast<int>(spec.outputs.size());
    std::vector<float> a(batch * p), b(batch * p);
    f32->Forward(x.data(), a.data());
    b16->Forward(x.data(), b.data());
    float scale = 0;
    for (float v : a) scale = std::max(scale, std::abs(v));
    ASSERT_GT(scale, 0.f);
    for (int i = 0; i < batch * p; ++i) EXPECT_NEAR(b[i], a[i], 0.03f * scale + 0.01f) << i;
    EXPECT_NE(a, b);  // really ran in reduced precision
  }
}

TEST(NetworkTest, Bf16TrainingGradientsCloseToFp32) {
  SKIP_WITHOUT_BF16();
  ModelSpec spec = *BuiltinSpec("tiny32");
  spec.layers.erase(spec.layers.begin() + 11);
  const int batch = 2;
  auto f32 = MakeNet(spec, batch, true, Precision::kFp32, 7);
  auto b16 = MakeNet(spec, batch, true, Precision::kBf16, 7);
  ASSERT_TRUE(f32 && b16);
  auto x = RandomVector(InputSize(spec) * batch, 9, 0.f, 2.f);
  auto r = RandomVector(batch * 3, 10);
  std::vector<float> y(batch * 3);
  f32->Forward(x.data(), y.data());
  f32->Backward(r.data());
  b16->Forward(x.data(), y.data());
  b16->Backward(r.data());
  for (size_t pi = 0; pi < f32->parameters().size(); ++pi) {
    const auto& a = f32->parameters()[pi];
    const auto& b = b16->parameters()[pi];
    double dot = 0, na = 0, nb = 0;
    for (int64_t i = 0; i < a.numel(); ++i) {
      dot += double(a.grad[i]) * b.grad[i];
      na += double(a.grad[i]) * a.grad[i];
      nb += double(b.grad[i]) * b.grad[i];
    }
    // Same direction (cosine > 0.95) and magnitude within 25%: bf16 rounding also creates ties in
    // max pooling, which route some gradients to a different voxel than fp32 does.
    EXPECT_GT(dot / std::sqrt(na * nb + 1e-30), 0.95) << a.name;
    EXPECT_NEAR(std::sqrt(nb), std::sqrt(na), 0.25 * std::sqrt(na) + 1e-6) << a.name;
  }
}

TEST(NetworkTest, BadSpecsAndOptionsAreRefused) {
  ModelSpec spec = *BuiltinSpec("tiny32");
  spec.layers[0].filters = 0;
  NetworkOptions o;
  auto r = Network::Create(spec, o);
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("layer 0 (conv3d)"), std::string::npos) << r.status().message();
  o.batch = 0;
  r = Network::Create(*BuiltinSpec("tiny32"), o);
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("batch"), std::string::npos);
}

TEST(NetworkTest, LoadExportRoundTripAndErrors) {
  auto a = MakeNet(*BuiltinSpec("tiny32"), 1, false, Precision::kFp32, 1);
  auto b = MakeNet(*BuiltinSpec("tiny32"), 1, false, Precision::kFp32, 2);
  ASSERT_TRUE(a && b);
  auto wa = a->ExportParameters();
  EXPECT_NE(wa[0].data, b->ExportParameters()[0].data);  // different seeds, different init
  ASSERT_TRUE(b->LoadParameters(wa).ok());
  auto x = RandomVector(InputSize(*BuiltinSpec("tiny32")), 4, 0.f, 2.f);
  std::vector<float> ya(3), yb(3);
  a->Forward(x.data(), ya.data());
  b->Forward(x.data(), yb.data());
  EXPECT_EQ(ya, yb);
  auto missing = wa;
  missing.erase(missing.begin() + 2);
  Status st = b->LoadParameters(missing);
  ASSERT_FALSE(st.ok());
  EXPECT_NE(st.message().find(wa[2].name), std::string::npos) << st.message();
  auto wrong = wa;
  wrong[1].shape = {7};
  wrong[1].data.resize(7);
  st = b->LoadParameters(wrong);
  ASSERT_FALSE(st.ok());
  EXPECT_NE(st.message().find("conv0.bias"), std::string::npos) << st.message();
  // A failed load leaves the weights untouched.
  b->Forward(x.data(), yb.data());
  EXPECT_EQ(ya, yb);
}

TEST(NetworkTest, ProfileReportNamesEveryOp) {
  auto net = MakeNet(*BuiltinSpec("tiny32"), 2, true);
  ASSERT_TRUE(net);
  net->SetProfiling(true);
  auto x = RandomVector(InputSize(*BuiltinSpec("tiny32")) * 2, 4, 0.f, 2.f);
  std::vector<float> y(6), d(6, 0.1f);
  net->Forward(x.data(), y.data());
  net->Backward(d.data());
  std::string rep = net->ProfileReport();
  if (std::string(FirstBlockKernel::Isa()) != "none") {
    EXPECT_NE(rep.find("conv0+leaky+avg_pool0"), std::string::npos) << rep;
  } else {  // no fused kernel in this build: the block runs as two oneDNN ops
    EXPECT_NE(rep.find("conv0+leaky "), std::string::npos) << rep;
    EXPECT_NE(rep.find("avg_pool0"), std::string::npos) << rep;
  }
  EXPECT_EQ(rep.find("ref:"), std::string::npos) << "a reference (slow) oneDNN kernel was chosen\n" << rep;
  EXPECT_NE(rep.find("dense1"), std::string::npos) << rep;
  EXPECT_NE(rep.find("total"), std::string::npos) << rep;
}

}  // namespace
}  // namespace cosmoflow
