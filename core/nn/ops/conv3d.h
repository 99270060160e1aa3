// The conv3d op's parts (internal to core/nn): its geometry, its layout choice, and the candidate
// kernels of its backward passes.
//
// Kernel choice: each pass has a list of candidates. A candidate says whether it supports the
// problem (ISA, layout, precision, shape) and whether the rule prefers it; the op takes the forced
// candidate (NetworkOptions::kernels, "conv.<pass>" or "<op name>.<pass>") when it supports the
// problem, else the first supported candidate the rule prefers, or with kernel selection by
// measurement the fastest supported candidate as timed on the real descs (conv3d_measure.cc). The
// last candidate of every list (oneDNN's primitive) supports everything, so there is always a choice.
//   pass         candidates (list order)
//   fwd          winograd, fft (the tiled kernels, conv3d_tiled.cc), onednn (direct convolution,
//                layout chosen by ConvOp)
//   bwd_data     winograd, fft, transposed (a forward conv of the transposed problem), onednn
//   bwd_weights  winograd, fft, channels_last_wgrad, first_conv_wgrad (our direct kernels), onednn
#pragma once

#include <cstdint>
#include <memory>
#include <oneapi/dnnl/dnnl.hpp>
#include <string>
#include <utility>
#include <vector>

#include "core/nn/op.h"
#include "core/nn/ops/onednn_util.h"

namespace cosmoflow::nn_internal {

struct ConvGeom {
  int64_t n = 0, ic = 0, oc = 0, side = 0, out = 0, k = 0, stride = 1, pad_left = 0, pad_right = 0;
  dnnl::memory::dims weights_dims() const { return {oc, ic, k, k, k}; }
  dnnl::memory::dims dst_dims() const { return {n, oc, out, out, out}; }
  dnnl::memory::dims strides() const { return {stride, stride, stride}; }
  dnnl::memory::dims padl() const { return {pad_left, pad_left, pad_left}; }
  dnnl::memory::dims padr() const { return {pad_right, pad_right, pad_right}; }
  double Flops() const { return 2.0 * k * k * k * ic * oc * out * out * out * n; }
};
ConvGeom ConvGeomOf(const dnnl::memory::dims& src_dims, const LayerSpec& layer);

// Everything a backward candidate needs to decide and to set itself up.
struct ConvSetup {
  OpContext& ctx;
  const ConvGeom& g;
  bool first_op;
  const dnnl::memory::desc& src_md;  // the layout the convolution runs on (after any src reorder)
  const dnnl::memory::desc& dst_md;
  const dnnl::convolution_forward::primitive_desc& fwd_pd;
  // oneDNN's backward-weights choice for this problem (the rule asks whether it is a gemm).
  const dnnl::convolution_backward_weights::primitive_desc& onednn_bwd_w_pd;
  ParamStore& w;
  ParamStore& b;
  const WorkingWeights& weights;  // forward's working copy and the master
  float leaky_alpha;               // the fused leaky ReLU's slope, or -1 without one
  const std::string& op_name;      // "conv1", for the measurement's log line
  bool Fp32ChannelsLast() const;
};

// One pass of one conv. Run(c, a, b, out): fwd reads src (a) and writes dst (out) with bias and
// the fused activation; bwd_data reads diff_dst (b) and writes diff_src (out); bwd_weights reads
// src (a) and diff_dst (b) and overwrites the parameters' gradients (out unused).
class ConvPassKernel {
 public:
  virtual ~ConvPassKernel() = default;
  virtual void Run(OpContext& c, const dnnl::memory& a, const dnnl::memory& b, dnnl::memory* out) = 0;
  virtual void Refresh(OpContext& c) {}  // after the weights changed
  virtual std::string Impl() const = 0;
  virtual int64_t WorkspaceBytes() const { return 0; }
};

struct ConvCandidate {
  const char* name;
  bool (*supports)(const ConvSetup& s);
  bool (*preferred)(const ConvSetup& s);  // asked only when supported
  std::unique_ptr<ConvPassKernel> (*make)(const ConvSetup& s);
};
const std::vector<ConvCandidate>& FwdCandidates();         // conv3d.cc
const std::vector<ConvCandidate>& BwdDataCandidates();     // conv3d_bwd_data.cc
const std::vector<ConvCandidate>& BwdWeightsCandidates();  // conv3d_bwd_weights.cc
// The tiled candidates of the three passes (conv3d_tiled.cc): FFT-tiled and Winograd.
ConvCandidate FftFwdCandidate();
ConvCandidate FftBwdDataCandidate();
ConvCandidate FftBwdWeightsCandidate();
ConvCandidate WinogradFwdCandidate();
ConvCandidate WinogradBwdDataCandidate();
ConvCandidate WinogradBwdWeightsCandidate();

// The chosen entry's index for `pass` ("fwd", "bwd_data", "bwd_weights"): the forced candidate if
// it supports the problem; else with s.ctx.selection = kRule the first supported candidate the rule
// prefers (the list's last when none), with kMeasure the fastest measured (MeasureCandidates).
size_t ChooseCandidate(const std::vector<ConvCandidate>& list, const ConvSetup& s, const std::string& forced,
                       const char* pass);
// Times every candidate of `list` that supports the problem on scratch tensors of the pass's real
// descs (or takes s.ctx.timings' cached figures) and returns the fastest's index; the rule's
// choice `rule` is kept unless another is more than kMeasureMargin faster. Logs one line per pass.
constexpr double kMeasureMargin = 0.05;
size_t MeasureCandidates(const std::vector<ConvCandidate>& list, const ConvSetup& s, const char* pass, size_t rule);

// oneDNN's backward-weights / backward-data primitive descriptors for this problem.
dnnl::convolution_backward_weights::primitive_desc OneDnnBwdWeightsPd(OpContext& c, const ConvGeom& g,
                                                                      const dnnl::memory::desc& src_md,
                                                                      const dnnl::convolution_forward::primitive_desc& fwd);
dnnl::convolution_backward_data::primitive_desc OneDnnBwdDataPd(OpContext& c, const ConvGeom& g,
                                                                const dnnl::memory::desc& src_md,
                                                                const dnnl::convolution_forward::primitive_desc& fwd);

// Which of `candidates` (layouts a producer can write) a conv `layer` on src dims `dims` should
// read: oneDNN's preference, or in fp32 training channels-last (ndhwc) when every pass has a real
// kernel there, which then sets c.channels_last. 0 if it prefers none of them.
int PreferredConvSrcLayout(OpContext& c, const dnnl::memory::dims& dims, const LayerSpec& layer,
                           const std::vector<std::pair<dnnl::memory::desc, int>>& candidates);

}  // namespace cosmoflow::nn_internal
