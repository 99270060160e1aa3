// conv3d backward-data candidates.
//   transposed  backward-data of a stride-1 convolution is itself a convolution: diff_src =
//               diff_dst, padded by k-1-pad on each side, convolved with the weights transposed
//               (ic <-> oc) and flipped in space. oneDNN 2.6's fp32 forward kernel runs that faster
//               than its backward-data kernel when the input has a single 16-channel block; with
//               more input channels, or in bf16, it is no faster, so the rule takes it for fp32
//               convs with at most 16 input channels.
//   onednn      oneDNN's backward-data primitive.
// (and winograd and fft, the tiled correlations of conv3d_tiled.cc, first in the list)
#include <memory>

#include "core/nn/ops/conv3d.h"

namespace cosmoflow::nn_internal {
namespace {

using dnnl::memory;
using Tag = memory::format_tag;
using Dt = memory::data_type;

// The forward conv of the transposed problem, or an empty pd when oneDNN has no real kernel.
dnnl::convolution_forward::primitive_desc TransposedPd(const ConvSetup& s) {
  const int64_t pl = s.g.k - 1 - s.g.pad_left, pr = s.g.k - 1 - s.g.pad_right;
  const memory::dims tr_dims = {s.g.ic, s.g.oc, s.g.k, s.g.k, s.g.k};
  dnnl::convolution_forward::primitive_desc pd;
  try {
    pd = dnnl::convolution_forward::primitive_desc(
        dnnl::convolution_forward::desc(dnnl::prop_kind::forward_inference, dnnl::algorithm::convolution_direct,
                                        s.dst_md, memory::desc(tr_dims, s.ctx.dt, Tag::any), s.src_md, {1, 1, 1},
                                        {pl, pl, pl}, {pr, pr, pr}),
        s.ctx.eng);
  } catch (const dnnl::error&) {
    return {};
  }
  if (IsRef(pd.impl_info_str())) return {};
  return pd;
}

class TransposedKernel : public ConvPassKernel {
 public:
  TransposedKernel(const ConvSetup& s, dnnl::convolution_forward::primitive_desc pd)
      : pd_(std::move(pd)), prim_(pd_), g_(s.g), master_(static_cast<const float*>(s.weights.master.get_data_handle())) {
    plain_.assign(g_.ic * g_.oc * g_.k * g_.k * g_.k, 0.f);
    plain_mem_ = memory(memory::desc({g_.ic, g_.oc, g_.k, g_.k, g_.k}, Dt::f32, Tag::oidhw), s.ctx.eng, plain_.data());
    weights_ = memory(pd_.weights_desc(), s.ctx.eng);
    reorder_ = dnnl::reorder(plain_mem_, weights_);
    Refresh(s.ctx);
  }
  void Run(OpContext& c, const memory&, const memory& diff_dst, memory* diff_src) override {
    prim_.execute(c.strm, {{DNNL_ARG_SRC, diff_dst}, {DNNL_ARG_WEIGHTS, weights_}, {DNNL_ARG_DST, *diff_src}});
  }
  // tr[i][o][a][b][d] = w[o][i][k-1-a][k-1-b][k-1-d], then into the kernel's layout.
  void Refresh(OpContext& c) override {
    const int64_t k3 = g_.k * g_.k * g_.k;
    for (int64_t o = 0; o < g_.oc; ++o) {
      for (int64_t i = 0; i < g_.ic; ++i) {
        const float* src = master_ + (o * g_.ic + i) * k3;
        float* dst = plain_.data() + (i * g_.oc + o) * k3;
        for (int64_t t = 0; t < k3; ++t) dst[t] = src[k3 - 1 - t];
      }
    }
    reorder_.execute(c.strm, plain_mem_, weights_);
  }
  std::string Impl() const override { return "transposed_fwd:" + std::string(pd_.impl_info_str()); }
  int64_t WorkspaceBytes() const override {
    return static_cast<int64_t>(plain_.size() * sizeof(float) + weights_.get_desc().get_size());
  }

 private:
  dnnl::convolution_forward::primitive_desc pd_;
  dnnl::convolution_forward prim_;
  ConvGeom g_;
  const float* master_;
  std::vector<float> plain_;
  memory plain_mem_, weights_;
  dnnl::reorder reorder_;
};

class OneDnnKernel : public ConvPassKernel {
 public:
  explicit OneDnnKernel(const ConvSetup& s) : pd_(OneDnnBwdDataPd(s.ctx, s.g, s.src_md, s.fwd_pd)), prim_(pd_) {
    if (pd_.weights_desc() == s.weights.fwd.get_desc()) {
      weights_ = s.weights.fwd;  // the forward working copy serves both
    } else {
      weights_ = memory(pd_.weights_desc(), s.ctx.eng);
      reorder_ = dnnl::reorder(s.weights.master, weights_);
      own_copy_ = true;
      master_ = s.weights.master;
      Refresh(s.ctx);
    }
  }
  void Run(OpContext& c, const memory&, const memory& diff_dst, memory* diff_src) override {
    prim_.execute(c.strm, {{DNNL_ARG_DIFF_DST, diff_dst}, {DNNL_ARG_WEIGHTS, weights_}, {DNNL_ARG_DIFF_SRC, *diff_src}});
  }
  void Refresh(OpContext& c) override {
    if (own_copy_) reorder_.execute(c.strm, master_, weights_);
  }
  std::string Impl() const override { return pd_.impl_info_str(); }
  int64_t WorkspaceBytes() const override { return own_copy_ ? static_cast<int64_t>(weights_.get_desc().get_size()) : 0; }

 private:
  dnnl::convolution_backward_data::primitive_desc pd_;
  dnnl::convolution_backward_data prim_;
  memory weights_, master_;
  dnnl::reorder reorder_;
  bool own_copy_ = false;
};

}  // namespace

const std::vector<ConvCandidate>& BwdDataCandidates() {
  static const std::vector<ConvCandidate> kList = {
      WinogradBwdDataCandidate(),
      FftBwdDataCandidate(),
      {"transposed", [](const ConvSetup& s) { return s.g.stride == 1 && bool(TransposedPd(s)); },
       [](const ConvSetup& s) { return s.ctx.dt == Dt::f32 && s.g.ic <= 16; },
       [](const ConvSetup& s) -> std::unique_ptr<ConvPassKernel> {
         return std::make_unique<TransposedKernel>(s, TransposedPd(s));
       }},
      {"onednn", [](const ConvSetup&) { return true; }, [](const ConvSetup&) { return true; },
       [](const ConvSetup& s) -> std::unique_ptr<ConvPassKernel> { return std::make_unique<OneDnnKernel>(s); }},
  };
  return kList;
}

}  // namespace cosmoflow::nn_internal
