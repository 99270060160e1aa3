// Command-line flags (and an optional JSON config file with the same keys) of cosmoflow-train.
//
//   cosmoflow-train --spec=sc18 --train=DIR --val=DIR --out=RUN_DIR [--config=run.json] [...]
// Flags are "--key=value" or "--key value"; booleans accept "--augment" / "--augment=false".
// A config file is a JSON object {"key": value, ...}; flags on the command line override it.
// Every problem (unknown key, bad number, out of range, missing required flag) is an
// InvalidArgument whose message names the flag. UsageText() lists every flag with its default.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "core/base/status.h"
#include "trainer/lr_recipe.h"
#include "trainer/sampler.h"

namespace cosmoflow {

struct TrainerOptions {
  // Model and data.
  std::string spec = "sc18";       // built-in name or a JSON file
  std::string train_path;          // shard file or directory (required)
  std::string val_path;            // optional held-out set
  std::string out_dir;             // run directory: checkpoints/, train_log.csv, ... (required)
  std::string precision = "fp32";  // fp32 | bf16
  // Conv kernels (NetworkOptions::kernel_selection): rule | measure; --deterministic uses rule.
  std::string kernel_selection = "rule";
  std::string kernel_cache;  // timings file; "" = DefaultKernelCachePath(), "none" = no file
  // Schedule.
  int epochs = 1;
  int64_t max_steps = 0;  // 0 = no limit; else stop after this global step
  int batch = 4;          // per rank
  std::string optimizer;  // "" = the recipe's (mlperf: sgd, sc18: adam, constant: sgd)
  double momentum = 0.9;
  double weight_decay = 0;
  LrRecipeConfig lr;
  // Input pipeline.
  bool augment = false;
  bool augment_shift = false;  // random periodic shifts: only for whole periodic boxes
  std::string stage = "none";  // none | memory | a directory (node-local disk)
  int prefetch = 2;            // batches read ahead
  int64_t bn_statistics_batches = 0;  // 0: batch_norm keeps its momentum averages
  ShuffleMode shuffle = ShuffleMode::kGlobal;
  uint64_t seed = 1;
  // Checkpoints and logs.
  int64_t checkpoint_every = 0;  // steps; 0 = at the end of every epoch only
  int keep_checkpoints = 3;
  std::string resume = "auto";      // auto | never | a checkpoint file
  int log_every = 10;               // steps between progress lines
  bool tensorboard = true;          // also write train_log.csv's rows as TensorBoard events in out_dir
  bool deterministic = false;       // also checks weights are identical on all ranks
  int64_t check_weights_every = 0;  // steps; 0 = every 100 steps in deterministic mode, else never
  double bucket_mb = 25;
  std::string allreduce = "thread";  // thread (communication thread) | nonblocking (MPI_Iallreduce)
  // Abort the job (exit code 76) when training makes no progress for this long, or 10x the
  // slowest step if longer (trainer/watchdog.h); 0 = never.
  double watchdog_timeout_s = 300;
  // Uncertainty (docs/training.md).
  int members = 1;                   // deep ensemble of K runs: OUT/members/m<k>, seed + k
  // Members whose validation error is above this many times the median member's are left out of
  // the ensemble (SelectMembers in uncertainty_run.h); 0 keeps every member.
  double ensemble_prune_ratio = 1.5;
  int64_t mse_warmup_epochs = 0;     // with an uncertainty head: MSE on the means first
  std::string mean_gradient = "nll";  // nll | mse: what trains the means under the NLL
  // all | head: how far down the covariance outputs' gradient reaches (head: the last layer only;
  // NetworkOptions::covariance_gradient_head_only).
  std::string covariance_gradient = "all";
  std::string calibration = "power-edge";  // scale | power | power-joint | power-edge (uncertainty.h)
  // Test hooks (documented, harmless): make a rank die or stall, to test failure paths.
  int64_t debug_die_at_step = -1;
  int debug_die_rank = -1;
  double debug_step_sleep = 0;  // seconds slept per step (lets tests signal a running job)
  // Benchmark hook: each rank also sleeps N(3 s, s) seconds per step (truncated at 0), drawn
  // independently per rank and step, to measure the straggler cost of step-time jitter.
  double debug_step_jitter = 0;
};

// Parses argv (argv[0] is skipped). `help` is set when --help was given.
StatusOr<TrainerOptions> ParseTrainerOptions(int argc, char** argv, bool* help);
std::string UsageText();

}  // namespace cosmoflow
