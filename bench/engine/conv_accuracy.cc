// The error of each convolution path at a spec's real conv shapes (batch 1), in all three passes,
// against a naive double-precision reference: oneDNN's fp32 kernels, oneDNN with bf16 inputs (where
// the CPU has bf16), the FFT-tiled kernel (core/nn/kernels/fft_conv.h) and the Winograd kernel
// (core/nn/kernels/winograd_conv.h). Prints one markdown
// table; the error of a tensor is max |path - reference| / max |reference|.
//
//   conv_accuracy [--model sc18] [--layers conv1,conv2] [--seed 1]
//
// Inputs are uniform in [0, 1) (activations after a leaky ReLU are mostly positive), weights and
// output gradients uniform in [-1, 1) scaled by 1 / sqrt(fan-in).
#include <dnnl.hpp>
#include <omp.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <functional>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "core/base/flags.h"
#include "core/nn/kernels/fft_conv.h"
#include "core/nn/kernels/winograd_conv.h"
#include "core/nn/spec.h"

namespace cosmoflow {
namespace {

using dnnl::memory;
using Tag = memory::format_tag;
using Dt = memory::data_type;

struct Shape {
  std::string name;
  int c = 0, f = 0, in = 0, out = 0, k = 0, pad = 0;
  int64_t InVox() const { return int64_t{in} * in * in; }
  int64_t OutVox() const { return int64_t{out} * out * out; }
  int64_t K3() const { return int64_t{k} * k * k; }
};

// The stride-1 convs of `spec` named in `wanted` (conv<i> counts conv3d layers from 0). Only convs
// and pools change the activation's channels or side before the first flatten.
std::vector<Shape> ConvShapes(const ModelSpec& spec, const std::vector<std::string>& wanted) {
  std::vector<Shape> shapes;
  int64_t channels = spec.input_channels, side = spec.input_side;
  int conv = 0;
  for (const LayerSpec& l : spec.layers) {
    if (l.type == LayerType::kFlatten) break;
    if (l.type == LayerType::kAvgPool || l.type == LayerType::kMaxPool) side /= l.size;
    if (l.type != LayerType::kConv3d) continue;
    const std::string name = "conv" + std::to_string(conv++);
    const ConvGeometry g = ConvGeometryFor(side, l.kernel, l.stride, l.same_padding);
    if (l.stride == 1 && std::find(wanted.begin(), wanted.end(), name) != wanted.end())
      shapes.push_back({name, int(channels), l.filters, int(side), int(g.out), l.kernel, int(g.pad_left)});
    channels = l.filters;
    side = g.out;
  }
  return shapes;
}

// ---- the reference, planar NCDHW, batch 1, in double ----

// Calls body(o, i) for every output voxel o and input voxel i = o + tap - pad inside the input,
// for one tap (td, th, tw); flat indices.
template <typename Body>
void ForTap(const Shape& s, int td, int th, int tw, Body body) {
  for (int od = 0; od < s.out; ++od) {
    const int id = od + td - s.pad;
    if (id < 0 || id >= s.in) continue;
    for (int oh = 0; oh < s.out; ++oh) {
      const int ih = oh + th - s.pad;
      if (ih < 0 || ih >= s.in) continue;
      const int64_t orow = (int64_t{od} * s.out + oh) * s.out, irow = (int64_t{id} * s.in + ih) * s.in;
      const int ow0 = std::max(0, s.pad - tw), ow1 = std::min(s.out, s.in + s.pad - tw);
      for (int ow = ow0; ow < ow1; ++ow) body(orow + ow, irow + ow + tw - s.pad);
    }
  }
}

void RefForward(const Shape& s, const std::vector<float>& x, const std::vector<float>& w, std::vector<double>* y) {
  y->assign(size_t(s.f) * s.OutVox(), 0.0);
#pragma omp parallel for schedule(dynamic)
  for (int f = 0; f < s.f; ++f) {
    double* yf = y->data() + size_t(f) * s.OutVox();
    for (int c = 0; c < s.c; ++c) {
      const float* xc = x.data() + size_t(c) * s.InVox();
      for (int t = 0; t < s.K3(); ++t) {
        const double wt = w[(size_t(f) * s.c + c) * s.K3() + t];
        ForTap(s, t / (s.k * s.k), t / s.k % s.k, t % s.k, [&](int64_t o, int64_t i) { yf[o] += wt * xc[i]; });
      }
    }
  }
}

void RefBackwardData(const Shape& s, const std::vector<float>& dy, const std::vector<float>& w,
                     std::vector<double>* dx) {
  dx->assign(size_t(s.c) * s.InVox(), 0.0);
#pragma omp parallel for schedule(dynamic)
  for (int c = 0; c < s.c; ++c) {
    double* dxc = dx->data() + size_t(c) * s.InVox();
    for (int f = 0; f < s.f; ++f) {
      const float* dyf = dy.data() + size_t(f) * s.OutVox();
      for (int t = 0; t < s.K3(); ++t) {
        const double wt = w[(size_t(f) * s.c + c) * s.K3() + t];
        ForTap(s, t / (s.k * s.k), t / s.k % s.k, t % s.k, [&](int64_t o, int64_t i) { dxc[i] += wt * dyf[o]; });
      }
    }
  }
}

void RefBackwardWeights(const Shape& s, const std::vector<float>& x, const std::vector<float>& dy,
                        std::vector<double>* dw) {
  dw->assign(size_t(s.f) * s.c * s.K3(), 0.0);
#pragma omp parallel for collapse(2) schedule(dynamic)
  for (int f = 0; f < s.f; ++f) {
    for (int c = 0; c < s.c; ++c) {
      const float* dyf = dy.data() + size_t(f) * s.OutVox();
      const float* xc = x.data() + size_t(c) * s.InVox();
      for (int t = 0; t < s.K3(); ++t) {
        double sum = 0;
        ForTap(s, t / (s.k * s.k), t / s.k % s.k, t % s.k, [&](int64_t o, int64_t i) { sum += double(dyf[o]) * xc[i]; });
        (*dw)[(size_t(f) * s.c + c) * s.K3() + t] = sum;
      }
    }
  }
}

double RelError(const std::vector<float>& got, const std::vector<double>& ref) {
  double err = 0, scale = 0;
  for (size_t i = 0; i < ref.size(); ++i) {
    err = std::max(err, std::abs(double(got[i]) - ref[i]));
    scale = std::max(scale, std::abs(ref[i]));
  }
  return scale > 0 ? err / scale : err;
}

// ---- oneDNN, plain tensors reordered to and from whatever layout its kernels chose ----

struct OneDnnRun {
  std::vector<float> y, dx, dw;
  std::string impl[3];
};

memory::dims Dims5(int n, int c, int side) { return {n, c, side, side, side}; }

memory Plain(dnnl::engine& eng, const memory::dims& d, const float* data) {
  const Tag tag = d.size() == 5 ? Tag::ncdhw : Tag::oidhw;
  return memory(memory::desc(d, Dt::f32, tag), eng, const_cast<float*>(data));
}

// Reorders `plain` into a new memory of `md` (f32 or bf16) and returns it.
memory To(dnnl::engine& eng, dnnl::stream& strm, memory plain, const memory::desc& md) {
  memory m(md, eng);
  dnnl::reorder(plain, m).execute(strm, plain, m);
  return m;
}

OneDnnRun RunOneDnn(const Shape& s, Dt dt, const std::vector<float>& x, const std::vector<float>& w,
                    const std::vector<float>& dy) {
  dnnl::engine eng(dnnl::engine::kind::cpu, 0);
  dnnl::stream strm(eng);
  const memory::dims xd = Dims5(1, s.c, s.in), yd = Dims5(1, s.f, s.out), wd = {s.f, s.c, s.k, s.k, s.k};
  const memory::dims strides = {1, 1, 1}, pl = {s.pad, s.pad, s.pad};
  const int pr_i = (s.out - 1) + s.k - s.pad - s.in;
  const memory::dims pr = {pr_i, pr_i, pr_i};
  auto any = [&](const memory::dims& d, Dt t) { return memory::desc(d, t, Tag::any); };
  dnnl::convolution_forward::primitive_desc fwd(
      dnnl::convolution_forward::desc(dnnl::prop_kind::forward_training, dnnl::algorithm::convolution_direct,
                                      any(xd, dt), any(wd, dt), any(yd, Dt::f32), strides, pl, pr),
      eng);
  dnnl::convolution_backward_data::primitive_desc bwd_d(
      dnnl::convolution_backward_data::desc(dnnl::algorithm::convolution_direct, any(xd, Dt::f32), any(wd, dt),
                                            any(yd, dt), strides, pl, pr),
      eng, fwd);
  dnnl::convolution_backward_weights::primitive_desc bwd_w(
      dnnl::convolution_backward_weights::desc(dnnl::algorithm::convolution_direct, any(xd, dt),
                                               any(wd, Dt::f32), any(yd, dt), strides, pl, pr),
      eng, fwd);
  OneDnnRun r;
  r.impl[0] = fwd.impl_info_str();
  r.impl[1] = bwd_d.impl_info_str();
  r.impl[2] = bwd_w.impl_info_str();
  r.y.resize(dy.size());
  r.dx.resize(x.size());
  r.dw.resize(w.size());
  memory px = Plain(eng, xd, x.data()), pw = Plain(eng, wd, w.data()), pdy = Plain(eng, yd, dy.data());
  memory py = Plain(eng, yd, r.y.data()), pdx = Plain(eng, xd, r.dx.data()), pdw = Plain(eng, wd, r.dw.data());
  {
    memory src = To(eng, strm, px, fwd.src_desc()), wts = To(eng, strm, pw, fwd.weights_desc());
    memory dst(fwd.dst_desc(), eng);
    dnnl::convolution_forward(fwd).execute(strm, {{DNNL_ARG_SRC, src}, {DNNL_ARG_WEIGHTS, wts}, {DNNL_ARG_DST, dst}});
    dnnl::reorder(dst, py).execute(strm, dst, py);
  }
  {
    memory ddst = To(eng, strm, pdy, bwd_d.diff_dst_desc()), wts = To(eng, strm, pw, bwd_d.weights_desc());
    memory dsrc(bwd_d.diff_src_desc(), eng);
    dnnl::convolution_backward_data(bwd_d).execute(
        strm, {{DNNL_ARG_DIFF_DST, ddst}, {DNNL_ARG_WEIGHTS, wts}, {DNNL_ARG_DIFF_SRC, dsrc}});
    dnnl::reorder(dsrc, pdx).execute(strm, dsrc, pdx);
  }
  {
    memory src = To(eng, strm, px, bwd_w.src_desc()), ddst = To(eng, strm, pdy, bwd_w.diff_dst_desc());
    memory dwts(bwd_w.diff_weights_desc(), eng);
    dnnl::convolution_backward_weights(bwd_w).execute(
        strm, {{DNNL_ARG_SRC, src}, {DNNL_ARG_DIFF_DST, ddst}, {DNNL_ARG_DIFF_WEIGHTS, dwts}});
    dnnl::reorder(dwts, pdw).execute(strm, dwts, pdw);
  }
  strm.wait();
  return r;
}

// ---- the tiled kernels, planar layouts ----

struct TiledRun {  // a tiled kernel's three passes (empty where it takes no such problem)
  std::vector<float> y, dx, dw;
  int tile_fwd = 0, tile_bwd = 0;
};

TiledRun RunFft(const Shape& s, const std::vector<float>& x, const std::vector<float>& w, const std::vector<float>& dy) {
  TiledRun r;
  const Conv3dShape fs{1, s.c, s.f, s.in, s.out, s.k, s.pad};
  const Conv3dShape bs{1, s.f, s.c, s.out, s.in, s.k, s.k - 1 - s.pad};  // backward-data as a correlation
  r.tile_fwd = FftConv3d::TileFor(fs);
  r.tile_bwd = FftConv3d::TileFor(bs);
  if (r.tile_fwd > 0) {
    FftConv3d conv(fs, r.tile_fwd, ActivationLayout::Planar(s.c, s.InVox()), ActivationLayout::Planar(s.f, s.OutVox()));
    conv.SetWeights(w.data());
    r.y.resize(dy.size());
    conv.Forward(x.data(), r.y.data(), nullptr, -1.f);
    r.dw.resize(w.size());
    conv.BackwardWeights(x.data(), dy.data(), r.dw.data(), nullptr);
  }
  if (r.tile_bwd > 0) {
    FftConv3d conv(bs, r.tile_bwd, ActivationLayout::Planar(s.f, s.OutVox()), ActivationLayout::Planar(s.c, s.InVox()));
    conv.SetWeights(w.data(), /*flip_transpose=*/true);
    r.dx.resize(x.size());
    conv.Forward(dy.data(), r.dx.data(), nullptr, -1.f);
  }
  return r;
}

// ---- the Winograd kernel, planar layouts (empty results where it takes no such kernel) ----

TiledRun RunWinograd(const Shape& s, const std::vector<float>& x, const std::vector<float>& w,
                   const std::vector<float>& dy) {
  TiledRun r;
  const Conv3dShape fs{1, s.c, s.f, s.in, s.out, s.k, s.pad};
  const Conv3dShape bs{1, s.f, s.c, s.out, s.in, s.k, s.k - 1 - s.pad};
  if (!WinogradConv3d::Supports(fs) || !WinogradConv3d::Supports(bs)) return r;
  r.tile_fwd = r.tile_bwd = WinogradConv3d::OutputTile(s.k);
  WinogradConv3d fwd(fs, ActivationLayout::Planar(s.c, s.InVox()), ActivationLayout::Planar(s.f, s.OutVox()));
  fwd.SetWeights(w.data());
  r.y.resize(dy.size());
  fwd.Forward(x.data(), r.y.data(), nullptr, -1.f);
  r.dw.resize(w.size());
  fwd.BackwardWeights(x.data(), dy.data(), r.dw.data(), nullptr);
  WinogradConv3d bwd(bs, ActivationLayout::Planar(s.f, s.OutVox()), ActivationLayout::Planar(s.c, s.InVox()));
  bwd.SetWeights(w.data(), /*flip_transpose=*/true);
  r.dx.resize(x.size());
  bwd.Forward(dy.data(), r.dx.data(), nullptr, -1.f);
  return r;
}

std::vector<float> Uniform(size_t n, float lo, float hi, std::mt19937_64& rng) {
  std::uniform_real_distribution<float> u(lo, hi);
  std::vector<float> v(n);
  for (auto& e : v) e = u(rng);
  return v;
}

std::string Sci(double v) {
  char buf[32];
  std::snprintf(buf, sizeof(buf), "%.1e", v);
  return buf;
}

void Report(const Shape& s, uint64_t seed) {
  std::mt19937_64 rng(seed);
  const float ws = 1.f / std::sqrt(float(s.c * s.K3()));
  const auto x = Uniform(size_t(s.c) * s.InVox(), 0.f, 1.f, rng);
  const auto w = Uniform(size_t(s.f) * s.c * s.K3(), -ws, ws, rng);
  const auto dy = Uniform(size_t(s.f) * s.OutVox(), -1.f, 1.f, rng);
  std::vector<double> ry, rdx, rdw;
  RefForward(s, x, w, &ry);
  RefBackwardData(s, dy, w, &rdx);
  RefBackwardWeights(s, x, dy, &rdw);
  const std::string shape = std::to_string(s.c) + "->" + std::to_string(s.f) + ", k" + std::to_string(s.k) + ", " +
                            std::to_string(s.in) + "^3 -> " + std::to_string(s.out) + "^3";
  auto row = [&](const std::string& path, const std::vector<float>& y, const std::vector<float>& dx,
                 const std::vector<float>& dw, const std::string& how) {
    auto cell = [](const std::vector<float>& got, const std::vector<double>& ref) {
      return got.empty() ? std::string("n/a") : Sci(RelError(got, ref));
    };
    std::printf("| %s | %s | %s | %s | %s | %s | %s |\n", s.name.c_str(), shape.c_str(), path.c_str(),
                cell(y, ry).c_str(), cell(dx, rdx).c_str(), cell(dw, rdw).c_str(), how.c_str());
    std::fflush(stdout);
  };
  const OneDnnRun f32 = RunOneDnn(s, Dt::f32, x, w, dy);
  row("oneDNN fp32", f32.y, f32.dx, f32.dw, f32.impl[0] + " / " + f32.impl[1] + " / " + f32.impl[2]);
  try {
    const OneDnnRun b16 = RunOneDnn(s, Dt::bf16, x, w, dy);
    row("oneDNN bf16 inputs", b16.y, b16.dx, b16.dw, b16.impl[0] + " / " + b16.impl[1] + " / " + b16.impl[2]);
  } catch (const dnnl::error& e) {
    row("oneDNN bf16 inputs", {}, {}, {}, std::string("no bf16 kernels here: ") + e.what());
  }
  const TiledRun fft = RunFft(s, x, w, dy);
  row("FFT-tiled fp32", fft.y, fft.dx, fft.dw,
      "tile " + std::to_string(fft.tile_fwd) + "^3 (backward-data " + std::to_string(fft.tile_bwd) + "^3)");
  const TiledRun wino = RunWinograd(s, x, w, dy);
  const int m = wino.tile_fwd;
  row("Winograd fp32", wino.y, wino.dx, wino.dw,
      m > 0 ? "F(" + std::to_string(m) + "^3, " + std::to_string(s.k) + "^3)" : std::string("not taken (kernel side or memory cap)"));
}

}  // namespace
}  // namespace cosmoflow

