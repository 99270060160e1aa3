// The oneDNN network: a list of ops built once from a ModelSpec, executed forward then backward.
//
// Layout policy: every op's src is the previous op's dst memory (a concrete desc), and every op
// lets oneDNN choose its own dst/weights layout (format_tag::any). Reorders happen only at the edges:
// user input -> first op, last op -> user output, plain fp32 master weights <-> working weights.
// Backward diffs live in two ping-pong buffers (op i's diff_dst in buffer i % 2, its diff_src in the
// other), so training memory is activations + the two largest diffs, not a diff per layer.
#include "core/nn/network.h"

#include <omp.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <iomanip>
#include <sstream>
#include <oneapi/dnnl/dnnl.hpp>

#include "core/nn/conv_wgrad.h"
#include "core/nn/first_block.h"
#include "core/nn/network_internal.h"

namespace cosmoflow {

const char* PrecisionName(Precision p) { return p == Precision::kBf16 ? "bf16" : "fp32"; }

StatusOr<Precision> ParsePrecision(const std::string& name) {
  if (name == "fp32") return Precision::kFp32;
  if (name == "bf16") return Precision::kBf16;
  return InvalidArgumentError("unknown precision '" + name + "' (expected fp32 or bf16)");
}

bool Bf16Supported() {
  const auto isa = dnnl::get_effective_cpu_isa();
  return isa == dnnl::cpu_isa::avx512_core_bf16 || isa == dnnl::cpu_isa::avx512_core_amx;
}

namespace nn_internal {

uint64_t SplitMix64(uint64_t x) {
  x += 0x9E3779B97F4A7C15ull;
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
  return x ^ (x >> 31);
}

float DropoutUniform(uint64_t seed, uint64_t step, int layer, int64_t index) {
  uint64_t h = SplitMix64(seed ^ SplitMix64(step * 0x100000001B3ull + static_cast<uint64_t>(layer)));
  h = SplitMix64(h ^ static_cast<uint64_t>(index));
  return static_cast<float>(h >> 40) * (1.0f / 16777216.0f);
}

void AlignedFree::operator()(void* p) const { std::free(p); }

AlignedBuffer AllocateAligned(size_t bytes) {
  size_t rounded = (std::max<size_t>(bytes, 64) + 4095) / 4096 * 4096;
  return AlignedBuffer(std::aligned_alloc(4096, rounded));
}

}  // namespace nn_internal

namespace {

using dnnl::memory;
using Tag = memory::format_tag;
using Dt = memory::data_type;
using Dims = memory::dims;
using nn_internal::AlignedBuffer;
using nn_internal::AllocateAligned;
using nn_internal::Bf16ToF32;
using nn_internal::F32ToBf16;

using Clock = std::chrono::steady_clock;

double Ms(Clock::time_point a, Clock::time_point b) {
  return std::chrono::duration<double, std::milli>(b - a).count();
}

Tag PlainTag(size_t ndims) {
  switch (ndims) {
    case 1: return Tag::a;
    case 2: return Tag::ab;
    case 3: return Tag::abc;
    case 4: return Tag::abcd;
    case 5: return Tag::abcde;
    default: return Tag::abcdef;
  }
}

// Shared state of one network: engine, stream, working data type, the ping-pong diff buffers.
struct Ctx {
  dnnl::engine eng{dnnl::engine::kind::cpu, 0};
  dnnl::stream strm{eng};
  Dt dt = Dt::f32;
  bool training = false;
  int batch = 1;
  uint64_t seed = 0;
  uint64_t step = 0;  // training forwards so far (dropout masks)
  // fp32 training with a channels-last (ndhwc) first block: convolutions whose src is ndhwc write
  // ndhwc too (see PreferredSrcLayout).
  bool channels_last = false;
};

// A trainable tensor: fp32 master + gradient in plain layout, and the working copies ops need.
struct ParamStore {
  std::string name;
  std::vector<int64_t> shape;
  std::vector<float> value;
  std::vector<float> grad;
};

class Op {
 public:
  explicit Op(std::string name) : name_(std::move(name)) {}
  virtual ~Op() = default;
  const std::string& name() const { return name_; }
  virtual void Forward(Ctx& c) = 0;
  // Computes parameter grads (if any) and, when need_diff_src, diff_src.
  virtual void Backward(Ctx& c, bool need_diff_src) = 0;
  virtual void RefreshWeights(Ctx& c) {}
  virtual double FwdFlops() const { return 0; }
  virtual double BwdFlops(bool need_diff_src) const { return 0; }
  virtual std::string Impl() const { return impl_; }

  memory::desc src_md, dst_md;
  memory src, dst;
  memory diff_src, diff_dst;  // bound to the ping-pong buffers in training
  std::vector<int> params;    // indices into the network's parameter list
  double fwd_ms = 0, bwd_ms = 0;

 protected:
  std::string name_;
  std::string impl_;
};

dnnl::primitive_attr LeakyAttr(bool fuse, float alpha) {
  dnnl::primitive_attr attr;
  if (fuse) {
    dnnl::post_ops po;
    po.append_eltwise(1.f, dnnl::algorithm::eltwise_relu, alpha, 0.f);
    attr.set_post_ops(po);
  }
  return attr;
}

// Weights held by an op: the plain fp32 master (wrapped, no copy), and working copies for forward and
// backward-data in whatever layout/type those primitives chose, refreshed by reorders.
struct WorkingWeights {
  memory master;       // plain fp32 wrapping ParamStore::value
  memory fwd;          // may alias master
  memory bwd;          // may alias fwd
  dnnl::reorder to_fwd, to_bwd;
  bool fwd_is_master = false, bwd_is_fwd = false, has_bwd = false;

