// A single-process training loop for the tests: a spec, a Dataset, N optimizer steps. The product
// has one training loop, the MPI trainer's (trainer/trainer.cc); this one runs the same step
// (TrainOnBatch, trainer/train_step.h) without ranks, so the engine's learning and determinism can
// be tested without MPI.
//
// Deterministic mode: with the same seed, data and thread count, the weights after N steps are
// bit-identical between runs (sample order, dropout masks and initialisation come from the seed;
// oneDNN fp32/bf16 kernels and our reductions use a fixed order for a fixed thread count).
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "core/base/status.h"
#include "core/io/dataset.h"
#include "core/nn/loss.h"
#include "core/nn/network.h"
#include "core/nn/optimizer.h"
#include "core/nn/schedule.h"

namespace cosmoflow {

// Fills batches from a Dataset: reads int16 cubes, applies the spec's input transform, normalises
// labels. Indices are a seeded permutation per epoch (or sequential when shuffle is false).
class BatchLoader {
 public:
  // Checks the dataset's cube shape and parameter count against the spec.
  static StatusOr<std::unique_ptr<BatchLoader>> Create(const Dataset* dataset, const ModelSpec& spec, int batch,
                                                       bool shuffle, uint64_t seed);
  // Next batch: inputs batch x C x S^3 floats, labels batch x P normalised. Wraps around epochs.
  Status Next(float* inputs, float* labels);
  // Reads samples [first, first + batch) in order (validation); fails past the end.
  Status Read(int64_t first, float* inputs, float* labels);
  int64_t epoch() const { return epoch_; }
  int64_t position() const { return position_; }

 private:
  BatchLoader() = default;
  Status Load(int64_t index, float* input, float* label);
  void Reshuffle();
  const Dataset* dataset_ = nullptr;
  ModelSpec spec_;
  int batch_ = 1;
  bool shuffle_ = true;
  uint64_t seed_ = 0;
  std::vector<int64_t> order_;
  int64_t position_ = 0, epoch_ = 0;
  std::vector<int16_t> cube_;
};

struct TrainConfig {
  int batch = 4;
  int64_t steps = 100;
  Precision precision = Precision::kFp32;
  LossType loss = LossType::kMse;  // for a spec without an uncertainty head
  // A spec with an uncertainty head trains with the Gaussian NLL (loss.h), after
  // mse_warmup_steps steps of MSE on its means.
  MeanGradient mean_gradient = MeanGradient::kNll;
  int64_t mse_warmup_steps = 0;
  OptimizerConfig optimizer;
  LrScheduleConfig schedule;
  uint64_t seed = 0;
  bool shuffle = true;
  int64_t log_every = 0;  // 0: quiet
};

struct TrainResult {
  std::vector<double> losses;  // per step (training loss on the step's batch)
  std::vector<NamedTensor> weights;
  std::vector<NamedTensor> optimizer_state;
  double seconds = 0;
};

// Trains `spec` on `dataset` for config.steps steps from a fresh initialisation (seed). `on_step`
// (optional) is called after every step with (step, loss, lr).
StatusOr<TrainResult> TrainSingleProcess(const ModelSpec& spec, const Dataset& dataset, const TrainConfig& config,
                                         const std::function<void(int64_t, double, double)>& on_step = nullptr);

}  // namespace cosmoflow
