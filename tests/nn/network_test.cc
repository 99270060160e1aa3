// The oneDNN network against the naive double reference (forward) and finite differences (backward).
#include "core/nn/network.h"

#include <gtest/gtest.h>

#include <memory>
#include <numeric>
#include <string>

#include "core/nn/conv_wgrad.h"
#include "core/nn/first_block.h"
#include "tests/nn/test_util.h"

namespace cosmoflow {
namespace {

using namespace cosmoflow::testing;  // NOLINT

// One case per layer configuration the built-in specs use. Every case has a prefix conv so the
// layer under test must also produce a correct diff_src (the prefix conv's weight gradient needs it).
struct LayerCase {
  const char* name;
  int side;
  std::vector<LayerSpec> layers;  // between the prefix conv and flatten
};

std::vector<LayerCase> LayerCases() {
  return {
      {"conv_k3_s1_valid_leaky", 9, {ConvL(3, 3), LeakyL(0.01f)}},
      {"conv_k4_s1_valid", 9, {ConvL(3, 4)}},
      {"conv_k3_s2_valid", 10, {ConvL(3, 3, 2)}},
      {"conv_k2_s1_valid_leaky", 7, {ConvL(3, 2), LeakyL(0.01f)}},
      {"conv_k3_s1_same_leaky03", 7, {ConvL(3, 3, 1, true), LeakyL(0.3f)}},
      {"conv_k3_s2_same", 8, {ConvL(3, 3, 2, true)}},
      {"avg_pool2_odd", 8, {PoolL(false, 2)}},  // 7 -> 3: the trailing plane is dropped
      {"max_pool2", 9, {PoolL(true, 2)}},
      {"leaky_after_pool", 9, {PoolL(false, 2), LeakyL(0.2f)}},
  };
}

ModelSpec CaseSpec(const LayerCase& c, std::vector<LayerSpec> tail, int outputs) {
  std::vector<LayerSpec> layers = {ConvL(2, 2)};
  layers.insert(layers.end(), c.layers.begin(), c.layers.end());
  layers.push_back(FlattenL());
  layers.insert(layers.end(), tail.begin(), tail.end());
  return MakeSpec(2, c.side, layers, outputs);
}

TEST(NetworkLayerTest, ForwardMatchesReference) {
  for (const auto& c : LayerCases()) {
    SCOPED_TRACE(c.name);
    ModelSpec spec = CaseSpec(c, {DenseL(5)}, 5);
    ASSERT_TRUE(spec.Validate().ok()) << spec.Validate().ToString();
    ExpectForwardMatchesReference(spec, 2, 1e-4);
  }
}

TEST(NetworkLayerTest, BackwardMatchesFiniteDifferences) {
  for (const auto& c : LayerCases()) {
    SCOPED_TRACE(c.name);
    ExpectGradientsMatchFiniteDifferences(CaseSpec(c, {DenseL(3)}, 3), 2);
  }
}

// Stride-1 convolutions may compute diff_src as a forward convolution with transposed, flipped
// weights (see ConvOp): both that path and oneDNN's backward-data kernel, forced in turn, must match
// finite differences, and the 16-channel case must agree between the two.
TEST(NetworkLayerTest, BackwardDataPathsMatchFiniteDifferences) {
  for (const char* mode : {"transposed", "onednn"}) {
    ScopedEnv env("COSMOFLOW_CONV_BWD_DATA", mode);
    for (const auto& c : LayerCases()) {
      SCOPED_TRACE(std::string(mode) + " " + c.name);
      ExpectGradientsMatchFiniteDifferences(CaseSpec(c, {DenseL(3)}, 3), 2);
    }
  }
}

TEST(NetworkLayerTest, TransposedBackwardDataIsChosenForOneChannelBlockAndAgrees) {
  // 16 input channels (one block) into a k4 valid and a k3 same conv, like sc18's conv1.
  ModelSpec spec = MakeSpec(2, 12, {ConvL(16, 2), ConvL(16, 4), LeakyL(0.01f), ConvL(16, 3, 1, true), FlattenL(),
                                    DenseL(3)}, 3);
  ASSERT_TRUE(spec.Validate().ok()) << spec.Validate().ToString();
  const int batch = 2;
  auto x = RandomVector(InputSize(spec) * batch, 21);
  auto r = RandomVector(batch * 3, 22);
  std::vector<float> y(batch * 3);
  // Default rule: the fp32 16-input-channel convs (conv1, conv2) take the transposed path.
  std::unique_ptr<Network> nets[2] = {MakeNet(spec, batch, true),
                                      MakeTrainingNetWithEnv(spec, batch, "COSMOFLOW_CONV_BWD_DATA", "onednn")};
  for (int m = 0; m < 2; ++m) {
    ASSERT_TRUE(nets[m]);
    nets[m]->SetProfiling(true);
    nets[m]->Forward(x.data(), y.data());
    nets[m]->Backward(r.data());
    const std::string report = nets[m]->ProfileReport();
    size_t transposed = 0;
    for (size_t at = report.find("bwd_d=transposed_fwd"); at != std::string::npos;
         at = report.find("bwd_d=transposed_fwd", at + 1)) {
      ++transposed;
    }
    EXPECT_EQ(transposed, m == 0 ? 2u : 0u) << report;
  }
  ExpectSameGradients(*nets[0], *nets[1]);
  ExpectGradientsMatchFiniteDifferences(spec, batch);
}

TEST(NetworkLayerTest, DenseStackAndScaledTanh) {
  ModelSpec spec = MakeSpec(1, 4, {FlattenL(), DenseL(16), LeakyL(0.3f), DenseL(8), LeakyL(0.01f), DenseL(4),
                                   TanhL(1.2f)}, 4);
  ExpectForwardMatchesReference(spec, 3, 1e-4);
  ExpectGradientsMatchFiniteDifferences(spec, 3);
}

// The 1-channel first block (conv + leaky + avg pool), in the shapes the specs use, plus an odd conv
// output (9 -> pooled 4, the last plane unused) and fewer than 16 filters. Runs the fused kernel
// where the build has it, else oneDNN's ops (whose 1-channel conv needs the ndhwc-tagged src).
TEST(NetworkFirstBlockTest, FirstBlockMatchesReferenceAndFiniteDifferences) {
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

// The first conv's weight gradient by FirstConvWeightGrad (the default where oneDNN would run
// im2col + gemm, i.e. on AVX2, for 1-3 input channels) against oneDNN's and against finite
// differences: 2 input channels, SAME and VALID padding, kernels 3 and 2.
TEST(NetworkFirstConvTest, OwnWeightGradientMatchesOneDnnAndFiniteDifferences) {
  if (!FirstConvWeightGrad::Supported(2, 16, 3, 1))
    GTEST_SKIP() << "the first-conv weight-gradient kernel is built only for AVX-512 or AVX2 targets";
  for (bool same : {true, false}) {
    for (int k : {3, 2}) {
      SCOPED_TRACE(std::string(same ? "same" : "valid") + " kernel " + std::to_string(k));
      ModelSpec spec = MakeSpec(2, 10, {ConvL(16, k, 1, same), LeakyL(0.01f), PoolL(false, 2), ConvL(4, 2),
                                        LeakyL(0.01f), FlattenL(), DenseL(3)}, 3);
      ASSERT_TRUE(spec.Validate().ok()) << spec.Validate().ToString();
      const int batch = 2;
      OursAndOneDnn run = RunOursAndOneDnn(spec, batch, "COSMOFLOW_FIRST_CONV_WGRAD", 41);
      ASSERT_TRUE(run.ours && run.onednn);
      // On AVX2 oneDNN picks channels-last with a gemm backward-weights here, so ours runs.
      if (std::string(FirstBlockKernel::Isa()) == "avx2") {
        EXPECT_NE(run.ours_report.find("first_conv_wgrad"), std::string::npos) << run.ours_report;
      }
      EXPECT_EQ(run.onednn_report.find("first_conv_wgrad"), std::string::npos) << run.onednn_report;
      ExpectSameGradients(*run.ours, *run.onednn);
      ScopedEnv env("COSMOFLOW_FIRST_CONV_WGRAD", "ours");
      ExpectGradientsMatchFiniteDifferences(spec, batch);
    }
  }
}

// Every conv's weight gradient by ChannelsLastWeightGrad (the default where oneDNN would run
// im2col + gemm, i.e. on AVX2) against oneDNN's and against finite differences, in both tile
// shapes: 4 channels x 16 filters (a 4-channel first conv, SAME k3 and VALID k2) and 4 filters x
// 16 channels (16 -> 32 and 32 -> 64 SAME k3, the second with two channel blocks).
TEST(NetworkConvTest, ChannelsLastWeightGradientMatchesOneDnnAndFiniteDifferences) {
  if (!ChannelsLastWeightGrad::Supported(16, 32, 1))
    GTEST_SKIP() << "the channels-last weight-gradient kernel is built only for AVX2 targets";
  struct Case {
    ModelSpec spec;
    size_t ours;  // convs on our kernel in an AVX2 build (where oneDNN 2.6 picks ndhwc + gemm)
  };
  const Case cases[] = {
      {MakeSpec(4, 10, {ConvL(16, 3, 1, true), LeakyL(0.01f), PoolL(false, 2), ConvL(32, 3, 1, true), LeakyL(0.01f),
                        FlattenL(), DenseL(3)}, 3),
       2},
      {MakeSpec(4, 9, {ConvL(16, 2), LeakyL(0.01f), ConvL(32, 3, 1, true), LeakyL(0.01f), PoolL(false, 2),
                       ConvL(64, 3, 1, true), LeakyL(0.01f), FlattenL(), DenseL(3)}, 3),
       3},
  };
  for (const Case& c : cases) {
    const ModelSpec& spec = c.spec;
    ASSERT_TRUE(spec.Validate().ok()) << spec.Validate().ToString();
    const int batch = 2;
    OursAndOneDnn run = RunOursAndOneDnn(spec, batch, "COSMOFLOW_CONV_WGRAD", 51);
    ASSERT_TRUE(run.ours && run.onednn);
    auto count = [](const std::string& report) {
      size_t n = 0;
      for (size_t at = report.find("channels_last_wgrad"); at != std::string::npos;
           at = report.find("channels_last_wgrad", at + 1)) {
        ++n;
      }
      return n;
    };
    if (std::string(FirstBlockKernel::Isa()) == "avx2") {
      EXPECT_EQ(count(run.ours_report), c.ours) << run.ours_report;
    }
    EXPECT_EQ(count(run.onednn_report), 0u) << run.onednn_report;
    ExpectSameGradients(*run.ours, *run.onednn);
    ScopedEnv env("COSMOFLOW_CONV_WGRAD", "ours");
    ExpectGradientsMatchFiniteDifferences(spec, batch);
  }
}

TEST(NetworkFirstBlockTest, FusedAndGenericPathsAgree) {
  if (!FirstBlockKernel::Supported(32, 16, 3, 1, false, 2))
    GTEST_SKIP() << "the fused first block is built only for AVX-512 or AVX2 targets (this build has neither)";
  ModelSpec spec = *BuiltinSpec("tiny32");
  spec.layers.erase(spec.layers.begin() + 11);  // no dropout: both paths must give the same numbers
  const int batch = 2;
  auto x = RandomVector(InputSize(spec) * batch, 11, 0.f, 2.f);
  auto r = RandomVector(batch * 3, 12);
  std::vector<float> y_fused(batch * 3), y_generic(batch * 3);
  auto fused = MakeNet(spec, batch, true);
  auto generic = MakeTrainingNetWithEnv(spec, batch, "COSMOFLOW_NO_FUSED_FIRST_BLOCK", "1");
  ASSERT_TRUE(fused && generic);
  fused->Forward(x.data(), y_fused.data());
  generic->Forward(x.data(), y_generic.data());
  for (int i = 0; i < batch * 3; ++i) EXPECT_NEAR(y_fused[i], y_generic[i], 1e-4f * (1 + std::abs(y_generic[i])));
  fused->Backward(r.data());
  generic->Backward(r.data());
  ExpectSameGradients(*fused, *generic);
}

// fp32 training runs channels-last after the fused first block when oneDNN has real kernels for it
// (PreferredSrcLayout): the numbers must not depend on the layout.
TEST(NetworkFirstBlockTest, ChannelsLastAndBlockedLayoutsAgree) {
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
                                      MakeTrainingNetWithEnv(spec, batch, "COSMOFLOW_CHANNELS_LAST", "0")};
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
  // layout switch (24 per tensor took 73 s on the AVX2 machine, 8 take 31 s).
  ExpectGradientsMatchFiniteDifferences(spec, batch, 8);
}

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

TEST(NetworkTest, DropoutMasksAndScalesConsistentlyForwardAndBackward) {
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
  if (FirstBlockKernel::Supported(32, 16, 3, 1, false, 2)) {
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
