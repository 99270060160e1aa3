// The tiled fp32 candidates of conv3d's three passes: FFT-tiled (core/nn/kernels/fft_conv.h) and
// Winograd (core/nn/kernels/winograd_conv.h). Both need fp32, stride 1, and src and dst in a layout
// the kernels read (planar, channels-last, or blocked by 8 or 16 with whole blocks); FFT any kernel
// size with a tile within its memory cap, Winograd kernel sides 2 to 4 and transformed weights
// within its memory cap. backward-data is the forward correlation of diff_dst with the weights
// transposed and flipped.
// The rule takes Winograd where its modelled flop ratio (transforms and the padding of channels to
// 16 counted) is at least kMinWinogradFlopRatio and the pass has at least kMinWinogradTiles output
// tiles: sc18's 4^3 convs and mlperf's 3^3 convs of 32 and 64 input channels, which it runs
// 1.4-2.6x faster than oneDNN's direct kernels in every pass (docs/benchmarks.md); not layers of
// few input channels (mlperf's first conv, 4 channels padded to 16, ratio 0.96) nor small cubes.
// FFT runs only when forced ("conv.fwd=fft", ...) or chosen by measurement: it loses every pass.
#include <memory>
#include <optional>
#include <string>

#include "core/nn/kernels/fft_conv.h"
#include "core/nn/kernels/winograd_conv.h"
#include "core/nn/ops/conv3d.h"

namespace cosmoflow::nn_internal {
namespace {

using dnnl::memory;
using Tag = memory::format_tag;
using Dt = memory::data_type;

// FFTW's transforms run too slowly for the FFT path to win anywhere measured.
constexpr double kMinFftFlopRatio = 1e30;
constexpr double kMinWinogradFlopRatio = 3.0;
// Fewer tiles than this per pass and the per-step costs the flop ratio leaves out (transforming
// the weights, and the weight gradient's a^3 sums, once per filter and channel pair) outweigh the
// saving: the accuracy-study network's 3^3 convs on 8^3 and 4^3 cubes at batch 16 (128 and 16
// tiles) ran 1.4x and 7x slower in their backward pass than oneDNN's.
constexpr int64_t kMinWinogradTiles = 256;

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

Conv3dShape ForwardShape(const ConvSetup& s) {
  return {static_cast<int>(s.g.n), static_cast<int>(s.g.ic), static_cast<int>(s.g.oc), static_cast<int>(s.g.side),
          static_cast<int>(s.g.out), static_cast<int>(s.g.k), static_cast<int>(s.g.pad_left)};
}

// backward-data as a correlation from the conv's output channels to its input channels.
Conv3dShape BackwardDataShape(const ConvSetup& s) {
  return {static_cast<int>(s.g.n), static_cast<int>(s.g.oc), static_cast<int>(s.g.ic), static_cast<int>(s.g.out),
          static_cast<int>(s.g.side), static_cast<int>(s.g.k), static_cast<int>(s.g.k - 1 - s.g.pad_left)};
}

bool TiledSupports(const ConvSetup& s) {
  return s.ctx.dt == Dt::f32 && s.g.stride == 1 && LayoutOf(s.src_md) && LayoutOf(s.dst_md);
}

// What the pass classes need of an algorithm.
struct Fft {
  using Kernel = FftConv3d;
  static bool Supports(const Conv3dShape& shape) { return FftConv3d::TileFor(shape) > 0; }
  static bool Preferred(const Conv3dShape& shape) {
    const int t = FftConv3d::ChooseTile(shape);
    return t > 0 && FftConv3d::FlopRatio(shape, t) >= kMinFftFlopRatio;
  }
  static std::unique_ptr<FftConv3d> Make(const Conv3dShape& shape, const ActivationLayout& src,
                                         const ActivationLayout& dst) {
    return std::make_unique<FftConv3d>(shape, FftConv3d::TileFor(shape), src, dst);
  }
  static std::string Describe(const FftConv3d& k) { return "cosmoflow:fft_conv(tile " + std::to_string(k.tile()) + ")"; }
};

struct Winograd {
  using Kernel = WinogradConv3d;
  static bool Supports(const Conv3dShape& shape) { return WinogradConv3d::Supports(shape); }
  static bool Preferred(const Conv3dShape& shape) {
    return Supports(shape) && WinogradConv3d::FlopRatio(shape) >= kMinWinogradFlopRatio &&
           WinogradConv3d::Tiles(shape) >= kMinWinogradTiles;
  }
  static std::unique_ptr<WinogradConv3d> Make(const Conv3dShape& shape, const ActivationLayout& src,
                                              const ActivationLayout& dst) {
    return std::make_unique<WinogradConv3d>(shape, src, dst);
  }
  static std::string Describe(const WinogradConv3d& k) {
    const int m = k.tile();
    return "cosmoflow:winograd_conv(F(" + std::to_string(m) + "," + std::to_string(WinogradConv3d::kPoints + 1 - m) +
           "))";
  }
};

template <class Algo>
class TiledForward : public ConvPassKernel {
 public:
  explicit TiledForward(const ConvSetup& s)
      : conv_(Algo::Make(ForwardShape(s), *LayoutOf(s.src_md), *LayoutOf(s.dst_md))),
        weights_(s.w.value.data()),
        bias_(s.b.value.data()),
        alpha_(s.leaky_alpha) {
    conv_->SetWeights(weights_);
  }
  void Run(OpContext&, const memory& src, const memory&, memory* dst) override {
    conv_->Forward(static_cast<const float*>(src.get_data_handle()), static_cast<float*>(dst->get_data_handle()), bias_,
                   alpha_);
  }
  void Refresh(OpContext&) override { conv_->SetWeights(weights_); }
  std::string Impl() const override { return Algo::Describe(*conv_); }
  int64_t WorkspaceBytes() const override { return conv_->WorkspaceBytes(); }

