#include "core/nn/loss.h"

#include <algorithm>
#include <cassert>
#include <cmath>

#include "core/nn/uncertainty.h"

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

// ---- uncertainty heads ----
const char* MeanGradientName(MeanGradient g) { return g == MeanGradient::kMse ? "mse" : "nll"; }

StatusOr<MeanGradient> ParseMeanGradient(const std::string& name) {
  if (name == "nll") return MeanGradient::kNll;
  if (name == "mse") return MeanGradient::kMse;
  return InvalidArgumentError("unknown mean gradient '" + name + "' (expected nll or mse)");
}

namespace {

constexpr double kHalfLog2Pi = 0.91893853320467274178;

// One sample of the diagonal head: NLL and gradient (scaled by `g`) of p means and log-variances.
double DiagonalNll(int p, const float* pred, const float* y, float* diff, float g, MeanGradient mg) {
  double nll = p * kHalfLog2Pi;
  for (int i = 0; i < p; ++i) {
    const double r = double(y[i]) - pred[i];
    const double s = pred[p + i];
    const bool clamped = std::abs(s) > kLogVarianceLimit;
    const double sc = std::min(kLogVarianceLimit, std::max(-kLogVarianceLimit, s));
    const double inv_var = std::exp(-sc);
    nll += 0.5 * (sc + r * r * inv_var);
    if (!diff) continue;
    diff[i] = static_cast<float>(g * (mg == MeanGradient::kMse ? -2.0 * r : -r * inv_var));
    diff[p + i] = clamped ? 0.f : static_cast<float>(g * 0.5 * (1.0 - r * r * inv_var));
  }
  return nll;
}

// One sample of the full head: L from the head (PrecisionCholesky), u = L^T r,
// dNLL/dmu = -L u, dNLL/dlog L_ii = -1 + r_i u_i L_ii, dNLL/dL_ij = r_i u_j (i > j).
double FullNll(int p, const float* pred, const float* y, float* diff, float g, MeanGradient mg) {
  double l[64], r[8], u[8];  // p <= 8 (checked by the caller)
  PrecisionCholesky(UncertaintyHead::kGaussianFull, p, pred, l);
  double nll = p * kHalfLog2Pi;
  for (int i = 0; i < p; ++i) r[i] = double(y[i]) - pred[i];
  for (int j = 0; j < p; ++j) {
    u[j] = 0;
    for (int i = j; i < p; ++i) u[j] += l[i * p + j] * r[i];
    nll += 0.5 * u[j] * u[j] - std::log(l[j * p + j]);
  }
  if (!diff) return nll;
  for (int i = 0; i < p; ++i) {
    double lu = 0;
    for (int j = 0; j <= i; ++j) lu += l[i * p + j] * u[j];
    diff[i] = static_cast<float>(g * (mg == MeanGradient::kMse ? -2.0 * r[i] : -lu));
    const bool clamped = std::abs(pred[p + i]) > 0.5 * kLogVarianceLimit;
    diff[p + i] = clamped ? 0.f : static_cast<float>(g * (-1.0 + r[i] * u[i] * l[i * p + i]));
  }
  int k = 2 * p;
  for (int i = 1; i < p; ++i)
    for (int j = 0; j < i; ++j) diff[k++] = static_cast<float>(g * r[i] * u[j]);
  return nll;
}

}  // namespace

double GaussianNll(UncertaintyHead head, int p, const float* prediction, const float* target, int64_t batch,
                   float* diff, MeanGradient mean_gradient) {
  assert(head != UncertaintyHead::kNone && p >= 1 && p <= 8);
  if (batch <= 0) return 0.0;
  const int w = HeadWidth(head, p);
  const float g = 1.f / static_cast<float>(batch * p);
  double sum = 0;
  for (int64_t b = 0; b < batch; ++b) {
    const float* pred = prediction + b * w;
    const float* y = target + b * p;
    float* d = diff ? diff + b * w : nullptr;
    sum += head == UncertaintyHead::kGaussian ? DiagonalNll(p, pred, y, d, g, mean_gradient)
                                              : FullNll(p, pred, y, d, g, mean_gradient);
  }
  return sum / static_cast<double>(batch * p);
}

double MeanSquaredErrorOfMeans(UncertaintyHead head, int p, const float* prediction, const float* target,
                               int64_t batch, float* diff) {
  if (batch <= 0) return 0.0;
  const int w = HeadWidth(head, p);
  const float inv_n = 1.f / static_cast<float>(batch * p);
  double sum = 0;
  for (int64_t b = 0; b < batch; ++b) {
    for (int i = 0; i < w; ++i) {
      if (i >= p) {
        if (diff) diff[b * w + i] = 0.f;
        continue;
      }
      const float e = prediction[b * w + i] - target[b * p + i];
      sum += double(e) * e;
      if (diff) diff[b * w + i] = 2.f * e * inv_n;
    }
  }
  return sum / static_cast<double>(batch * p);
}
// ---- end uncertainty heads ----

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
