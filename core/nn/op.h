// The op interface of the network (internal to core/nn): one op per layer, or per fused group of
// layers, built once for a batch size and then only executed.
//
// Life cycle, as Network::Create drives it:
//   factory (layer_table row) -> constructor: checks, chooses kernels, creates primitives and dst;
//   training: SetUpBackward(need_diff_src) once the network has bound diff_src/diff_dst;
//   then per step: Forward, and in training Backward; RefreshWeights after parameter writes.
// Memory: src is the previous op's dst (a concrete oneDNN desc); dst is the op's own; diff_dst and
// diff_src point into the network's two ping-pong buffers (op i's diff_dst in buffer i % 2).
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <oneapi/dnnl/dnnl.hpp>
#include <string>
#include <vector>

#include "core/nn/kernel_timings.h"
#include "core/nn/network.h"
#include "core/nn/spec.h"

namespace cosmoflow::nn_internal {

// Shared state of one network.
struct OpContext {
  dnnl::engine eng{dnnl::engine::kind::cpu, 0};
  dnnl::stream strm{eng};
  dnnl::memory::data_type dt = dnnl::memory::data_type::f32;
  bool training = false;
  int batch = 1;
  uint64_t seed = 0;
  uint64_t step = 0;  // training forwards so far (dropout masks)
  // 0: batch_norm's running statistics move by momentum. k >= 1: this forward is the k-th of a
  // statistics pass (Network::BeginStatisticsPass), and they become the pass's population values.
  int64_t statistics_pass = 0;
  // Convolutions whose src is channels-last (ndhwc) write ndhwc too (see ConvLayout in conv3d.h).
  bool channels_last = false;
  // Kernel choices forced by the caller (NetworkOptions::kernels, validated).
  std::map<std::string, std::string> kernels;
  // Sums `n` doubles over every replica of this network (NetworkOptions::allreduce_sum); empty for
  // one process.
  std::function<void(double* data, int n)> allreduce_sum;
  // > 0: the last layer's input gradient uses only its first `head_gradient_outputs` outputs (the
  // means of an uncertainty head; NetworkOptions::covariance_gradient_head_only).
  int head_gradient_outputs = 0;
  // How a pass's kernel is chosen where `kernels` forces none (NetworkOptions::kernel_selection),
  // and, when measuring, the timings (owned by the network, saved after the last op is set up).
  KernelSelection selection = KernelSelection::kRule;
  KernelTimings* timings = nullptr;

  // The forced choice for `pass` of op `op_name` of kind `kind` ("conv1.bwd_data" before
  // "conv.bwd_data"), or "" when the rule decides.
  std::string Forced(const std::string& op_name, const std::string& kind, const std::string& pass) const;
};

// A tensor owned by the network: fp32 master value and, if trainable and training, its gradient.
struct ParamStore {
  std::string name;
  std::vector<int64_t> shape;
  std::vector<float> value;
  std::vector<float> grad;
};

// What a layer's factory gets.
struct OpArgs {
  OpContext& ctx;
  const std::vector<LayerSpec>& layers;
  size_t index;  // the layer this op starts at
  std::string name;  // "conv1", "bn0" (before any "+leaky")
  dnnl::memory::desc src_md;
  dnnl::memory src;
  // The layer's tensors in the order of its row's params(), and their indices in the network's
  // list of trainable parameters (-1 for state tensors).
  std::vector<ParamStore*> params;
  std::vector<int> param_indices;
  bool first_op = false;  // no op before it: it never computes diff_src
  // Set by the factory: how many layers the op consumed (1, or 2 with a fused leaky ReLU).
  size_t consumed = 1;
  const LayerSpec& layer() const { return layers[index]; }
  // The leaky ReLU that follows this layer, or nullptr.
  const LayerSpec* NextLeaky() const;
};

class Op {
 public:
  explicit Op(std::string name) : name_(std::move(name)) {}
  virtual ~Op() = default;
  const std::string& name() const { return name_; }

  // Training only, once diff_dst/diff_src are bound.
  virtual void SetUpBackward(OpContext& c, bool need_diff_src) {}
  virtual void Forward(OpContext& c) = 0;
  // Computes parameter grads (if any) and, when need_diff_src, diff_src.
  virtual void Backward(OpContext& c, bool need_diff_src) = 0;
  // Called after the master values of the op's parameters changed.
  virtual void RefreshWeights(OpContext& c) {}
  // The fused first block reads the user's input directly.
  virtual bool ReadsUserInput() const { return false; }
  virtual void SetUserInput(const float* src) {}
  virtual double FwdFlops() const { return 0; }
  virtual double BwdFlops(bool need_diff_src) const { return 0; }
  virtual std::vector<KernelChoice> Kernels() const = 0;
  // Extra working memory the op holds beyond src/dst (bytes), for the profile.
  virtual int64_t WorkspaceBytes() const { return 0; }

  dnnl::memory::desc src_md, dst_md;
  dnnl::memory src, dst;
  dnnl::memory diff_src, diff_dst;
  std::vector<int> params;  // indices into the network's trainable parameters
  double fwd_ms = 0, bwd_ms = 0;

 protected:
  std::string name_;
};

}  // namespace cosmoflow::nn_internal
