// scaled_tanh (the last layer): y = scale * tanh(x), computed in fp32 on the previous op's output
// (fp32 or bf16); dst is fp32. Backward: dx = dy * scale * (1 - (y / scale)^2), written in the
// previous op's type.
#include <cmath>
#include <stdexcept>

#include "core/nn/network_internal.h"
#include "core/nn/ops/onednn_util.h"
#include "core/nn/ops/ops.h"

namespace cosmoflow::nn_internal {
namespace {

using dnnl::memory;
using Dt = memory::data_type;

class ScaledTanhOp : public Op {
 public:
  explicit ScaledTanhOp(OpArgs& a) : Op(a.name), scale_(a.layer().scale) {
    src_md = a.src_md;
    src = a.src;
    const memory::dims d = src_md.dims();
    n_ = 1;
    for (auto x : d) n_ *= x;
    bf16_src_ = src_md.data_type() == Dt::bf16;
    const memory::desc plain(d, src_md.data_type(), PlainTag(d.size()));
    if (src_md != plain) {
      throw std::invalid_argument("scaled_tanh: the previous op's output is not in a plain layout");
    }
    dst_md = memory::desc(d, Dt::f32, PlainTag(d.size()));
    dst = memory(dst_md, a.ctx.eng);
  }
  void Forward(OpContext& c) override {
    c.strm.wait();
    float* y = static_cast<float*>(dst.get_data_handle());
    for (int64_t i = 0; i < n_; ++i) y[i] = scale_ * std::tanh(Read(src, i));
  }
  void Backward(OpContext& c, bool need_diff_src) override {
    if (!need_diff_src) return;
    c.strm.wait();
    const float* y = static_cast<const float*>(dst.get_data_handle());
    const float* dy = static_cast<const float*>(diff_dst.get_data_handle());
    for (int64_t i = 0; i < n_; ++i) {
      const float t = y[i] / scale_;
      const float g = dy[i] * (scale_ * (1.f - t * t));
      if (bf16_src_) {
        static_cast<uint16_t*>(diff_src.get_data_handle())[i] = F32ToBf16(g);
      } else {
        static_cast<float*>(diff_src.get_data_handle())[i] = g;
      }
    }
  }
  std::vector<KernelChoice> Kernels() const override { return {{name_, "fwd", "cosmoflow", "scaled_tanh"}}; }

 private:
  float Read(const memory& m, int64_t i) const {
    return bf16_src_ ? Bf16ToF32(static_cast<const uint16_t*>(m.get_data_handle())[i])
                     : static_cast<const float*>(m.get_data_handle())[i];
  }
  float scale_;
  int64_t n_ = 0;
  bool bf16_src_ = false;
};

}  // namespace

std::unique_ptr<Op> MakeScaledTanhOp(OpArgs& args) { return std::make_unique<ScaledTanhOp>(args); }

}  // namespace cosmoflow::nn_internal
