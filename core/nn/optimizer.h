// Optimizers over the network's fp32 master parameters (Network::parameters()).
//
// Contract:
// - Step(params, lr) updates every Parameter's value from its grad, in place, with the given
//   learning rate (the schedule's value for this step); the caller then calls
//   Network::ParametersUpdated(). Gradients are read, never modified.
// - Weight decay is decoupled for Adam (AdamW: value -= lr * wd * value) and L2-coupled for SGD
//   (grad += wd * value), the usual conventions. Biases are not decayed.
// - State (momentum, Adam moments, step count) is exported as NamedTensors named
//   "<optimizer>.<slot>.<parameter>" (e.g. "adam.m.conv0.weights", "sgd.momentum.dense0.bias") plus
//   "<optimizer>.step" (a 1-element tensor), and restored from the same list; restore checks names
//   and shapes and names the first mismatch.
// - Deterministic: elementwise, no reductions, same result on every run.
// - Not thread-safe; internally parallel with OpenMP.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "core/base/status.h"
#include "core/nn/network.h"
#include "core/nn/tensor.h"

namespace cosmoflow {

struct OptimizerConfig {
  std::string name = "adam";  // "adam" | "sgd"
  float momentum = 0.9f;      // sgd
  bool nesterov = false;      // sgd
  float beta1 = 0.9f;         // adam
  float beta2 = 0.999f;       // adam
  float epsilon = 1e-8f;      // adam
  float weight_decay = 0.f;
};

class Optimizer {
 public:
  // Fails on an unknown name or out-of-range hyper-parameters (the message names the field).
  static StatusOr<std::unique_ptr<Optimizer>> Create(const OptimizerConfig& config);
  virtual ~Optimizer() = default;

  virtual const std::string& name() const = 0;
  // Lazily sizes its state on the first call from the parameters' shapes.
  virtual void Step(std::vector<Parameter>& params, float lr) = 0;
  virtual int64_t steps() const = 0;

  virtual std::vector<NamedTensor> ExportState(const std::vector<Parameter>& params) const = 0;
  virtual Status RestoreState(const std::vector<Parameter>& params, const std::vector<NamedTensor>& state) = 0;
};

}  // namespace cosmoflow
