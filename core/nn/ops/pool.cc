// avg_pool and max_pool: window = stride = size, no padding; floor semantics (27 -> 13: the
// trailing plane is not covered). Max pooling keeps oneDNN's workspace from forward for backward.
#include "core/nn/ops/ops.h"

namespace cosmoflow::nn_internal {
namespace {

using dnnl::memory;

class PoolOp : public Op {
 public:
  PoolOp(OpArgs& a, bool max) : Op(a.name) {
    OpContext& c = a.ctx;
    const int64_t size = a.layer().size;
    src_md = a.src_md;
    src = a.src;
    memory::dims d = src_md.dims();
    const int64_t out = d[2] / size;
    memory::dims strides = {size, size, size}, kernel = {size, size, size}, pad = {0, 0, 0};
    auto alg = max ? dnnl::algorithm::pooling_max : dnnl::algorithm::pooling_avg_exclude_padding;
    auto prop = c.training ? dnnl::prop_kind::forward_training : dnnl::prop_kind::forward_inference;
    memory::desc d_any({d[0], d[1], out, out, out}, c.dt, memory::format_tag::any);
    fwd_pd_ = dnnl::pooling_forward::primitive_desc(
        dnnl::pooling_forward::desc(prop, alg, src_md, d_any, strides, kernel, pad, pad), c.eng);
    fwd_ = dnnl::pooling_forward(fwd_pd_);
    dst_md = fwd_pd_.dst_desc();
    dst = memory(dst_md, c.eng);
    if (c.training) {
      if (max) workspace_ = memory(fwd_pd_.workspace_desc(), c.eng);
      has_ws_ = max;
      bwd_pd_ = dnnl::pooling_backward::primitive_desc(
          dnnl::pooling_backward::desc(alg, src_md, dst_md, strides, kernel, pad, pad), c.eng, fwd_pd_);
      bwd_ = dnnl::pooling_backward(bwd_pd_);
    }
  }
  void Forward(OpContext& c) override {
    if (has_ws_) {
      fwd_.execute(c.strm, {{DNNL_ARG_SRC, src}, {DNNL_ARG_DST, dst}, {DNNL_ARG_WORKSPACE, workspace_}});
    } else {
      fwd_.execute(c.strm, {{DNNL_ARG_SRC, src}, {DNNL_ARG_DST, dst}});
    }
  }
  void Backward(OpContext& c, bool need_diff_src) override {
    if (!need_diff_src) return;
    if (has_ws_) {
      bwd_.execute(c.strm, {{DNNL_ARG_DIFF_DST, diff_dst}, {DNNL_ARG_DIFF_SRC, diff_src},
                            {DNNL_ARG_WORKSPACE, workspace_}});
    } else {
      bwd_.execute(c.strm, {{DNNL_ARG_DIFF_DST, diff_dst}, {DNNL_ARG_DIFF_SRC, diff_src}});
    }
  }
  std::vector<KernelChoice> Kernels() const override {
    std::vector<KernelChoice> k = {{name_, "fwd", "onednn", fwd_pd_.impl_info_str()}};
    if (bwd_pd_) k.push_back({name_, "bwd", "onednn", bwd_pd_.impl_info_str()});
    return k;
  }
  int64_t WorkspaceBytes() const override { return has_ws_ ? static_cast<int64_t>(workspace_.get_desc().get_size()) : 0; }

 private:
  dnnl::pooling_forward::primitive_desc fwd_pd_;
  dnnl::pooling_forward fwd_;
  dnnl::pooling_backward::primitive_desc bwd_pd_;
  dnnl::pooling_backward bwd_;
  memory workspace_;
  bool has_ws_ = false;
};

}  // namespace

std::unique_ptr<Op> MakePoolOp(OpArgs& args) {
  return std::make_unique<PoolOp>(args, args.layer().type == LayerType::kMaxPool);
}

}  // namespace cosmoflow::nn_internal
