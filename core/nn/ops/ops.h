// Factories of the network's ops, one per op file; the layer table (core/nn/layer_table.cc) names
// them in its rows. Each returns nullptr where the layer needs no op in this network.
#pragma once

#include <memory>

#include "core/nn/op.h"

namespace cosmoflow::nn_internal {

std::unique_ptr<Op> MakeConv3dOp(OpArgs& args);      // conv3d.cc (+ a following leaky ReLU)
std::unique_ptr<Op> MakeDenseOp(OpArgs& args);       // dense.cc (+ a following leaky ReLU)
std::unique_ptr<Op> MakePoolOp(OpArgs& args);        // pool.cc: avg_pool, max_pool
std::unique_ptr<Op> MakeLeakyReluOp(OpArgs& args);   // leaky_relu.cc
std::unique_ptr<Op> MakeDropoutOp(OpArgs& args);     // dropout.cc (training only)
std::unique_ptr<Op> MakeScaledTanhOp(OpArgs& args);  // scaled_tanh.cc
std::unique_ptr<Op> MakeBatchNormOp(OpArgs& args);   // batch_norm.cc

// first_block.cc: the fused 1-channel conv + leaky ReLU + average pool at the network's start, or
// nullptr when the layers, the build or NetworkOptions::kernels ("first_block") rule it out.
std::unique_ptr<Op> MakeFusedFirstBlockOp(OpArgs& args);

}  // namespace cosmoflow::nn_internal
