// A model described by data: the JSON spec stored in every checkpoint.
//
// JSON form (all keys shown; docs/formats.md is the reference):
// {
//   "name": "sc18", "input_channels": 1, "input_side": 128,
//   "input_transform": "log1p",          // "none" | "log1p" | "divide_by_mean" | "overdensity"
//   "uncertainty": "none",               // "none" | "gaussian" | "gaussian_full" (omitted when none)
//   "outputs": [{"name": "Omega_M", "unit": "", "offset": 0.30, "scale": 0.05}, ...],
//   "layers": [
//     {"type": "conv3d", "filters": 16, "kernel": 3, "stride": 1, "padding": "valid"},
//     {"type": "leaky_relu", "alpha": 0.01},
//     {"type": "avg_pool", "size": 2},     // or "max_pool"; stride = size
//     {"type": "dropout", "rate": 0.5},
//     {"type": "flatten"},
//     {"type": "dense", "units": 2048},
//     {"type": "scaled_tanh", "scale": 1.2}
//   ]
// }
// Label normalisation: the network regresses normalised labels n = (physical - offset) / scale;
// the server maps its outputs back with physical = offset + scale * n. Both travel in the spec.
// The training loss is taken on n, so scale is also each output's unit of error in the loss: a
// larger scale weighs that output less (tools/specs/study32x4-mean-ns-light.json gives n_s, which a small box
// barely constrains, 4x its half-range so that its irreducible error does not dominate).
//
// Uncertainty head ("uncertainty", core/nn/uncertainty.h has the arithmetic): with P outputs the
// last dense layer has HeadWidth(uncertainty, P) units, all in normalised label units:
//   none           P: the means.
//   gaussian       2P: P means, then P log-variances (a diagonal covariance).
//   gaussian_full  P + P + P(P-1)/2: P means, P log-diagonal entries and the P(P-1)/2 entries
//                  below the diagonal (row-major: (1,0), (2,0), (2,1), ...) of the lower-triangular
//                  Cholesky factor L of the precision matrix, Lambda = L L^T = Covariance^-1.
// The head is trained with the Gaussian negative log-likelihood (core/nn/loss.h).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "core/base/status.h"

namespace cosmoflow {

// Every layer type has one row in core/nn/layer_table.cc (JSON name and fields, validation, shape,
// parameters, FLOPs, op factory); a static_assert there keeps the table and this enum in step.
enum class LayerType {
  kConv3d,
  kAvgPool,
  kMaxPool,
  kLeakyRelu,
  kDropout,
  kFlatten,
  kDense,
  kScaledTanh,
  kBatchNorm,
};
inline constexpr int kNumLayerTypes = 9;
enum class InputTransform { kNone, kLog1p, kDivideByMean, kOverdensity };
const char* LayerTypeName(LayerType t);             // "conv3d", "avg_pool", ... (the JSON names)
const char* InputTransformName(InputTransform t);   // "none", "log1p", "divide_by_mean", "overdensity"

// ---- uncertainty head (spec-level) ----
enum class UncertaintyHead { kNone, kGaussian, kGaussianFull };
const char* UncertaintyHeadName(UncertaintyHead h);  // "none", "gaussian", "gaussian_full"
StatusOr<UncertaintyHead> ParseUncertaintyHead(const std::string& name);
// Units of the last dense layer that a head needs for p outputs (see the header comment).
int HeadWidth(UncertaintyHead h, int p);
// ---- end uncertainty head ----

struct LayerSpec {
  LayerType type = LayerType::kConv3d;
  int filters = 0;     // conv3d
  int kernel = 0;      // conv3d
  int stride = 1;      // conv3d
  bool same_padding = false;  // conv3d: SAME (output = ceil(in/stride)) vs VALID
  int size = 0;        // pools: window = stride = size
  float alpha = 0.f;   // leaky_relu
  float rate = 0.f;    // dropout
  int units = 0;       // dense
  float scale = 1.f;   // scaled_tanh
  // batch_norm: running = (1 - momentum) * running + momentum * batch statistic (PyTorch's
  // convention); y = gamma * (x - mean) / sqrt(var + epsilon) + beta, per channel.
  float momentum = 0.1f;
  float epsilon = 1e-5f;
};

// Output side and padding of a conv3d layer on a cube of side `in`. SAME follows TensorFlow:
// output = ceil(in / stride), the odd padding voxel on the right. VALID: output 0 when the kernel
// does not fit, no padding.
struct ConvGeometry {
  int64_t out = 0;
  int64_t pad_left = 0;
  int64_t pad_right = 0;
};
ConvGeometry ConvGeometryFor(int64_t in, int kernel, int stride, bool same_padding);

struct OutputSpec {
  std::string name;    // "Omega_M", "sigma_8", "n_s", "H0"
  std::string unit;    // "" for dimensionless, "km/s/Mpc" for H0
  float offset = 0.f;  // physical = offset + scale * normalised
  float scale = 1.f;
};

struct ModelSpec {
  std::string name;
  int input_channels = 0;
  int input_side = 0;
  InputTransform input_transform = InputTransform::kLog1p;
  std::vector<OutputSpec> outputs;
  std::vector<LayerSpec> layers;
  UncertaintyHead uncertainty = UncertaintyHead::kNone;  // spec-level: what the outputs mean

  // Width of the network's output: HeadWidth(uncertainty, outputs.size()) (= the last dense
  // layer's units in a valid spec).
  int NetworkOutputs() const { return HeadWidth(uncertainty, static_cast<int>(outputs.size())); }

  // Checks sizes and that every layer fits its input; the message names the layer (index, type).
  Status Validate() const;
  int64_t NumParameters() const;   // trainable values
  int64_t NumStateValues() const;  // saved but not trained: batch norm's running statistics
  // Forward FLOPs per sample, a multiply-add counted as 2 (conv and dense only), as the peer counts.
  double ForwardFlops() const;

  std::string ToJson() const;
  static StatusOr<ModelSpec> FromJson(const std::string& json);
};

// Built-in specs: "sc18", "mlperf" (exactly as in the CosmoFlow papers), and small ones for tests
// and the quickstart: "tiny32" (1x32^3), "small64" (1x64^3), "mlperf64" (4x64^3).
StatusOr<ModelSpec> BuiltinSpec(const std::string& name);
// A spec file (JSON, validated) if `name_or_file` names a regular file, else the built-in spec of
// that name; errors name it.
StatusOr<ModelSpec> LoadSpec(const std::string& name_or_file);
std::vector<std::string> BuiltinSpecNames();

// Default label normalisation for the CosmoFlow parameter ranges: offset = centre of the range,
// scale = half its width, so the normalised labels lie in [-1, 1].
std::vector<OutputSpec> CosmoFlowOutputs(int num_params /* 3 or 4 */);

// Applies the spec's input transform to `n` counts: log1p(x), x / mean(x) (mean over the cube's
// channel), x / mean(x) - 1 (overdensity), or identity. `voxels_per_channel` is used by
// divide_by_mean and overdensity.
void ApplyInputTransform(InputTransform t, const int16_t* counts, int64_t n, int64_t voxels_per_channel,
                         float* dst);
void ApplyInputTransform(InputTransform t, const float* values, int64_t n, int64_t voxels_per_channel,
                         float* dst);

}  // namespace cosmoflow