  void Init(Ctx& c, const memory::desc& plain, float* value, const memory::desc& fwd_md,
            const memory::desc* bwd_md) {
    master = memory(plain, c.eng, value);
    fwd_is_master = fwd_md == plain;
    if (fwd_is_master) {
      fwd = master;
    } else {
      fwd = memory(fwd_md, c.eng);
      to_fwd = dnnl::reorder(master, fwd);
    }
    has_bwd = bwd_md != nullptr;
    if (has_bwd) {
      bwd_is_fwd = *bwd_md == fwd_md;
      if (bwd_is_fwd) {
        bwd = fwd;
      } else {
        bwd = memory(*bwd_md, c.eng);
        to_bwd = dnnl::reorder(master, bwd);
      }
    }
  }
  void Refresh(Ctx& c) {
    if (!fwd_is_master) to_fwd.execute(c.strm, master, fwd);
    if (has_bwd && !bwd_is_fwd) to_bwd.execute(c.strm, master, bwd);
  }
};

// Gradient of the weights: computed in the primitive's layout, reordered to the plain fp32 grad.
struct WeightGrad {
  memory plain, work;
  dnnl::reorder to_plain;
  bool direct = false;
  void Init(Ctx& c, const memory::desc& plain_md, float* grad, const memory::desc& work_md) {
    plain = memory(plain_md, c.eng, grad);
    direct = work_md == plain_md;
    if (direct) {
      work = plain;
    } else {
      work = memory(work_md, c.eng);
      to_plain = dnnl::reorder(work, plain);
    }
  }
  void Export(Ctx& c) {
    if (!direct) to_plain.execute(c.strm, work, plain);
  }
};

// Backward of a fused leaky ReLU: diff_dst *= (dst > 0 ? 1 : alpha), in place, from the op's dst.
struct FusedLeakyBwd {
  bool on = false;
  dnnl::eltwise_backward prim;
  void Init(Ctx& c, bool fuse, float alpha, const memory::desc& dst_md) {
    on = fuse && c.training;
    if (!on) return;
    auto fwd_pd = dnnl::eltwise_forward::primitive_desc(
        dnnl::eltwise_forward::desc(dnnl::prop_kind::forward_training,
                                    dnnl::algorithm::eltwise_relu_use_dst_for_bwd, dst_md, alpha, 0.f),
        c.eng);
    auto pd = dnnl::eltwise_backward::primitive_desc(
        dnnl::eltwise_backward::desc(dnnl::algorithm::eltwise_relu_use_dst_for_bwd, dst_md, dst_md, alpha,
                                     0.f),
        c.eng, fwd_pd);
    prim = dnnl::eltwise_backward(pd);
  }
  void Run(Ctx& c, memory& dst, memory& diff) {
    if (!on) return;
    prim.execute(c.strm, {{DNNL_ARG_DST, dst}, {DNNL_ARG_DIFF_DST, diff}, {DNNL_ARG_DIFF_SRC, diff}});
  }
};

bool IsRef(const char* impl) { return std::string(impl).rfind("ref", 0) == 0; }

// A COSMOFLOW_* switch between one of our kernels and oneDNN's (the tests run both paths): +1 when
// the variable is `ours` ("ours", "transposed"), -1 when it is "onednn", 0 otherwise (the op's rule
// decides).
int ForcedPath(const char* variable, const char* ours) {
  const char* v = std::getenv(variable);
  if (v == nullptr) return 0;
  if (std::string(v) == "onednn") return -1;
  return std::string(v) == ours ? 1 : 0;
}

// True when oneDNN's primitive runs as im2col + gemm rather than a direct kernel.
bool IsGemm(const char* impl) { return std::string(impl).find("gemm") != std::string::npos; }

// The backward-weights and backward-data implementations oneDNN picks for a conv with this concrete
// src layout.
std::pair<std::string, std::string> BackwardImpls(Ctx& c, const memory::desc& src_md,
                                                  const dnnl::convolution_forward::primitive_desc& fwd_pd,
                                                  int64_t oc, int64_t ic, int64_t k, const memory::desc& b_md,
                                                  const Dims& strides, const Dims& padl, const Dims& padr) {
  auto w = dnnl::convolution_backward_weights::primitive_desc(
      dnnl::convolution_backward_weights::desc(dnnl::algorithm::convolution_direct, src_md,
                                               memory::desc({oc, ic, k, k, k}, Dt::f32, Tag::any), b_md,
                                               fwd_pd.dst_desc(), strides, padl, padr),
      c.eng, fwd_pd);
  auto d = dnnl::convolution_backward_data::primitive_desc(
      dnnl::convolution_backward_data::desc(dnnl::algorithm::convolution_direct, src_md,
                                            memory::desc({oc, ic, k, k, k}, c.dt, Tag::any), fwd_pd.dst_desc(),
                                            strides, padl, padr),
      c.eng, fwd_pd);
  return {w.impl_info_str(), d.impl_info_str()};
}

// Whether oneDNN has non-reference backward kernels for a conv with this concrete src layout.
bool BackwardIsJit(Ctx& c, const memory::desc& src_md, const dnnl::convolution_forward::primitive_desc& fwd_pd,
                   int64_t oc, int64_t ic, int64_t k, const memory::desc& b_md, const Dims& strides,
                   const Dims& padl, const Dims& padr, bool need_bwd_data = true) {
  auto [w, d] = BackwardImpls(c, src_md, fwd_pd, oc, ic, k, b_md, strides, padl, padr);
  return !IsRef(w.c_str()) && (!need_bwd_data || !IsRef(d.c_str()));
}

class ConvOp : public Op {
 public:
  // first_op: the network's first op never runs backward-data (no gradient for the input cube).
  ConvOp(std::string name, Ctx& c, const memory::desc& in_md, const memory& in, const LayerSpec& l,
         bool fuse_leaky, float alpha, ParamStore& w, ParamStore& b, int w_index, bool first_op)
      : Op(std::move(name)) {
    src_md = in_md;
    src = in;
    Dims in_dims = in_md.dims();
    const int64_t n = in_dims[0], ic = in_dims[1], side = in_dims[2];
    const int64_t k = l.kernel, s = l.stride, oc = l.filters;
    const ConvGeometry g = ConvGeometryFor(side, l.kernel, l.stride, l.same_padding);
    const int64_t out = g.out, pl = g.pad_left, pr = g.pad_right;
    flops_ = 2.0 * k * k * k * ic * oc * out * out * out * n;
    geom_ = {ic, oc, k, s, pl, pr};
    Dims strides = {s, s, s}, padl = {pl, pl, pl}, padr = {pr, pr, pr};
    memory::desc w_any({oc, ic, k, k, k}, c.dt, Tag::any);
    memory::desc w_plain({oc, ic, k, k, k}, Dt::f32, Tag::oidhw);
    memory::desc b_md({oc}, Dt::f32, Tag::x);
    const bool channels_last = c.channels_last && in_md == memory::desc(in_dims, c.dt, Tag::ndhwc);
    memory::desc d_any({n, oc, out, out, out}, c.dt, channels_last ? Tag::ndhwc : Tag::any);
    auto prop = c.training ? dnnl::prop_kind::forward_training : dnnl::prop_kind::forward_inference;
    auto make_fwd = [&](const memory::desc& s_md, const memory::desc& d_md) {
      return dnnl::convolution_forward::primitive_desc(
          dnnl::convolution_forward::desc(prop, dnnl::algorithm::convolution_direct, s_md, w_any, b_md, d_md,
                                          strides, padl, padr),
          LeakyAttr(fuse_leaky, alpha), c.eng);
    };
    // Take the incoming layout when real kernels handle it (forward, and in training both backward
    // passes); if oneDNN would fall back to its reference loops, let it choose the src layout and
    // reorder into it (and diff_src back).
    fwd_pd_ = make_fwd(src_md, d_any);
    conv_src_md_ = src_md;
    conv_src_ = src;
    // -1 when a pass the op runs (forward; in training backward-weights and, but for the first op,
    // backward-data) would be oneDNN's reference loops, else how many of them run im2col + gemm
    // rather than a direct kernel. On AVX2 oneDNN 2.6 has no direct 3D backward-weights, and the
    // blocked layouts' fallback is the reference: ndhwc (direct forward and backward-data, gemm
    // backward-weights) beats planar ncdhw (gemm for all three).
    auto gemm_passes = [&](const dnnl::convolution_forward::primitive_desc& pd, const memory::desc& s_md) {
      std::vector<std::string> impls = {pd.impl_info_str()};
      if (c.training) {
        auto [w, d] = BackwardImpls(c, s_md, pd, oc, ic, k, b_md, strides, padl, padr);
        impls.push_back(w);
        if (!first_op) impls.push_back(d);
      }
      int gemm = 0;
      for (const auto& impl : impls) {
        if (IsRef(impl.c_str())) return -1;
        if (IsGemm(impl.c_str())) ++gemm;
      }
      return gemm;
    };
    if (const int incoming = gemm_passes(fwd_pd_, src_md); incoming != 0) {
      // The incoming layout, oneDNN's own choice, then the usual blocked / channels-last / planar
      // layouts for src and dst: the first with only direct kernels, else the one with fewest gemm
      // passes, else oneDNN's choice.
      // (e.g. a 4-channel fp32 training conv has real backward kernels only for ndhwc/ndhwc.)
      dnnl::convolution_forward::primitive_desc best;
      int best_gemm = incoming;
      if (best_gemm >= 0) best = fwd_pd_;
      fwd_pd_ = make_fwd(memory::desc(in_dims, c.dt, Tag::any), d_any);
      std::vector<std::pair<Tag, Tag>> candidates = {{Tag::any, Tag::any}};
      for (Tag dt_tag : {Tag::any, Tag::ndhwc, Tag::nCdhw16c, Tag::nCdhw8c, Tag::ncdhw}) {
        for (Tag t : {Tag::any, Tag::nCdhw16c, Tag::nCdhw8c, Tag::ndhwc, Tag::ncdhw}) {
          candidates.push_back({t, dt_tag});
        }
      }
      const Dims out_dims = {n, oc, out, out, out};
      for (auto [t, dt_tag] : candidates) {
        if (best && best_gemm == 0) break;
        dnnl::convolution_forward::primitive_desc pd;
        try {
          pd = make_fwd(memory::desc(in_dims, c.dt, t),
                        dt_tag == Tag::any ? d_any : memory::desc(out_dims, c.dt, dt_tag));
        } catch (const dnnl::error&) {
          continue;  // no implementation at all for this pair
        }
        const int g = gemm_passes(pd, pd.src_desc());
        if (g >= 0 && (!best || g < best_gemm)) {
          best = pd;
          best_gemm = g;
        }
      }
      if (best) fwd_pd_ = best;
      // With one input channel ncdhw and ndhwc are the same bytes and compare equal, yet oneDNN picks
      // its kernels by the layout tag the desc carries: keep the chosen desc even when no reorder is due.
      conv_src_md_ = fwd_pd_.src_desc();
      if (fwd_pd_.src_desc() != src_md) {
        conv_src_ = memory(conv_src_md_, c.eng);
        src_reorder_ = dnnl::reorder(src, conv_src_);
        reorder_src_ = true;
      }
    }
    fwd_ = dnnl::convolution_forward(fwd_pd_);
    dst_md = fwd_pd_.dst_desc();
    dst = memory(dst_md, c.eng);
    impl_ = std::string("fwd=") + fwd_pd_.impl_info_str();
    bias_ = memory(b_md, c.eng, b.value.data());
    params = {w_index, w_index + 1};
    if (c.training) {
      bwd_w_pd_ = dnnl::convolution_backward_weights::primitive_desc(
          dnnl::convolution_backward_weights::desc(dnnl::algorithm::convolution_direct, conv_src_md_,
                                                   memory::desc({oc, ic, k, k, k}, Dt::f32, Tag::any), b_md,
                                                   dst_md, strides, padl, padr),
          c.eng, fwd_pd_);
      if (UseFirstConvWeightGrad(first_op, in_dims, {n, oc, out, out, out})) {
        auto kernel = std::make_shared<FirstConvWeightGrad>(static_cast<int>(n), static_cast<int>(ic),
                                                            static_cast<int>(side), static_cast<int>(k),
                                                            static_cast<int>(pl), static_cast<int>(out));
        own_wgrad_ = [kernel, gw = w.grad.data(), gb = b.grad.data()](const float* x, const float* dy) {
          kernel->Run(x, dy, gw, gb);
        };
        impl_ += std::string(" bwd_w=cosmoflow:first_conv_wgrad(") + FirstBlockKernel::Isa() + ")";
      } else if (UseChannelsLastWeightGrad(in_dims, {n, oc, out, out, out})) {
        auto kernel = std::make_shared<ChannelsLastWeightGrad>(
            static_cast<int>(n), static_cast<int>(ic), static_cast<int>(oc), static_cast<int>(side),
            static_cast<int>(k), static_cast<int>(pl), static_cast<int>(out));
        own_wgrad_ = [kernel, gw = w.grad.data(), gb = b.grad.data()](const float* x, const float* dy) {
          kernel->Run(x, dy, gw, gb);
        };
        impl_ += " bwd_w=cosmoflow:channels_last_wgrad(avx2)";
      } else {  // oneDNN's primitive (not generated when ours replaces it)
        bwd_w_ = dnnl::convolution_backward_weights(bwd_w_pd_);
        wgrad_.Init(c, w_plain, w.grad.data(), bwd_w_pd_.diff_weights_desc());
        diff_bias_ = memory(b_md, c.eng, b.grad.data());
        impl_ += std::string(" bwd_w=") + bwd_w_pd_.impl_info_str();
      }
      bwd_d_pd_ = dnnl::convolution_backward_data::primitive_desc(
          dnnl::convolution_backward_data::desc(dnnl::algorithm::convolution_direct, conv_src_md_, w_any,
                                                dst_md, strides, padl, padr),
          c.eng, fwd_pd_);
      auto bwd_w_md = bwd_d_pd_.weights_desc();
      weights_.Init(c, w_plain, w.value.data(), fwd_pd_.weights_desc(), &bwd_w_md);
      leaky_bwd_.Init(c, fuse_leaky, alpha, dst_md);
    } else {
      weights_.Init(c, w_plain, w.value.data(), fwd_pd_.weights_desc(), nullptr);
    }
  }

