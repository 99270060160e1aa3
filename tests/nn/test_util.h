// Helpers shared by the nn tests: small specs, random inputs, finite-difference gradient checks.
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <fstream>
#include <memory>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "core/nn/network.h"
#include "tests/nn/reference.h"

namespace cosmoflow::testing {

inline LayerSpec ConvL(int f, int k, int s = 1, bool same = false) {
  LayerSpec l;
  l.type = LayerType::kConv3d;
  l.filters = f;
  l.kernel = k;
  l.stride = s;
  l.same_padding = same;
  return l;
}
inline LayerSpec PoolL(bool max, int size) {
  LayerSpec l;
  l.type = max ? LayerType::kMaxPool : LayerType::kAvgPool;
  l.size = size;
  return l;
}
inline LayerSpec LeakyL(float a) {
  LayerSpec l;
  l.type = LayerType::kLeakyRelu;
  l.alpha = a;
  return l;
}
inline LayerSpec DropoutL(float r) {
  LayerSpec l;
  l.type = LayerType::kDropout;
  l.rate = r;
  return l;
}
inline LayerSpec FlattenL() {
  LayerSpec l;
  l.type = LayerType::kFlatten;
  return l;
}
inline LayerSpec DenseL(int u) {
  LayerSpec l;
  l.type = LayerType::kDense;
  l.units = u;
  return l;
}
inline LayerSpec TanhL(float s) {
  LayerSpec l;
  l.type = LayerType::kScaledTanh;
  l.scale = s;
  return l;
}

inline ModelSpec MakeSpec(int channels, int side, std::vector<LayerSpec> layers, int outputs) {
  ModelSpec s;
  s.name = "test";
  s.input_channels = channels;
  s.input_side = side;
  s.input_transform = InputTransform::kNone;
  for (int i = 0; i < outputs; ++i) s.outputs.push_back({"o" + std::to_string(i), "", 0.f, 1.f});
  s.layers = std::move(layers);
  return s;
}

inline std::vector<float> RandomVector(int64_t n, uint64_t seed, float lo = -1.f, float hi = 1.f) {
  std::mt19937_64 rng(seed);
  std::uniform_real_distribution<float> u(lo, hi);
  std::vector<float> v(n);
  for (auto& x : v) x = u(rng);
  return v;
}

// ||a - ref|| / ||ref|| over n values (relative L2 error; 0 when equal).
inline double RelativeL2Error(const float* a, const float* ref, int64_t n) {
  double d = 0, s = 0;
  for (int64_t i = 0; i < n; ++i) d += (double(a[i]) - ref[i]) * (double(a[i]) - ref[i]), s += double(ref[i]) * ref[i];
  return std::sqrt(d / (s + 1e-30));
}

inline int64_t InputSize(const ModelSpec& s) {
  return int64_t{s.input_channels} * s.input_side * s.input_side * s.input_side;
}

inline std::unique_ptr<Network> MakeNet(const ModelSpec& spec, int batch, bool training,
                                        Precision precision = Precision::kFp32, uint64_t seed = 1,
                                        KernelOptions kernels = {}) {
  NetworkOptions o;
  o.batch = batch;
  o.training = training;
  o.precision = precision;
  o.seed = seed;
  o.kernels = std::move(kernels);
  auto r = Network::Create(spec, o);
  EXPECT_TRUE(r.ok()) << r.status().ToString();
  if (!r.ok()) return nullptr;
  return std::move(r).value();
}

// A training network of `spec` with the given kernel choices (NetworkOptions::kernels).
inline std::unique_ptr<Network> MakeTrainingNet(const ModelSpec& spec, int batch, KernelOptions kernels) {
  return MakeNet(spec, batch, true, Precision::kFp32, 1, std::move(kernels));
}

// Whether /proc/cpuinfo lists AMX with bf16 tiles.
inline bool CpuHasAmxBf16() {
  std::ifstream in("/proc/cpuinfo");
  std::stringstream text;
  text << in.rdbuf();
  return text.str().find(" amx_bf16") != std::string::npos;
}

// bf16 tests run where the CPU has AVX512-BF16 or AMX. Elsewhere a bf16 network must be refused with
// FAILED_PRECONDITION naming the missing instructions (checked here), and the test is skipped.
inline bool Bf16RunsOrIsRefused() {
  if (Bf16Supported()) return true;
  NetworkOptions o;
  o.precision = Precision::kBf16;
  auto r = Network::Create(*BuiltinSpec("tiny32"), o);
  EXPECT_FALSE(r.ok());
  if (!r.ok()) {
    EXPECT_EQ(r.status().code(), StatusCode::kFailedPrecondition);
    EXPECT_NE(r.status().message().find("AVX512-BF16"), std::string::npos) << r.status().message();
  }
  return false;
}
#define SKIP_WITHOUT_BF16()                                                                         \
  if (!Bf16RunsOrIsRefused())                                                                       \
  GTEST_SKIP() << "this CPU has neither AVX512-BF16 nor AMX: bf16 networks are refused (checked)"

// Perturbs every parameter by a small random amount so biases are non-zero in the checks.
inline void RandomizeBiases(Network& net, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::uniform_real_distribution<float> u(-0.1f, 0.1f);
  for (auto& p : net.parameters()) {
    if (p.shape.size() == 1) {
      for (int64_t i = 0; i < p.numel(); ++i) p.value[i] = u(rng);
    }
  }
  net.ParametersUpdated();
}

// Compares the network's forward (inference) with the double reference, sample by sample.
inline void ExpectForwardMatchesReference(const ModelSpec& spec, int batch, double rel_tol, uint64_t seed = 3) {
  auto net = MakeNet(spec, batch, false);
  ASSERT_TRUE(net);
  RandomizeBiases(*net, seed);
  const int64_t in = InputSize(spec);
  auto x = RandomVector(in * batch, seed);
  const int64_t p = static_cast<int64_t>(spec.outputs.size());
  std::vector<float> y(batch * p);
  net->Forward(x.data(), y.data());
  auto params = net->ExportParameters();
  for (int b = 0; b < batch; ++b) {
    auto ref = ReferenceForward(spec, params, x.data() + b * in);
    ASSERT_EQ(static_cast<int64_t>(ref.size()), p);
    double scale = 1e-3;
    for (double v : ref) scale = std::max(scale, std::abs(v));
    for (int64_t i = 0; i < p; ++i) {
      EXPECT_NEAR(y[b * p + i], ref[i], rel_tol * scale) << "sample " << b << " output " << i;
    }
  }
}

// Analytic gradients (network, fp32) against central differences of the double reference for
// L = sum_b sum_p r[b,p] * out[b,p]. Up to `per_tensor` elements of every parameter are checked.
inline void ExpectGradientsMatchFiniteDifferences(const ModelSpec& spec, int batch, int per_tensor = 24,
                                                  double tol = 2e-3, uint64_t seed = 5,
                                                  const KernelOptions& kernels = {}) {
  auto net = MakeTrainingNet(spec, batch, kernels);
  ASSERT_TRUE(net);
  RandomizeBiases(*net, seed);
  const int64_t p = static_cast<int64_t>(spec.outputs.size());
  auto x = RandomVector(InputSize(spec) * batch, seed + 1);
  auto r = RandomVector(batch * p, seed + 2);
  std::vector<float> y(batch * p);
  net->Forward(x.data(), y.data());
  std::vector<int> ready;
  net->Backward(r.data(), [&](int i) { ready.push_back(i); });
  // Every parameter reported ready exactly once, in reverse order.
  ASSERT_EQ(ready.size(), net->parameters().size());
  for (size_t i = 0; i < ready.size(); ++i) EXPECT_EQ(ready[i], static_cast<int>(ready.size() - 1 - i));

  auto params = net->ExportParameters();
  // Training semantics: batch_norm normalises with the batch's statistics.
  auto loss = [&](const std::vector<NamedTensor>& ps) {
    double l = 0;
    auto outs = ReferenceForwardBatch(spec, ps, x.data(), batch, true);
    for (int b = 0; b < batch; ++b) {
      for (int64_t i = 0; i < p; ++i) l += double(r[b * p + i]) * outs[b][i];
    }
    return l;
  };
  std::mt19937_64 rng(seed + 3);
  for (size_t ti = 0; ti < net->parameters().size(); ++ti) {
    const Parameter& par = net->parameters()[ti];
    ASSERT_EQ(par.name, params[ti].name);
    const int64_t n = par.numel();
    std::vector<int64_t> idx;
    if (n <= per_tensor) {
      for (int64_t i = 0; i < n; ++i) idx.push_back(i);
    } else {
      std::uniform_int_distribution<int64_t> pick(0, n - 1);
      for (int i = 0; i < per_tensor; ++i) idx.push_back(pick(rng));
    }
    double max_g = 1e-6;
    for (int64_t i = 0; i < n; ++i) max_g = std::max(max_g, std::abs(double(par.grad[i])));
    int bad = 0;
    for (int64_t i : idx) {
      const float orig = params[ti].data[i];
      const float eps = 1e-5f * std::max(1.f, std::abs(orig));
      params[ti].data[i] = orig + eps;
      const double plus_delta = double(params[ti].data[i]) - orig;
      double lp = loss(params);
      params[ti].data[i] = orig - eps;
      const double minus_delta = double(params[ti].data[i]) - orig;
      double lm = loss(params);
      params[ti].data[i] = orig;
      const double fd = (lp - lm) / (plus_delta - minus_delta);
      const double g = par.grad[i];
      if (std::abs(g - fd) > tol * max_g + 1e-5) {
        ++bad;
        ADD_FAILURE() << par.name << "[" << i << "]: analytic " << g << " vs finite difference " << fd
                      << " (max |grad| " << max_g << ")";
        if (bad > 5) return;
      }
    }
  }
}

// How many passes of the network's ops named `op_prefix`* run `kernel` for `pass` ("" = any pass).
inline size_t CountKernel(const Network& net, const std::string& pass, const std::string& kernel,
                          const std::string& op_prefix = "conv") {
  size_t n = 0;
  for (const auto& k : net.ChosenKernels()) {
    n += k.op.rfind(op_prefix, 0) == 0 && (pass.empty() || k.pass == pass) && k.kernel == kernel ? 1 : 0;
  }
  return n;
}

// Two training networks of `spec`, one built with `kernels` (our kernel forced on) and one with
// oneDNN forced for the same keys, each run forward and backward once on the same random input and
// output gradient: for tests that compare one of our kernels with oneDNN's.
struct OursAndOneDnn {
  std::unique_ptr<Network> ours, onednn;
};
inline OursAndOneDnn RunOursAndOneDnn(const ModelSpec& spec, int batch, const KernelOptions& ours,
                                      const KernelOptions& onednn, uint64_t seed) {
  OursAndOneDnn r{MakeTrainingNet(spec, batch, ours), MakeTrainingNet(spec, batch, onednn)};
  if (!r.ours || !r.onednn) return r;
  const int outputs = static_cast<int>(spec.outputs.size());
  auto x = RandomVector(InputSize(spec) * batch, seed, 0.f, 2.f);
  auto diff = RandomVector(int64_t{batch} * outputs, seed + 1);
  std::vector<float> y(int64_t{batch} * outputs);
  for (Network* net : {r.ours.get(), r.onednn.get()}) {
    net->Forward(x.data(), y.data());
    net->Backward(diff.data());
  }
  return r;
}

// Every parameter gradient of `a` within rel_tol * max|gradient of the tensor in b| of `b`'s.
inline void ExpectSameGradients(Network& a, Network& b, double rel_tol = 1e-4) {
  ASSERT_EQ(a.parameters().size(), b.parameters().size());
  for (size_t pi = 0; pi < a.parameters().size(); ++pi) {
    const Parameter& pa = a.parameters()[pi];
    const Parameter& pb = b.parameters()[pi];
    ASSERT_EQ(pa.numel(), pb.numel()) << pa.name;
    double max_g = 1e-6;
    for (int64_t i = 0; i < pb.numel(); ++i) max_g = std::max(max_g, double(std::abs(pb.grad[i])));
    for (int64_t i = 0; i < pa.numel(); ++i) {
      ASSERT_NEAR(pa.grad[i], pb.grad[i], rel_tol * max_g) << pa.name << "[" << i << "]";
    }
  }
}

}  // namespace cosmoflow::testing
