// One synchronous training step on one batch: forward, loss, backward, optimizer step. The MPI
// trainer runs it with hooks that average the gradients over the ranks; the single-process loop of
// the tests (tests/common/train_loop.h) runs it without. It is the only place where the order of
// these calls is written down.
//
// Thread-safety: as the network's; one thread per network.
#pragma once

#include <functional>
#include <vector>

#include "core/nn/loss.h"
#include "core/nn/network.h"
#include "core/nn/optimizer.h"

namespace cosmoflow {

struct TrainStepHooks {
  // Called after the loss, before backward (e.g. GradientAllreducer::BeginStep).
  std::function<void()> before_backward;
  // Network::Backward's on_grad_ready: parameters()[i]'s gradient is final.
  std::function<void(int)> on_grad_ready;
  // After backward, before the optimizer step (e.g. release the input, wait for averaged
  // gradients: GradientAllreducer::FinishStep).
  std::function<void()> after_backward;
};

// Runs `net` (training mode) on `src` (batch x C x side^3), computes `loss` against the normalised
// `labels` (pred.size() = batch x P values), backpropagates, steps `optimizer` with learning rate
// `lr` and refreshes the network's working copies of the weights (ParametersUpdated). `pred` and
// `diff` are batch x P scratch. Returns the batch's mean loss (may be non-finite: the caller
// decides what a divergence means).
double TrainOnBatch(Network& net, Optimizer& optimizer, LossType loss, const float* src,
                    const float* labels, float lr, std::vector<float>& pred,
                    std::vector<float>& diff, const TrainStepHooks& hooks = {});

// The same with any loss of the network's output (pred and diff: batch x the network's output
// width, e.g. an uncertainty head's; trainer/uncertainty_run.h StepLoss): returns the batch's mean
// loss and writes dLoss/dPred into diff.
using BatchLoss = std::function<double(const float* pred, const float* labels, float* diff)>;
double TrainOnBatch(Network& net, Optimizer& optimizer, const BatchLoss& loss, const float* src,
                    const float* labels, float lr, std::vector<float>& pred,
                    std::vector<float>& diff, const TrainStepHooks& hooks = {});

}  // namespace cosmoflow
