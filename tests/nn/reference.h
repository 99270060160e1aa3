// Naive double-precision reference of a ModelSpec's forward pass, written as plain loops so that it
// shares nothing with the network. Dropout is the identity; batch_norm uses the running statistics
// (inference) or, in ReferenceForwardBatch with batch_statistics, the batch's mean and biased
// variance over all samples.
#pragma once

#include <cmath>
#include <cstdint>
#include <stdexcept>
#include <string>
#include <vector>

#include "core/nn/spec.h"
#include "core/nn/tensor.h"

namespace cosmoflow::testing {

struct RefTensor {
  int64_t c = 0, side = 0;  // side == 0: flat vector of c features
  std::vector<double> v;
};

inline const NamedTensor& FindTensor(const std::vector<NamedTensor>& ts, const std::string& name) {
  for (const auto& t : ts) {
    if (t.name == name) return t;
  }
  throw std::runtime_error("reference: missing tensor " + name);
}

// Counters of the layers that own tensors (conv<i>, dense<i>, bn<i>), as the network names them.
struct RefCounters {
  int conv = 0, dense = 0, bn = 0;
};

// Applies one per-sample layer (every type but batch_norm) to x.
inline void ReferenceLayer(const LayerSpec& l, const std::vector<NamedTensor>& params, RefCounters& n, RefTensor& x) {
  int& conv = n.conv;
  int& dense = n.dense;
    switch (l.type) {
      case LayerType::kConv3d: {
        const auto& w = FindTensor(params, "conv" + std::to_string(conv) + ".weights");
        const auto& b = FindTensor(params, "conv" + std::to_string(conv) + ".bias");
        ++conv;
        const int64_t k = l.kernel, s = l.stride, in = x.side, ic = x.c, oc = l.filters;
        int64_t out, pl = 0;
        if (l.same_padding) {
          out = (in + s - 1) / s;
          int64_t total = std::max<int64_t>((out - 1) * s + k - in, 0);
          pl = total / 2;
        } else {
          out = (in - k) / s + 1;
        }
        RefTensor y;
        y.c = oc;
        y.side = out;
        y.v.assign(oc * out * out * out, 0.0);
        for (int64_t o = 0; o < oc; ++o) {
          double* yo = &y.v[o * out * out * out];
          for (int64_t i = 0; i < out * out * out; ++i) yo[i] = b.data[o];
          for (int64_t c = 0; c < ic; ++c) {
            const double* xc = &x.v[c * in * in * in];
            for (int64_t kd = 0; kd < k; ++kd)
              for (int64_t kh = 0; kh < k; ++kh)
                for (int64_t kw = 0; kw < k; ++kw) {
                  const double wv = w.data[(((o * ic + c) * k + kd) * k + kh) * k + kw];
                  for (int64_t od = 0; od < out; ++od) {
                    const int64_t id = od * s + kd - pl;
                    if (id < 0 || id >= in) continue;
                    for (int64_t oh = 0; oh < out; ++oh) {
                      const int64_t ih = oh * s + kh - pl;
                      if (ih < 0 || ih >= in) continue;
                      double* yr = yo + (od * out + oh) * out;
                      const double* xr = xc + (id * in + ih) * in;
                      for (int64_t ow = 0; ow < out; ++ow) {
                        const int64_t iw = ow * s + kw - pl;
                        if (iw < 0 || iw >= in) continue;
                        yr[ow] += wv * xr[iw];
                      }
                    }
                  }
                }
          }
        }
        x = std::move(y);
        break;
      }
      case LayerType::kAvgPool:
      case LayerType::kMaxPool: {
        const int64_t p = l.size, in = x.side, out = in / p;
        RefTensor y;
        y.c = x.c;
        y.side = out;
        y.v.assign(x.c * out * out * out, 0.0);
        for (int64_t c = 0; c < x.c; ++c)
          for (int64_t od = 0; od < out; ++od)
            for (int64_t oh = 0; oh < out; ++oh)
              for (int64_t ow = 0; ow < out; ++ow) {
                double acc = l.type == LayerType::kMaxPool ? -1e300 : 0.0;
                for (int64_t a = 0; a < p; ++a)
                  for (int64_t b2 = 0; b2 < p; ++b2)
                    for (int64_t e = 0; e < p; ++e) {
                      double v = x.v[((c * in + od * p + a) * in + oh * p + b2) * in + ow * p + e];
                      acc = l.type == LayerType::kMaxPool ? std::max(acc, v) : acc + v;
                    }
                if (l.type == LayerType::kAvgPool) acc /= double(p * p * p);
                y.v[((c * out + od) * out + oh) * out + ow] = acc;
              }
        x = std::move(y);
        break;
      }
      case LayerType::kLeakyRelu:
        for (auto& v : x.v) v = v > 0 ? v : l.alpha * v;
        break;
      case LayerType::kDropout:
        break;
      case LayerType::kFlatten:
        x.c = static_cast<int64_t>(x.v.size());
        x.side = 0;
        break;
      case LayerType::kDense: {
        const auto& w = FindTensor(params, "dense" + std::to_string(dense) + ".weights");
        const auto& b = FindTensor(params, "dense" + std::to_string(dense) + ".bias");
        ++dense;
        const int64_t in = static_cast<int64_t>(x.v.size());
        std::vector<double> y(l.units);
        for (int64_t o = 0; o < l.units; ++o) {
          double acc = b.data[o];
          for (int64_t i = 0; i < in; ++i) acc += double(w.data[o * in + i]) * x.v[i];
          y[o] = acc;
        }
        x.v = std::move(y);
        x.c = l.units;
        break;
      }
      case LayerType::kBatchNorm:
        throw std::logic_error("reference: batch_norm is a batch layer");
      case LayerType::kScaledTanh:
        for (auto& v : x.v) v = l.scale * std::tanh(v);
        break;
    }
}

// batch_norm over the batch `xs` (channel c of every sample, all voxels).
inline void ReferenceBatchNorm(const LayerSpec& l, const std::vector<NamedTensor>& params, RefCounters& n,
                               bool batch_statistics, std::vector<RefTensor>& xs) {
  const std::string name = "bn" + std::to_string(n.bn++);
  const auto& gamma = FindTensor(params, name + ".gamma");
  const auto& beta = FindTensor(params, name + ".beta");
  const auto& rmean = FindTensor(params, name + ".running_mean");
  const auto& rvar = FindTensor(params, name + ".running_var");
  const int64_t c = xs[0].c, per = static_cast<int64_t>(xs[0].v.size()) / c;
  for (int64_t ch = 0; ch < c; ++ch) {
    double mean = rmean.data[ch], var = rvar.data[ch];
    if (batch_statistics) {
      double s = 0, s2 = 0;
      for (const auto& x : xs)
        for (int64_t i = 0; i < per; ++i) s += x.v[ch * per + i];
      mean = s / (per * double(xs.size()));
      for (const auto& x : xs)
        for (int64_t i = 0; i < per; ++i) s2 += (x.v[ch * per + i] - mean) * (x.v[ch * per + i] - mean);
      var = s2 / (per * double(xs.size()));
    }
    const double inv = 1.0 / std::sqrt(var + l.epsilon);
    for (auto& x : xs)
      for (int64_t i = 0; i < per; ++i) {
        double& v = x.v[ch * per + i];
        v = gamma.data[ch] * (v - mean) * inv + beta.data[ch];
      }
  }
}

// Every sample of a batch (batch x C x side^3 inputs); outputs per sample.
inline std::vector<std::vector<double>> ReferenceForwardBatch(const ModelSpec& spec,
                                                              const std::vector<NamedTensor>& params,
                                                              const float* input, int batch, bool batch_statistics) {
  const int64_t in = int64_t{spec.input_channels} * spec.input_side * spec.input_side * spec.input_side;
  std::vector<RefTensor> xs(batch);
  for (int b = 0; b < batch; ++b) {
    xs[b].c = spec.input_channels;
    xs[b].side = spec.input_side;
    xs[b].v.assign(input + b * in, input + (b + 1) * in);
  }
  RefCounters n;
  for (const LayerSpec& l : spec.layers) {
    if (l.type == LayerType::kBatchNorm) {
      ReferenceBatchNorm(l, params, n, batch_statistics, xs);
      continue;
    }
    RefCounters start = n;
    for (auto& x : xs) {
      n = start;
      ReferenceLayer(l, params, n, x);
    }
  }
  std::vector<std::vector<double>> out;
  for (auto& x : xs) out.push_back(std::move(x.v));
  return out;
}

// One sample. params: the network's exported tensors (conv<i>.weights OIDHW, dense<i>.weights
// (out,in), bn<i>.gamma/beta/running_mean/running_var).
inline std::vector<double> ReferenceForward(const ModelSpec& spec, const std::vector<NamedTensor>& params,
                                            const float* input) {
  return ReferenceForwardBatch(spec, params, input, 1, false)[0];
}


}  // namespace cosmoflow::testing
