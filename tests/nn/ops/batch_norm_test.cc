// batch_norm: training forward against the naive batch reference (also with a mean large against
// the spread), gradients against finite differences, bf16 against fp32, running statistics, the
// statistics pass (population statistics of its batches), inference from the running statistics,
// and the layer's spec.
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

// The training network's output for inputs U(lo, hi) against the naive batch reference.
void ExpectForwardMatchesBatchReference(const ModelSpec& spec, int batch, uint64_t seed, float lo, float hi, double tol) {
  ASSERT_TRUE(spec.Validate().ok()) << spec.Validate().ToString();
  auto net = MakeTrainingNet(spec, batch, {});
  ASSERT_TRUE(net);
  RandomizeBatchNorm(*net, seed);
  auto params = net->ExportParameters();
  auto x = RandomVector(InputSize(spec) * batch, seed + 1, lo, hi);
  const int outputs = static_cast<int>(spec.outputs.size());
  std::vector<float> y(batch * outputs);
  net->Forward(x.data(), y.data());
  auto ref = ReferenceForwardBatch(spec, params, x.data(), batch, true);
  for (int b = 0; b < batch; ++b)
    for (int i = 0; i < outputs; ++i) EXPECT_NEAR(y[b * outputs + i], ref[b][i], tol * (1 + std::abs(ref[b][i])));
}

