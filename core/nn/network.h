// The CosmoFlow network on oneDNN primitives: forward and backward of a ModelSpec for one batch size.
//
// Contract:
// - Create() builds every primitive, memory and workspace for (spec, batch, precision, mode) once;
//   Forward/Backward only execute (no allocation, no primitive creation per step).
// - Input: batch x C x D x H x W float32, plain NCDHW, already passed through the input transform.
//   Output: batch x P float32 normalised labels (see ModelSpec outputs).
// - Parameters are fp32 master copies in plain layout (OIDHW, (out,in), (out)). In bf16 mode the
//   network keeps bf16/reordered working copies that it refreshes from the masters when told by
//   ParametersUpdated(). Gradients are fp32 in the same plain layout as the parameters.
// - The gradient of the input cube is never computed.
// - Not thread-safe: one thread drives one Network. oneDNN uses OpenMP threads internally.
// - Built from the layer table (core/nn/layer_table.h): one op per layer (core/nn/ops/), a conv or
//   dense followed by a leaky ReLU fused into one op, and a 1-channel first block (conv + leaky
//   ReLU + average pool) fused into one kernel where the CPU supports it.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "core/base/status.h"
#include "core/nn/spec.h"
#include "core/nn/tensor.h"

namespace cosmoflow {

enum class Precision { kFp32, kBf16 };
const char* PrecisionName(Precision p);
StatusOr<Precision> ParsePrecision(const std::string& name);  // "fp32" | "bf16"
// Whether this CPU runs bf16 networks (oneDNN needs AVX512-BF16 or AMX). Without it, building a bf16
// network fails with FAILED_PRECONDITION rather than falling back to oneDNN's reference loops.
bool Bf16Supported();

// Kernel choices forced by the caller, by key; an absent key or "auto" leaves the choice to the
// rule. Keys and values (docs/engine.md has the candidates' rules):
//   "conv.fwd"          fft | onednn
//   "conv.bwd_data"     fft | transposed | onednn
//   "conv.bwd_weights"  fft | channels_last_wgrad | first_conv_wgrad | onednn
//   "conv.layout"       channels_last | no_channels_last
//   "first_block"       fused | onednn
// "convN.<pass>" (N a conv's index, e.g. "conv1.bwd_data") applies to one conv and wins over
// "conv.<pass>". A forced candidate that does not support a conv's problem (ISA, layout,
// precision, shape) leaves that conv to the rule; ChosenKernels() says what runs.
using KernelOptions = std::map<std::string, std::string>;
// Checks keys and values; the error names the first bad entry.
Status ValidateKernelOptions(const KernelOptions& kernels);
// The one environment override of kernel choices: COSMOFLOW_KERNELS="key=value,key=value" (same
// keys and values). Network::Create applies it over NetworkOptions::kernels; a malformed value is
// an error of Create.
StatusOr<KernelOptions> KernelOptionsFromEnvironment();

// How a conv pass's kernel is chosen where KernelOptions forces none:
//   kRule     the fixed rule of docs/engine.md (the same kernels on every run and machine state);
//   kMeasure  every candidate that supports the pass is timed on the pass's real shapes and
//             layouts at Create, and the fastest kept (the rule's choice unless another is more
//             than 5% faster). Timings are kept in NetworkOptions::kernel_cache. The choice
//             depends on the machine's state when first timed: networks that must agree
//             bit for bit (ranks of one job) share one choice through PinnedKernels.
enum class KernelSelection { kRule, kMeasure };
const char* KernelSelectionName(KernelSelection s);
StatusOr<KernelSelection> ParseKernelSelection(const std::string& name);  // "rule" | "measure"
// The timing cache's default file: $COSMOFLOW_KERNEL_CACHE, else $XDG_CACHE_HOME/cosmoflow/
// kernel-timings.tsv, else $HOME/.cache/cosmoflow/kernel-timings.tsv; "" when none is set.
std::string DefaultKernelCachePath();
// "key=value,key=value" (the COSMOFLOW_KERNELS form) and back.
std::string FormatKernelOptions(const KernelOptions& kernels);
StatusOr<KernelOptions> ParseKernelOptions(const std::string& text);

struct NetworkOptions {
  int batch = 1;
  Precision precision = Precision::kFp32;
  bool training = false;      // false: inference only (no backward buffers, dropout off)
  uint64_t seed = 0;          // parameter init and dropout masks
  KernelOptions kernels;
  // Sums `n` doubles in place over every replica of this network (data-parallel ranks), for the
  // batch statistics of batch_norm layers; the trainer passes an MPI allreduce. Empty: this process
  // is the only replica.
  std::function<void(double* data, int n)> allreduce_sum;
  // Uncertainty heads only: when true, the gradient of the covariance outputs trains the last dense
  // layer but stops there (the layers below learn from the means' gradient alone), so the trunk
  // trains as a head-less network's would and the covariance is a read-out of its features.
  bool covariance_gradient_head_only = false;
  // Kernel choice where `kernels` forces none (see KernelSelection), and the file of measured
  // timings, keyed by (pass, shapes, layouts, precision, ISA, threads) so that a second Create
  // on the same machine does not time again; "" keeps timings for this Create only.
  KernelSelection kernel_selection = KernelSelection::kRule;
  std::string kernel_cache;
};

// Which kernel runs one pass of one op.
struct KernelChoice {
  std::string op;      // "conv1+leaky", "avg_pool0", ...
  std::string pass;    // "fwd", "bwd_data", "bwd_weights", "bwd"
  std::string kernel;  // the candidate: "onednn", "transposed", "channels_last_wgrad", "fused", ...
  std::string impl;    // what it runs: oneDNN's implementation name, or our kernel and its ISA
};

// Every conv pass of `chosen` as a forced "convN.<pass>" option: a network created with them runs
// the same kernels without measuring (how the MPI trainer makes every rank run rank 0's choice).
KernelOptions PinnedKernels(const std::vector<KernelChoice>& chosen);

// One pass as the logs and the profile show it: "fwd=onednn(brg:avx512_core)".
std::string DescribeKernel(const KernelChoice& k);
// Every conv pass of `chosen`, "conv1+leaky fwd=onednn(...), conv1+leaky bwd_weights=...".
std::string DescribeConvKernels(const std::vector<KernelChoice>& chosen);

// A view of one trainable tensor owned by the network.
struct Parameter {
  std::string name;                 // "conv0.weights", "conv0.bias", "dense0.weights", ...
  std::vector<int64_t> shape;       // plain layout
  float* value = nullptr;           // fp32 master, numel() floats
  float* grad = nullptr;            // fp32 gradient (training only), numel() floats
  int64_t numel() const {
    int64_t n = 1;
    for (auto d : shape) n *= d;
    return n;
  }
};

class Network {
 public:
  static StatusOr<std::unique_ptr<Network>> Create(const ModelSpec& spec, const NetworkOptions& options);
  virtual ~Network() = default;