int main(int argc, char** argv) {
  using namespace cosmoflow;
  std::string model = "sc18", layers = "conv1,conv2";
  int64_t seed = 1;
  bool help = false;
  FlagParser flags;
  flags.AddString("model", &model, "built-in spec or a .json spec file");
  flags.AddString("layers", &layers, "comma-separated conv layers (conv<i>, counting conv3d layers from 0)");
  flags.AddInt("seed", &seed, "random inputs");
  flags.AddBool("help", &help, "this text");
  std::vector<std::string> positional;
  if (Status st = flags.Parse(argc, argv, &positional); !st.ok() || !positional.empty()) {
    std::fprintf(stderr, "conv_accuracy: %s\n",
                 st.ok() ? ("unexpected argument '" + positional[0] + "'").c_str() : st.message().c_str());
    return 2;
  }
  if (help) {
    std::printf("usage: conv_accuracy [flags]\n%s", flags.Usage().c_str());
    return 0;
  }
  StatusOr<ModelSpec> spec = LoadSpec(model);
  if (!spec.ok()) {
    std::fprintf(stderr, "conv_accuracy: %s\n", spec.status().message().c_str());
    return 2;
  }
  std::vector<std::string> wanted;
  std::stringstream ss(layers);
  for (std::string item; std::getline(ss, item, ',');) wanted.push_back(item);
  const auto shapes = ConvShapes(*spec, wanted);
  if (shapes.empty()) {
    std::fprintf(stderr, "conv_accuracy: no stride-1 conv named %s in %s\n", layers.c_str(), model.c_str());
    return 1;
  }
  std::printf("| layer | shape | path | forward | backward-data | backward-weights | kernels |\n");
  std::printf("|---|---|---|---|---|---|---|\n");
  for (const Shape& s : shapes) Report(s, uint64_t(seed));
  return 0;
}
