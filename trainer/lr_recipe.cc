#include "trainer/lr_recipe.h"

#include <algorithm>

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
  LrRecipeSchedule s;
  s.config_ = config;
  s.steps_per_epoch_ = steps_per_epoch;
  s.total_steps_ = std::max<int64_t>(total_steps, 1);
  s.peak_lr_ = config.recipe == LrRecipe::kMlperf
                   ? config.base_lr * global_batch / config.base_batch
                   : config.base_lr;
  return s;
}

double LrRecipeSchedule::At(int64_t step) const {
  switch (config_.recipe) {
    case LrRecipe::kConstant:
      return config_.base_lr;
    case LrRecipe::kSc18: {
      const double t = std::min(1.0, static_cast<double>(step) / total_steps_);
      return config_.base_lr + (config_.end_lr - config_.base_lr) * t;
    }
    case LrRecipe::kMlperf: {
      const double epoch = static_cast<double>(step) / steps_per_epoch_;
      if (epoch < config_.warmup_epochs) {
        return config_.base_lr + (peak_lr_ - config_.base_lr) * epoch / config_.warmup_epochs;
      }
      double lr = peak_lr_;
      for (size_t i = 0; i < config_.decay_epochs.size(); ++i) {
        if (epoch >= config_.decay_epochs[i]) lr = peak_lr_ * config_.decay_factors[i];
      }
      return lr;
    }
  }
  return config_.base_lr;
}

}  // namespace cosmoflow