  void EnableBwdData(Ctx& c) {
    // Created lazily: the first layer never computes diff_src.
    has_bwd_d_ = true;
    if (UseTransposedBwdData(c)) {
      SetUpTransposedBwdData(c);
    } else {
      bwd_d_ = dnnl::convolution_backward_data(bwd_d_pd_);
      impl_ += std::string(" bwd_d=") + bwd_d_pd_.impl_info_str();
    }
    if (reorder_src_) {
      conv_diff_src_ = memory(conv_src_md_, c.eng);
      diff_src_reorder_ = dnnl::reorder(dnnl::reorder::primitive_desc(c.eng, conv_src_md_, c.eng, src_md));
    }
  }

  void Forward(Ctx& c) override {
    if (reorder_src_) src_reorder_.execute(c.strm, src, conv_src_);
    fwd_.execute(c.strm, {{DNNL_ARG_SRC, conv_src_}, {DNNL_ARG_WEIGHTS, weights_.fwd}, {DNNL_ARG_BIAS, bias_},
                          {DNNL_ARG_DST, dst}});
  }
  void Backward(Ctx& c, bool need_diff_src) override {
    leaky_bwd_.Run(c, dst, diff_dst);
    if (own_wgrad_) {
      own_wgrad_(static_cast<const float*>(conv_src_.get_data_handle()),
                 static_cast<const float*>(diff_dst.get_data_handle()));
    } else {
      bwd_w_.execute(c.strm, {{DNNL_ARG_SRC, conv_src_}, {DNNL_ARG_DIFF_DST, diff_dst},
                              {DNNL_ARG_DIFF_WEIGHTS, wgrad_.work}, {DNNL_ARG_DIFF_BIAS, diff_bias_}});
      wgrad_.Export(c);
    }
    if (need_diff_src && has_bwd_d_) {
      memory& out = reorder_src_ ? conv_diff_src_ : diff_src;
      if (transposed_bwd_d_) {
        tr_fwd_.execute(c.strm, {{DNNL_ARG_SRC, diff_dst}, {DNNL_ARG_WEIGHTS, tr_weights_}, {DNNL_ARG_DST, out}});
      } else {
        bwd_d_.execute(c.strm, {{DNNL_ARG_DIFF_DST, diff_dst}, {DNNL_ARG_WEIGHTS, weights_.bwd},
                                {DNNL_ARG_DIFF_SRC, out}});
      }
      if (reorder_src_) diff_src_reorder_.execute(c.strm, conv_diff_src_, diff_src);
    }
  }
  void RefreshWeights(Ctx& c) override {
    weights_.Refresh(c);
    if (transposed_bwd_d_) RefreshTransposedWeights(c);
  }
  double FwdFlops() const override { return flops_; }
  double BwdFlops(bool need_diff_src) const override { return flops_ * (need_diff_src ? 2 : 1); }
  std::string Impl() const override { return impl_ + (reorder_src_ ? " (src reordered)" : ""); }

 private:
  struct Geometry {
    int64_t ic = 0, oc = 0, k = 0, stride = 0, pad_left = 0, pad_right = 0;
  };

  // Both weight-gradient kernels read fp32 channels-last (ndhwc) src and diff_dst.
  bool Fp32ChannelsLast(const Dims& in_dims, const Dims& out_dims) const {
    return conv_src_md_ == memory::desc(in_dims, Dt::f32, Tag::ndhwc) &&
           dst_md == memory::desc(out_dims, Dt::f32, Tag::ndhwc);
  }

  // The first conv's weight gradient by our kernel (FirstConvWeightGrad) where oneDNN would run it
  // as im2col + gemm and ChannelsLastWeightGrad does not take the shape (1-3 input channels): fp32,
  // channels-last src and dst, a shape the kernel takes. With AVX-512
  // oneDNN has direct kernels, so this is for AVX2 builds. COSMOFLOW_FIRST_CONV_WGRAD=onednn|ours
  // overrides the rule (the tests run both).
  bool UseFirstConvWeightGrad(bool first_op, const Dims& in_dims, const Dims& out_dims) const {
    if (!first_op || !Fp32ChannelsLast(in_dims, out_dims) ||
        !FirstConvWeightGrad::Supported(static_cast<int>(geom_.ic), static_cast<int>(geom_.oc),
                                        static_cast<int>(geom_.k), static_cast<int>(geom_.stride))) {
      return false;
    }
    if (const int forced = ForcedPath("COSMOFLOW_FIRST_CONV_WGRAD", "ours"); forced != 0) return forced > 0;
    // ChannelsLastWeightGrad takes 4 channels too, 1.8x faster (it reads ndhwc in place).
    return IsGemm(bwd_w_pd_.impl_info_str()) &&
           !ChannelsLastWeightGrad::Supported(static_cast<int>(geom_.ic), static_cast<int>(geom_.oc),
                                              static_cast<int>(geom_.stride));
  }

