// dense: oneDNN's inner product on the flattened activation (it reads the 5-D tensor directly, in
// NCDHW element order), with a following leaky ReLU fused as a post-op.
#include <cstdlib>
#include <cstring>

#include "core/nn/ops/onednn_util.h"
#include "core/nn/ops/ops.h"

namespace cosmoflow::nn_internal {
namespace {

using dnnl::memory;
using Dt = memory::data_type;
using Tag = memory::format_tag;

class DenseOp : public Op {
 public:
  DenseOp(OpArgs& a, const LayerSpec* leaky) : Op(a.name + (leaky ? "+leaky" : "")) {
    OpContext& c = a.ctx;
    const bool fuse = leaky != nullptr;
    const float alpha = fuse ? leaky->alpha : 0.f;
    ParamStore& w = *a.params[0];
    ParamStore& b = *a.params[1];
    src_md = a.src_md;
    src = a.src;
    memory::dims in_dims = src_md.dims();
    const int64_t n = in_dims[0], o = a.layer().units;
    memory::dims w_dims = in_dims;
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
        dnnl::inner_product_forward::desc(prop, src_md, w_any, b_md, d_any), LeakyAttr(fuse, alpha), c.eng);
    fwd_ = dnnl::inner_product_forward(fwd_pd_);
    dst_md = fwd_pd_.dst_desc();
    dst = memory(dst_md, c.eng);
    bias_ = memory(b_md, c.eng, b.value.data());
    params = {a.param_indices[0], a.param_indices[1]};
    if (a.index + a.consumed == a.layers.size()) head_gradient_outputs_ = c.head_gradient_outputs;
    if (!c.training) {
      weights_.Init(c, w_plain, w.value.data(), fwd_pd_.weights_desc(), nullptr);
      return;
    }
    bwd_w_pd_ = dnnl::inner_product_backward_weights::primitive_desc(
        dnnl::inner_product_backward_weights::desc(src_md, memory::desc(w_dims, Dt::f32, Tag::any), b_md, dst_md),
        c.eng, fwd_pd_);
    bwd_w_ = dnnl::inner_product_backward_weights(bwd_w_pd_);
    wgrad_.Init(c, w_plain, w.grad.data(), bwd_w_pd_.diff_weights_desc());
    diff_bias_ = memory(b_md, c.eng, b.grad.data());
    bwd_d_pd_ = dnnl::inner_product_backward_data::primitive_desc(
        dnnl::inner_product_backward_data::desc(src_md, w_any, dst_md), c.eng, fwd_pd_);
    bwd_d_ = dnnl::inner_product_backward_data(bwd_d_pd_);
    auto bwd_w_md = bwd_d_pd_.weights_desc();
    weights_.Init(c, w_plain, w.value.data(), fwd_pd_.weights_desc(), &bwd_w_md);
    leaky_bwd_.Init(c, fuse, alpha, dst_md);
  }
  void Forward(OpContext& c) override {
    fwd_.execute(c.strm, {{DNNL_ARG_SRC, src}, {DNNL_ARG_WEIGHTS, weights_.fwd}, {DNNL_ARG_BIAS, bias_},
                          {DNNL_ARG_DST, dst}});
  }
  void Backward(OpContext& c, bool need_diff_src) override {
    leaky_bwd_.Run(c, dst, diff_dst);
    bwd_w_.execute(c.strm, {{DNNL_ARG_SRC, src}, {DNNL_ARG_DIFF_DST, diff_dst},
                            {DNNL_ARG_DIFF_WEIGHTS, wgrad_.work}, {DNNL_ARG_DIFF_BIAS, diff_bias_}});
    wgrad_.Export(c);
    if (need_diff_src) {
      if (head_gradient_outputs_ > 0) KeepHeadGradientOnly(c);
      bwd_d_.execute(c.strm, {{DNNL_ARG_DIFF_DST, diff_dst}, {DNNL_ARG_WEIGHTS, weights_.bwd},
                              {DNNL_ARG_DIFF_SRC, diff_src}});
    }
  }
  void RefreshWeights(OpContext& c) override { weights_.Refresh(c); }
  // Zeroes diff_dst's columns from head_gradient_outputs_ on, after the weight gradient has used
  // them: the covariance outputs then reach no layer below this one.
  void KeepHeadGradientOnly(OpContext& c) {
    c.strm.wait();
    const dnnl_memory_desc_t& md = diff_dst.get_desc().data;
    const auto& blocking = md.format_desc.blocking;
    const int64_t n = md.dims[0], o = md.dims[1];
    const size_t bytes = md.data_type == dnnl_bf16 ? 2 : 4;
    // oneDNN gives a 2-D inner product plain row- or column-major gradients; a blocked one would
    // need a reorder, and no CPU path here makes one.
    if (blocking.inner_nblks != 0) std::abort();
    auto* base = static_cast<unsigned char*>(diff_dst.get_data_handle());
    for (int64_t i = 0; i < n; ++i)
      for (int64_t j = head_gradient_outputs_; j < o; ++j)
        std::memset(base + (i * blocking.strides[0] + j * blocking.strides[1]) * bytes, 0, bytes);
  }
  double FwdFlops() const override { return flops_; }
  double BwdFlops(bool need_diff_src) const override { return flops_ * (need_diff_src ? 2 : 1); }
  std::vector<KernelChoice> Kernels() const override {
    std::vector<KernelChoice> k = {{name_, "fwd", "onednn", fwd_pd_.impl_info_str()}};
    if (bwd_w_pd_) {
      k.push_back({name_, "bwd_weights", "onednn", bwd_w_pd_.impl_info_str()});
      k.push_back({name_, "bwd_data", "onednn", bwd_d_pd_.impl_info_str()});
    }
    return k;
  }

 private:
  double flops_ = 0;
  int head_gradient_outputs_ = 0;  // OpContext::head_gradient_outputs, for the last layer only
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

}  // namespace

std::unique_ptr<Op> MakeDenseOp(OpArgs& args) {
  const LayerSpec* leaky = args.NextLeaky();
  if (leaky) args.consumed = 2;
  return std::make_unique<DenseOp>(args, leaky);
}

}  // namespace cosmoflow::nn_internal
