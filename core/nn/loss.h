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

// ---- uncertainty heads (spec.h describes the layouts) ----
// Gaussian negative log-likelihood of the targets (batch x p) under a head's output (batch x
// HeadWidth(head, p)). Per sample, with r = target - mean and L the Cholesky factor of the
// precision (gaussian: L = diag(exp(-log_variance / 2))):
//   NLL = 0.5 p log(2 pi) - sum_i log L_ii + 0.5 ||L^T r||^2
// which needs no matrix inverse and is stable for any head output (the log entries are clamped,
// uncertainty.h). Returns the mean NLL per sample divided by p (nats per parameter); diff (if not
// null, batch x width) receives its gradient. With MeanGradient::kMse the means get the gradient of
// the MSE instead (as ComputeLoss gives it) and the covariance entries the NLL's with the means
// held fixed: the means then train exactly as without a head.
enum class MeanGradient { kNll, kMse };
const char* MeanGradientName(MeanGradient g);  // "nll" | "mse"
StatusOr<MeanGradient> ParseMeanGradient(const std::string& name);
double GaussianNll(UncertaintyHead head, int p, const float* prediction, const float* target, int64_t batch,
                   float* diff, MeanGradient mean_gradient = MeanGradient::kNll);
// MSE of the means alone (mean over batch x p); the head's other entries get zero gradient. The
// warm-up loss before the NLL takes over.
double MeanSquaredErrorOfMeans(UncertaintyHead head, int p, const float* prediction, const float* target,
                               int64_t batch, float* diff);
// ---- end uncertainty heads ----

// Maps physical labels to normalised ones (and back) with the spec's outputs; n = batch * P.
void NormaliseLabels(const ModelSpec& spec, const float* physical, int64_t batch, float* normalised);
void DenormaliseOutputs(const ModelSpec& spec, const float* normalised, int64_t batch, float* physical);

}  // namespace cosmoflow
