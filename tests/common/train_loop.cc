#include "tests/common/train_loop.h"

#include <chrono>
#include <cmath>

#include "core/base/log.h"
#include "trainer/train_step.h"
#include "trainer/uncertainty_run.h"

namespace cosmoflow {
namespace {

// SplitMix64's finaliser (the same function core/nn uses for its seeds), kept here so that the
// tests' shuffle does not depend on the engine's internal header.
uint64_t SplitMix64(uint64_t x) {
  x += 0x9E3779B97F4A7C15ull;
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
  return x ^ (x >> 31);
}

}  // namespace

StatusOr<std::unique_ptr<BatchLoader>> BatchLoader::Create(const Dataset* dataset, const ModelSpec& spec, int batch,
                                                           bool shuffle, uint64_t seed) {
  if (dataset == nullptr || dataset->size() == 0) return InvalidArgumentError("batch loader: empty dataset");
  const DatasetInfo& info = dataset->info();
  const CubeShape want{spec.input_channels, spec.input_side, spec.input_side, spec.input_side};
  if (info.shape != want) {
    return InvalidArgumentError("batch loader: dataset cubes are " + info.shape.ToString() + " but model '" +
                                spec.name + "' expects " + want.ToString());
  }
  if (info.param_names.size() != spec.outputs.size()) {
    return InvalidArgumentError("batch loader: dataset has " + std::to_string(info.param_names.size()) +
                                " parameters but model '" + spec.name + "' has " +
                                std::to_string(spec.outputs.size()) + " outputs");
  }
  if (batch <= 0) return InvalidArgumentError("batch loader: batch must be positive");
  std::unique_ptr<BatchLoader> l(new BatchLoader());
  l->dataset_ = dataset;
  l->spec_ = spec;
  l->batch_ = batch;
  l->shuffle_ = shuffle;
  l->seed_ = seed;
  l->cube_.resize(info.shape.elements());
  l->order_.resize(dataset->size());
  l->Reshuffle();
  return l;
}

void BatchLoader::Reshuffle() {
  for (size_t i = 0; i < order_.size(); ++i) order_[i] = static_cast<int64_t>(i);
  if (!shuffle_) return;
  // Fisher-Yates with our own hash so the order is the same on every platform and library.
  uint64_t state = SplitMix64(seed_ ^ (0xA5A5A5A5ull + static_cast<uint64_t>(epoch_)));
  for (size_t i = order_.size(); i > 1; --i) {
    state = SplitMix64(state);
    size_t j = static_cast<size_t>(state % i);
    std::swap(order_[i - 1], order_[j]);
  }
}

Status BatchLoader::Load(int64_t index, float* input, float* label) {
  CF_RETURN_IF_ERROR(dataset_->ReadCubeInto(index, cube_.data()));
  const CubeShape& shape = dataset_->info().shape;
  ApplyInputTransform(spec_.input_transform, cube_.data(), shape.elements(), shape.voxels(), input);
  CF_ASSIGN_OR_RETURN(std::vector<float> params, dataset_->ReadParams(index));
  if (params.size() != spec_.outputs.size()) {
    return DataLossError("batch loader: sample " + std::to_string(index) + " has " + std::to_string(params.size()) +
                         " parameters");
  }
  NormaliseLabels(spec_, params.data(), 1, label);
  return Status::Ok();
}

Status BatchLoader::Next(float* inputs, float* labels) {
  const int64_t in = dataset_->info().shape.elements();
  const int64_t p = static_cast<int64_t>(spec_.outputs.size());
  for (int b = 0; b < batch_; ++b) {
    if (position_ >= static_cast<int64_t>(order_.size())) {
      position_ = 0;
      ++epoch_;
      Reshuffle();
    }
    CF_RETURN_IF_ERROR(Load(order_[position_++], inputs + b * in, labels + b * p));
  }
  return Status::Ok();
}

Status BatchLoader::Read(int64_t first, float* inputs, float* labels) {
  if (first < 0 || first + batch_ > dataset_->size()) {
    return OutOfRangeError("batch loader: samples [" + std::to_string(first) + ", " + std::to_string(first + batch_) +
                           ") past the end of a dataset of " + std::to_string(dataset_->size()));
  }
  const int64_t in = dataset_->info().shape.elements();
  const int64_t p = static_cast<int64_t>(spec_.outputs.size());
  for (int b = 0; b < batch_; ++b) CF_RETURN_IF_ERROR(Load(first + b, inputs + b * in, labels + b * p));
  return Status::Ok();
}

StatusOr<TrainResult> TrainSingleProcess(const ModelSpec& spec, const Dataset& dataset, const TrainConfig& config,
                                         const std::function<void(int64_t, double, double)>& on_step) {
  if (config.steps < 0) return InvalidArgumentError("train: steps must be >= 0");
  NetworkOptions opts;
  opts.batch = config.batch;
  opts.precision = config.precision;
  opts.training = true;
  opts.seed = config.seed;
  CF_ASSIGN_OR_RETURN(std::unique_ptr<Network> net, Network::Create(spec, opts));
  CF_ASSIGN_OR_RETURN(std::unique_ptr<Optimizer> opt, Optimizer::Create(config.optimizer));
  CF_ASSIGN_OR_RETURN(LrSchedule schedule, LrSchedule::Create(config.schedule));
  CF_ASSIGN_OR_RETURN(std::unique_ptr<BatchLoader> loader,
                      BatchLoader::Create(&dataset, spec, config.batch, config.shuffle, config.seed));
  const int64_t in = int64_t{spec.input_channels} * spec.input_side * spec.input_side * spec.input_side;
  const int64_t p = static_cast<int64_t>(spec.outputs.size()), w = spec.NetworkOutputs();
  std::vector<float> x(in * config.batch), labels(p * config.batch), y(w * config.batch), diff(w * config.batch);
  StepLossConfig head_loss{config.mse_warmup_steps, config.mean_gradient};
  TrainResult result;
  auto t0 = std::chrono::steady_clock::now();
  for (int64_t step = 0; step < config.steps; ++step) {
    CF_RETURN_IF_ERROR(loader->Next(x.data(), labels.data()));
    const double lr = schedule.Value(step);
    // A spec with an uncertainty head: the Gaussian NLL after the MSE warm-up (StepLoss).
    const BatchLoss batch_loss = [&](const float* pred, const float* l, float* d) {
      if (spec.uncertainty == UncertaintyHead::kNone)
        return ComputeLoss(config.loss, pred, l, p * config.batch, d);
      return StepLoss(spec, head_loss, step, pred, l, config.batch, d);
    };
    const double loss =
        TrainOnBatch(*net, *opt, batch_loss, x.data(), labels.data(), static_cast<float>(lr), y, diff);
    if (!std::isfinite(loss)) {
      return AbortedError("train: loss became " + std::to_string(loss) + " at step " + std::to_string(step) +
                          " (learning rate too high?)");
    }
    result.losses.push_back(loss);
    if (on_step) on_step(step, loss, lr);
    if (config.log_every > 0 && (step + 1) % config.log_every == 0) {
      CF_LOG(INFO) << "step " << step + 1 << " loss " << loss << " lr " << lr;
    }
  }
  result.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  result.weights = net->ExportParameters();
  result.optimizer_state = opt->ExportState(net->parameters());
  return result;
}

}  // namespace cosmoflow
