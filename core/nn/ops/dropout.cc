// Inverted dropout: kept elements are scaled by 1/(1-rate) in training; no op at inference. The
// mask is a hash of (seed, training step, layer index, element), so backward regenerates it instead
// of storing it, and a run is reproducible from the seed.
#include <cstring>

#include "core/nn/network_internal.h"
#include "core/nn/ops/ops.h"

namespace cosmoflow::nn_internal {
namespace {

using Dt = dnnl::memory::data_type;

class DropoutOp : public Op {
 public:
  explicit DropoutOp(OpArgs& a) : Op(a.name), rate_(a.layer().rate), layer_(static_cast<int>(a.index)) {
    src_md = a.src_md;
    src = a.src;
    dst_md = src_md;
    dst = dnnl::memory(dst_md, a.ctx.eng);
    elems_ = static_cast<int64_t>(dst_md.get_size() / (a.ctx.dt == Dt::f32 ? 4 : 2));
  }
  void Forward(OpContext& c) override { Apply(c, src, dst, c.training); }
  void Backward(OpContext& c, bool need_diff_src) override {
    if (need_diff_src) Apply(c, diff_dst, diff_src, true);
  }
  std::vector<KernelChoice> Kernels() const override { return {{name_, "fwd", "cosmoflow", "dropout"}}; }

 private:
  void Apply(OpContext& c, dnnl::memory& in, dnnl::memory& out, bool active) {
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
        y[i] = DropoutUniform(seed, step, layer, i) < rate ? 0.f : x[i] * keep_scale;
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
        y[i] = DropoutUniform(seed, step, layer, i) < rate ? uint16_t{0} : F32ToBf16(Bf16ToF32(x[i]) * keep_scale);
      }
    }
  }
  float rate_;
  int layer_;
  int64_t elems_ = 0;
};

}  // namespace

std::unique_ptr<Op> MakeDropoutOp(OpArgs& args) {
  if (!args.ctx.training) return nullptr;  // the identity at inference
  return std::make_unique<DropoutOp>(args);
}

}  // namespace cosmoflow::nn_internal