  virtual const ModelSpec& spec() const = 0;
  virtual const NetworkOptions& options() const = 0;

  // Trainable tensors in a fixed order (the order of layers, weights before bias).
  virtual std::vector<Parameter>& parameters() = 0;
  // The kernel of every pass of every op, in op order (also in ProfileReport()).
  virtual std::vector<KernelChoice> ChosenKernels() const = 0;
  // Must be called after anything writes parameter values (optimizer step, load, allreduce of
  // weights) so that reordered / bf16 working copies are refreshed.
  virtual void ParametersUpdated() = 0;

  // Deterministic initialisation from `seed` by each tensor's rule in the layer table (He-uniform
  // for conv/dense weights, zero biases, batch norm's gamma and running variance one).
  virtual void InitParameters(uint64_t seed) = 0;
  // Copies every tensor by name and shape, the trainable parameters and the state tensors (batch
  // norm's running statistics); errors name the first missing or mismatched tensor.
  virtual Status LoadParameters(const std::vector<NamedTensor>& tensors) = 0;
  // Trainable parameters in parameters() order, then the state tensors.
  virtual std::vector<NamedTensor> ExportParameters() const = 0;

  // src: batch x C x side^3 floats; dst: batch x P floats. Dropout is active only in training mode.
  virtual void Forward(const float* src, float* dst) = 0;

  // Backward from diff_dst = dLoss/dOutput (batch x P) of the last Forward(); writes (overwrites)
  // every parameter's grad. `on_grad_ready(i)` is called, in reverse layer order, as soon as the
  // gradient of parameters()[i] is final, so a trainer can start its allreduce while the backward
  // pass continues. Training mode only.
  virtual void Backward(const float* diff_dst,
                        const std::function<void(int)>& on_grad_ready = nullptr) = 0;

  // Recomputes batch_norm's running statistics (training mode): between Begin and End, each
  // Forward() sets them to the mean and unbiased variance of every activation of every batch
  // forwarded since Begin (over all replicas), instead of moving them by momentum; no Backward()
  // is needed. The momentum averages follow weights that changed during the last steps and rest on
  // a few batches; these are the population statistics of the weights as they are now. Dropout
  // draws masks as in training, and End restores the training step, so a resumed run draws the
  // masks an uninterrupted one would.
  virtual void BeginStatisticsPass() = 0;
  virtual void EndStatisticsPass() = 0;

  // Number of training Forward() calls so far; it selects the dropout masks. A trainer resuming
  // after step S sets it to S so that it draws the same masks as an uninterrupted run.
  virtual void SetTrainingStep(uint64_t step) = 0;

  // Per-layer timing of the last Forward/Backward when profiling is on (for the benchmarks).
  virtual void SetProfiling(bool on) = 0;
  virtual std::string ProfileReport() const = 0;
};

}  // namespace cosmoflow
