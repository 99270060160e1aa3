// The fused first block: a conv3d on 1-4 channels + leaky ReLU + average or max pool at the start
// of the network as one op on our kernel (core/nn/kernels/first_block.h), which never writes the
// conv's output. It reads the user's fp32 input directly and writes the layout the next conv
// prefers. "first_block" in NetworkOptions::kernels: "fused", "onednn" (separate oneDNN ops) or
// "auto" (the rule below).
#include "core/nn/kernels/first_block.h"

#include <cmath>
#include <optional>
#include <string>

#include "core/nn/ops/conv3d.h"
#include "core/nn/ops/ops.h"

namespace cosmoflow::nn_internal {
namespace {

using dnnl::memory;
using Tag = memory::format_tag;
using Dt = memory::data_type;

class FusedFirstBlockOp : public Op {
 public:
  FusedFirstBlockOp(OpArgs& a, const FirstBlockShape& shape, const memory::desc& dst_desc, int channel_stride)
      : Op(a.name + (shape.max_pool ? "+leaky+max_pool0" : "+leaky+avg_pool0")),
        kernel_(shape, a.ctx.dt == Dt::bf16, a.ctx.training, channel_stride),
        pool_(shape.max_pool ? "maxpool" : "avgpool"),
        w_(*a.params[0]), b_(*a.params[1]) {
    params = {a.param_indices[0], a.param_indices[1]};
    dst_md = dst_desc;
    dst = memory(dst_md, a.ctx.eng);
  }
  bool ReadsUserInput() const override { return true; }
  void SetUserInput(const float* x) override { input_ = x; }
  void Forward(OpContext& c) override { kernel_.Forward(input_, w_.value.data(), b_.value.data(), dst.get_data_handle()); }
  void Backward(OpContext& c, bool need_diff_src) override {
    kernel_.BackwardWeights(input_, diff_dst.get_data_handle(), w_.grad.data(), b_.grad.data());
  }
  double FwdFlops() const override { return kernel_.ConvFlops(); }
  double BwdFlops(bool) const override { return kernel_.ConvFlops(); }
  int64_t WorkspaceBytes() const override { return kernel_.WorkspaceBytes(); }
  std::vector<KernelChoice> Kernels() const override {
    const std::string impl = "cosmoflow:first_block(conv+leaky+" + pool_ + ", " + FirstBlockKernel::Isa() + ")";
    std::vector<KernelChoice> k = {{name_, "fwd", "fused", impl}};
    if (kernel_training_) k.push_back({name_, "bwd_weights", "fused", impl});
    return k;
  }

  bool kernel_training_ = false;

 private:
  FirstBlockKernel kernel_;
  std::string pool_;
  ParamStore& w_;
  ParamStore& b_;
  const float* input_ = nullptr;
};

// The block's shape when the spec starts with conv3d (stride 1) + leaky_relu + a pool that the
// kernel supports; nothing otherwise.
std::optional<FirstBlockShape> BlockShape(const OpArgs& a) {
  const auto& L = a.layers;
  if (a.index != 0 || L.size() < 3 || L[0].type != LayerType::kConv3d || L[0].stride != 1 ||
      L[1].type != LayerType::kLeakyRelu ||
      (L[2].type != LayerType::kAvgPool && L[2].type != LayerType::kMaxPool)) {
    return std::nullopt;
  }
  const int64_t side = a.src_md.dims()[2];
  const ConvGeometry cg = ConvGeometryFor(side, L[0].kernel, 1, L[0].same_padding);
  FirstBlockShape b;
  b.batch = static_cast<int>(a.ctx.batch);
  b.channels = static_cast<int>(a.src_md.dims()[1]);
  b.side = static_cast<int>(side);
  b.filters = L[0].filters;
  b.kernel = L[0].kernel;
  b.pad_left = static_cast<int>(cg.pad_left);
  b.out_side = static_cast<int>(cg.out);
  b.alpha = L[1].alpha;
  b.pool = L[2].size;
  b.max_pool = L[2].type == LayerType::kMaxPool;
  if (!FirstBlockKernel::Supported(b)) return std::nullopt;
  return b;
}

// The rule. The kernel computes in fp32; in a bf16 network oneDNN runs a multi-channel conv at
// about twice that rate (AMX tiles, or AVX512-BF16 dot products), so there the fused block pays
// only where the memory it removes (the conv output written and pooled, in training its gradient
// written and read) is large. Per sample, so the choice does not depend on the batch. Measured:
// the full-resolution study's 1 MiB block (32^3 sub-cubes, 16 filters) runs faster in oneDNN on
// AMX (13%) and on a Zen 4 (25%); mlperf's 128 MiB block runs faster fused on AMX, and on a Zen 4
// 1.33x slower fused but in half the peak memory (0.9 against 1.8 GiB at batch 4), which the rule
// keeps (first_block=onednn trades it back). oneDNN's 1-channel bf16 conv (sc18) is slow on every
// CPU measured, and in fp32 the fused block always wins.
constexpr double kBf16MinConvOutputBytesPerSample = 16.0 * (1 << 20);

bool RuleFuses(const OpArgs& a, const FirstBlockShape& b) {
  if (a.ctx.dt != Dt::bf16 || b.channels == 1) return true;
  const double conv_output_bytes = 2.0 * b.filters * std::pow(double(b.out_side), 3);
  return conv_output_bytes >= kBf16MinConvOutputBytesPerSample;
}

}  // namespace

std::unique_ptr<Op> MakeFusedFirstBlockOp(OpArgs& a) {
  const std::string forced = a.ctx.Forced(a.name, "", "first_block");
  if (forced == "onednn") return nullptr;
  const std::optional<FirstBlockShape> shape = BlockShape(a);
  if (!shape || (forced != "fused" && !RuleFuses(a, *shape))) return nullptr;
  const auto& L = a.layers;
  const int64_t f = shape->filters, q = shape->out_side / shape->pool;
  const memory::dims dims = {a.ctx.batch, f, q, q, q};
  // Layouts the kernel can write, in order of preference when nothing decides.
  std::vector<std::pair<memory::desc, int>> layouts;
  layouts.push_back({memory::desc(dims, a.ctx.dt, Tag::nCdhw16c), 16});
  if (f <= 8) layouts.push_back({memory::desc(dims, a.ctx.dt, Tag::nCdhw8c), 8});
  layouts.push_back({memory::desc(dims, a.ctx.dt, Tag::ndhwc), static_cast<int>(f)});
  layouts.push_back({memory::desc(dims, a.ctx.dt, Tag::ncdhw), 0});
  int pick = 0;
  if (L.size() > 3 && L[3].type == LayerType::kConv3d) {
    // Ask oneDNN which src layout the next convolution wants, and write exactly that.
    pick = PreferredConvSrcLayout(a.ctx, dims, L[3], layouts);
  }
  a.consumed = 3;
  auto op = std::make_unique<FusedFirstBlockOp>(a, *shape, layouts[pick].first, layouts[pick].second);
  op->kernel_training_ = a.ctx.training;
  return op;
}

}  // namespace cosmoflow::nn_internal
