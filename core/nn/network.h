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
#pragma once

#include <cstdint>
#include <functional>
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

struct NetworkOptions {
  int batch = 1;
  Precision precision = Precision::kFp32;
  bool training = false;      // false: inference only (no backward buffers, dropout off)
  uint64_t seed = 0;          // parameter init and dropout masks
};

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
  // Must be called after anything writes parameter values (optimizer step, load, allreduce of
  // weights) so that reordered / bf16 working copies are refreshed.
  virtual void ParametersUpdated() = 0;

  // Deterministic initialisation from `seed` (He-uniform for conv/dense with leaky ReLU, zero bias).
  virtual void InitParameters(uint64_t seed) = 0;
  // Copies weights by name and shape; errors name the first missing or mismatched tensor.
  virtual Status LoadParameters(const std::vector<NamedTensor>& tensors) = 0;
  virtual std::vector<NamedTensor> ExportParameters() const = 0;

  // src: batch x C x side^3 floats; dst: batch x P floats. Dropout is active only in training mode.
  virtual void Forward(const float* src, float* dst) = 0;

  // Backward from diff_dst = dLoss/dOutput (batch x P) of the last Forward(); writes (overwrites)
  // every parameter's grad. `on_grad_ready(i)` is called, in reverse layer order, as soon as the
  // gradient of parameters()[i] is final, so a trainer can start its allreduce while the backward
  // pass continues. Training mode only.
  virtual void Backward(const float* diff_dst,
                        const std::function<void(int)>& on_grad_ready = nullptr) = 0;

  // Number of training Forward() calls so far; it selects the dropout masks. A trainer resuming
  // after step S sets it to S so that it draws the same masks as an uninterrupted run.
  virtual void SetTrainingStep(uint64_t step) = 0;

  // Per-layer timing of the last Forward/Backward when profiling is on (for the benchmarks).
  virtual void SetProfiling(bool on) = 0;
  virtual std::string ProfileReport() const = 0;
};

}  // namespace cosmoflow
