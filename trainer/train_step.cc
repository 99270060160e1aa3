#include "trainer/train_step.h"

namespace cosmoflow {

double TrainOnBatch(Network& net, Optimizer& optimizer, LossType loss, const float* src,
                    const float* labels, float lr, std::vector<float>& pred,
                    std::vector<float>& diff, const TrainStepHooks& hooks) {
  const int64_t n = static_cast<int64_t>(pred.size());
  const BatchLoss plain = [loss, n](const float* p, const float* l, float* d) {
    return ComputeLoss(loss, p, l, n, d);
  };
  return TrainOnBatch(net, optimizer, plain, src, labels, lr, pred, diff, hooks);
}

double TrainOnBatch(Network& net, Optimizer& optimizer, const BatchLoss& loss, const float* src,
                    const float* labels, float lr, std::vector<float>& pred,
                    std::vector<float>& diff, const TrainStepHooks& hooks) {
  net.Forward(src, pred.data());
  const double value = loss(pred.data(), labels, diff.data());
  if (hooks.before_backward) hooks.before_backward();
  net.Backward(diff.data(), hooks.on_grad_ready);
  if (hooks.after_backward) hooks.after_backward();
  optimizer.Step(net.parameters(), lr);
  net.ParametersUpdated();
  return value;
}

}  // namespace cosmoflow
