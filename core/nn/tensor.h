// A named fp32 tensor in a plain layout: how weights and optimizer state leave the network (for
// checkpoints, allreduce and tests). Conv weights are OIDHW, dense weights (out, in), biases (out).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace cosmoflow {

struct NamedTensor {
  std::string name;            // e.g. "conv0.weights", "dense2.bias", "adam.m.conv0.weights"
  std::vector<int64_t> shape;
  std::vector<float> data;

  int64_t numel() const {
    int64_t n = 1;
    for (auto d : shape) n *= d;
    return n;
  }
};

}  // namespace cosmoflow
