// conv3d: oneDNN's direct convolution forward (with a following leaky ReLU fused as a post-op), and
// the backward passes by the candidates of conv3d_bwd_data.cc and conv3d_bwd_weights.cc.
//
// Layout: the conv takes the incoming layout when oneDNN has real kernels for every pass it runs
// there; otherwise it searches the usual layouts for src and dst, preferring direct kernels (no
// reference loops, then the fewest im2col + gemm passes), and reorders src (and diff_src back).
// On AVX2 oneDNN 2.6 has no direct 3D backward-weights kernel and its blocked layouts fall back to
// the reference loops, so channels-last (direct forward and backward-data) wins there. In bf16
// training oneDNN runs its AMX kernels only on channels-last, so a bf16 training conv switches to it
// where the channels-last forward is an AMX kernel (and keeps the blocked layout elsewhere).
// "conv.layout" in NetworkOptions::kernels: "auto" (the above), "channels_last" (ndhwc src and dst
// wherever oneDNN has a real forward kernel for it), "no_channels_last" (never switch a training
// network to channels-last, after the fused first block or for AMX).
#include "core/nn/ops/conv3d.h"

#include "core/nn/ops/ops.h"

namespace cosmoflow::nn_internal {

using dnnl::memory;
using Tag = memory::format_tag;
using Dt = memory::data_type;

ConvGeom ConvGeomOf(const memory::dims& src_dims, const LayerSpec& l) {
  ConvGeom g;
  g.n = src_dims[0];
  g.ic = src_dims[1];
  g.side = src_dims[2];
  g.oc = l.filters;
  g.k = l.kernel;
  g.stride = l.stride;
  const ConvGeometry cg = ConvGeometryFor(g.side, l.kernel, l.stride, l.same_padding);
  g.out = cg.out;
  g.pad_left = cg.pad_left;
  g.pad_right = cg.pad_right;
  return g;
}

bool ConvSetup::Fp32ChannelsLast() const {
  return src_md == memory::desc({g.n, g.ic, g.side, g.side, g.side}, Dt::f32, Tag::ndhwc) &&
         dst_md == memory::desc(g.dst_dims(), Dt::f32, Tag::ndhwc);
}

size_t ChooseCandidate(const std::vector<ConvCandidate>& list, const ConvSetup& s, const std::string& forced,
                       const char* pass) {
  for (size_t i = 0; i < list.size() && !forced.empty(); ++i) {
    if (forced == list[i].name && list[i].supports(s)) return i;
  }
  size_t rule = list.size() - 1;
  for (size_t i = 0; i + 1 < list.size(); ++i) {
    if (list[i].supports(s) && list[i].preferred(s)) {
      rule = i;
      break;
    }
  }
  return s.ctx.selection == KernelSelection::kMeasure ? MeasureCandidates(list, s, pass, rule) : rule;
}

dnnl::convolution_backward_weights::primitive_desc OneDnnBwdWeightsPd(
    OpContext& c, const ConvGeom& g, const memory::desc& src_md, const dnnl::convolution_forward::primitive_desc& fwd) {
  return dnnl::convolution_backward_weights::primitive_desc(
      dnnl::convolution_backward_weights::desc(dnnl::algorithm::convolution_direct, src_md,
                                               memory::desc(g.weights_dims(), Dt::f32, Tag::any),
                                               memory::desc({g.oc}, Dt::f32, Tag::x), fwd.dst_desc(), g.strides(),
                                               g.padl(), g.padr()),
      c.eng, fwd);
}

dnnl::convolution_backward_data::primitive_desc OneDnnBwdDataPd(
    OpContext& c, const ConvGeom& g, const memory::desc& src_md, const dnnl::convolution_forward::primitive_desc& fwd) {
  return dnnl::convolution_backward_data::primitive_desc(
      dnnl::convolution_backward_data::desc(dnnl::algorithm::convolution_direct, src_md,
                                            memory::desc(g.weights_dims(), c.dt, Tag::any), fwd.dst_desc(),
                                            g.strides(), g.padl(), g.padr()),
      c.eng, fwd);
}

namespace {

dnnl::convolution_forward::primitive_desc MakeFwdPd(OpContext& c, const ConvGeom& g, const memory::desc& s_md,
                                                    const memory::desc& d_md, const dnnl::primitive_attr& attr) {
  auto prop = c.training ? dnnl::prop_kind::forward_training : dnnl::prop_kind::forward_inference;
  return dnnl::convolution_forward::primitive_desc(
      dnnl::convolution_forward::desc(prop, dnnl::algorithm::convolution_direct, s_md,
                                      memory::desc(g.weights_dims(), c.dt, Tag::any),
                                      memory::desc({g.oc}, Dt::f32, Tag::x), d_md, g.strides(), g.padl(), g.padr()),
      attr, c.eng);
}

// -1 when a pass the conv runs (forward; in training backward-weights and, but for the first op,
// backward-data) would be oneDNN's reference loops, else how many of them are im2col + gemm.
int GemmPasses(OpContext& c, const ConvGeom& g, const dnnl::convolution_forward::primitive_desc& pd, bool first_op) {
  std::vector<std::string> impls = {pd.impl_info_str()};
  if (c.training) {
    impls.push_back(OneDnnBwdWeightsPd(c, g, pd.src_desc(), pd).impl_info_str());
    if (!first_op) impls.push_back(OneDnnBwdDataPd(c, g, pd.src_desc(), pd).impl_info_str());
  }
  int gemm = 0;
  for (const auto& impl : impls) {
    if (IsRef(impl)) return -1;
    if (IsGemm(impl)) ++gemm;
  }
  return gemm;
}

// The incoming layout when it has only direct kernels; else the first (src, dst) layout pair with
// only direct kernels, else the one with fewest gemm passes, else oneDNN's own choice.
dnnl::convolution_forward::primitive_desc SearchFwdLayout(OpContext& c, const ConvGeom& g,
                                                          const memory::desc& src_md, const memory::desc& d_any,
                                                          const dnnl::primitive_attr& attr, bool first_op) {
  auto incoming_pd = MakeFwdPd(c, g, src_md, d_any, attr);
  const int incoming = GemmPasses(c, g, incoming_pd, first_op);
  if (incoming == 0) return incoming_pd;
  dnnl::convolution_forward::primitive_desc best;
  int best_gemm = incoming;
  if (best_gemm >= 0) best = incoming_pd;
  const memory::dims in_dims = src_md.dims();
  std::vector<std::pair<Tag, Tag>> pairs = {{Tag::any, Tag::any}};
  for (Tag d : {Tag::any, Tag::ndhwc, Tag::nCdhw16c, Tag::nCdhw8c, Tag::ncdhw}) {
    for (Tag s : {Tag::any, Tag::nCdhw16c, Tag::nCdhw8c, Tag::ndhwc, Tag::ncdhw}) pairs.push_back({s, d});
  }
  for (auto [s, d] : pairs) {
    if (best && best_gemm == 0) break;
    dnnl::convolution_forward::primitive_desc pd;
    try {
      pd = MakeFwdPd(c, g, memory::desc(in_dims, c.dt, s), d == Tag::any ? d_any : memory::desc(g.dst_dims(), c.dt, d),
                     attr);
    } catch (const dnnl::error&) {
      continue;  // no implementation at all for this pair
    }
    const int gemm = GemmPasses(c, g, pd, first_op);
    if (gemm >= 0 && (!best || gemm < best_gemm)) {
      best = pd;
      best_gemm = gemm;
    }
  }
  return best ? best : MakeFwdPd(c, g, memory::desc(in_dims, c.dt, Tag::any), d_any, attr);
}

// ndhwc src and dst, when oneDNN has a real forward kernel for them (else an empty pd).
dnnl::convolution_forward::primitive_desc ChannelsLastFwd(OpContext& c, const ConvGeom& g,
                                                          const memory::dims& in_dims,
                                                          const dnnl::primitive_attr& attr) {
  try {
    auto pd = MakeFwdPd(c, g, memory::desc(in_dims, c.dt, Tag::ndhwc), memory::desc(g.dst_dims(), c.dt, Tag::ndhwc),
                        attr);
    if (!IsRef(pd.impl_info_str())) return pd;
  } catch (const dnnl::error&) {
    // no implementation for ndhwc
  }
  return {};
}

// Whether oneDNN has non-reference kernels for every pass of a conv reading src_md.
bool AllPassesReal(OpContext& c, const ConvGeom& g, const dnnl::convolution_forward::primitive_desc& fwd) {
  if (IsRef(fwd.impl_info_str())) return false;
  if (!c.training) return true;
  return !IsRef(OneDnnBwdWeightsPd(c, g, fwd.src_desc(), fwd).impl_info_str()) &&
         !IsRef(OneDnnBwdDataPd(c, g, fwd.src_desc(), fwd).impl_info_str());
}

// Whether oneDNN runs the primitive on AMX tiles.
bool RunsOnAmx(const dnnl::convolution_forward::primitive_desc& pd) {
  return std::string(pd.impl_info_str()).find("amx") != std::string::npos;
}

class ConvOp : public Op {
 public:
  ConvOp(OpArgs& a, const LayerSpec* leaky)
      : Op(a.name + (leaky ? "+leaky" : "")), base_name_(a.name), w_(*a.params[0]), b_(*a.params[1]),
        first_op_(a.first_op) {
    OpContext& c = a.ctx;
    src_md = a.src_md;
    src = a.src;
    g_ = ConvGeomOf(src_md.dims(), a.layer());
    const bool fuse = leaky != nullptr;
    const float alpha = fuse ? leaky->alpha : 0.f;
    alpha_ = fuse ? alpha : -1.f;
    ChooseLayoutAndForward(c, LeakyAttr(fuse, alpha));
    dst_md = fwd_pd_.dst_desc();
    dst = memory(dst_md, c.eng);
    bias_ = memory(memory::desc({g_.oc}, Dt::f32, Tag::x), c.eng, b_.value.data());
    params = {a.param_indices[0], a.param_indices[1]};
    weights_.Init(c, memory::desc(g_.weights_dims(), Dt::f32, Tag::oidhw), w_.value.data(), fwd_pd_.weights_desc(),
                  nullptr);
    if (c.training) {
      onednn_bwd_w_pd_ = OneDnnBwdWeightsPd(c, g_, conv_src_md_, fwd_pd_);
      leaky_bwd_.Init(c, fuse, alpha, dst_md);
    }
    const ConvSetup s = Setup(c);
    const auto& fl = FwdCandidates();
    const size_t fi = ChooseCandidate(fl, s, c.Forced(base_name_, "conv", "fwd"), "fwd");
    fwd_name_ = fl[fi].name;
    fwd_ = fl[fi].make(s);
  }

