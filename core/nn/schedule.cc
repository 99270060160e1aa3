#include "core/nn/schedule.h"

#include <algorithm>
#include <cmath>

namespace cosmoflow {

StatusOr<LrSchedule> LrSchedule::Create(const LrScheduleConfig& c) {
  if (!(c.base_lr > 0) || !std::isfinite(c.base_lr)) {
    return InvalidArgumentError("lr schedule: base_lr must be positive and finite");
  }
  if (!(c.warmup_steps >= 0)) return InvalidArgumentError("lr schedule: warmup_steps must be >= 0");
  if (!std::isfinite(c.warmup_start_lr)) {
    return InvalidArgumentError("lr schedule: warmup_start_lr must be finite");
  }
  if (c.decay == "step") {
    if (c.decay_factors.empty() && !(c.decay_factor > 0 && c.decay_factor <= 1)) {
      return InvalidArgumentError("lr schedule: decay_factor must be in (0, 1]");
    }
    if (!c.decay_factors.empty() && c.decay_factors.size() != c.decay_boundaries.size()) {
      return InvalidArgumentError("lr schedule: decay_factors needs one factor per decay boundary");
    }
    for (double f : c.decay_factors) {
      if (!(f > 0) || !std::isfinite(f)) return InvalidArgumentError("lr schedule: decay_factors must be positive");
    }
    for (size_t i = 0; i < c.decay_boundaries.size(); ++i) {
      if (c.decay_boundaries[i] < 0 || (i > 0 && c.decay_boundaries[i] <= c.decay_boundaries[i - 1])) {
        return InvalidArgumentError("lr schedule: decay_boundaries must be non-negative and increasing (entry " +
                                    std::to_string(i) + ")");
      }
    }
  } else if (c.decay == "poly") {
    if (c.total_steps <= c.warmup_steps) {
      return InvalidArgumentError("lr schedule: poly decay needs total_steps > warmup_steps");
    }
    if (!(c.power > 0)) return InvalidArgumentError("lr schedule: power must be positive");
    if (!(c.end_lr >= 0) || c.end_lr > c.base_lr) {
      return InvalidArgumentError("lr schedule: end_lr must be in [0, base_lr]");
    }
  } else if (c.decay != "constant") {
    return InvalidArgumentError("lr schedule: unknown decay '" + c.decay + "' (expected constant, step or poly)");
  }
  LrSchedule s;
  s.config_ = c;
  return s;
}

double LrSchedule::Value(int64_t step) const {
  const auto& c = config_;
  if (step < 0) step = 0;
  if (double(step) < c.warmup_steps) {
    if (c.warmup_start_lr < 0) return c.base_lr * double(step + 1) / c.warmup_steps;
    return c.warmup_start_lr + (c.base_lr - c.warmup_start_lr) * double(step) / c.warmup_steps;
  }
  if (c.decay == "step") {
    int64_t k = 0;
    for (int64_t b : c.decay_boundaries) k += step >= b ? 1 : 0;
    if (!c.decay_factors.empty()) return k == 0 ? c.base_lr : c.base_lr * c.decay_factors[size_t(k - 1)];
    return c.base_lr * std::pow(c.decay_factor, double(k));
  }
  if (c.decay == "poly") {
    double t = std::min(1.0, (double(step) - c.warmup_steps) / (double(c.total_steps) - c.warmup_steps));
    return c.end_lr + (c.base_lr - c.end_lr) * std::pow(1.0 - t, c.power);
  }
  return c.base_lr;
}

}  // namespace cosmoflow