  // Any other conv's weight gradient by our kernel (ChannelsLastWeightGrad) where oneDNN would run
  // it as im2col + gemm (AVX2): fp32, channels-last src and dst, a shape the kernel takes.
  // COSMOFLOW_CONV_WGRAD=onednn|ours overrides the rule (the tests run both).
  bool UseChannelsLastWeightGrad(const Dims& in_dims, const Dims& out_dims) const {
    if (!Fp32ChannelsLast(in_dims, out_dims) ||
        !ChannelsLastWeightGrad::Supported(static_cast<int>(geom_.ic), static_cast<int>(geom_.oc),
                                           static_cast<int>(geom_.stride))) {
      return false;
    }
    if (const int forced = ForcedPath("COSMOFLOW_CONV_WGRAD", "ours"); forced != 0) return forced > 0;
    return IsGemm(bwd_w_pd_.impl_info_str());
  }

  // Backward-data of a stride-1 convolution is itself a convolution: diff_src = diff_dst, padded by
  // k-1-pad on each side, convolved with the weights transposed (ic <-> oc) and flipped in space.
  // oneDNN 2.6's fp32 forward kernel runs that faster than its backward-data kernel when the input
  // has a single 16-channel block: sc18's conv1 (16 -> 32, k 4, 63^3, batch 4) 149 ms vs 194 ms,
  // 16 -> 16 (k 4, 30^3) 7.1 vs 7.7 ms; with 32 input channels it is a wash or slower (sc18 conv2 59
  // vs 55 ms), and in bf16 within 3%. COSMOFLOW_CONV_BWD_DATA=onednn|transposed overrides the rule
  // (the tests run both).
  bool UseTransposedBwdData(Ctx& c) const {
    if (geom_.stride != 1) return false;  // the identity above holds for stride 1 only
    if (const int forced = ForcedPath("COSMOFLOW_CONV_BWD_DATA", "transposed"); forced != 0) return forced > 0;
    return c.dt == Dt::f32 && geom_.ic <= 16;
  }

  void SetUpTransposedBwdData(Ctx& c) {
    const int64_t ic = geom_.ic, oc = geom_.oc, k = geom_.k;
    const Dims tr_dims = {ic, oc, k, k, k};
    const int64_t pl = k - 1 - geom_.pad_left, pr = k - 1 - geom_.pad_right;
    dnnl::convolution_forward::primitive_desc pd;
    try {
      pd = dnnl::convolution_forward::primitive_desc(
          dnnl::convolution_forward::desc(dnnl::prop_kind::forward_inference, dnnl::algorithm::convolution_direct,
                                          dst_md, memory::desc(tr_dims, c.dt, Tag::any), conv_src_md_, {1, 1, 1},
                                          {pl, pl, pl}, {pr, pr, pr}),
          c.eng);
    } catch (const dnnl::error&) {
      // no implementation at all for these layouts: handled below like a reference one
    }
    if (!pd || IsRef(pd.impl_info_str())) {  // no real kernel: keep oneDNN's backward-data
      bwd_d_ = dnnl::convolution_backward_data(bwd_d_pd_);
      impl_ += std::string(" bwd_d=") + bwd_d_pd_.impl_info_str();
      return;
    }
    transposed_bwd_d_ = true;
    weights_.has_bwd = false;  // the flipped copy below replaces the backward-data working weights
    tr_fwd_ = dnnl::convolution_forward(pd);
    impl_ += std::string(" bwd_d=transposed_fwd:") + pd.impl_info_str();
    tr_plain_.assign(ic * oc * k * k * k, 0.f);
    tr_plain_mem_ = memory(memory::desc(tr_dims, Dt::f32, Tag::oidhw), c.eng, tr_plain_.data());
    tr_weights_ = memory(pd.weights_desc(), c.eng);
    tr_reorder_ = dnnl::reorder(tr_plain_mem_, tr_weights_);
    RefreshTransposedWeights(c);
  }

  // tr[i][o][a][b][d] = w[o][i][k-1-a][k-1-b][k-1-d], then into the kernel's layout.
  void RefreshTransposedWeights(Ctx& c) {
    const int64_t ic = geom_.ic, oc = geom_.oc, k = geom_.k, k3 = k * k * k;
    const float* w = static_cast<const float*>(weights_.master.get_data_handle());
    for (int64_t o = 0; o < oc; ++o) {
      for (int64_t i = 0; i < ic; ++i) {
        const float* src = w + (o * ic + i) * k3;
        float* dst = tr_plain_.data() + (i * oc + o) * k3;
        for (int64_t t = 0; t < k3; ++t) dst[t] = src[k3 - 1 - t];
      }
    }
    tr_reorder_.execute(c.strm, tr_plain_mem_, tr_weights_);
  }

  Geometry geom_;
  bool transposed_bwd_d_ = false;
  dnnl::convolution_forward tr_fwd_;
  std::vector<float> tr_plain_;
  memory tr_plain_mem_, tr_weights_;
  dnnl::reorder tr_reorder_;
  memory::desc conv_src_md_;
  memory conv_src_, conv_diff_src_;
  dnnl::reorder src_reorder_, diff_src_reorder_;
  bool reorder_src_ = false;
  double flops_ = 0;
  dnnl::convolution_forward::primitive_desc fwd_pd_;
  dnnl::convolution_forward fwd_;
  dnnl::convolution_backward_weights::primitive_desc bwd_w_pd_;
  dnnl::convolution_backward_weights bwd_w_;
  dnnl::convolution_backward_data::primitive_desc bwd_d_pd_;
  dnnl::convolution_backward_data bwd_d_;
  bool has_bwd_d_ = false;
  WorkingWeights weights_;
  WeightGrad wgrad_;
  memory bias_, diff_bias_;
  FusedLeakyBwd leaky_bwd_;
  // One of our weight-gradient kernels (src, diff_dst) -> the parameters' gradients; replaces
  // bwd_w_ when set.
  std::function<void(const float*, const float*)> own_wgrad_;
};

class DenseOp : public Op {
 public:
  DenseOp(std::string name, Ctx& c, const memory::desc& in_md, const memory& in, int units, bool fuse_leaky,
          float alpha, ParamStore& w, ParamStore& b, int w_index)
      : Op(std::move(name)) {
    src_md = in_md;
    src = in;
    Dims in_dims = in_md.dims();
    const int64_t n = in_dims[0], o = units;
    Dims w_dims = in_dims;
    w_dims[0] = o;
    int64_t features = 1;
    for (size_t i = 1; i < in_dims.size(); ++i) features *= in_dims[i];
    flops_ = 2.0 * features * o * n;
    memory::desc w_any(w_dims, c.dt, Tag::any);
    memory::desc w_plain(w_dims, Dt::f32, PlainTag(w_dims.size()));
    memory::desc b_md({o}, Dt::f32, Tag::x);
    memory::desc d_any({n, o}, c.dt, Tag::any);
    auto prop = c.training ? dnnl::prop_kind::forward_training : dnnl::prop_kind::forward_inference;
    fwd_pd_ = dnnl::inner_product_forward::primitive_desc(
        dnnl::inner_product_forward::desc(prop, src_md, w_any, b_md, d_any), LeakyAttr(fuse_leaky, alpha), c.eng);
    fwd_ = dnnl::inner_product_forward(fwd_pd_);
    dst_md = fwd_pd_.dst_desc();
    dst = memory(dst_md, c.eng);
    impl_ = std::string("fwd=") + fwd_pd_.impl_info_str();
    bias_ = memory(b_md, c.eng, b.value.data());
    params = {w_index, w_index + 1};
    if (c.training) {
      bwd_w_pd_ = dnnl::inner_product_backward_weights::primitive_desc(
          dnnl::inner_product_backward_weights::desc(src_md, memory::desc(w_dims, Dt::f32, Tag::any), b_md,
                                                     dst_md),
          c.eng, fwd_pd_);
      bwd_w_ = dnnl::inner_product_backward_weights(bwd_w_pd_);
      wgrad_.Init(c, w_plain, w.grad.data(), bwd_w_pd_.diff_weights_desc());
      diff_bias_ = memory(b_md, c.eng, b.grad.data());
      bwd_d_pd_ = dnnl::inner_product_backward_data::primitive_desc(
          dnnl::inner_product_backward_data::desc(src_md, w_any, dst_md), c.eng, fwd_pd_);
      bwd_d_ = dnnl::inner_product_backward_data(bwd_d_pd_);
      auto bwd_w_md = bwd_d_pd_.weights_desc();
      weights_.Init(c, w_plain, w.value.data(), fwd_pd_.weights_desc(), &bwd_w_md);
      leaky_bwd_.Init(c, fuse_leaky, alpha, dst_md);
      impl_ += std::string(" bwd_w=") + bwd_w_pd_.impl_info_str() + " bwd_d=" + bwd_d_pd_.impl_info_str();
    } else {
      weights_.Init(c, w_plain, w.value.data(), fwd_pd_.weights_desc(), nullptr);
    }
  }
  void Forward(Ctx& c) override {
    fwd_.execute(c.strm, {{DNNL_ARG_SRC, src}, {DNNL_ARG_WEIGHTS, weights_.fwd}, {DNNL_ARG_BIAS, bias_},
                          {DNNL_ARG_DST, dst}});
  }
  void Backward(Ctx& c, bool need_diff_src) override {
    leaky_bwd_.Run(c, dst, diff_dst);
    bwd_w_.execute(c.strm, {{DNNL_ARG_SRC, src}, {DNNL_ARG_DIFF_DST, diff_dst},
                            {DNNL_ARG_DIFF_WEIGHTS, wgrad_.work}, {DNNL_ARG_DIFF_BIAS, diff_bias_}});
    wgrad_.Export(c);
    if (need_diff_src) {
      bwd_d_.execute(c.strm, {{DNNL_ARG_DIFF_DST, diff_dst}, {DNNL_ARG_WEIGHTS, weights_.bwd},
                              {DNNL_ARG_DIFF_SRC, diff_src}});
    }
  }
  void RefreshWeights(Ctx& c) override { weights_.Refresh(c); }
  double FwdFlops() const override { return flops_; }
  double BwdFlops(bool need_diff_src) const override { return flops_ * (need_diff_src ? 2 : 1); }

