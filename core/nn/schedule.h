// Learning-rate schedule: linear warmup, then constant, step decay or polynomial decay (the MLPerf
// CosmoFlow recipe scales the base rate with the global batch and warms up over a few epochs).
//
//   lr(step) = base * (step + 1) / warmup_steps                      for step < warmup_steps
//   constant: base
//   step:     base * decay_factor ^ (number of boundaries in decay_boundaries that are <= step)
//   poly:     end + (base - end) * (1 - t)^power, t = min(1, (step - warmup) / (total - warmup))
// Steps count optimizer updates from 0. Value() is pure: the same step always gives the same rate,
// so a resumed run continues the schedule exactly.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "core/base/status.h"

namespace cosmoflow {

struct LrScheduleConfig {
  std::string decay = "constant";        // "constant" | "step" | "poly"
  double base_lr = 1e-3;
  int64_t warmup_steps = 0;
  std::vector<int64_t> decay_boundaries;  // step: increasing step numbers
  double decay_factor = 0.1;             // step
  int64_t total_steps = 0;               // poly: must exceed warmup_steps
  double end_lr = 0.0;                   // poly
  double power = 1.0;                    // poly
};

class LrSchedule {
 public:
  // Validates the configuration; errors name the field.
  static StatusOr<LrSchedule> Create(const LrScheduleConfig& config);
  double Value(int64_t step) const;
  const LrScheduleConfig& config() const { return config_; }

 private:
  LrScheduleConfig config_;
};

}  // namespace cosmoflow
