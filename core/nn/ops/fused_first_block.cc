// The fused first block: a 1-channel conv3d + leaky ReLU + average pool at the start of the network
// as one op on our kernel (core/nn/kernels/first_block.h), which never writes the conv's output.
// It reads the user's fp32 input directly and writes the channels-last layout the next conv
// prefers. "first_block" in NetworkOptions::kernels: "fused" (default where the kernel supports
// the block) or "onednn" (separate oneDNN ops).
#include "core/nn/kernels/first_block.h"
#include "core/nn/ops/conv3d.h"
#include "core/nn/ops/ops.h"

namespace cosmoflow::nn_internal {
namespace {

using dnnl::memory;
using Tag = memory::format_tag;
using Dt = memory::data_type;

class FusedFirstBlockOp : public Op {
 public:
  FusedFirstBlockOp(OpArgs& a, const memory::desc& dst_desc, int channel_stride)
      : Op(a.name + "+leaky+avg_pool0"),
        kernel_(a.ctx.batch, static_cast<int>(a.src_md.dims()[2]), a.layers[0].filters,
                a.layers[0].kernel, a.layers[1].alpha, a.layers[2].size, a.ctx.dt == Dt::bf16, a.ctx.training,
                channel_stride),
        w_(*a.params[0]), b_(*a.params[1]) {
    params = {a.param_indices[0], a.param_indices[1]};
    dst_md = dst_desc;
    dst = memory(dst_md, a.ctx.eng);
  }
  bool ReadsUserInput() const override { return true; }
  void SetUserInput(const float* x) override { input_ = x; }
  void Forward(OpContext& c) override { kernel_.Forward(input_, w_.value.data(), b_.value.data(), dst.get_data_handle()); }
  void Backward(OpContext& c, bool need_diff_src) override {
    kernel_.BackwardWeights(input_, w_.value.data(), b_.value.data(), diff_dst.get_data_handle(), w_.grad.data(),
                            b_.grad.data());
  }
  double FwdFlops() const override { return kernel_.ConvFlops(); }
  double BwdFlops(bool) const override { return kernel_.ConvFlops(); }
  std::vector<KernelChoice> Kernels() const override {
    const std::string impl = std::string("cosmoflow:first_block(conv+leaky+avgpool, ") + FirstBlockKernel::Isa() + ")";
    std::vector<KernelChoice> k = {{name_, "fwd", "fused", impl}};
    if (kernel_training_) k.push_back({name_, "bwd_weights", "fused", impl});
    return k;
  }

  bool kernel_training_ = false;

 private:
  FirstBlockKernel kernel_;
  ParamStore& w_;
  ParamStore& b_;
  const float* input_ = nullptr;
};

bool BlockFits(const OpArgs& a) {
  const auto& L = a.layers;
  if (a.index != 0 || L.size() < 3 || a.src_md.dims()[1] != 1) return false;
  if (L[0].type != LayerType::kConv3d || L[1].type != LayerType::kLeakyRelu || L[2].type != LayerType::kAvgPool) {
    return false;
  }
  return FirstBlockKernel::Supported(static_cast<int>(a.src_md.dims()[2]), L[0].filters, L[0].kernel, L[0].stride,
                                     L[0].same_padding, L[2].size);
}

}  // namespace

std::unique_ptr<Op> MakeFusedFirstBlockOp(OpArgs& a) {
  if (a.ctx.Forced(a.name, "", "first_block") == "onednn" || !BlockFits(a)) return nullptr;
  const auto& L = a.layers;
  const int64_t side = a.src_md.dims()[2];
  const int64_t f = L[0].filters, q = (side - L[0].kernel + 1) / L[2].size;
  const memory::dims dims = {a.ctx.batch, f, q, q, q};
  // Channels-last layouts the kernel can write, in order of preference when nothing decides.
  std::vector<std::pair<memory::desc, int>> layouts;
  if (f <= 16) layouts.push_back({memory::desc(dims, a.ctx.dt, Tag::nCdhw16c), 16});
  if (f <= 8) layouts.push_back({memory::desc(dims, a.ctx.dt, Tag::nCdhw8c), 8});
  layouts.push_back({memory::desc(dims, a.ctx.dt, Tag::ndhwc), static_cast<int>(f)});
  layouts.push_back({memory::desc(dims, a.ctx.dt, Tag::ncdhw), 0});
  int pick = 0;
  if (L.size() > 3 && L[3].type == LayerType::kConv3d) {
    // Ask oneDNN which src layout the next convolution wants, and write exactly that.
    pick = PreferredConvSrcLayout(a.ctx, dims, L[3], layouts);
  }
  a.consumed = 3;
  auto op = std::make_unique<FusedFirstBlockOp>(a, layouts[pick].first, layouts[pick].second);
  op->kernel_training_ = a.ctx.training;
  return op;
}

}  // namespace cosmoflow::nn_internal