 private:
  double flops_ = 0;
  dnnl::inner_product_forward::primitive_desc fwd_pd_;
  dnnl::inner_product_forward fwd_;
  dnnl::inner_product_backward_weights::primitive_desc bwd_w_pd_;
  dnnl::inner_product_backward_weights bwd_w_;
  dnnl::inner_product_backward_data::primitive_desc bwd_d_pd_;
  dnnl::inner_product_backward_data bwd_d_;
  WorkingWeights weights_;
  WeightGrad wgrad_;
  memory bias_, diff_bias_;
  FusedLeakyBwd leaky_bwd_;
};

class PoolOp : public Op {
 public:
  PoolOp(std::string name, Ctx& c, const memory::desc& in_md, const memory& in, bool max, int size)
      : Op(std::move(name)) {
    src_md = in_md;
    src = in;
    Dims d = in_md.dims();
    const int64_t out = d[2] / size;
    // Floor semantics (27 -> 13): the trailing plane is simply not covered.
    Dims strides = {size, size, size}, kernel = {size, size, size}, pad = {0, 0, 0};
    auto alg = max ? dnnl::algorithm::pooling_max : dnnl::algorithm::pooling_avg_exclude_padding;
    auto prop = c.training ? dnnl::prop_kind::forward_training : dnnl::prop_kind::forward_inference;
    memory::desc d_any({d[0], d[1], out, out, out}, c.dt, Tag::any);
    fwd_pd_ = dnnl::pooling_forward::primitive_desc(
        dnnl::pooling_forward::desc(prop, alg, src_md, d_any, strides, kernel, pad, pad), c.eng);
    fwd_ = dnnl::pooling_forward(fwd_pd_);
    dst_md = fwd_pd_.dst_desc();
    dst = memory(dst_md, c.eng);
    impl_ = std::string("fwd=") + fwd_pd_.impl_info_str();
    if (c.training) {
      if (max) workspace_ = memory(fwd_pd_.workspace_desc(), c.eng);
      has_ws_ = max;
      bwd_pd_ = dnnl::pooling_backward::primitive_desc(
          dnnl::pooling_backward::desc(alg, src_md, dst_md, strides, kernel, pad, pad), c.eng, fwd_pd_);
      bwd_ = dnnl::pooling_backward(bwd_pd_);
      impl_ += std::string(" bwd=") + bwd_pd_.impl_info_str();
    }
  }
  void Forward(Ctx& c) override {
    if (has_ws_) {
      fwd_.execute(c.strm, {{DNNL_ARG_SRC, src}, {DNNL_ARG_DST, dst}, {DNNL_ARG_WORKSPACE, workspace_}});
    } else {
      fwd_.execute(c.strm, {{DNNL_ARG_SRC, src}, {DNNL_ARG_DST, dst}});
    }
  }
  void Backward(Ctx& c, bool need_diff_src) override {
    if (!need_diff_src) return;
    if (has_ws_) {
      bwd_.execute(c.strm, {{DNNL_ARG_DIFF_DST, diff_dst}, {DNNL_ARG_DIFF_SRC, diff_src},
                            {DNNL_ARG_WORKSPACE, workspace_}});
    } else {
      bwd_.execute(c.strm, {{DNNL_ARG_DIFF_DST, diff_dst}, {DNNL_ARG_DIFF_SRC, diff_src}});
    }
  }

 private:
  dnnl::pooling_forward::primitive_desc fwd_pd_;
  dnnl::pooling_forward fwd_;
  dnnl::pooling_backward::primitive_desc bwd_pd_;
  dnnl::pooling_backward bwd_;
  memory workspace_;
  bool has_ws_ = false;
};

class LeakyOp : public Op {
 public:
  LeakyOp(std::string name, Ctx& c, const memory::desc& in_md, const memory& in, float alpha)
      : Op(std::move(name)) {
    src_md = in_md;
    src = in;
    auto prop = c.training ? dnnl::prop_kind::forward_training : dnnl::prop_kind::forward_inference;
    auto alg = dnnl::algorithm::eltwise_relu_use_dst_for_bwd;
    fwd_pd_ = dnnl::eltwise_forward::primitive_desc(dnnl::eltwise_forward::desc(prop, alg, src_md, alpha, 0.f),
                                                    c.eng);
    fwd_ = dnnl::eltwise_forward(fwd_pd_);
    dst_md = fwd_pd_.dst_desc();
    dst = memory(dst_md, c.eng);
    impl_ = std::string("fwd=") + fwd_pd_.impl_info_str();
    if (c.training) {
      auto pd = dnnl::eltwise_backward::primitive_desc(dnnl::eltwise_backward::desc(alg, dst_md, dst_md, alpha, 0.f),
                                                       c.eng, fwd_pd_);
      bwd_ = dnnl::eltwise_backward(pd);
    }
  }
  void Forward(Ctx& c) override { fwd_.execute(c.strm, {{DNNL_ARG_SRC, src}, {DNNL_ARG_DST, dst}}); }
  void Backward(Ctx& c, bool need_diff_src) override {
    if (!need_diff_src) return;
    bwd_.execute(c.strm, {{DNNL_ARG_DST, dst}, {DNNL_ARG_DIFF_DST, diff_dst}, {DNNL_ARG_DIFF_SRC, diff_src}});
  }

 private:
  dnnl::eltwise_forward::primitive_desc fwd_pd_;
  dnnl::eltwise_forward fwd_;
  dnnl::eltwise_backward bwd_;
};

// Inverted dropout: kept elements are scaled by 1/(1-rate) in training; identity in inference. The
// mask is a hash of (seed, training step, layer, element), so backward regenerates it instead of
// storing it, and a run is reproducible from the seed.
class DropoutOp : public Op {
 public:
  DropoutOp(std::string name, Ctx& c, const memory::desc& in_md, const memory& in, float rate, int layer)
      : Op(std::move(name)), rate_(rate), layer_(layer) {
    src_md = in_md;
    src = in;
    dst_md = in_md;
    dst = memory(dst_md, c.eng);
    elems_ = static_cast<int64_t>(dst_md.get_size() / (c.dt == Dt::f32 ? 4 : 2));
    impl_ = "cosmoflow:dropout";
  }
  void Forward(Ctx& c) override { Apply(c, src, dst, c.training); }
  void Backward(Ctx& c, bool need_diff_src) override {
    if (need_diff_src) Apply(c, diff_dst, diff_src, true);
  }

