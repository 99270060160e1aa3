// conv3d backward-weights candidates. Our two kernels replace oneDNN's where oneDNN 2.6 would run
// the pass as im2col + gemm (it has no direct 3D backward-weights kernel for AVX2): both read fp32
// channels-last src and diff_dst in place.
//   channels_last_wgrad  any stride-1 conv with C % 16 == 0 (F % 4 == 0) or C == 4 (F % 16 == 0)
//   first_conv_wgrad     the network's first conv with 1-4 channels and 16 filters (a planar copy)
//   onednn               oneDNN's primitive, reordered to the plain gradient
// (and winograd and fft, the tiled correlations of conv3d_tiled.cc, first in the list)
#include <memory>

#include "core/nn/kernels/conv_wgrad.h"
#include "core/nn/kernels/first_block.h"
#include "core/nn/ops/conv3d.h"

namespace cosmoflow::nn_internal {
namespace {

using dnnl::memory;

bool OneDnnIsGemm(const ConvSetup& s) { return IsGemm(s.onednn_bwd_w_pd.impl_info_str()); }

class ChannelsLastKernel : public ConvPassKernel {
 public:
  explicit ChannelsLastKernel(const ConvSetup& s)
      : kernel_(static_cast<int>(s.g.n), static_cast<int>(s.g.ic), static_cast<int>(s.g.oc),
                static_cast<int>(s.g.side), static_cast<int>(s.g.k), static_cast<int>(s.g.pad_left),
                static_cast<int>(s.g.out)),
        gw_(s.w.grad.data()), gb_(s.b.grad.data()) {}
  void Run(OpContext& c, const memory& src, const memory& diff_dst, memory*) override {
    kernel_.Run(static_cast<const float*>(src.get_data_handle()), static_cast<const float*>(diff_dst.get_data_handle()),
                gw_, gb_);
  }
  std::string Impl() const override { return "cosmoflow:channels_last_wgrad(avx2)"; }

 private:
  ChannelsLastWeightGrad kernel_;
  float* gw_;
  float* gb_;
};

class FirstConvKernel : public ConvPassKernel {
 public:
  explicit FirstConvKernel(const ConvSetup& s)
      : kernel_(static_cast<int>(s.g.n), static_cast<int>(s.g.ic), static_cast<int>(s.g.side),
                static_cast<int>(s.g.k), static_cast<int>(s.g.pad_left), static_cast<int>(s.g.out)),
        gw_(s.w.grad.data()), gb_(s.b.grad.data()) {}
  void Run(OpContext& c, const memory& src, const memory& diff_dst, memory*) override {
    kernel_.Run(static_cast<const float*>(src.get_data_handle()), static_cast<const float*>(diff_dst.get_data_handle()),
                gw_, gb_);
  }
  std::string Impl() const override { return std::string("cosmoflow:first_conv_wgrad(") + FirstBlockKernel::Isa() + ")"; }

 private:
  FirstConvWeightGrad kernel_;
  float* gw_;
  float* gb_;
};

class OneDnnKernel : public ConvPassKernel {
 public:
  explicit OneDnnKernel(const ConvSetup& s) : pd_(s.onednn_bwd_w_pd), prim_(pd_) {
    wgrad_.Init(s.ctx, memory::desc(s.g.weights_dims(), memory::data_type::f32, memory::format_tag::oidhw),
                s.w.grad.data(), pd_.diff_weights_desc());
    diff_bias_ = memory(memory::desc({s.g.oc}, memory::data_type::f32, memory::format_tag::x), s.ctx.eng,
                        s.b.grad.data());
  }
  void Run(OpContext& c, const memory& src, const memory& diff_dst, memory*) override {
    prim_.execute(c.strm, {{DNNL_ARG_SRC, src}, {DNNL_ARG_DIFF_DST, diff_dst}, {DNNL_ARG_DIFF_WEIGHTS, wgrad_.work},
                           {DNNL_ARG_DIFF_BIAS, diff_bias_}});
    wgrad_.Export(c);
  }
  std::string Impl() const override { return pd_.impl_info_str(); }

 private:
  dnnl::convolution_backward_weights::primitive_desc pd_;
  dnnl::convolution_backward_weights prim_;
  WeightGrad wgrad_;
  memory diff_bias_;
};

}  // namespace

const std::vector<ConvCandidate>& BwdWeightsCandidates() {
  static const std::vector<ConvCandidate> kList = {
      WinogradBwdWeightsCandidate(),
      FftBwdWeightsCandidate(),
      {"channels_last_wgrad",
       [](const ConvSetup& s) {
         return s.Fp32ChannelsLast() && ChannelsLastWeightGrad::Supported(static_cast<int>(s.g.ic),
                                                                          static_cast<int>(s.g.oc),
                                                                          static_cast<int>(s.g.stride));
       },
       OneDnnIsGemm, [](const ConvSetup& s) -> std::unique_ptr<ConvPassKernel> {
         return std::make_unique<ChannelsLastKernel>(s);
       }},
      {"first_conv_wgrad",
       [](const ConvSetup& s) {
         return s.first_op && s.Fp32ChannelsLast() &&
                FirstConvWeightGrad::Supported(static_cast<int>(s.g.ic), static_cast<int>(s.g.oc),
                                               static_cast<int>(s.g.k), static_cast<int>(s.g.stride));
       },
       OneDnnIsGemm, [](const ConvSetup& s) -> std::unique_ptr<ConvPassKernel> {
         return std::make_unique<FirstConvKernel>(s);
       }},
      {"onednn", [](const ConvSetup&) { return true; }, [](const ConvSetup&) { return true; },
       [](const ConvSetup& s) -> std::unique_ptr<ConvPassKernel> { return std::make_unique<OneDnnKernel>(s); }},
  };
  return kList;
}

}  // namespace cosmoflow::nn_internal