TEST(BatchNormTest, TrainingForwardMatchesBatchReference) {
  ExpectForwardMatchesBatchReference(BnSpec(), 4, 3, 0.f, 2.f, 1e-4);
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

// Activations whose mean is large against their spread (1000 + U(0, 1)): one-pass sums of x and
// x^2 in fp32 would cancel to noise; the op's two passes keep the variance.
TEST(BatchNormTest, LargeMeanAgainstTheSpreadKeepsTheVariance) {
  ExpectForwardMatchesBatchReference(MakeSpec(2, 6, {BatchNormL(), FlattenL(), DenseL(3)}, 3), 3, 5, 1000.f, 1001.f, 1e-3);
}

// In bf16 (activations and gradients rounded to bf16, statistics in fp32/double) the output and
// every gradient stay within bf16's rounding of the fp32 network's.
TEST(BatchNormTest, Bf16IsFp32WithinBf16Rounding) {
  SKIP_WITHOUT_BF16();
  ModelSpec spec = MakeSpec(2, 10, {ConvL(16, 3), BatchNormL(), LeakyL(0.1f), PoolL(false, 2), FlattenL(), DenseL(6),
                                    BatchNormL(0.2f, 1e-3f), DenseL(3)}, 3);
  const int batch = 4;
  auto f32 = MakeNet(spec, batch, true, Precision::kFp32, 9);
  auto bf16 = MakeNet(spec, batch, true, Precision::kBf16, 9);
  ASSERT_TRUE(f32 && bf16);
  auto x = RandomVector(InputSize(spec) * batch, 10, 0.f, 2.f);
  auto r = RandomVector(batch * 3, 11);
  std::vector<float> y32(batch * 3), y16(batch * 3);
  f32->Forward(x.data(), y32.data());
  bf16->Forward(x.data(), y16.data());
  f32->Backward(r.data());
  bf16->Backward(r.data());
  const double out = RelativeL2Error(y16.data(), y32.data(), batch * 3);
  EXPECT_GT(out, 0.0);  // really ran in reduced precision
  EXPECT_LT(out, 0.02);
  for (size_t pi = 0; pi < f32->parameters().size(); ++pi) {
    const Parameter& ref = f32->parameters()[pi];
    const Parameter& got = bf16->parameters()[pi];
    if (ref.name == "conv0.bias" || ref.name == "dense0.bias") {
      // A bias that a batch_norm follows has no effect, so its gradient is zero up to rounding.
      const Parameter& w = f32->parameters()[pi - 1];
      double wnorm = 0;
      for (int64_t i = 0; i < w.numel(); ++i) wnorm += double(w.grad[i]) * w.grad[i];
      for (int64_t i = 0; i < ref.numel(); ++i) EXPECT_LT(std::abs(got.grad[i]), 1e-3 * std::sqrt(wnorm)) << ref.name;
      continue;
    }
    // beta's gradient is a sum of dy over the batch with cancellation: bf16's rounding of dy shows more.
    const double tol = ref.name.find("beta") != std::string::npos ? 0.15 : 0.05;
    EXPECT_LT(RelativeL2Error(got.grad, ref.grad, ref.numel()), tol) << ref.name;
  }
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

// Mean and unbiased variance per channel of the union of `batches` (each batch x 2 x per).
std::vector<std::pair<double, double>> UnionStatistics(const std::vector<std::vector<float>>& batches, int batch,
                                                       int64_t per) {
  std::vector<std::pair<double, double>> out;
  for (int ch = 0; ch < 2; ++ch) {
    std::vector<double> v;
    for (const auto& x : batches)
      for (int b = 0; b < batch; ++b)
        for (int64_t i = 0; i < per; ++i) v.push_back(x[(b * 2 + ch) * per + i]);
    double m = 0, s2 = 0;
    for (double e : v) m += e;
    m /= v.size();
    for (double e : v) s2 += (e - m) * (e - m);
    out.push_back({m, s2 / (v.size() - 1)});
  }
  return out;
}

TEST(BatchNormTest, StatisticsPassSetsThePopulationStatisticsOfItsBatches) {
  ModelSpec spec = MakeSpec(2, 3, {BatchNormL(0.25f), FlattenL(), DenseL(2)}, 2);
  const int batch = 4;
  const int64_t per = 27;
  auto net = MakeTrainingNet(spec, batch, {});
  ASSERT_TRUE(net);
  // Batches whose means differ (the union's variance holds the spread of the batch means too), one
  // of them far from zero against its spread.
  std::vector<std::vector<float>> xs = {RandomVector(InputSize(spec) * batch, 21, 0.f, 1.f),
                                        RandomVector(InputSize(spec) * batch, 22, 2.f, 5.f),
                                        RandomVector(InputSize(spec) * batch, 23, 1000.f, 1001.f)};
  std::vector<float> y(batch * 2);
  net->Forward(xs[0].data(), y.data());  // moves the running statistics by momentum first
  net->BeginStatisticsPass();
  for (const auto& x : xs) net->Forward(x.data(), y.data());
  net->EndStatisticsPass();
  auto expect = [&](const std::vector<std::pair<double, double>>& ref, const char* what) {
    auto tensors = net->ExportParameters();
    const auto& mean = FindTensor(tensors, "bn0.running_mean");
    const auto& var = FindTensor(tensors, "bn0.running_var");
    for (int ch = 0; ch < 2; ++ch) {
      EXPECT_NEAR(mean.data[ch], ref[ch].first, 1e-5 * (1 + std::abs(ref[ch].first))) << what << " channel " << ch;
      EXPECT_NEAR(var.data[ch], ref[ch].second, 1e-4 * ref[ch].second) << what << " channel " << ch;
    }
  };
  expect(UnionStatistics(xs, batch, per), "three batches");
  // A new pass starts over; after it, training moves the statistics by momentum again.
  net->BeginStatisticsPass();
  net->Forward(xs[1].data(), y.data());
  net->EndStatisticsPass();
  auto one = UnionStatistics({xs[1]}, batch, per);
  expect(one, "a second pass of one batch");
  net->Forward(xs[0].data(), y.data());
  auto zero = UnionStatistics({xs[0]}, batch, per);
  expect({{0.75 * one[0].first + 0.25 * zero[0].first, 0.75 * one[0].second + 0.25 * zero[0].second},
          {0.75 * one[1].first + 0.25 * zero[1].first, 0.75 * one[1].second + 0.25 * zero[1].second}},
         "momentum after the pass");
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
