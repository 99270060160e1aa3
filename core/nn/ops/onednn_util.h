// Pieces the oneDNN-backed ops share: working copies of weights, weight gradients in the
// primitive's layout, a fused leaky ReLU's backward, and readers of oneDNN's implementation names.
#pragma once

#include <oneapi/dnnl/dnnl.hpp>
#include <string>

#include "core/nn/op.h"

namespace cosmoflow::nn_internal {

dnnl::memory::format_tag PlainTag(size_t ndims);

// Post-op attribute: leaky ReLU with slope `alpha` after the primitive when `fuse`.
dnnl::primitive_attr LeakyAttr(bool fuse, float alpha);

// True for oneDNN's reference loops ("ref:any", ...), orders of magnitude slower than its jit code.
bool IsRef(const std::string& impl);
// True when oneDNN runs the primitive as im2col + gemm rather than a direct kernel.
bool IsGemm(const std::string& impl);

// Weights held by an op: the plain fp32 master (wrapped, no copy), and working copies for forward
// and backward-data in whatever layout/type those primitives chose, refreshed by reorders.
struct WorkingWeights {
  dnnl::memory master;  // plain fp32 wrapping ParamStore::value
  dnnl::memory fwd;     // may alias master
  dnnl::memory bwd;     // may alias fwd
  dnnl::reorder to_fwd, to_bwd;
  bool fwd_is_master = false, bwd_is_fwd = false, has_bwd = false;

  // bwd_md: nullptr when no backward-data working copy is needed.
  void Init(OpContext& c, const dnnl::memory::desc& plain, float* value, const dnnl::memory::desc& fwd_md,
            const dnnl::memory::desc* bwd_md);
  void Refresh(OpContext& c);
};

// Gradient of the weights: computed in the primitive's layout, reordered to the plain fp32 grad.
struct WeightGrad {
  dnnl::memory plain, work;
  dnnl::reorder to_plain;
  bool direct = false;
  void Init(OpContext& c, const dnnl::memory::desc& plain_md, float* grad, const dnnl::memory::desc& work_md);
  void Export(OpContext& c);
};

// Backward of a fused leaky ReLU: diff_dst *= (dst > 0 ? 1 : alpha), in place, from the op's dst.
struct FusedLeakyBwd {
  bool on = false;
  dnnl::eltwise_backward prim;
  void Init(OpContext& c, bool fuse, float alpha, const dnnl::memory::desc& dst_md);
  void Run(OpContext& c, dnnl::memory& dst, dnnl::memory& diff);
};

}  // namespace cosmoflow::nn_internal
