// batch_norm: training forward against the naive batch reference, gradients against finite
// differences, running statistics, inference from the running statistics, and the layer's spec.
#include <gtest/gtest.h>

#include <cmath>

#include "core/nn/checkpoint.h"
#include "tests/common/files.h"
#include "tests/nn/test_util.h"

namespace cosmoflow {
namespace {

using namespace cosmoflow::testing;  // NOLINT

LayerSpec BatchNormL(float momentum = 0.1f, float epsilon = 1e-5f) {
  LayerSpec l;
  l.type = LayerType::kBatchNorm;
  l.momentum = momentum;
  l.epsilon = epsilon;
  return l;
}

// conv -> batch_norm (5-D) -> leaky -> flatten -> dense -> batch_norm (2-D) -> dense.
ModelSpec BnSpec() {
  return MakeSpec(2, 6, {ConvL(16, 3), BatchNormL(), LeakyL(0.1f), PoolL(false, 2), FlattenL(), DenseL(6),
                         BatchNormL(0.2f, 1e-3f), DenseL(3)}, 3);
}

// Perturbs gamma and beta (init 1 and 0) so the checks see their effect.
void RandomizeBatchNorm(Network& net, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::uniform_real_distribution<float> u(0.5f, 1.5f);
  for (auto& p : net.parameters()) {
    if (p.name.rfind("bn", 0) != 0) continue;
    for (int64_t i = 0; i < p.numel(); ++i) p.value[i] = p.name.find("gamma") != std::string::npos ? u(rng) : u(rng) - 1.f;
  }
  net.ParametersUpdated();
}

TEST(BatchNormTest, TrainingForwardMatchesBatchReference) {
  ModelSpec spec = BnSpec();
  ASSERT_TRUE(spec.Validate().ok()) << spec.Validate().ToString();
  const int batch = 4;
  auto net = MakeTrainingNet(spec, batch, {});
  ASSERT_TRUE(net);
  RandomizeBatchNorm(*net, 3);
  auto params = net->ExportParameters();
  auto x = RandomVector(InputSize(spec) * batch, 4, 0.f, 2.f);
  std::vector<float> y(batch * 3);
  net->Forward(x.data(), y.data());
  auto ref = ReferenceForwardBatch(spec, params, x.data(), batch, true);
  for (int b = 0; b < batch; ++b)
    for (int i = 0; i < 3; ++i) EXPECT_NEAR(y[b * 3 + i], ref[b][i], 1e-4 * (1 + std::abs(ref[b][i])));
}

TEST(BatchNormTest, GradientsMatchFiniteDifferences) {
  ModelSpec spec = BnSpec();
  const int batch = 3;
  auto net = MakeTrainingNet(spec, batch, {});
  ASSERT_TRUE(net);
  // The finite-difference helper builds its own network from the same seed: gamma/beta at their
  // init (1, 0) there, which still exercises every term of the backward pass.
  ExpectGradientsMatchFiniteDifferences(spec, batch, 24, 2e-3, 7);
}

TEST(BatchNormTest, RunningStatisticsFollowTheBatchAndServeInference) {
  // batch_norm on the input itself, so the batch statistics are those of x.
  ModelSpec spec = MakeSpec(2, 3, {BatchNormL(0.25f), FlattenL(), DenseL(2)}, 2);
  const int batch = 5;
  auto net = MakeTrainingNet(spec, batch, {});
  ASSERT_TRUE(net);
  auto x = RandomVector(InputSize(spec) * batch, 11, 0.f, 3.f);
  std::vector<float> y(batch * 2);
  net->Forward(x.data(), y.data());
  auto tensors = net->ExportParameters();
  const auto& mean = FindTensor(tensors, "bn0.running_mean");
  const auto& var = FindTensor(tensors, "bn0.running_var");
  const int64_t per = 27, count = per * batch;
  for (int ch = 0; ch < 2; ++ch) {
    double s = 0, s2 = 0;
    for (int b = 0; b < batch; ++b)
      for (int64_t i = 0; i < per; ++i) s += x[(b * 2 + ch) * per + i];
    const double m = s / count;
    for (int b = 0; b < batch; ++b)
      for (int64_t i = 0; i < per; ++i) s2 += std::pow(x[(b * 2 + ch) * per + i] - m, 2);
    EXPECT_NEAR(mean.data[ch], 0.25 * m, 1e-5);
    EXPECT_NEAR(var.data[ch], 0.75 + 0.25 * s2 / (count - 1), 1e-5);  // unbiased batch variance
  }
  // Inference uses the running statistics, including after a checkpoint round trip.
  TempDir dir("bn");
  Checkpoint ckpt;
  ckpt.spec = spec;
  ckpt.weights = tensors;
  auto path = WriteCheckpoint(dir.path() + "/bn.h5", ckpt);
  ASSERT_TRUE(path.ok()) << path.status().ToString();
  auto read = ReadCheckpoint(dir.path() + "/bn.h5");
  ASSERT_TRUE(read.ok()) << read.status().ToString();
  auto inf = MakeNet(spec, batch, false);
  ASSERT_TRUE(inf);
  ASSERT_TRUE(inf->LoadParameters(read->weights).ok());
  inf->Forward(x.data(), y.data());
  for (int b = 0; b < batch; ++b) {
    auto ref = ReferenceForward(spec, tensors, x.data() + b * InputSize(spec));
    for (int i = 0; i < 2; ++i) EXPECT_NEAR(y[b * 2 + i], ref[i], 1e-4 * (1 + std::abs(ref[i])));
  }
  // The running statistics are state, not trainable: not in parameters(), required on load.
  for (const auto& p : net->parameters()) EXPECT_EQ(p.name.find("running"), std::string::npos) << p.name;
  auto missing = tensors;
  missing.pop_back();
  Status st = inf->LoadParameters(missing);
  ASSERT_FALSE(st.ok());
  EXPECT_NE(st.message().find("bn0.running_var"), std::string::npos) << st.message();
}

TEST(BatchNormTest, SpecFieldsRoundTripAndBadValuesAreNamed) {
  ModelSpec spec = BnSpec();
  auto back = ModelSpec::FromJson(spec.ToJson());
  ASSERT_TRUE(back.ok()) << back.status().ToString();
  EXPECT_EQ(back->ToJson(), spec.ToJson());
  EXPECT_EQ(back->layers[6].momentum, 0.2f);
  EXPECT_EQ(back->NumParameters(), spec.NumParameters());
  // gamma + beta per channel are trainable; running statistics are not counted.
  ModelSpec plain = MakeSpec(2, 6, {ConvL(16, 3), LeakyL(0.1f), PoolL(false, 2), FlattenL(), DenseL(6), DenseL(3)}, 3);
  EXPECT_EQ(spec.NumParameters(), plain.NumParameters() + 2 * 16 + 2 * 6);
  spec.layers[1].epsilon = 0.f;
  Status st = spec.Validate();
  ASSERT_FALSE(st.ok());
  EXPECT_NE(st.message().find("layer 1 (batch_norm): epsilon"), std::string::npos) << st.message();
  auto bad = ModelSpec::FromJson(R"({"input_channels": 1, "input_side": 4, "outputs": [{"name": "a"}],
      "layers": [{"type": "batch_norm", "momentum": "high"}, {"type": "flatten"}, {"type": "dense", "units": 1}]})");
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.status().message().find("layer 0 (batch_norm): field 'momentum' must be a number"), std::string::npos)
      << bad.status().message();
}

}  // namespace
}  // namespace cosmoflow