  void SetUpBackward(OpContext& c, bool need_diff_src) override {
    const ConvSetup s = Setup(c);
    const auto& wl = BwdWeightsCandidates();
    const size_t wi = ChooseCandidate(wl, s, c.Forced(base_name_, "conv", "bwd_weights"), "bwd_weights");
    bwd_w_name_ = wl[wi].name;
    bwd_w_ = wl[wi].make(s);
    if (!need_diff_src) return;  // the first op: no gradient for the input cube
    const auto& dl = BwdDataCandidates();
    const size_t di = ChooseCandidate(dl, s, c.Forced(base_name_, "conv", "bwd_data"), "bwd_data");
    bwd_d_name_ = dl[di].name;
    bwd_d_ = dl[di].make(s);
    if (reorder_src_) {
      conv_diff_src_ = memory(conv_src_md_, c.eng);
      diff_src_reorder_ = dnnl::reorder(dnnl::reorder::primitive_desc(c.eng, conv_src_md_, c.eng, src_md));
    }
  }

  void Forward(OpContext& c) override {
    if (reorder_src_) src_reorder_.execute(c.strm, src, conv_src_);
    fwd_->Run(c, conv_src_, bias_, &dst);
  }

  void Backward(OpContext& c, bool need_diff_src) override {
    leaky_bwd_.Run(c, dst, diff_dst);
    bwd_w_->Run(c, conv_src_, diff_dst, nullptr);
    if (!need_diff_src || !bwd_d_) return;
    memory& out = reorder_src_ ? conv_diff_src_ : diff_src;
    bwd_d_->Run(c, conv_src_, diff_dst, &out);
    if (reorder_src_) diff_src_reorder_.execute(c.strm, conv_diff_src_, diff_src);
  }

