#include "core/nn/ops/onednn_util.h"

namespace cosmoflow::nn_internal {

using dnnl::memory;
using Tag = memory::format_tag;

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

dnnl::primitive_attr LeakyAttr(bool fuse, float alpha) {
  dnnl::primitive_attr attr;
  if (fuse) {
    dnnl::post_ops po;
    po.append_eltwise(1.f, dnnl::algorithm::eltwise_relu, alpha, 0.f);
    attr.set_post_ops(po);
  }
  return attr;
}

bool IsRef(const std::string& impl) { return impl.rfind("ref", 0) == 0; }

bool IsGemm(const std::string& impl) { return impl.find("gemm") != std::string::npos; }

void WorkingWeights::Init(OpContext& c, const memory::desc& plain, float* value, const memory::desc& fwd_md,
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
  // The working copies hold the master's values from the start, not whatever the allocator
  // returned: kernel selection by measurement times oneDNN on them before the first step, and
  // stale heap bytes read as denormals made conv0's forward time 50x too slow.
  Refresh(c);
  c.strm.wait();
}

void WorkingWeights::Refresh(OpContext& c) {
  if (!fwd_is_master) to_fwd.execute(c.strm, master, fwd);
  if (has_bwd && !bwd_is_fwd) to_bwd.execute(c.strm, master, bwd);
}

void WeightGrad::Init(OpContext& c, const memory::desc& plain_md, float* grad, const memory::desc& work_md) {
  plain = memory(plain_md, c.eng, grad);
  direct = work_md == plain_md;
  if (direct) {
    work = plain;
  } else {
    work = memory(work_md, c.eng);
    to_plain = dnnl::reorder(work, plain);
  }
}

void WeightGrad::Export(OpContext& c) {
  if (!direct) to_plain.execute(c.strm, work, plain);
}

void FusedLeakyBwd::Init(OpContext& c, bool fuse, float alpha, const memory::desc& dst_md) {
  on = fuse && c.training;
  if (!on) return;
  auto fwd_pd = dnnl::eltwise_forward::primitive_desc(
      dnnl::eltwise_forward::desc(dnnl::prop_kind::forward_training, dnnl::algorithm::eltwise_relu_use_dst_for_bwd,
                                  dst_md, alpha, 0.f),
      c.eng);
  auto pd = dnnl::eltwise_backward::primitive_desc(
      dnnl::eltwise_backward::desc(dnnl::algorithm::eltwise_relu_use_dst_for_bwd, dst_md, dst_md, alpha, 0.f),
      c.eng, fwd_pd);
  prim = dnnl::eltwise_backward(pd);
}

void FusedLeakyBwd::Run(OpContext& c, memory& dst, memory& diff) {
  if (!on) return;
  prim.execute(c.strm, {{DNNL_ARG_DST, dst}, {DNNL_ARG_DIFF_DST, diff}, {DNNL_ARG_DIFF_SRC, diff}});
}

}  // namespace cosmoflow::nn_internal
