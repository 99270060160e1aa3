#include "core/nn/loss.h"

#include <cmath>

namespace cosmoflow {

const char* LossName(LossType t) { return t == LossType::kL1 ? "l1" : "mse"; }

StatusOr<LossType> ParseLoss(const std::string& name) {
  if (name == "mse") return LossType::kMse;
  if (name == "l1") return LossType::kL1;
  return InvalidArgumentError("unknown loss '" + name + "' (expected mse or l1)");
}

double ComputeLoss(LossType type, const float* prediction, const float* target, int64_t n, float* diff) {
  if (n <= 0) return 0.0;
  double sum = 0;
  const float inv_n = 1.f / static_cast<float>(n);
  for (int64_t i = 0; i < n; ++i) {
    const float e = prediction[i] - target[i];
    if (type == LossType::kMse) {
      sum += double(e) * e;
      if (diff) diff[i] = 2.f * e * inv_n;
    } else {
      sum += std::abs(double(e));
      // Subgradient 0 at e == 0.
      if (diff) diff[i] = (e > 0.f ? 1.f : (e < 0.f ? -1.f : 0.f)) * inv_n;
    }
  }
  return sum / static_cast<double>(n);
}

void NormaliseLabels(const ModelSpec& spec, const float* physical, int64_t batch, float* normalised) {
  const size_t p = spec.outputs.size();
  for (int64_t b = 0; b < batch; ++b) {
    for (size_t i = 0; i < p; ++i) {
      const auto& o = spec.outputs[i];
      normalised[b * p + i] = (physical[b * p + i] - o.offset) / o.scale;
    }
  }
}

void DenormaliseOutputs(const ModelSpec& spec, const float* normalised, int64_t batch, float* physical) {
  const size_t p = spec.outputs.size();
  for (int64_t b = 0; b < batch; ++b) {
    for (size_t i = 0; i < p; ++i) {
      const auto& o = spec.outputs[i];
      physical[b * p + i] = o.offset + o.scale * normalised[b * p + i];
    }
  }
}

}  // namespace cosmoflow