  void RefreshWeights(OpContext& c) override {
    weights_.Refresh(c);
    fwd_->Refresh(c);
    if (bwd_w_) bwd_w_->Refresh(c);
    if (bwd_d_) bwd_d_->Refresh(c);
  }
  double FwdFlops() const override { return g_.Flops(); }
  double BwdFlops(bool need_diff_src) const override { return g_.Flops() * (need_diff_src ? 2 : 1); }
  std::vector<KernelChoice> Kernels() const override {
    std::vector<KernelChoice> k = {{name_, "fwd", fwd_name_, fwd_->Impl() + (reorder_src_ ? " (src reordered)" : "")}};
    if (bwd_w_) k.push_back({name_, "bwd_weights", bwd_w_name_, bwd_w_->Impl()});
    if (bwd_d_) k.push_back({name_, "bwd_data", bwd_d_name_, bwd_d_->Impl()});
    return k;
  }
  int64_t WorkspaceBytes() const override {
    int64_t bytes = reorder_src_ ? static_cast<int64_t>(conv_src_md_.get_size()) * (bwd_d_ ? 2 : 1) : 0;
    bytes += fwd_->WorkspaceBytes();
    if (bwd_w_) bytes += bwd_w_->WorkspaceBytes();
    if (bwd_d_) bytes += bwd_d_->WorkspaceBytes();
    return bytes;
  }

