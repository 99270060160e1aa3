// SGD with momentum and Adam over the network's fp32 master parameters, with their state exported
// as NamedTensors for checkpoints ("sgd.momentum.<param>", "adam.m.<param>", "adam.v.<param>",
// "adam.t"). Written here because core/nn had no optimizer when the trainer was built; the update
// rules are the textbook ones (PyTorch's SGD with dampening 0, Adam with bias correction).
// Deterministic: plain loops, no threads, so every rank computes bit-identical updates from
// identical gradients.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "core/base/status.h"
#include "core/nn/network.h"
#include "core/nn/tensor.h"

namespace cosmoflow {

struct TrainerOptimizerConfig {
  std::string name = "sgd";   // "sgd" | "adam"
  double momentum = 0.9;      // sgd
  double beta1 = 0.9, beta2 = 0.999, epsilon = 1e-8;  // adam
  double weight_decay = 0;    // added to the gradient as wd * w (L2), both optimizers
};

class TrainerOptimizer {
 public:
  static StatusOr<std::unique_ptr<TrainerOptimizer>> Create(const TrainerOptimizerConfig& config,
                                                     const std::vector<Parameter>& params);
  virtual ~TrainerOptimizer() = default;
  const std::string& name() const { return config_.name; }
  // One update of every parameter from its grad with learning rate `lr`.
  virtual void Step(std::vector<Parameter>& params, double lr) = 0;
  virtual std::vector<NamedTensor> ExportState() const = 0;
  // Fails naming the first missing or mismatched state tensor.
  virtual Status LoadState(const std::vector<NamedTensor>& state) = 0;

 protected:
  explicit TrainerOptimizer(TrainerOptimizerConfig config) : config_(std::move(config)) {}
  TrainerOptimizerConfig config_;
};

}  // namespace cosmoflow