 private:
  void Apply(Ctx& c, memory& in, memory& out, bool active) {
    const float keep_scale = 1.f / (1.f - rate_);
    const uint64_t seed = c.seed, step = c.step;
    const int layer = layer_;
    const float rate = rate_;
    const int64_t n = elems_;
    if (c.dt == Dt::f32) {
      const float* x = static_cast<const float*>(in.get_data_handle());
      float* y = static_cast<float*>(out.get_data_handle());
      if (!active) {
        std::memcpy(y, x, n * sizeof(float));
        return;
      }
#pragma omp parallel for schedule(static) if (n > 65536)
      for (int64_t i = 0; i < n; ++i) {
        y[i] = nn_internal::DropoutUniform(seed, step, layer, i) < rate ? 0.f : x[i] * keep_scale;
      }
    } else {
      const uint16_t* x = static_cast<const uint16_t*>(in.get_data_handle());
      uint16_t* y = static_cast<uint16_t*>(out.get_data_handle());
      if (!active) {
        std::memcpy(y, x, n * sizeof(uint16_t));
        return;
      }
#pragma omp parallel for schedule(static) if (n > 65536)
      for (int64_t i = 0; i < n; ++i) {
        y[i] = nn_internal::DropoutUniform(seed, step, layer, i) < rate ? uint16_t{0}
                                                                        : F32ToBf16(Bf16ToF32(x[i]) * keep_scale);
      }
    }
  }
  float rate_;
  int layer_;
  int64_t elems_ = 0;
};

// The fused first block (1-channel conv + leaky ReLU + average pool) as an op.
class FirstBlockOp : public Op {
 public:
  FirstBlockOp(std::string name, Ctx& c, const LayerSpec& conv, float alpha, int pool, int side,
               const memory::desc& dst_desc, int channel_stride, ParamStore& w, ParamStore& b, int w_index)
      : Op(std::move(name)),
        kernel_(c.batch, side, conv.filters, conv.kernel, alpha, pool, c.dt == Dt::bf16, c.training,
                channel_stride) {
    params = {w_index, w_index + 1};
    w_ = &w;
    b_ = &b;
    dst_md = dst_desc;
    dst = memory(dst_md, c.eng);
    impl_ = std::string("cosmoflow:first_block(conv+leaky+avgpool, ") + FirstBlockKernel::Isa() + ")";
  }
  void SetInput(const float* x) { input_ = x; }
  void Forward(Ctx& c) override { kernel_.Forward(input_, w_->value.data(), b_->value.data(), dst.get_data_handle()); }
  void Backward(Ctx& c, bool need_diff_src) override {
    kernel_.BackwardWeights(input_, w_->value.data(), b_->value.data(), diff_dst.get_data_handle(),
                            w_->grad.data(), b_->grad.data());
  }
  void RefreshWeights(Ctx& c) override {}
  double FwdFlops() const override { return kernel_.ConvFlops(); }
  double BwdFlops(bool) const override { return kernel_.ConvFlops(); }

 private:
  FirstBlockKernel kernel_;
  const float* input_ = nullptr;
  ParamStore* w_ = nullptr;
  ParamStore* b_ = nullptr;
};

// Index of the layout in `candidates` that a conv `l` on src dims `dims` picks with src = any
// (0 if it picks none of them). In fp32 training it may choose channels-last and set c.channels_last.
int PreferredSrcLayout(Ctx& c, const Dims& dims, const LayerSpec& l,
                       const std::vector<std::pair<memory::desc, int>>& candidates) {
  const int64_t k = l.kernel, s = l.stride;
  const ConvGeometry g = ConvGeometryFor(dims[2], l.kernel, l.stride, l.same_padding);
  const int64_t out = g.out, pl = g.pad_left, pr = g.pad_right;
  auto prop = c.training ? dnnl::prop_kind::forward_training : dnnl::prop_kind::forward_inference;
  auto pd = dnnl::convolution_forward::primitive_desc(
      dnnl::convolution_forward::desc(prop, dnnl::algorithm::convolution_direct,
                                      memory::desc(dims, c.dt, Tag::any),
                                      memory::desc({l.filters, dims[1], k, k, k}, c.dt, Tag::any),
                                      memory::desc({l.filters}, Dt::f32, Tag::x),
                                      memory::desc({dims[0], l.filters, out, out, out}, c.dt, Tag::any), {s, s, s},
                                      {pl, pl, pl}, {pr, pr, pr}),
      c.eng);
  for (size_t i = 0; i < candidates.size(); ++i) {
    if (pd.src_desc() == candidates[i].first && !c.training) return static_cast<int>(i);
  }
  // fp32 training: channels-last throughout when every pass has a real kernel on ndhwc src and dst.
  // oneDNN 2.6 runs its brgemm forward only on ndhwc, and only when dst is ndhwc too (with dst
  // "any" it offers nothing but ref): sc18's conv1 forward 136 vs 160 ms (blocked jit), the
  // backward passes and conv2 within noise, the whole sc18 step 4% faster. Not for inference, bf16
  // or the mlperf network, where channels-last measured slower. COSMOFLOW_CHANNELS_LAST=0 turns it
  // off (the tests compare both).
  const char* cl = std::getenv("COSMOFLOW_CHANNELS_LAST");
  if (c.training && c.dt == Dt::f32 && (cl == nullptr || cl[0] != '0')) {
    const memory::desc nhwc(dims, c.dt, Tag::ndhwc);
    for (size_t i = 0; i < candidates.size(); ++i) {
      if (candidates[i].first != nhwc) continue;
      try {
        auto fwd = dnnl::convolution_forward::primitive_desc(
            dnnl::convolution_forward::desc(prop, dnnl::algorithm::convolution_direct, nhwc,
                                            memory::desc({l.filters, dims[1], k, k, k}, c.dt, Tag::any),
                                            memory::desc({l.filters}, Dt::f32, Tag::x),
                                            memory::desc({dims[0], l.filters, out, out, out}, c.dt, Tag::ndhwc),
                                            {s, s, s}, {pl, pl, pl}, {pr, pr, pr}),
            c.eng);
        if (!IsRef(fwd.impl_info_str()) &&
            BackwardIsJit(c, nhwc, fwd, l.filters, dims[1], k, memory::desc({l.filters}, Dt::f32, Tag::x),
                          {s, s, s}, {pl, pl, pl}, {pr, pr, pr})) {
          c.channels_last = true;
          return static_cast<int>(i);
        }
      } catch (const dnnl::error&) {
        // no implementation for ndhwc: fall through to oneDNN's preference
      }
    }
  }
  // Training: the first candidate whose forward and backward kernels are all real (not ref).
  for (size_t i = 0; i < candidates.size(); ++i) {
    auto fwd = dnnl::convolution_forward::primitive_desc(
        dnnl::convolution_forward::desc(prop, dnnl::algorithm::convolution_direct, candidates[i].first,
                                        memory::desc({l.filters, dims[1], k, k, k}, c.dt, Tag::any),
                                        memory::desc({l.filters}, Dt::f32, Tag::x),
                                        memory::desc({dims[0], l.filters, out, out, out}, c.dt, Tag::any),
                                        {s, s, s}, {pl, pl, pl}, {pr, pr, pr}),
        c.eng);
    if (IsRef(fwd.impl_info_str())) continue;
    if (!c.training || BackwardIsJit(c, candidates[i].first, fwd, l.filters, dims[1], k,
                                     memory::desc({l.filters}, Dt::f32, Tag::x), {s, s, s}, {pl, pl, pl},
                                     {pr, pr, pr})) {
      return static_cast<int>(i);
    }
  }
  return 0;
}

class NetworkImpl : public Network {
 public:
  const ModelSpec& spec() const override { return spec_; }
  const NetworkOptions& options() const override { return options_; }
  std::vector<Parameter>& parameters() override { return params_; }

  Status Build(const ModelSpec& spec, const NetworkOptions& options);

  void ParametersUpdated() override {
    for (auto& op : ops_) op->RefreshWeights(ctx_);
    ctx_.strm.wait();
  }

  void InitParameters(uint64_t seed) override {
    for (size_t i = 0; i < stores_.size(); ++i) {
      ParamStore& p = *stores_[i];
      const bool is_bias = p.shape.size() == 1;
      if (is_bias) {
        std::fill(p.value.begin(), p.value.end(), 0.f);
        continue;
      }
      int64_t fan_in = 1;
      for (size_t d = 1; d < p.shape.size(); ++d) fan_in *= p.shape[d];
      const float bound = std::sqrt(6.f / static_cast<float>(fan_in));
      uint64_t state = nn_internal::SplitMix64(seed * 0x9E3779B97F4A7C15ull + i + 1);
      for (auto& v : p.value) {
        state = nn_internal::SplitMix64(state);
        float u = static_cast<float>(state >> 40) * (1.0f / 16777216.0f);
        v = (2.f * u - 1.f) * bound;
      }
    }
    ParametersUpdated();
  }