 private:
  ConvSetup Setup(OpContext& c) const {
    return ConvSetup{c, g_, first_op_, conv_src_md_, dst_md, fwd_pd_, onednn_bwd_w_pd_, w_, b_, weights_, alpha_,
                     base_name_};
  }

  void ChooseLayoutAndForward(OpContext& c, const dnnl::primitive_attr& attr) {
    const memory::dims in_dims = src_md.dims();
    const std::string layout = c.Forced(base_name_, "conv", "layout");
    if (layout == "channels_last") {
      fwd_pd_ = ChannelsLastFwd(c, g_, in_dims, attr);
    } else if (layout != "no_channels_last" && c.training && c.dt == Dt::bf16) {
      // bf16 training on AMX: oneDNN 2.6 runs every pass on AMX tiles only on ndhwc, several
      // times its blocked AVX512-BF16 kernels; the ops after this one then stay channels-last.
      auto pd = ChannelsLastFwd(c, g_, in_dims, attr);
      if (pd && RunsOnAmx(pd) && AllPassesReal(c, g_, pd)) {
        fwd_pd_ = pd;
        c.channels_last = true;
      }
    }
    if (!fwd_pd_) {
      const bool channels_last = c.channels_last && src_md == memory::desc(in_dims, c.dt, Tag::ndhwc);
      const memory::desc d_any(g_.dst_dims(), c.dt, channels_last ? Tag::ndhwc : Tag::any);
      fwd_pd_ = SearchFwdLayout(c, g_, src_md, d_any, attr, first_op_);
    }
    // With one input channel ncdhw and ndhwc are the same bytes and compare equal, yet oneDNN picks
    // its kernels by the layout tag the desc carries: keep the chosen desc even when no reorder is due.
    conv_src_md_ = fwd_pd_.src_desc();
    conv_src_ = src;
    if (conv_src_md_ != src_md) {
      conv_src_ = memory(conv_src_md_, c.eng);
      src_reorder_ = dnnl::reorder(src, conv_src_);
      reorder_src_ = true;
    }
  }

