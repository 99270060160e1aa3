// Learning-rate schedule: linear warmup, then constant, step decay or polynomial decay. The one
// schedule object of the project: the trainer's recipes (MLPerf, SC18) are configurations of it.
//
//   warmup (step < warmup_steps):
//     from zero:            base * (step + 1) / warmup_steps          (warmup_start_lr < 0)
//     from a starting rate: start + (base - start) * step / warmup_steps
//   constant: base
//   step:     base * decay_factor ^ (number of boundaries in decay_boundaries that are <= step), or,
//             with decay_factors (one per boundary), base * decay_factors[i] for the last boundary
//             i that is <= step (MLPerf's recipe: x0.25 at epoch 32, x0.125 at epoch 64)
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
  double warmup_steps = 0;               // may be fractional (warmup given in epochs)
  double warmup_start_lr = -1;           // < 0: warm up from zero
  std::vector<int64_t> decay_boundaries;  // step: increasing step numbers
  double decay_factor = 0.1;             // step, when decay_factors is empty
  std::vector<double> decay_factors;     // step: one absolute factor per boundary (optional)
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
