// The tiled candidates of conv3d's three passes: FFT-tiled (core/nn/kernels/fft_conv.h) and
// Winograd (core/nn/kernels/winograd_conv.h). Both need stride 1 and src and dst in a layout the
// kernels read (planar, channels-last, or blocked by 8 or 16 with whole blocks); FFT fp32 tensors
// and any kernel size with a tile within its memory cap, Winograd fp32 or bf16 tensors (fp32
// arithmetic; the fp32 master weights), kernel sides 2 to 4 and transformed weights within its
// memory cap. backward-data is the forward correlation of diff_dst with the weights transposed and
// flipped.
// The rule takes Winograd where its modelled flop ratio (transforms and the padding of channels to
// 16 counted) is at least kMinWinogradFlopRatio and the pass has at least kMinWinogradTiles output
// tiles: sc18's 4^3 convs and mlperf's 3^3 convs of 32 and 64 input channels, which it runs
// 1.4-2.6x faster than oneDNN's direct kernels in every pass (docs/benchmarks.md); not layers of
// few input channels (mlperf's first conv, 4 channels padded to 16, ratio 0.96) nor small cubes.
// In bf16 the rule takes Winograd (same thresholds) only on a CPU without AMX: there oneDNN's
// AVX512-BF16 direct kernels run at about twice the fp32 FMA peak, and Winograd's fp32 arithmetic
// with a flop ratio >= 3 still wins (sc18's conv1 and conv2 on a Zen 4, docs/benchmarks.md); on
// AMX oneDNN's tiles run several times faster than that. In a build without AVX-512 the rule never
// takes Winograd: its narrower micro-kernel there runs sc18's 4^3 convs forward at 0.6-0.75x the
// speed of oneDNN's AVX2 direct kernels (measured on a Zen 4 held to AVX2, docs/benchmarks.md);
// forcing or measurement still can.
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

// The element strides of an fp32 or bf16 activation, or nullopt for a layout the kernels do not read.
std::optional<ActivationLayout> LayoutOf(const memory::desc& md) {
  const memory::dims d = md.dims();
  const Dt dt = md.data_type();
  if (d.size() != 5 || (dt != Dt::f32 && dt != Dt::bf16) || d[2] != d[3] || d[2] != d[4]) return std::nullopt;
  const int64_t c = d[1], voxels = d[2] * d[3] * d[4];
  if (md == memory::desc(d, dt, Tag::ncdhw)) return ActivationLayout::Planar(c, voxels);
  if (md == memory::desc(d, dt, Tag::ndhwc)) return ActivationLayout::ChannelsLast(c, voxels);
  if (c % 16 == 0 && md == memory::desc(d, dt, Tag::nCdhw16c)) return ActivationLayout::Blocked(c, voxels, 16);
  if (c % 8 == 0 && md == memory::desc(d, dt, Tag::nCdhw8c)) return ActivationLayout::Blocked(c, voxels, 8);
  return std::nullopt;
}

bool CpuHasAmx() { return dnnl::get_effective_cpu_isa() == dnnl::cpu_isa::avx512_core_amx; }

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
  return s.g.stride == 1 && LayoutOf(s.src_md) && LayoutOf(s.dst_md);
}

// What the pass classes need of an algorithm.
struct Fft {
  using Kernel = FftConv3d;
  static bool Supports(const Conv3dShape& shape, Dt dt) { return dt == Dt::f32 && FftConv3d::TileFor(shape) > 0; }
  static bool Preferred(const Conv3dShape& shape, Dt) {
    const int t = FftConv3d::ChooseTile(shape);
    return t > 0 && FftConv3d::FlopRatio(shape, t) >= kMinFftFlopRatio;
  }
  static std::unique_ptr<FftConv3d> Make(const Conv3dShape& shape, const ActivationLayout& src,
                                         const ActivationLayout& dst, Dt) {
    return std::make_unique<FftConv3d>(shape, FftConv3d::TileFor(shape), src, dst);
  }
  // fp32 only (Supports).
  static void Forward(const FftConv3d& k, const void* src, void* dst, const float* bias, float alpha) {
    k.Forward(static_cast<const float*>(src), static_cast<float*>(dst), bias, alpha);
  }
  static void BackwardWeights(const FftConv3d& k, const void* src, const void* diff_dst, float* gw, float* gb) {
    k.BackwardWeights(static_cast<const float*>(src), static_cast<const float*>(diff_dst), gw, gb);
  }
  static std::string Describe(const FftConv3d& k) { return "cosmoflow:fft_conv(tile " + std::to_string(k.tile()) + ")"; }
};

struct Winograd {
  using Kernel = WinogradConv3d;
  static bool Supports(const Conv3dShape& shape, Dt) { return WinogradConv3d::Supports(shape); }
  static bool Preferred(const Conv3dShape& shape, Dt dt) {
    return WinogradConv3d::Avx512MicroKernel() && WinogradConv3d::Supports(shape) &&
           WinogradConv3d::FlopRatio(shape) >= kMinWinogradFlopRatio &&
           WinogradConv3d::Tiles(shape) >= kMinWinogradTiles && (dt == Dt::f32 || !CpuHasAmx());
  }
  static std::unique_ptr<WinogradConv3d> Make(const Conv3dShape& shape, const ActivationLayout& src,
                                              const ActivationLayout& dst, Dt dt) {
    return std::make_unique<WinogradConv3d>(shape, src, dst,
                                            dt == Dt::bf16 ? WinogradConv3d::Io::kBf16 : WinogradConv3d::Io::kF32);
  }
  static void Forward(const WinogradConv3d& k, const void* src, void* dst, const float* bias, float alpha) {
    k.Forward(src, dst, bias, alpha);
  }
  static void BackwardWeights(const WinogradConv3d& k, const void* src, const void* diff_dst, float* gw, float* gb) {
    k.BackwardWeights(src, diff_dst, gw, gb);
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
      : conv_(Algo::Make(ForwardShape(s), *LayoutOf(s.src_md), *LayoutOf(s.dst_md), s.ctx.dt)),
        weights_(s.w.value.data()),
        bias_(s.b.value.data()),
        alpha_(s.leaky_alpha) {
    conv_->SetWeights(weights_);
  }
  void Run(OpContext&, const memory& src, const memory&, memory* dst) override {
    Algo::Forward(*conv_, src.get_data_handle(), dst->get_data_handle(), bias_, alpha_);
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
      : conv_(Algo::Make(BackwardDataShape(s), *LayoutOf(s.dst_md), *LayoutOf(s.src_md), s.ctx.dt)),
        weights_(s.w.value.data()) {
    conv_->SetWeights(weights_, true);
  }
  void Run(OpContext&, const memory&, const memory& diff_dst, memory* diff_src) override {
    Algo::Forward(*conv_, diff_dst.get_data_handle(), diff_src->get_data_handle(), nullptr, -1.f);
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
      : conv_(Algo::Make(ForwardShape(s), *LayoutOf(s.src_md), *LayoutOf(s.dst_md), s.ctx.dt)),
        grad_w_(s.w.grad.data()),
        grad_b_(s.b.grad.data()) {}
  void Run(OpContext&, const memory& src, const memory& diff_dst, memory*) override {
    Algo::BackwardWeights(*conv_, src.get_data_handle(), diff_dst.get_data_handle(), grad_w_, grad_b_);
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
  return {name, [](const ConvSetup& s) { return TiledSupports(s) && Algo::Supports(Shape(s), s.ctx.dt); },
          [](const ConvSetup& s) { return Algo::Preferred(Shape(s), s.ctx.dt); },
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
