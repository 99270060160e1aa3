#include "trainer/lr_recipe.h"

#include <algorithm>
#include <cmath>
#include <string>

namespace cosmoflow {

StatusOr<LrRecipe> ParseLrRecipe(const std::string& name) {
  if (name == "mlperf") return LrRecipe::kMlperf;
  if (name == "sc18") return LrRecipe::kSc18;
  if (name == "constant") return LrRecipe::kConstant;
  return InvalidArgumentError("--recipe: unknown recipe '" + name +
                              "' (expected mlperf, sc18 or constant)");
}

const char* LrRecipeName(LrRecipe recipe) {
  switch (recipe) {
    case LrRecipe::kMlperf:
      return "mlperf";
    case LrRecipe::kSc18:
      return "sc18";
    case LrRecipe::kConstant:
      return "constant";
  }
  return "?";
}

StatusOr<LrRecipeSchedule> LrRecipeSchedule::Create(const LrRecipeConfig& config, int global_batch,
                                                    int64_t steps_per_epoch, int64_t total_steps) {
  if (!(config.base_lr > 0)) return InvalidArgumentError("--lr must be > 0");
  if (config.end_lr < 0) return InvalidArgumentError("--end-lr must be >= 0");
  if (config.base_batch < 1) return InvalidArgumentError("--base-batch must be >= 1");
  if (config.warmup_epochs < 0) return InvalidArgumentError("--warmup-epochs must be >= 0");
  if (config.decay_epochs.size() != config.decay_factors.size()) {
    return InvalidArgumentError("--decay-epochs and --decay-factors must have the same length");
  }
  for (size_t i = 0; i < config.decay_epochs.size(); ++i) {
    if (i > 0 && config.decay_epochs[i] <= config.decay_epochs[i - 1]) {
      return InvalidArgumentError("--decay-epochs must be ascending");
    }
    if (!(config.decay_factors[i] > 0)) return InvalidArgumentError("--decay-factors must be > 0");
  }
  if (steps_per_epoch < 1 || total_steps < 0 || global_batch < 1) {
    return InvalidArgumentError("LR schedule: bad steps per epoch, total steps or batch");
  }
  if (config.recipe == LrRecipe::kSc18 && config.end_lr > config.base_lr) {
    return InvalidArgumentError("--end-lr must not exceed --lr (the SC18 recipe decays)");
  }
  LrScheduleConfig c;
  c.base_lr = config.base_lr;
  switch (config.recipe) {
    case LrRecipe::kConstant:
      break;
    case LrRecipe::kSc18:  // linear decay from base_lr at step 0 to end_lr at the last step
      c.decay = "poly";
      c.power = 1;
      c.end_lr = config.end_lr;
      c.total_steps = std::max<int64_t>(total_steps, 1);
      break;
    case LrRecipe::kMlperf: {
      c.decay = "step";
      c.base_lr = config.base_lr * global_batch / config.base_batch;  // linear scaling: the peak
      c.warmup_steps = config.warmup_epochs * double(steps_per_epoch);
      c.warmup_start_lr = config.base_lr;
      for (size_t i = 0; i < config.decay_epochs.size(); ++i) {
        // Epoch e starts at step ceil(e * steps_per_epoch) (epochs may be fractional).
        c.decay_boundaries.push_back(
            static_cast<int64_t>(std::ceil(config.decay_epochs[i] * double(steps_per_epoch))));
      }
      c.decay_factors = config.decay_factors;
      break;
    }
  }
  auto schedule = LrSchedule::Create(c);
  if (!schedule.ok()) {
    return InvalidArgumentError("LR recipe " + std::string(LrRecipeName(config.recipe)) + ": " +
                                schedule.status().message());
  }
  return LrRecipeSchedule(std::move(*schedule));
}

}  // namespace cosmoflow
