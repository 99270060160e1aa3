// The FFT-tiled candidates of conv3d's three passes (core/nn/kernels/fft_conv.h): fp32, stride 1,
// any kernel size and padding, src and dst in a layout the kernel reads (planar, channels-last,
// or blocked by 8 or 16 with whole blocks), and a tile within the memory cap (FftConv3d::TileFor).
// backward-data is the forward correlation of diff_dst with the weights transposed and flipped.
// The rule takes them when the modelled flop ratio is at least kMinFlopRatio; everywhere else they
// run only when forced ("conv.fwd=fft", ...).
#include <memory>
#include <optional>

#include "core/nn/kernels/fft_conv.h"
#include "core/nn/ops/conv3d.h"

namespace cosmoflow::nn_internal {
namespace {

using dnnl::memory;
using Tag = memory::format_tag;
using Dt = memory::data_type;

// Below this direct / FFT flop ratio the FFT path's memory traffic eats the saving.
constexpr double kMinFlopRatio = 1e30;

std::optional<ActivationLayout> LayoutOf(const memory::desc& md) {
  const memory::dims d = md.dims();
  if (d.size() != 5 || md.data_type() != Dt::f32 || d[2] != d[3] || d[2] != d[4]) return std::nullopt;
  const int64_t c = d[1], voxels = d[2] * d[3] * d[4];
  if (md == memory::desc(d, Dt::f32, Tag::ncdhw)) return ActivationLayout::Planar(c, voxels);
  if (md == memory::desc(d, Dt::f32, Tag::ndhwc)) return ActivationLayout::ChannelsLast(c, voxels);
  if (c % 16 == 0 && md == memory::desc(d, Dt::f32, Tag::nCdhw16c)) return ActivationLayout::Blocked(c, voxels, 16);
  if (c % 8 == 0 && md == memory::desc(d, Dt::f32, Tag::nCdhw8c)) return ActivationLayout::Blocked(c, voxels, 8);
  return std::nullopt;
}

FftConvShape ForwardShape(const ConvSetup& s) {
  return {static_cast<int>(s.g.n), static_cast<int>(s.g.ic), static_cast<int>(s.g.oc), static_cast<int>(s.g.side),
          static_cast<int>(s.g.out), static_cast<int>(s.g.k), static_cast<int>(s.g.pad_left)};
}

// backward-data as a correlation from the conv's output channels to its input channels.
FftConvShape BackwardDataShape(const ConvSetup& s) {
  return {static_cast<int>(s.g.n), static_cast<int>(s.g.oc), static_cast<int>(s.g.ic), static_cast<int>(s.g.out),
          static_cast<int>(s.g.side), static_cast<int>(s.g.k), static_cast<int>(s.g.k - 1 - s.g.pad_left)};
}

bool Supports(const ConvSetup& s, const FftConvShape& shape) {
  return s.ctx.dt == Dt::f32 && s.g.stride == 1 && LayoutOf(s.src_md) && LayoutOf(s.dst_md) &&
         FftConv3d::TileFor(shape) > 0;
}

bool Preferred(const FftConvShape& shape) {
  const int t = FftConv3d::ChooseTile(shape);
  return t > 0 && FftConv3d::FlopRatio(shape, t) >= kMinFlopRatio;
}

std::string Describe(const FftConv3d& conv) { return "cosmoflow:fft_conv(tile " + std::to_string(conv.tile()) + ")"; }

class FftForward : public ConvPassKernel {
 public:
  explicit FftForward(const ConvSetup& s)
      : conv_(ForwardShape(s), FftConv3d::TileFor(ForwardShape(s)), *LayoutOf(s.src_md), *LayoutOf(s.dst_md)),
        weights_(s.w.value.data()), bias_(s.b.value.data()), alpha_(s.leaky_alpha) {
    conv_.SetWeights(weights_);
  }
  void Run(OpContext& c, const memory& src, const memory&, memory* dst) override {
    conv_.Forward(static_cast<const float*>(src.get_data_handle()), static_cast<float*>(dst->get_data_handle()), bias_,
                  alpha_);
  }
  void Refresh(OpContext&) override { conv_.SetWeights(weights_); }
  std::string Impl() const override { return Describe(conv_); }
  int64_t WorkspaceBytes() const override { return conv_.WorkspaceBytes(); }

 private:
  FftConv3d conv_;
  const float* weights_;
  const float* bias_;
  float alpha_;
};

class FftBackwardData : public ConvPassKernel {
 public:
  explicit FftBackwardData(const ConvSetup& s)
      : conv_(BackwardDataShape(s), FftConv3d::TileFor(BackwardDataShape(s)), *LayoutOf(s.dst_md),
              *LayoutOf(s.src_md)),
        weights_(s.w.value.data()) {
    conv_.SetWeights(weights_, true);
  }
  void Run(OpContext& c, const memory&, const memory& diff_dst, memory* diff_src) override {
    conv_.Forward(static_cast<const float*>(diff_dst.get_data_handle()),
                  static_cast<float*>(diff_src->get_data_handle()), nullptr, -1.f);
  }
  void Refresh(OpContext&) override { conv_.SetWeights(weights_, true); }
  std::string Impl() const override { return Describe(conv_); }
  int64_t WorkspaceBytes() const override { return conv_.WorkspaceBytes(); }

 private:
  FftConv3d conv_;
  const float* weights_;
};

class FftBackwardWeights : public ConvPassKernel {
 public:
  explicit FftBackwardWeights(const ConvSetup& s)
      : conv_(ForwardShape(s), FftConv3d::TileFor(ForwardShape(s)), *LayoutOf(s.src_md), *LayoutOf(s.dst_md)),
        grad_w_(s.w.grad.data()), grad_b_(s.b.grad.data()) {}
  void Run(OpContext& c, const memory& src, const memory& diff_dst, memory*) override {
    conv_.BackwardWeights(static_cast<const float*>(src.get_data_handle()),
                          static_cast<const float*>(diff_dst.get_data_handle()), grad_w_, grad_b_);
  }
  std::string Impl() const override { return Describe(conv_); }
  int64_t WorkspaceBytes() const override { return conv_.WorkspaceBytes(); }

 private:
  FftConv3d conv_;
  float* grad_w_;
  float* grad_b_;
};

}  // namespace

ConvCandidate FftFwdCandidate() {
  return {"fft", [](const ConvSetup& s) { return Supports(s, ForwardShape(s)); },
          [](const ConvSetup& s) { return Preferred(ForwardShape(s)); },
          [](const ConvSetup& s) -> std::unique_ptr<ConvPassKernel> { return std::make_unique<FftForward>(s); }};
}

ConvCandidate FftBwdDataCandidate() {
  return {"fft", [](const ConvSetup& s) { return Supports(s, BackwardDataShape(s)); },
          [](const ConvSetup& s) { return Preferred(BackwardDataShape(s)); },
          [](const ConvSetup& s) -> std::unique_ptr<ConvPassKernel> { return std::make_unique<FftBackwardData>(s); }};
}

ConvCandidate FftBwdWeightsCandidate() {
  return {"fft", [](const ConvSetup& s) { return Supports(s, ForwardShape(s)); },
          [](const ConvSetup& s) { return Preferred(ForwardShape(s)); },
          [](const ConvSetup& s) -> std::unique_ptr<ConvPassKernel> { return std::make_unique<FftBackwardWeights>(s); }};
}

}  // namespace cosmoflow::nn_internal
