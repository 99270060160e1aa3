// A leaky ReLU that no conv3d or dense before it absorbed (after a pool, say). Backward uses the
// op's dst, so no copy of src is kept.
#include "core/nn/ops/ops.h"

namespace cosmoflow::nn_internal {
namespace {

class LeakyReluOp : public Op {
 public:
  explicit LeakyReluOp(OpArgs& a) : Op(a.name) {
    OpContext& c = a.ctx;
    const float alpha = a.layer().alpha;
    src_md = a.src_md;
    src = a.src;
    auto prop = c.training ? dnnl::prop_kind::forward_training : dnnl::prop_kind::forward_inference;
    auto alg = dnnl::algorithm::eltwise_relu_use_dst_for_bwd;
    fwd_pd_ = dnnl::eltwise_forward::primitive_desc(dnnl::eltwise_forward::desc(prop, alg, src_md, alpha, 0.f),
                                                    c.eng);
    fwd_ = dnnl::eltwise_forward(fwd_pd_);
    dst_md = fwd_pd_.dst_desc();
    dst = dnnl::memory(dst_md, c.eng);
    if (c.training) {
      bwd_pd_ = dnnl::eltwise_backward::primitive_desc(
          dnnl::eltwise_backward::desc(alg, dst_md, dst_md, alpha, 0.f), c.eng, fwd_pd_);
      bwd_ = dnnl::eltwise_backward(bwd_pd_);
    }
  }
  void Forward(OpContext& c) override { fwd_.execute(c.strm, {{DNNL_ARG_SRC, src}, {DNNL_ARG_DST, dst}}); }
  void Backward(OpContext& c, bool need_diff_src) override {
    if (!need_diff_src) return;
    bwd_.execute(c.strm, {{DNNL_ARG_DST, dst}, {DNNL_ARG_DIFF_DST, diff_dst}, {DNNL_ARG_DIFF_SRC, diff_src}});
  }
  std::vector<KernelChoice> Kernels() const override {
    std::vector<KernelChoice> k = {{name_, "fwd", "onednn", fwd_pd_.impl_info_str()}};
    if (bwd_pd_) k.push_back({name_, "bwd", "onednn", bwd_pd_.impl_info_str()});
    return k;
  }

 private:
  dnnl::eltwise_forward::primitive_desc fwd_pd_;
  dnnl::eltwise_forward fwd_;
  dnnl::eltwise_backward::primitive_desc bwd_pd_;
  dnnl::eltwise_backward bwd_;
};

}  // namespace

std::unique_ptr<Op> MakeLeakyReluOp(OpArgs& args) { return std::make_unique<LeakyReluOp>(args); }

}  // namespace cosmoflow::nn_internal