 private:
  std::unique_ptr<typename Algo::Kernel> conv_;
  const float* weights_;
  const float* bias_;
  float alpha_;
};

template <class Algo>
class TiledBackwardData : public ConvPassKernel {
 public:
  explicit TiledBackwardData(const ConvSetup& s)
      : conv_(Algo::Make(BackwardDataShape(s), *LayoutOf(s.dst_md), *LayoutOf(s.src_md))), weights_(s.w.value.data()) {
    conv_->SetWeights(weights_, true);
  }
  void Run(OpContext&, const memory&, const memory& diff_dst, memory* diff_src) override {
    conv_->Forward(static_cast<const float*>(diff_dst.get_data_handle()),
                   static_cast<float*>(diff_src->get_data_handle()), nullptr, -1.f);
  }
  void Refresh(OpContext&) override { conv_->SetWeights(weights_, true); }
  std::string Impl() const override { return Algo::Describe(*conv_); }
  int64_t WorkspaceBytes() const override { return conv_->WorkspaceBytes(); }

 private:
  std::unique_ptr<typename Algo::Kernel> conv_;
  const float* weights_;
};

template <class Algo>
class TiledBackwardWeights : public ConvPassKernel {
 public:
  explicit TiledBackwardWeights(const ConvSetup& s)
      : conv_(Algo::Make(ForwardShape(s), *LayoutOf(s.src_md), *LayoutOf(s.dst_md))),
        grad_w_(s.w.grad.data()),
        grad_b_(s.b.grad.data()) {}
  void Run(OpContext&, const memory& src, const memory& diff_dst, memory*) override {
    conv_->BackwardWeights(static_cast<const float*>(src.get_data_handle()),
                           static_cast<const float*>(diff_dst.get_data_handle()), grad_w_, grad_b_);
  }
  std::string Impl() const override { return Algo::Describe(*conv_); }
  int64_t WorkspaceBytes() const override { return conv_->WorkspaceBytes(); }

 private:
  std::unique_ptr<typename Algo::Kernel> conv_;
  float* grad_w_;
  float* grad_b_;
};

template <class Algo, Conv3dShape (*Shape)(const ConvSetup&), template <class> class Pass>
ConvCandidate TiledCandidate(const char* name) {
  return {name, [](const ConvSetup& s) { return TiledSupports(s) && Algo::Supports(Shape(s)); },
          [](const ConvSetup& s) { return Algo::Preferred(Shape(s)); },
          [](const ConvSetup& s) -> std::unique_ptr<ConvPassKernel> { return std::make_unique<Pass<Algo>>(s); }};
}

}  // namespace

ConvCandidate FftFwdCandidate() { return TiledCandidate<Fft, ForwardShape, TiledForward>("fft"); }
ConvCandidate FftBwdDataCandidate() { return TiledCandidate<Fft, BackwardDataShape, TiledBackwardData>("fft"); }
ConvCandidate FftBwdWeightsCandidate() { return TiledCandidate<Fft, ForwardShape, TiledBackwardWeights>("fft"); }
ConvCandidate WinogradFwdCandidate() { return TiledCandidate<Winograd, ForwardShape, TiledForward>("winograd"); }
ConvCandidate WinogradBwdDataCandidate() {
  return TiledCandidate<Winograd, BackwardDataShape, TiledBackwardData>("winograd");
}
ConvCandidate WinogradBwdWeightsCandidate() {
  return TiledCandidate<Winograd, ForwardShape, TiledBackwardWeights>("winograd");
}

}  // namespace cosmoflow::nn_internal
