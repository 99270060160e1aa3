// Regression losses on normalised labels (n = (physical - offset) / scale, see spec.h).
//
// Contract: prediction and target are batch x P floats (the network's output and the normalised
// labels). The loss is the mean over all batch * P elements; diff (if not null) receives
// dLoss/dPrediction, batch x P floats, ready for Network::Backward. In data-parallel training every
// rank computes the mean over its own batch and gradients are averaged across ranks, which equals
// the mean over the global batch when local batches are equal.
#pragma once

#include <cstdint>
#include <string>

#include "core/base/status.h"
#include "core/nn/spec.h"

namespace cosmoflow {

enum class LossType { kMse, kL1 };
const char* LossName(LossType t);                       // "mse" | "l1"
StatusOr<LossType> ParseLoss(const std::string& name);

// Returns the mean loss; writes the gradient into diff[n] when diff != nullptr.
double ComputeLoss(LossType type, const float* prediction, const float* target, int64_t n, float* diff);

// Maps physical labels to normalised ones (and back) with the spec's outputs; n = batch * P.
void NormaliseLabels(const ModelSpec& spec, const float* physical, int64_t batch, float* normalised);
void DenormaliseOutputs(const ModelSpec& spec, const float* normalised, int64_t batch, float* physical);

}  // namespace cosmoflow
