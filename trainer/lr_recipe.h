// Learning-rate recipes, as functions of the global step (fractional epochs = step /
// steps_per_epoch).
//
// - kMlperf (MLPerf HPC CosmoFlow reference): SGD with momentum; peak LR = base_lr * global_batch /
//   base_batch (linear scaling); linear warmup from base_lr to the peak over warmup_epochs; then
//   the peak times decay_factors[i] from epoch decay_epochs[i] on (step decay).
// - kSc18 (CosmoFlow SC18): Adam; LR decays linearly from base_lr at step 0 to end_lr at the last
// step.
// - kConstant: base_lr throughout (tests, debugging).
// Each recipe is a configuration of core/nn's LrSchedule (the one schedule object); this class
// translates epochs and the global batch into it. Pure and deterministic, so a resumed run gets the
// same LR at the same step.
#pragma once

#include <cstdint>
#include <utility>
#include <string>
#include <vector>

#include "core/base/status.h"
#include "core/nn/schedule.h"

namespace cosmoflow {

enum class LrRecipe { kMlperf, kSc18, kConstant };
StatusOr<LrRecipe> ParseLrRecipe(const std::string& name);  // "mlperf" | "sc18" | "constant"
const char* LrRecipeName(LrRecipe recipe);

struct LrRecipeConfig {
  LrRecipe recipe = LrRecipe::kMlperf;
  double base_lr = 0.001;
  int base_batch = 64;                                // kMlperf: the batch at which base_lr applies
  double warmup_epochs = 4;                           // kMlperf
  std::vector<double> decay_epochs = {32, 64};        // kMlperf, ascending
  std::vector<double> decay_factors = {0.25, 0.125};  // kMlperf, same length
  double end_lr = 0;                                  // kSc18: LR at the last step
};

class LrRecipeSchedule {
 public:
  // Checks the config (positive LR, ascending decay epochs, matching lengths).
  static StatusOr<LrRecipeSchedule> Create(const LrRecipeConfig& config, int global_batch,
                                           int64_t steps_per_epoch, int64_t total_steps);
  double At(int64_t step) const { return schedule_.Value(step); }
  double peak_lr() const { return schedule_.config().base_lr; }
  const LrSchedule& schedule() const { return schedule_; }

 private:
  explicit LrRecipeSchedule(LrSchedule schedule) : schedule_(std::move(schedule)) {}
  LrSchedule schedule_;
};

}  // namespace cosmoflow