  std::string base_name_;
  ParamStore& w_;
  ParamStore& b_;
  bool first_op_;
  ConvGeom g_;
  memory::desc conv_src_md_;
  memory conv_src_, conv_diff_src_;
  dnnl::reorder src_reorder_, diff_src_reorder_;
  bool reorder_src_ = false;
  float alpha_ = -1.f;
  dnnl::convolution_forward::primitive_desc fwd_pd_;
  dnnl::convolution_backward_weights::primitive_desc onednn_bwd_w_pd_;
  WorkingWeights weights_;
  memory bias_;
  FusedLeakyBwd leaky_bwd_;
  std::unique_ptr<ConvPassKernel> fwd_, bwd_w_, bwd_d_;
  std::string fwd_name_, bwd_w_name_, bwd_d_name_;
};

// oneDNN's forward primitive on the layout ConvOp chose (bias and leaky ReLU fused).
class OneDnnFwdKernel : public ConvPassKernel {
 public:
  explicit OneDnnFwdKernel(const ConvSetup& s) : pd_(s.fwd_pd), prim_(pd_), weights_(s.weights.fwd) {}
  void Run(OpContext& c, const memory& src, const memory& bias, memory* dst) override {
    prim_.execute(c.strm, {{DNNL_ARG_SRC, src}, {DNNL_ARG_WEIGHTS, weights_}, {DNNL_ARG_BIAS, bias}, {DNNL_ARG_DST, *dst}});
  }
  std::string Impl() const override { return pd_.impl_info_str(); }

 private:
  dnnl::convolution_forward::primitive_desc pd_;
  dnnl::convolution_forward prim_;
  memory weights_;
};

}  // namespace

const std::vector<ConvCandidate>& FwdCandidates() {
  static const std::vector<ConvCandidate> kList = {
      WinogradFwdCandidate(),
      FftFwdCandidate(),
      {"onednn", [](const ConvSetup&) { return true; }, [](const ConvSetup&) { return true; },
       [](const ConvSetup& s) -> std::unique_ptr<ConvPassKernel> { return std::make_unique<OneDnnFwdKernel>(s); }},
  };
  return kList;
}

int PreferredConvSrcLayout(OpContext& c, const memory::dims& dims, const LayerSpec& l,
                           const std::vector<std::pair<memory::desc, int>>& candidates) {
  const ConvGeom g = ConvGeomOf(dims, l);
  const dnnl::primitive_attr none;
  auto pd = MakeFwdPd(c, g, memory::desc(dims, c.dt, Tag::any), memory::desc(g.dst_dims(), c.dt, Tag::any), none);
  for (size_t i = 0; i < candidates.size(); ++i) {
    if (pd.src_desc() == candidates[i].first && !c.training) return static_cast<int>(i);
  }
  // Training: channels-last throughout when every pass has a real kernel on ndhwc src and dst
  // (oneDNN 2.6 runs its brgemm forward only on ndhwc, and only when dst is ndhwc too): always for
  // fp32; for bf16 only where that forward runs on AMX (several times the blocked AVX512-BF16
  // kernels), since without AMX channels-last bf16 is slower. Not for inference, where oneDNN's
  // own choice (the first candidate it picks) is kept.
  const std::string layout = c.Forced("", "conv", "layout");
  if (c.training && layout != "no_channels_last") {
    const memory::desc nhwc(dims, c.dt, Tag::ndhwc);
    for (size_t i = 0; i < candidates.size(); ++i) {
      if (candidates[i].first != nhwc) continue;
      auto fwd = ChannelsLastFwd(c, g, dims, none);
      const bool wanted = c.dt == Dt::f32 || layout == "channels_last" || (fwd && RunsOnAmx(fwd));
      if (fwd && wanted && AllPassesReal(c, g, fwd)) {
        c.channels_last = true;
        return static_cast<int>(i);
      }
    }
  }
  // Training: the first candidate whose forward and backward kernels are all real (not ref).
  for (size_t i = 0; i < candidates.size(); ++i) {
    auto fwd = MakeFwdPd(c, g, candidates[i].first, memory::desc(g.dst_dims(), c.dt, Tag::any), none);
    if (AllPassesReal(c, g, fwd)) return static_cast<int>(i);
  }
  return 0;
}

std::unique_ptr<Op> MakeConv3dOp(OpArgs& args) {
  const LayerSpec* leaky = args.NextLeaky();
  if (leaky) args.consumed = 2;
  return std::make_unique<ConvOp>(args, leaky);
}

}  // namespace cosmoflow::nn_internal
