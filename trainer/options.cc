#include "trainer/options.h"

#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <optional>
#include <sstream>

#include "core/base/flags.h"
#include "core/nn/uncertainty.h"

namespace cosmoflow {
namespace {

struct FlagInfo {
  const char* name;
  const char* help;
  bool is_bool;
};

// The one list of flags: parsing, the config file and --help all read it.
const FlagInfo kFlags[] = {
    {"config", "JSON file with any of these keys; command-line flags override it", false},
    {"spec",
     "model: built-in name (sc18, mlperf, tiny32, small64, mlperf64) or a JSON spec file [sc18]",
     false},
    {"train", "training set: HDF5 shard or directory of shards (required)", false},
    {"val", "validation set: HDF5 shard or directory; validated after every epoch [none]", false},
    {"out",
     "run directory for checkpoints/, train_log.csv, run.json, val_predictions.csv (required)",
     false},
    {"precision", "fp32 | bf16 [fp32]", false},
    {"kernel-selection",
     "conv kernels: rule (the fixed rule; always with --deterministic) | measure (rank 0 times "
     "every candidate at start-up, all ranks run the fastest) [rule]",
     false},
    {"kernel-cache",
     "file of measured kernel timings, reused by later runs on this machine; none = no file "
     "[$COSMOFLOW_KERNEL_CACHE, else ~/.cache/cosmoflow/kernel-timings.tsv]",
     false},
    {"epochs", "number of epochs [1]", false},
    {"max-steps", "stop after this global step, 0 = no limit [0]", false},
    {"batch", "samples per rank per step [4]", false},
    {"recipe",
     "LR recipe: mlperf (SGD, scaled LR, warmup, step decay) | sc18 (Adam, linear decay) | "
     "constant [mlperf]",
     false},
    {"optimizer", "sgd | adam [the recipe's]", false},
    {"lr", "base learning rate [0.001]", false},
    {"end-lr", "sc18 recipe: final learning rate [0]", false},
    {"base-batch", "mlperf recipe: global batch at which --lr applies [64]", false},
    {"warmup-epochs", "mlperf recipe: linear warmup length in epochs [4]", false},
    {"decay-epochs", "mlperf recipe: comma-separated epochs of step decay [32,64]", false},
    {"decay-factors", "mlperf recipe: LR factors from those epochs on [0.25,0.125]", false},
    {"momentum", "SGD momentum [0.9]", false},
    {"weight-decay", "L2 weight decay [0]", false},
    {"augment", "random cube symmetries (48 rotations/reflections) [false]", true},
    {"augment-shift",
     "random periodic shifts (whole periodic universes only: a cut sub-cube gains seams) [false]",
     true},
    {"stage",
     "none | memory | DIR: copy the dataset into memory or a node-local directory first [none]",
     false},
    {"prefetch", "batches read ahead by the background reader [2]", false},
    {"bn-statistics-batches",
     "at each epoch end, set batch_norm's running statistics to the population statistics of N "
     "of the epoch's batches (0: keep the momentum averages) [0]",
     false},
    {"shuffle",
     "global (one permutation per epoch) | shard (each rank permutes its own block) [global]",
     false},
    {"seed", "seed for initialisation, shuffling, augmentation and dropout [1]", false},
    {"checkpoint-every", "checkpoint every N steps; 0 = at each epoch end only [0]", false},
    {"keep-checkpoints", "how many checkpoints to keep [3]", false},
    {"resume",
     "auto (latest valid checkpoint in OUT/checkpoints) | never | a checkpoint file [auto]", false},
    {"log-every", "steps between progress lines on rank 0 [10]", false},
    {"tensorboard", "write TensorBoard events (events.out.tfevents.*) in the run directory [true]", true},
    {"deterministic",
     "check that all ranks hold identical weights (every 100 steps by default) [false]", true},
    {"check-weights-every", "steps between weight checksums across ranks, 0 = default [0]", false},
    {"bucket-mb", "gradient fusion bucket size in MB [25]", false},
    {"allreduce",
     "thread (a communication thread allreduces buckets during backward) | nonblocking "
     "(MPI_Iallreduce) [thread]",
     false},
    {"ensemble-prune-ratio",
     "with --members: leave out members whose validation error is above this many times the "
     "median member's; 0 keeps all [1.5]",
     false},
    {"members",
     "deep ensemble: train K members one after the other in OUT/members/m<k> (seed --seed + k), "
     "then write OUT/ensemble.json for the server [1]",
     false},
    {"mse-warmup-epochs",
     "with an uncertainty head in the spec: epochs of MSE on the means before the Gaussian NLL [0]",
     false},
    {"mean-gradient",
     "with an uncertainty head: nll (the NLL trains the means too) | mse (the means get the MSE "
     "gradient, the covariance the NLL's) [nll]",
     false},
    {"calibration",
     "with an uncertainty head: the form of the sigma calibration fitted on --val: scale (one "
     "factor per output) | power (sigma -> s r (sigma/r)^b: a factor and an exponent) | "
     "power-joint (power, then one factor for the narrow outputs' untruncated ellipse) | "
     "power-edge (power, then sigma x exp(e u^2) by the mean's place u in the prior, for the narrow "
     "outputs) [power-edge]",
     false},
    {"covariance-gradient",
     "with an uncertainty head: all (the covariance outputs' gradient trains every layer) | head "
     "(it trains the last dense layer only; the layers below learn from the means alone) [all]",
     false},
    {"watchdog-timeout-s",
     "abort the job (exit 76) after this long without progress, or 10x the slowest step if "
     "longer; 0 = never [300]",
     false},
    {"debug-die-at-step", "test hook: rank --debug-die-rank exits abruptly at this step [-1]",
     false},
    {"debug-die-rank", "test hook: which rank dies [-1]", false},
    {"debug-step-sleep", "test hook: seconds to sleep each step [0]", false},
    {"debug-step-jitter",
     "benchmark hook: each rank also sleeps N(3 S, S) seconds per step, independently [0]", false},
    {"help", "print this help", true},
};

const FlagInfo* FindFlag(const std::string& name) {
  for (const auto& f : kFlags) {
    if (name == f.name) return &f;
  }
  return nullptr;
}

Status Bad(const std::string& flag, const std::string& value, const std::string& why) {
  return InvalidArgumentError("--" + flag + "=" + value + ": " + why);
}

// Range-checked values; the parsing itself is core/base/flags.h's, the messages quote "--k=v".
StatusOr<int64_t> ToInt(const std::string& flag, const std::string& v, int64_t lo, int64_t hi) {
  auto x = ParseInt(v, "--" + flag);
  if (!x.ok()) return Bad(flag, v, "not an integer");
  if (*x < lo || *x > hi) {
    return Bad(flag, v, "out of range [" + std::to_string(lo) + ", " + std::to_string(hi) + "]");
  }
  return *x;
}

StatusOr<double> ToDouble(const std::string& flag, const std::string& v, double lo, double hi) {
  auto x = ParseDouble(v, "--" + flag);
  if (!x.ok()) return Bad(flag, v, "not a number");
  if (*x < lo || *x > hi) {
    std::ostringstream os;
    os << "out of range [" << lo << ", " << hi << "]";
    return Bad(flag, v, os.str());
  }
  return *x;
}

StatusOr<bool> ToBool(const std::string& flag, const std::string& v) {
  auto x = ParseBool(v, "--" + flag);
  if (!x.ok()) return Bad(flag, v, "expected true or false");
  return *x;
}

StatusOr<std::vector<double>> ToList(const std::string& flag, const std::string& v) {
  if (v.empty()) return std::vector<double>{};  // e.g. "decay-epochs": [] in a config: no decay
  auto x = ParseDoubleList(v, "--" + flag);
  if (!x.ok()) return Bad(flag, v, "not a comma-separated list of numbers");
  return *x;
}

// Each Apply*Flag sets the flag `k` of its group and returns its status, or nullopt when `k` is not
// one of its flags.
// The model, the data and how it is read.
std::optional<Status> ApplyDataFlag(TrainerOptions& o, const std::string& k, const std::string& v) {
  if (k == "spec") {
    o.spec = v;
  } else if (k == "train") {
    o.train_path = v;
  } else if (k == "val") {
    o.val_path = v;
  } else if (k == "out") {
    o.out_dir = v;
  } else if (k == "precision") {
    if (v != "fp32" && v != "bf16") return Bad(k, v, "expected fp32 or bf16");
    o.precision = v;
  } else if (k == "kernel-selection") {
    if (v != "measure" && v != "rule") return Bad(k, v, "expected measure or rule");
    o.kernel_selection = v;
  } else if (k == "kernel-cache") {
    if (v.empty()) return Bad(k, v, "expected a file or none");
    o.kernel_cache = v;
  } else if (k == "augment") {
    CF_ASSIGN_OR_RETURN(o.augment, ToBool(k, v));
  } else if (k == "augment-shift") {
    CF_ASSIGN_OR_RETURN(o.augment_shift, ToBool(k, v));
  } else if (k == "stage") {
    if (v.empty()) return Bad(k, v, "expected none, memory or a directory");
    o.stage = v;
  } else if (k == "bn-statistics-batches") {
    CF_ASSIGN_OR_RETURN(o.bn_statistics_batches, ToInt(k, v, 0, int64_t{1} << 40));
  } else if (k == "prefetch") {
    CF_ASSIGN_OR_RETURN(int64_t x, ToInt(k, v, 1, 64));
    o.prefetch = static_cast<int>(x);
  } else if (k == "shuffle") {
    if (v == "global")
      o.shuffle = ShuffleMode::kGlobal;
    else if (v == "shard")
      o.shuffle = ShuffleMode::kShard;
    else
      return Bad(k, v, "expected global or shard");
  } else if (k == "seed") {
    CF_ASSIGN_OR_RETURN(int64_t x, ToInt(k, v, 0, int64_t{1} << 62));
    o.seed = static_cast<uint64_t>(x);
  } else {
    return std::nullopt;
  }
  return Status::Ok();
}

// Epochs, batch, optimizer and learning-rate schedule.
std::optional<Status> ApplyOptimizationFlag(TrainerOptions& o, const std::string& k,
                                            const std::string& v) {
  if (k == "epochs") {
    CF_ASSIGN_OR_RETURN(int64_t x, ToInt(k, v, 1, 1000000));
    o.epochs = static_cast<int>(x);
  } else if (k == "max-steps") {
    CF_ASSIGN_OR_RETURN(o.max_steps, ToInt(k, v, 0, int64_t{1} << 50));
  } else if (k == "batch") {
    CF_ASSIGN_OR_RETURN(int64_t x, ToInt(k, v, 1, 4096));
    o.batch = static_cast<int>(x);
  } else if (k == "recipe") {
    CF_ASSIGN_OR_RETURN(o.lr.recipe, ParseLrRecipe(v));
  } else if (k == "optimizer") {
    if (v != "sgd" && v != "adam") return Bad(k, v, "expected sgd or adam");
    o.optimizer = v;
  } else if (k == "lr") {
    CF_ASSIGN_OR_RETURN(o.lr.base_lr, ToDouble(k, v, 1e-12, 100));
  } else if (k == "end-lr") {
    CF_ASSIGN_OR_RETURN(o.lr.end_lr, ToDouble(k, v, 0, 100));
  } else if (k == "base-batch") {
    CF_ASSIGN_OR_RETURN(int64_t x, ToInt(k, v, 1, 1 << 24));
    o.lr.base_batch = static_cast<int>(x);
  } else if (k == "warmup-epochs") {
    CF_ASSIGN_OR_RETURN(o.lr.warmup_epochs, ToDouble(k, v, 0, 1e6));
  } else if (k == "decay-epochs") {
    CF_ASSIGN_OR_RETURN(o.lr.decay_epochs, ToList(k, v));
  } else if (k == "decay-factors") {
    CF_ASSIGN_OR_RETURN(o.lr.decay_factors, ToList(k, v));
  } else if (k == "momentum") {
    CF_ASSIGN_OR_RETURN(o.momentum, ToDouble(k, v, 0, 0.999999));
  } else if (k == "weight-decay") {
    CF_ASSIGN_OR_RETURN(o.weight_decay, ToDouble(k, v, 0, 1));
  } else {
    return std::nullopt;
  }
  return Status::Ok();
}

// Checkpoints, resume, logging, communication and the debugging flags of the tests.
std::optional<Status> ApplyRunFlag(TrainerOptions& o, const std::string& k, const std::string& v) {
  if (k == "checkpoint-every") {
    CF_ASSIGN_OR_RETURN(o.checkpoint_every, ToInt(k, v, 0, int64_t{1} << 50));
  } else if (k == "keep-checkpoints") {
    CF_ASSIGN_OR_RETURN(int64_t x, ToInt(k, v, 1, 1000));
    o.keep_checkpoints = static_cast<int>(x);
  } else if (k == "resume") {
    if (v.empty()) return Bad(k, v, "expected auto, never or a checkpoint file");
    o.resume = v;
  } else if (k == "log-every") {
    CF_ASSIGN_OR_RETURN(int64_t x, ToInt(k, v, 1, 1 << 30));
    o.log_every = static_cast<int>(x);
  } else if (k == "tensorboard") {
    CF_ASSIGN_OR_RETURN(o.tensorboard, ToBool(k, v));
  } else if (k == "deterministic") {
    CF_ASSIGN_OR_RETURN(o.deterministic, ToBool(k, v));
  } else if (k == "check-weights-every") {
    CF_ASSIGN_OR_RETURN(o.check_weights_every, ToInt(k, v, 0, int64_t{1} << 50));
  } else if (k == "bucket-mb") {
    CF_ASSIGN_OR_RETURN(o.bucket_mb, ToDouble(k, v, 0.001, 4096));
  } else if (k == "allreduce") {
    if (v != "thread" && v != "nonblocking") return Bad(k, v, "expected thread or nonblocking");
    o.allreduce = v;
  } else if (k == "ensemble-prune-ratio") {
    CF_ASSIGN_OR_RETURN(o.ensemble_prune_ratio, ToDouble(k, v, 0, 1e6));
  } else if (k == "members") {
    CF_ASSIGN_OR_RETURN(int64_t x, ToInt(k, v, 1, 64));
    o.members = static_cast<int>(x);
  } else if (k == "mse-warmup-epochs") {
    CF_ASSIGN_OR_RETURN(o.mse_warmup_epochs, ToInt(k, v, 0, 1000000));
  } else if (k == "mean-gradient") {
    if (v != "nll" && v != "mse") return Bad(k, v, "expected nll or mse");
    o.mean_gradient = v;
  } else if (k == "calibration") {
    if (!ParseCalibrationForm(v).ok()) return Bad(k, v, "expected scale, power, power-joint or power-edge");
    o.calibration = v;
  } else if (k == "covariance-gradient") {
    if (v != "all" && v != "head") return Bad(k, v, "expected all or head");
    o.covariance_gradient = v;
  } else if (k == "debug-die-at-step") {
    CF_ASSIGN_OR_RETURN(o.debug_die_at_step, ToInt(k, v, -1, int64_t{1} << 50));
  } else if (k == "debug-die-rank") {
    CF_ASSIGN_OR_RETURN(int64_t x, ToInt(k, v, -1, 1 << 20));
    o.debug_die_rank = static_cast<int>(x);
  } else if (k == "debug-step-sleep") {
    CF_ASSIGN_OR_RETURN(o.debug_step_sleep, ToDouble(k, v, 0, 3600));
  } else if (k == "debug-step-jitter") {
    CF_ASSIGN_OR_RETURN(o.debug_step_jitter, ToDouble(k, v, 0, 600));
  } else if (k == "watchdog-timeout-s") {
    CF_ASSIGN_OR_RETURN(o.watchdog_timeout_s, ToDouble(k, v, 0, 1e7));
  } else {
    return std::nullopt;
  }
  return Status::Ok();
}

Status Apply(TrainerOptions& o, const std::string& k, const std::string& v) {
  for (auto* apply : {ApplyDataFlag, ApplyOptimizationFlag, ApplyRunFlag}) {
    if (std::optional<Status> s = apply(o, k, v)) return *s;
  }
  return InvalidArgumentError("unknown flag --" + k);
}

std::string JsonValueToString(const nlohmann::json& j) {
  if (j.is_string()) return j.get<std::string>();
  if (j.is_boolean()) return j.get<bool>() ? "true" : "false";
  if (j.is_array()) {
    std::string s;
    for (const auto& e : j) s += (s.empty() ? "" : ",") + JsonValueToString(e);
    return s;
  }
  return j.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
}

}  // namespace

std::string UsageText() {
  std::ostringstream os;
  os << "usage: cosmoflow-train --train=PATH --out=DIR [flags]   (run under mpirun or srun)\n";
  for (const auto& f : kFlags) {
    os << "  --" << f.name << (f.is_bool ? "" : "=V") << "\n      " << f.help << "\n";
  }
  return os.str();
}

StatusOr<TrainerOptions> ParseTrainerOptions(int argc, char** argv, bool* help) {
  *help = false;
  CF_ASSIGN_OR_RETURN(FlagTokens tokens, TokenizeFlags(argc, argv, 1, [](const std::string& n) {
                        const FlagInfo* f = FindFlag(n);
                        return f == nullptr ? -1 : f->is_bool ? 0 : 1;
                      }));
  if (!tokens.positional.empty()) {
    return InvalidArgumentError("unexpected argument '" + tokens.positional[0] +
                                "' (flags look like --name=value)");
  }
  const auto& flags = tokens.flags;
  for (const auto& kv : flags) {
    if (kv.first == "help") {
      *help = true;
      return TrainerOptions{};
    }
  }

  TrainerOptions o;
  // The config file first, so that command-line flags override it.
  for (const auto& [k, v] : flags) {
    if (k != "config") continue;
    std::ifstream in(v);
    if (!in) return InvalidArgumentError("--config=" + v + ": cannot open file");
    nlohmann::json j;
    try {
      in >> j;
    } catch (const std::exception& e) {
      return InvalidArgumentError("--config=" + v + ": not valid JSON: " + e.what());
    }
    if (!j.is_object()) return InvalidArgumentError("--config=" + v + ": expected a JSON object");
    for (auto it = j.begin(); it != j.end(); ++it) {
      if (it.key() == "config" || it.key() == "help" || !FindFlag(it.key())) {
        return InvalidArgumentError("--config=" + v + ": unknown key '" + it.key() + "'");
      }
      Status s = Apply(o, it.key(), JsonValueToString(it.value()));
      if (!s.ok()) return s.WithContext("--config=" + v);
    }
  }
  for (const auto& [k, v] : flags) {
    if (k != "config") CF_RETURN_IF_ERROR(Apply(o, k, v));
  }
  if (o.train_path.empty())
    return InvalidArgumentError("--train is required (a shard file or directory)");
  if (o.out_dir.empty()) return InvalidArgumentError("--out is required (the run directory)");
  if (o.optimizer.empty()) o.optimizer = o.lr.recipe == LrRecipe::kSc18 ? "adam" : "sgd";
  if (o.members > 1 && o.resume != "auto" && o.resume != "never")
    return Bad("resume", o.resume, "with --members each member resumes from its own directory (auto or never)");
  return o;
}

}  // namespace cosmoflow