  Status LoadParameters(const std::vector<NamedTensor>& tensors) override {
    for (auto& p : stores_) {
      const NamedTensor* t = nullptr;
      for (const auto& cand : tensors) {
        if (cand.name == p->name) {
          t = &cand;
          break;
        }
      }
      if (t == nullptr) return NotFoundError("parameter '" + p->name + "' missing from the loaded tensors");
      if (t->shape != p->shape || static_cast<int64_t>(t->data.size()) != static_cast<int64_t>(p->value.size())) {
        return InvalidArgumentError("parameter '" + p->name + "': shape " + ShapeString(t->shape) +
                                    " does not match the network's " + ShapeString(p->shape));
      }
    }
    for (auto& p : stores_) {
      for (const auto& t : tensors) {
        if (t.name == p->name) {
          std::copy(t.data.begin(), t.data.end(), p->value.begin());
          break;
        }
      }
    }
    ParametersUpdated();
    return Status::Ok();
  }

  std::vector<NamedTensor> ExportParameters() const override {
    std::vector<NamedTensor> out;
    for (const auto& p : stores_) out.push_back({p->name, p->shape, p->value});
    return out;
  }

  void Forward(const float* src, float* dst) override;
  void Backward(const float* diff_dst, const std::function<void(int)>& on_grad_ready) override;

  void SetTrainingStep(uint64_t step) override { ctx_.step = step; }
  void SetProfiling(bool on) override { profiling_ = on; }
  std::string ProfileReport() const override;

 private:
  static std::string ShapeString(const std::vector<int64_t>& s) {
    std::string r = "[";
    for (size_t i = 0; i < s.size(); ++i) r += (i ? "," : "") + std::to_string(s[i]);
    return r + "]";
  }
  int AddParam(const std::string& name, std::vector<int64_t> shape) {
    auto p = std::make_unique<ParamStore>();
    p->name = name;
    p->shape = std::move(shape);
    int64_t n = 1;
    for (auto d : p->shape) n *= d;
    p->value.assign(n, 0.f);
    if (ctx_.training) p->grad.assign(n, 0.f);
    stores_.push_back(std::move(p));
    return static_cast<int>(stores_.size()) - 1;
  }

  ModelSpec spec_;
  NetworkOptions options_;
  Ctx ctx_;
  std::vector<std::unique_ptr<ParamStore>> stores_;
  std::vector<Parameter> params_;
  std::vector<std::unique_ptr<Op>> ops_;
  FirstBlockOp* first_block_ = nullptr;

  // Edges.
  memory user_src_, net_src_;
  bool src_reorder_ = false;
  dnnl::reorder src_reorder_prim_;
  memory user_dst_;
  dnnl::reorder dst_reorder_prim_;
  memory user_diff_;
  dnnl::reorder diff_reorder_prim_;
  std::vector<float> out_copy_;   // outputs kept for the scaled-tanh backward
  std::vector<float> diff_copy_;  // adjusted diff_dst
  float tanh_scale_ = 0.f;        // 0: no scaled tanh
  int outputs_ = 0;
  AlignedBuffer diff_buffers_[2];

