// Naive double-precision reference of a ModelSpec's forward pass (inference semantics: dropout is
// the identity), written as plain loops so that it shares nothing with the oneDNN network.
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

// One sample. params: the network's exported parameters (conv<i>.weights OIDHW, dense<i>.weights (out,in)).
inline std::vector<double> ReferenceForward(const ModelSpec& spec, const std::vector<NamedTensor>& params,
                                            const float* input) {
  RefTensor x;
  x.c = spec.input_channels;
  x.side = spec.input_side;
  x.v.assign(input, input + x.c * x.side * x.side * x.side);
  int conv = 0, dense = 0;
  for (const LayerSpec& l : spec.layers) {
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
      case LayerType::kScaledTanh:
        for (auto& v : x.v) v = l.scale * std::tanh(v);
        break;
    }
  }
  return x.v;
}

}  // namespace cosmoflow::testing
