// conv3d: forward against the naive double reference, every backward candidate against finite
// differences, and our backward kernels against oneDNN's on the machine at hand.
#include "core/nn/kernels/conv_wgrad.h"
#include "core/nn/kernels/first_block.h"
#include <dnnl.hpp>
#include <gtest/gtest.h>

#include <fstream>
#include <memory>
#include <sstream>
#include <string>

#include "tests/nn/test_util.h"

namespace cosmoflow {
namespace {

using namespace cosmoflow::testing;  // NOLINT

// Each case has a prefix conv so the conv under test must also produce a correct diff_src.
ModelSpec ConvCase(int side, std::vector<LayerSpec> layers, int outputs = 3) {
  std::vector<LayerSpec> all = {ConvL(2, 2)};
  all.insert(all.end(), layers.begin(), layers.end());
  all.push_back(FlattenL());
  all.push_back(DenseL(outputs));
  return MakeSpec(2, side, all, outputs);
}

std::vector<std::pair<const char*, ModelSpec>> ConvCases() {
  return {
      {"k3_s1_valid_leaky", ConvCase(9, {ConvL(3, 3), LeakyL(0.01f)})},
      {"k4_s1_valid", ConvCase(9, {ConvL(3, 4)})},
      {"k3_s2_valid", ConvCase(10, {ConvL(3, 3, 2)})},
      {"k2_s1_valid_leaky", ConvCase(7, {ConvL(3, 2), LeakyL(0.01f)})},
      {"k3_s1_same_leaky03", ConvCase(7, {ConvL(3, 3, 1, true), LeakyL(0.3f)})},
      {"k3_s2_same", ConvCase(8, {ConvL(3, 3, 2, true)})},
  };
}

TEST(Conv3dTest, ForwardMatchesReference) {
  for (const auto& [name, spec] : ConvCases()) {
    SCOPED_TRACE(name);
    ModelSpec s = ConvCase(spec.input_side, {spec.layers.begin() + 1, spec.layers.end() - 2}, 5);
    ASSERT_TRUE(s.Validate().ok()) << s.Validate().ToString();
    ExpectForwardMatchesReference(s, 2, 1e-4);
  }
}

// Both backward-data candidates, forced in turn, match finite differences in every case (a stride-2
// conv, which the transposed candidate does not support, falls back to oneDNN's: checked below).
TEST(Conv3dTest, BackwardDataCandidatesMatchFiniteDifferences) {
  for (const char* mode : {"transposed", "onednn"}) {
    for (const auto& [name, spec] : ConvCases()) {
      SCOPED_TRACE(std::string(mode) + " " + name);
      auto net = MakeTrainingNet(spec, 2, {{"conv.bwd_data", mode}});
      ASSERT_TRUE(net);
      const bool strided = spec.layers[1].stride != 1;
      EXPECT_EQ(CountKernel(*net, "bwd_data", mode), std::string(mode) == "transposed" && strided ? 0u : 1u);
      ExpectGradientsMatchFiniteDifferences(spec, 2, 24, 2e-3, 5, {{"conv.bwd_data", mode}});
    }
  }
}

TEST(Conv3dTest, TransposedBackwardDataIsTheRuleForOneChannelBlockAndAgrees) {
  // 16 input channels (one block) into a k5 valid and a k5 same conv: sc18's conv1 but for the
  // kernel side (the rule takes Winograd for k = 2..4, conv3d_tiled.cc).
  ModelSpec spec = MakeSpec(2, 12, {ConvL(16, 2), ConvL(16, 5), LeakyL(0.01f), ConvL(16, 5, 1, true), FlattenL(),
                                    DenseL(3)}, 3);
  ASSERT_TRUE(spec.Validate().ok()) << spec.Validate().ToString();
  OursAndOneDnn run = RunOursAndOneDnn(spec, 2, {}, {{"conv.bwd_data", "onednn"}}, 21);
  ASSERT_TRUE(run.ours && run.onednn);
  // The rule: the fp32 16-input-channel convs (conv1, conv2) take the transposed candidate where
  // oneDNN has a real kernel for the transposed problem. On AVX2 it has none for the valid conv1
  // (diff_dst padded by k-1 = 4 on each side: oneDNN 2.6's AVX2 kernel refuses that padding, only
  // its reference remains), so conv1 keeps oneDNN's backward-data there.
  const auto avx512_bits = static_cast<unsigned>(dnnl::cpu_isa::avx512_core);  // the ISAs are bit sets
  const bool avx512 = (static_cast<unsigned>(dnnl::get_effective_cpu_isa()) & avx512_bits) == avx512_bits;
  EXPECT_EQ(CountKernel(*run.ours, "bwd_data", "transposed", "conv1"), avx512 ? 1u : 0u);
  EXPECT_EQ(CountKernel(*run.ours, "bwd_data", "onednn", "conv1"), avx512 ? 0u : 1u);
  EXPECT_EQ(CountKernel(*run.ours, "bwd_data", "transposed", "conv2"), 1u);
  EXPECT_EQ(CountKernel(*run.onednn, "bwd_data", "transposed"), 0u);
  ExpectSameGradients(*run.ours, *run.onednn);
  ExpectGradientsMatchFiniteDifferences(spec, 2);
}

// The first conv's weight gradient by first_conv_wgrad (the rule's choice where oneDNN would run
// im2col + gemm, i.e. on AVX2, for 1-3 input channels) against oneDNN's and finite differences: 2
// input channels, SAME and VALID padding, kernels 3 and 2. Forced, with channels-last layout (the
// kernel reads ndhwc), so it runs on AVX-512 machines too.
TEST(Conv3dTest, FirstConvWeightGradientMatchesOneDnnAndFiniteDifferences) {
  if (!FirstConvWeightGrad::Supported(2, 16, 3, 1))
    GTEST_SKIP() << "the first-conv weight-gradient kernel is built only for AVX-512 or AVX2 targets";
  // The block as separate ops (the fused first block would take it).
  const KernelOptions ours = {
      {"first_block", "onednn"}, {"conv0.bwd_weights", "first_conv_wgrad"}, {"conv0.layout", "channels_last"}};
  const KernelOptions onednn = {
      {"first_block", "onednn"}, {"conv0.bwd_weights", "onednn"}, {"conv0.layout", "channels_last"}};
  for (bool same : {true, false}) {
    for (int k : {3, 2}) {
      SCOPED_TRACE(std::string(same ? "same" : "valid") + " kernel " + std::to_string(k));
      ModelSpec spec = MakeSpec(2, 10, {ConvL(16, k, 1, same), LeakyL(0.01f), PoolL(false, 2), ConvL(4, 2),
                                        LeakyL(0.01f), FlattenL(), DenseL(3)}, 3);
      ASSERT_TRUE(spec.Validate().ok()) << spec.Validate().ToString();
      OursAndOneDnn run = RunOursAndOneDnn(spec, 2, ours, onednn, 41);
      ASSERT_TRUE(run.ours && run.onednn);
      if (CountKernel(*run.ours, "bwd_weights", "first_conv_wgrad") != 1) {
        GTEST_SKIP() << "oneDNN has no real channels-last forward kernel for this conv on this CPU, so "
                        "first_conv_wgrad (which reads ndhwc) cannot run here";
      }
      EXPECT_EQ(CountKernel(*run.onednn, "bwd_weights", "first_conv_wgrad"), 0u);
      ExpectSameGradients(*run.ours, *run.onednn);
      ExpectGradientsMatchFiniteDifferences(spec, 2, 24, 2e-3, 5, ours);
    }
  }
}

// Every conv's weight gradient by channels_last_wgrad against oneDNN's and finite differences, in
// both tile shapes: 4 channels x 16 filters (a 4-channel first conv, SAME k3 and VALID k2) and 4
// filters x 16 channels (16 -> 32 and 32 -> 64 SAME k3, the second with two channel blocks).
// Forced with channels-last layout, so it runs with AVX-512 as well as AVX2.
TEST(Conv3dTest, ChannelsLastWeightGradientMatchesOneDnnAndFiniteDifferences) {
  if (!ChannelsLastWeightGrad::Supported(16, 32, 1))
    GTEST_SKIP() << "the channels-last weight-gradient kernel is built only for AVX2 targets";
  struct Case {
    ModelSpec spec;
    size_t convs;
  };
  const Case cases[] = {
      {MakeSpec(4, 10, {ConvL(16, 3, 1, true), LeakyL(0.01f), PoolL(false, 2), ConvL(32, 3, 1, true), LeakyL(0.01f),
                        FlattenL(), DenseL(3)}, 3),
       2},
      {MakeSpec(4, 9, {ConvL(16, 2), LeakyL(0.01f), ConvL(32, 3, 1, true), LeakyL(0.01f), PoolL(false, 2),
                       ConvL(64, 3, 1, true), LeakyL(0.01f), FlattenL(), DenseL(3)}, 3),
       3},
  };
  // The first block as separate ops (the fused first block would take the first case's).
  const KernelOptions ours = {
      {"first_block", "onednn"}, {"conv.bwd_weights", "channels_last_wgrad"}, {"conv.layout", "channels_last"}};
  const KernelOptions onednn = {
      {"first_block", "onednn"}, {"conv.bwd_weights", "onednn"}, {"conv.layout", "channels_last"}};
  for (const Case& c : cases) {
    ASSERT_TRUE(c.spec.Validate().ok()) << c.spec.Validate().ToString();
    OursAndOneDnn run = RunOursAndOneDnn(c.spec, 2, ours, onednn, 51);
    ASSERT_TRUE(run.ours && run.onednn);
    if (CountKernel(*run.ours, "bwd_weights", "channels_last_wgrad") != c.convs) {
      GTEST_SKIP() << "oneDNN has no real channels-last forward kernel for every conv here, so "
                      "channels_last_wgrad (which reads ndhwc) cannot run on all of them";
    }
    EXPECT_EQ(CountKernel(*run.onednn, "bwd_weights", "channels_last_wgrad"), 0u);
    ExpectSameGradients(*run.ours, *run.onednn);
    ExpectGradientsMatchFiniteDifferences(c.spec, 2, 24, 2e-3, 5, ours);
  }
}

// The rule: our weight-gradient kernels run exactly where oneDNN would use im2col + gemm.
TEST(Conv3dTest, RuleTakesOurWeightGradientOnlyWhereOneDnnUsesGemm) {
  ModelSpec spec = MakeSpec(4, 10, {ConvL(16, 3, 1, true), LeakyL(0.01f), PoolL(false, 2), ConvL(32, 3, 1, true),
                                    LeakyL(0.01f), FlattenL(), DenseL(3)}, 3);
  // The first block as separate ops: the conv's own rule is under test, not the fused block.
  auto rule = MakeTrainingNet(spec, 2, {{"first_block", "onednn"}});
  auto onednn = MakeTrainingNet(spec, 2, {{"first_block", "onednn"}, {"conv.bwd_weights", "onednn"}});
  ASSERT_TRUE(rule && onednn);
  const auto chosen = rule->ChosenKernels();
  const auto reference = onednn->ChosenKernels();
  ASSERT_EQ(chosen.size(), reference.size());
  size_t convs = 0;
  for (size_t i = 0; i < chosen.size(); ++i) {
    if (chosen[i].pass != "bwd_weights" || chosen[i].op.rfind("conv", 0) != 0) continue;
    ++convs;
    const bool gemm = reference[i].impl.find("gemm") != std::string::npos;
    EXPECT_EQ(chosen[i].kernel != "onednn", gemm) << chosen[i].op << ": " << chosen[i].kernel << " vs oneDNN's "
                                                  << reference[i].impl;
  }
  EXPECT_EQ(convs, 2u);
}

// Passes of convs after the first op whose oneDNN implementation runs on AMX tiles.
size_t AmxPasses(const Network& net) {
  size_t n = 0;
  for (const auto& k : net.ChosenKernels()) {
    const bool later_conv = k.op.rfind("conv", 0) == 0 && k.op.rfind("conv0", 0) != 0;
    n += later_conv && k.impl.find("amx") != std::string::npos ? 1 : 0;
  }
  return n;
}

// The rule: bf16 training goes channels-last where oneDNN runs that on AMX, so that every pass of
// the later convs runs on AMX tiles (several times the blocked AVX512-BF16 kernels);
// conv.layout=no_channels_last keeps the blocked layout. Gradients stay close to fp32's
// (NetworkTest.Bf16TrainingGradientsCloseToFp32 trains the same network).
TEST(Conv3dTest, Bf16TrainingRunsEveryLaterConvPassOnAmxWhereTheCpuHasIt) {
  SKIP_WITHOUT_BF16();
  if (!CpuHasAmxBf16()) GTEST_SKIP() << "this CPU has no AMX: bf16 training keeps the blocked layout";
  const ModelSpec spec = *BuiltinSpec("tiny32");
  auto rule = MakeNet(spec, 2, true, Precision::kBf16, 7);
  auto blocked = MakeNet(spec, 2, true, Precision::kBf16, 7, {{"conv.layout", "no_channels_last"}});
  ASSERT_TRUE(rule && blocked);
  EXPECT_EQ(AmxPasses(*rule), 6u);  // conv1 and conv2: forward, backward-data, backward-weights
  EXPECT_EQ(AmxPasses(*blocked), 0u);
}

}  // namespace
}  // namespace cosmoflow