  bool profiling_ = false;
  double edge_fwd_ms_ = 0, edge_bwd_ms_ = 0;
};

Status NetworkImpl::Build(const ModelSpec& spec, const NetworkOptions& options) {
  CF_RETURN_IF_ERROR(spec.Validate());
  if (options.batch <= 0 || options.batch > 4096) {
    return InvalidArgumentError("network: batch must be in [1, 4096], got " + std::to_string(options.batch));
  }
  spec_ = spec;
  options_ = options;
  ctx_.dt = options.precision == Precision::kBf16 ? Dt::bf16 : Dt::f32;
  ctx_.training = options.training;
  ctx_.batch = options.batch;
  ctx_.seed = options.seed;
  if (ctx_.dt == Dt::bf16 && !Bf16Supported()) {
    return FailedPreconditionError("network: bf16 needs a CPU with AVX512-BF16 or AMX");
  }
  const int64_t n = options.batch, c0 = spec.input_channels, side = spec.input_side;
  outputs_ = [&] { int u = 0; for (const auto& l : spec.layers) if (l.type == LayerType::kDense) u = l.units; return u; }();

  size_t li = 0;
  int conv_count = 0, dense_count = 0, pool_count = 0, act_count = 0, drop_count = 0;
  memory::desc cur_md;
  memory cur;
  user_src_ = memory(memory::desc({n, c0, side, side, side}, Dt::f32, Tag::ncdhw), ctx_.eng, DNNL_MEMORY_NONE);

  // Fast path for the first block: 1-channel conv (stride 1) + leaky ReLU + average pool.
  const auto& L = spec.layers;
  const char* no_fuse = std::getenv("COSMOFLOW_NO_FUSED_FIRST_BLOCK");
  if ((no_fuse == nullptr || no_fuse[0] == '0') && L.size() >= 3 && c0 == 1 && L[0].type == LayerType::kConv3d &&
      L[1].type == LayerType::kLeakyRelu && L[2].type == LayerType::kAvgPool &&
      FirstBlockKernel::Supported(static_cast<int>(side), L[0].filters, L[0].kernel, L[0].stride,
                                  L[0].same_padding, L[2].size)) {
    int w = AddParam("conv0.weights", {L[0].filters, 1, L[0].kernel, L[0].kernel, L[0].kernel});
    AddParam("conv0.bias", {L[0].filters});
    const int64_t f = L[0].filters, q = (side - L[0].kernel + 1) / L[2].size;
    const Dims dims = {n, f, q, q, q};
    // Channels-last layouts the kernel can write, in order of preference when nothing decides.
    std::vector<std::pair<memory::desc, int>> layouts;
    if (f <= 16) layouts.push_back({memory::desc(dims, ctx_.dt, Tag::nCdhw16c), 16});
    if (f <= 8) layouts.push_back({memory::desc(dims, ctx_.dt, Tag::nCdhw8c), 8});
    layouts.push_back({memory::desc(dims, ctx_.dt, Tag::ndhwc), static_cast<int>(f)});
    layouts.push_back({memory::desc(dims, ctx_.dt, Tag::ncdhw), 0});
    int pick = 0;
    if (L.size() > 3 && L[3].type == LayerType::kConv3d) {
      // Ask oneDNN which src layout the next convolution wants, and write exactly that.
      pick = PreferredSrcLayout(ctx_, dims, L[3], layouts);
    }
    auto op = std::make_unique<FirstBlockOp>("conv0+leaky+avg_pool0", ctx_, L[0], L[1].alpha, L[2].size,
                                             static_cast<int>(side), layouts[pick].first, layouts[pick].second,
                                             *stores_[w], *stores_[w + 1], w);
    first_block_ = op.get();
    cur_md = op->dst_md;
    cur = op->dst;
    ops_.push_back(std::move(op));
    conv_count = 1;
    act_count = 1;
    pool_count = 1;
    li = 3;
  } else if (ctx_.dt == Dt::f32) {
    cur_md = user_src_.get_desc();
    cur = user_src_;
  } else {
    net_src_ = memory(memory::desc({n, c0, side, side, side}, ctx_.dt, Tag::ncdhw), ctx_.eng);
    src_reorder_prim_ = dnnl::reorder(user_src_, net_src_);
    src_reorder_ = true;
    cur_md = net_src_.get_desc();
    cur = net_src_;
  }

  for (; li < L.size(); ++li) {
    const LayerSpec& l = L[li];
    const bool fuse = li + 1 < L.size() && L[li + 1].type == LayerType::kLeakyRelu;
    const float alpha = fuse ? L[li + 1].alpha : 0.f;
    std::unique_ptr<Op> op;
    switch (l.type) {
      case LayerType::kConv3d: {
        std::string nm = "conv" + std::to_string(conv_count++);
        const int64_t ic = cur_md.dims()[1];
        int w = AddParam(nm + ".weights", {l.filters, ic, l.kernel, l.kernel, l.kernel});
        AddParam(nm + ".bias", {l.filters});
        op = std::make_unique<ConvOp>(nm + (fuse ? "+leaky" : ""), ctx_, cur_md, cur, l, fuse, alpha, *stores_[w],
                                      *stores_[w + 1], w, ops_.empty());
        if (fuse) ++li;
        break;
      }
      case LayerType::kDense: {
        std::string nm = "dense" + std::to_string(dense_count++);
        Dims d = cur_md.dims();
        std::vector<int64_t> wshape = {l.units};
        int64_t features = 1;
        for (size_t i = 1; i < d.size(); ++i) features *= d[i];
        wshape.push_back(features);
        int w = AddParam(nm + ".weights", wshape);
        AddParam(nm + ".bias", {l.units});
        op = std::make_unique<DenseOp>(nm + (fuse ? "+leaky" : ""), ctx_, cur_md, cur, l.units, fuse, alpha,
                                       *stores_[w], *stores_[w + 1], w);
        if (fuse) ++li;
        break;
      }
      case LayerType::kAvgPool:
      case LayerType::kMaxPool: {
        bool max = l.type == LayerType::kMaxPool;
        op = std::make_unique<PoolOp>((max ? "max_pool" : "avg_pool") + std::to_string(pool_count++), ctx_, cur_md,
                                      cur, max, l.size);
        break;
      }
      case LayerType::kLeakyRelu:
        op = std::make_unique<LeakyOp>("leaky" + std::to_string(act_count++), ctx_, cur_md, cur, l.alpha);
        break;
      case LayerType::kDropout:
        if (!ctx_.training) continue;  // identity at inference
        op = std::make_unique<DropoutOp>("dropout" + std::to_string(drop_count++), ctx_, cur_md, cur, l.rate,
                                         static_cast<int>(li));
        break;
      case LayerType::kFlatten:
        continue;  // inner product reads the 5-D tensor directly (same element order as NCDHW)
      case LayerType::kScaledTanh:
        tanh_scale_ = l.scale;
        continue;
    }
    cur_md = op->dst_md;
    cur = op->dst;
    ops_.push_back(std::move(op));
  }

  // Output edge.
  memory::desc user_out_md({n, outputs_}, Dt::f32, Tag::nc);
  user_dst_ = memory(user_out_md, ctx_.eng, DNNL_MEMORY_NONE);
  dst_reorder_prim_ = dnnl::reorder(ops_.back()->dst, user_dst_);
  out_copy_.assign(n * outputs_, 0.f);

  if (ctx_.training) {
    // Conv backward-data is needed by every conv but the first op.
    for (size_t i = 1; i < ops_.size(); ++i) {
      if (auto* conv = dynamic_cast<ConvOp*>(ops_[i].get())) conv->EnableBwdData(ctx_);
    }
    size_t sizes[2] = {0, 0};
    for (size_t i = 0; i < ops_.size(); ++i) sizes[i % 2] = std::max(sizes[i % 2], ops_[i]->dst_md.get_size());
    for (int p = 0; p < 2; ++p) diff_buffers_[p] = AllocateAligned(sizes[p]);
    for (size_t i = 0; i < ops_.size(); ++i) {
      ops_[i]->diff_dst = memory(ops_[i]->dst_md, ctx_.eng, diff_buffers_[i % 2].get());
      if (i > 0) ops_[i]->diff_src = memory(ops_[i]->src_md, ctx_.eng, diff_buffers_[(i + 1) % 2].get());
    }
    diff_copy_.assign(n * outputs_, 0.f);
    user_diff_ = memory(user_out_md, ctx_.eng, diff_copy_.data());
    diff_reorder_prim_ = dnnl::reorder(user_diff_, ops_.back()->diff_dst);
  }

  params_.clear();
  for (auto& p : stores_) {
    Parameter v;
    v.name = p->name;
    v.shape = p->shape;
    v.value = p->value.data();
    v.grad = ctx_.training ? p->grad.data() : nullptr;
    params_.push_back(v);
  }
  InitParameters(options.seed);
  return Status::Ok();
}

void NetworkImpl::Forward(const float* src, float* dst) {
  auto t0 = Clock::now();
  if (ctx_.training) ++ctx_.step;  // a fresh dropout mask per training forward; Backward reuses it
  user_src_.set_data_handle(const_cast<float*>(src));
  if (src_reorder_) src_reorder_prim_.execute(ctx_.strm, user_src_, net_src_);
  if (first_block_ != nullptr) first_block_->SetInput(src);
  auto t1 = Clock::now();
  edge_fwd_ms_ = Ms(t0, t1);
  for (auto& op : ops_) {
    auto a = Clock::now();
    op->Forward(ctx_);
    if (profiling_) {
      ctx_.strm.wait();
      op->fwd_ms = Ms(a, Clock::now());
    }
  }
  auto t2 = Clock::now();
  user_dst_.set_data_handle(dst);
  dst_reorder_prim_.execute(ctx_.strm, ops_.back()->dst, user_dst_);
  ctx_.strm.wait();
  const int64_t total = static_cast<int64_t>(ctx_.batch) * outputs_;
  if (tanh_scale_ > 0.f) {
    for (int64_t i = 0; i < total; ++i) dst[i] = tanh_scale_ * std::tanh(dst[i]);
  }
  std::copy(dst, dst + total, out_copy_.begin());
  edge_fwd_ms_ += Ms(t2, Clock::now());
}

void NetworkImpl::Backward(const float* diff_dst, const std::function<void(int)>& on_grad_ready) {
  assert(ctx_.training && "Backward needs a network created with training = true");
  if (!ctx_.training) return;
  auto t0 = Clock::now();
  const int64_t total = static_cast<int64_t>(ctx_.batch) * outputs_;
  for (int64_t i = 0; i < total; ++i) {
    float g = diff_dst[i];
    if (tanh_scale_ > 0.f) {
      float t = out_copy_[i] / tanh_scale_;
      g *= tanh_scale_ * (1.f - t * t);
    }
    diff_copy_[i] = g;
  }
  diff_reorder_prim_.execute(ctx_.strm, user_diff_, ops_.back()->diff_dst);
  edge_bwd_ms_ = Ms(t0, Clock::now());
  for (size_t i = ops_.size(); i-- > 0;) {
    auto a = Clock::now();
    ops_[i]->Backward(ctx_, i > 0);
    ctx_.strm.wait();
    if (profiling_) ops_[i]->bwd_ms = Ms(a, Clock::now());
    if (on_grad_ready) {
      for (auto it = ops_[i]->params.rbegin(); it != ops_[i]->params.rend(); ++it) on_grad_ready(*it);
    }
  }
}

std::string NetworkImpl::ProfileReport() const {
  std::ostringstream os;
  os << std::fixed;
  double tf = edge_fwd_ms_, tb = edge_bwd_ms_;
  for (const auto& op : ops_) {
    tf += op->fwd_ms;
    tb += op->bwd_ms;
  }
  os << "| op | fwd ms | fwd GFLOP/s | bwd ms | bwd GFLOP/s | share | implementation |\n";
  os << "|---|---|---|---|---|---|---|\n";
  for (size_t i = 0; i < ops_.size(); ++i) {
    const Op& op = *ops_[i];
    double ff = op.FwdFlops(), bf = op.BwdFlops(i > 0);
    os << "| " << op.name() << " | " << std::setprecision(2) << op.fwd_ms << " | " << std::setprecision(0)
       << (ff > 0 && op.fwd_ms > 0 ? ff / op.fwd_ms / 1e6 : 0) << " | " << std::setprecision(2) << op.bwd_ms
       << " | " << std::setprecision(0) << (bf > 0 && op.bwd_ms > 0 ? bf / op.bwd_ms / 1e6 : 0) << " | "
       << std::setprecision(1) << 100.0 * (op.fwd_ms + op.bwd_ms) / std::max(1e-9, tf + tb) << "% | "
       << op.Impl() << " |\n";
  }
  os << "| edges (input/output reorders, loss edge) | " << std::setprecision(2) << edge_fwd_ms_ << " | | "
     << edge_bwd_ms_ << " | | " << std::setprecision(1) << 100.0 * (edge_fwd_ms_ + edge_bwd_ms_) / std::max(1e-9, tf + tb)
     << "% | |\n";
  os << "| total | " << std::setprecision(2) << tf << " | | " << tb << " | | 100% | |\n";
  return os.str();
}

}  // namespace

StatusOr<std::unique_ptr<Network>> Network::Create(const ModelSpec& spec, const NetworkOptions& options) {
  auto net = std::make_unique<NetworkImpl>();
  try {
    CF_RETURN_IF_ERROR(net->Build(spec, options));
  } catch (const dnnl::error& e) {
    return InternalError("network '" + spec.name + "': oneDNN refused a primitive: " + e.what());
  } catch (const std::bad_alloc&) {
    return ResourceExhaustedError("network '" + spec.name + "': out of memory building batch " +
                                  std::to_string(options.batch));
  }
  return std::unique_ptr<Network>(std::move(net));
}

}  // namespace cosmoflow
