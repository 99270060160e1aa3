#include "trainer/trainer.h"

#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <csignal>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <random>
#include <sstream>
#include <thread>

#include "core/base/crc32c.h"
#include "core/base/log.h"
#include "core/io/dataset.h"
#include "core/nn/checkpoint.h"
#include "core/nn/loss.h"
#include "core/nn/network.h"
#include "core/nn/optimizer.h"
#include "core/nn/spec.h"
#include "trainer/grad_allreducer.h"
#include "trainer/lr_recipe.h"
#include "trainer/prefetch_loader.h"
#include "trainer/run_log.h"
#include "trainer/sampler.h"
#include "trainer/signals.h"
#include "trainer/train_step.h"
#include "trainer/uncertainty_run.h"
#include "trainer/peer_probe.h"
#include "trainer/watchdog.h"

#ifndef COSMOFLOW_GIT_REV
#define COSMOFLOW_GIT_REV "unknown"
#endif

namespace cosmoflow {
namespace {

namespace fs = std::filesystem;
using Clock = std::chrono::steady_clock;

double Seconds(Clock::time_point a, Clock::time_point b) {
  return std::chrono::duration<double>(b - a).count();
}

std::string FormatDuration(double s) {
  if (!(s >= 0) || s > 1e8) return "?";
  const long t = static_cast<long>(s + 0.5);
  char buf[32];
  if (t >= 3600)
    std::snprintf(buf, sizeof(buf), "%ldh%02ldm", t / 3600, (t / 60) % 60);
  else if (t >= 60)
    std::snprintf(buf, sizeof(buf), "%ldm%02lds", t / 60, t % 60);
  else
    std::snprintf(buf, sizeof(buf), "%lds", t);
  return buf;
}

double Median(std::vector<double> v) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  const size_t n = v.size();
  return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

Status CheckDatasetFits(const ModelSpec& spec, const Dataset& ds, const std::string& what) {
  const CubeShape& s = ds.info().shape;
  const CubeShape want{spec.input_channels, spec.input_side, spec.input_side, spec.input_side};
  if (s != want) {
    return InvalidArgumentError(what + ": cubes are " + s.ToString() + " but model '" + spec.name +
                                "' takes " + want.ToString());
  }
  if (ds.size() < 1) return InvalidArgumentError(what + ": dataset is empty");
  return Status::Ok();
}

// Opens a dataset on every rank; all ranks agree on the outcome.
StatusOr<std::unique_ptr<Dataset>> OpenDatasetEverywhere(const std::string& path,
                                                         const ModelSpec& spec,
                                                         const std::string& what,
                                                         const MpiWorld& world) {
  auto ds = Dataset::Open(path);
  Status local = ds.ok() ? CheckDatasetFits(spec, **ds, what + " " + path)
                         : ds.status().WithContext(what + " " + path);
  CF_RETURN_IF_ERROR(AgreeOnStatus(local, world.comm));
  return std::move(ds).value();
}

// Copies the dataset's shard files into `dir`/`tag` (local rank 0 of each node copies, the others
// wait), so training reads node-local storage instead of the shared file system.
StatusOr<std::string> StageToDirectory(const Dataset& ds, const std::string& dir,
                                       const std::string& tag, const MpiWorld& world) {
  const fs::path target = fs::path(dir) / ("cosmoflow-stage-" + tag);
  Status local;
  if (world.local_rank == 0) {
    std::error_code ec;
    fs::create_directories(target, ec);
    if (ec)
      local = NotFoundError("--stage=" + dir + ": cannot create " + target.string() + ": " +
                            ec.message());
    for (int i = 0; local.ok() && i < ds.num_shards(); ++i) {
      const fs::path src = ds.shard(i).path();
      const fs::path dst = target / src.filename();
      // Skip files already staged by an earlier run of the job (same size and not older).
      if (fs::exists(dst, ec) && fs::file_size(dst, ec) == fs::file_size(src, ec) &&
          fs::last_write_time(dst, ec) >= fs::last_write_time(src, ec)) {
        continue;
      }
      const fs::path tmp = dst.string() + ".staging";
      fs::copy_file(src, tmp, fs::copy_options::overwrite_existing, ec);
      if (!ec) fs::rename(tmp, dst, ec);
      if (ec)
        local = InternalError("--stage: copying " + src.string() + " to " + dst.string() + ": " +
                              ec.message());
    }
  }
  CF_RETURN_IF_ERROR(AgreeOnStatus(local, world.comm));  // also the barrier: files are in place
  return target.string();
}

uint32_t WeightsChecksum(const std::vector<Parameter>& params) {
  uint32_t crc = 0;
  for (const Parameter& p : params) crc = Crc32c(p.value, p.numel() * sizeof(float), crc);
  return crc;
}

bool WriteFileAtomically(const std::string& path, const std::string& text) {
  const std::string tmp = path + ".tmp";
  {
    std::ofstream out(tmp, std::ios::trunc);
    if (!out) return false;
    out << text;
    if (!out) return false;
  }
  return std::rename(tmp.c_str(), path.c_str()) == 0;
}

struct ValResult {
  double loss = 0, mae = 0;
  std::vector<double> rel_err;
  int64_t count = 0;
};

// The measured times of one training step.
struct StepTimes {
  double data_wait = 0;  // blocked in the input pipeline
  double comm = 0;       // step-boundary agreement + gradient wait
};

bool HasBatchNorm(const ModelSpec& spec) {
  for (const LayerSpec& l : spec.layers) {
    if (l.type == LayerType::kBatchNorm) return true;
  }
  return false;
}

class Trainer {
 public:
  Trainer(const TrainerOptions& o, const MpiWorld& w, std::string command_line)
      : opt_(o), world_(w), command_line_(std::move(command_line)) {
    jitter_rng_.seed(0x6a09e667f3bcc908ULL ^ (uint64_t(opt_.seed) << 20) ^ uint64_t(world_.rank));
  }
  int Run();
  // After Run(): the spec, the final checkpoint file and (rank 0) the last validation's posteriors
  // and the training labels' range, for an ensemble of such runs.
  const ModelSpec& spec() const { return spec_; }
  const std::string& final_checkpoint() const { return final_checkpoint_; }
  const ValidationPosteriors& posteriors() const { return posteriors_; }
  const std::vector<double>& prior_low() const { return prior_low_; }
  const std::vector<double>& prior_high() const { return prior_high_; }

 private:
  // Setup, in order; each stage ends with an agreement over the ranks.
  Status Setup();
  Status LoadSpecAndPrecision();
  Status OpenRunDirectory();
  Status OpenDatasets();
  Status PlanEpochs();
  Status Stage();
  Status StageIntoDirectory();
  Status StageIntoMemory();
  Status BuildNetwork();
  // ::CreateNetworkOnEveryRank (mpi_util.h) with `what` in errors; rank 0 logs every conv's kernels.
  StatusOr<std::unique_ptr<Network>> CreateNetworkOnEveryRank(const NetworkOptions& o, const std::string& what);
  Status BuildOptimizerAndSchedule();
  void BuildReducer();
  Status Resume();
  StatusOr<std::string> ChooseCheckpoint();
  Status RestoreFrom(const Checkpoint& c, const std::string& path);

  // The training loop, one step at a time. The std::optional<int> results are the process exit
  // code when the run ends there, nullopt to go on.
  void LogRunDescription() const;
  BatchPlan TrainingPlan() const;
  PrefetchConfig TrainingLoaderConfig() const;
  std::optional<int> StepBoundary(PrefetchLoader& loader, const PrefetchedBatch* batch,
                                  double* comm);
  void MaybeDieForTests() const;
  int StopForRequeue();
  void TrainStep(PrefetchLoader& loader, const PrefetchedBatch* batch, double* comm);
  void RecordTiming(double step_seconds, const StepTimes& times);
  std::optional<int> MaybeLogProgress();
  std::optional<int> MaybeCheckWeights();
  std::optional<int> MaybeRecomputeStatistics();
  Status RecomputeStatistics();
  std::optional<int> MaybeValidate();
  std::optional<int> MaybeCheckpoint();
  int Finish();
  bool EpochEnd() const { return step_ % steps_per_epoch_ == 0; }

  Status SaveCheckpoint();
  StatusOr<ValResult> Validate();
  Status RunValidation(std::vector<double>& sums, std::vector<float>& rows);
  void AccumulateValidation(const PrefetchedBatch& batch, const std::vector<float>& pred,
                            std::vector<double>& sums, std::vector<float>& rows) const;
  void WriteValidationPredictions(const std::vector<float>& all);
  void FitValidationCalibration(const ValidationPosteriors& v);
  void LogValidation(const ValResult& val);
  void LogProgress(double window_loss);
  void WriteSummary(const std::string& outcome);
  void AddTimingSummary(nlohmann::json& j) const;
  int Fail(const Status& s);
  int FailRun(const Status& s);  // writes the "error" summary, then Fail
  bool root() const { return world_.rank == 0; }

  TrainerOptions opt_;
  MpiWorld world_;
  MPI_Comm stats_comm_ = MPI_COMM_NULL;  // batch_norm statistics (a dup of world_.comm)
  std::string command_line_;
  ModelSpec spec_;
  Precision precision_ = Precision::kFp32;
  std::unique_ptr<Dataset> train_set_, val_set_;
  std::unique_ptr<SampleSource> train_source_, val_source_;
  std::vector<int64_t> val_indices_;  // this rank's validation samples
  LabelMap train_labels_, val_labels_;
  std::unique_ptr<EpochSampler> sampler_;
  std::unique_ptr<Network> net_, val_net_;
  std::unique_ptr<Optimizer> optimizer_;
  std::unique_ptr<GradientAllreducer> reducer_;
  std::unique_ptr<PeerProbe> peer_probe_;  // before watchdog_: the watchdog's thread uses it
  std::unique_ptr<CollectiveWatchdog> watchdog_;
  std::mt19937_64 jitter_rng_;  // --debug-step-jitter: a stream per (seed, rank)
  std::unique_ptr<LrRecipeSchedule> schedule_;
  std::unique_ptr<RunLog> log_;
  std::string ckpt_dir_;
  uint64_t seed_ = 1;
  int64_t steps_per_epoch_ = 1, total_steps_ = 0;
  int64_t step_ = 0, samples_seen_ = 0, start_step_ = 0;
  int64_t last_saved_step_ = -1;
  std::string resumed_from_;
  double lr_ = 0;
  std::vector<float> pred_, diff_;  // batch x NetworkOutputs() scratch of the training step
  // Timing of this process (rank 0's figures are the ones reported).
  Clock::time_point run_start_;
  std::vector<double> step_seconds_, data_wait_seconds_, comm_wait_seconds_, comm_span_seconds_;
  std::vector<double> grad_wait_seconds_;  // the part of comm_wait spent in the gradient allreduce
  double window_loss_ = 0, window_time_ = 0, window_wait_ = 0, window_comm_ = 0;
  int64_t window_steps_ = 0;
  ValResult last_val_;
  bool have_val_ = false;
  // Uncertainty (rank 0): the last validation's posteriors, the calibration fitted on them (saved
  // with the next checkpoint) and the prior it truncates to (the training labels' range).
  ValidationPosteriors posteriors_;
  Calibration calibration_;
  std::vector<double> prior_low_, prior_high_;
  std::string final_checkpoint_;
};

int Trainer::Fail(const Status& s) {
  if (root()) std::fprintf(stderr, "cosmoflow-train: error: %s\n", s.ToString().c_str());
  return kExitError;
}

int Trainer::FailRun(const Status& s) {
  WriteSummary("error");
  return Fail(s);
}

// ---- setup ----

Status Trainer::Setup() {
  // Everything here may fail on bad input; each stage ends with an agreement so no rank hangs.
  CF_RETURN_IF_ERROR(LoadSpecAndPrecision());
  CF_RETURN_IF_ERROR(OpenRunDirectory());
  CF_RETURN_IF_ERROR(OpenDatasets());
  CF_RETURN_IF_ERROR(PlanEpochs());
  CF_RETURN_IF_ERROR(Stage());
  CF_RETURN_IF_ERROR(BuildNetwork());
  CF_RETURN_IF_ERROR(BuildOptimizerAndSchedule());
  BuildReducer();
  return Resume();
}

Status Trainer::LoadSpecAndPrecision() {
  auto spec = LoadSpec(opt_.spec);
  if (!spec.ok()) spec = spec.status().WithContext("--spec");
  auto precision = ParsePrecision(opt_.precision);
  Status local = !spec.ok() ? spec.status() : precision.status();
  if (local.ok() && *precision == Precision::kBf16 && !Bf16Supported()) {
    // Known before anything is written: refuse here rather than leave an empty run directory.
    local = FailedPreconditionError(
        "--precision=bf16: this CPU has neither AVX512-BF16 nor AMX (use fp32)");
  }
  CF_RETURN_IF_ERROR(AgreeOnStatus(local, world_.comm));
  spec_ = *spec;
  precision_ = *precision;
  seed_ = opt_.seed;
  return Status::Ok();
}

// A save killed with -9 leaves its temporary file behind (an sc18 checkpoint with Adam state is
// ~84 MB): the dead writers' go, a live writer's (another job on this --out) stay.
void RemoveStaleCheckpointTemporaries(const std::string& dir) {
  for (const TemporaryCheckpointFile& f : RemoveStaleTemporaryFiles(dir)) {
    if (f.removed) {
      CF_LOG(INFO) << "removed stale temporary checkpoint file " << f.path << " (its writer, pid "
                   << f.writer_pid << ", is gone)";
    } else if (f.writer_alive) {
      CF_LOG(WARNING) << "kept temporary checkpoint file " << f.path << ": its writer, pid "
                      << f.writer_pid << ", is still running (another job on this --out?)";
    } else {
      CF_LOG(WARNING) << "cannot remove stale temporary checkpoint file " << f.path;
    }
  }
}

Status Trainer::OpenRunDirectory() {
  Status local;
  if (root()) {
    std::error_code ec;
    fs::create_directories(fs::path(opt_.out_dir) / "checkpoints", ec);
    local = ec ? NotFoundError("--out=" + opt_.out_dir +
                               ": cannot create the run directory: " + ec.message())
               : Status::Ok();
    if (local.ok()) {
      RemoveStaleCheckpointTemporaries((fs::path(opt_.out_dir) / "checkpoints").string());
      std::vector<std::string> names;
      for (const auto& o : spec_.outputs) names.push_back(o.name);
      auto log = RunLog::Open((fs::path(opt_.out_dir) / "train_log.csv").string(), names,
                              opt_.tensorboard ? opt_.out_dir : "");
      if (log.ok())
        log_ = std::make_unique<RunLog>(std::move(log).value());
      else
        local = log.status();
    }
  }
  CF_RETURN_IF_ERROR(AgreeOnStatus(local, world_.comm));
  ckpt_dir_ = (fs::path(opt_.out_dir) / "checkpoints").string();
  return Status::Ok();
}

Status Trainer::OpenDatasets() {
  CF_ASSIGN_OR_RETURN(train_set_, OpenDatasetEverywhere(opt_.train_path, spec_, "--train", world_));
  if (!opt_.val_path.empty()) {
    CF_ASSIGN_OR_RETURN(val_set_, OpenDatasetEverywhere(opt_.val_path, spec_, "--val", world_));
  }
  auto labels = MakeLabelMap(spec_, train_set_->info(), "--train " + opt_.train_path);
  Status local = labels.status();
  if (labels.ok()) train_labels_ = *labels;
  if (local.ok() && val_set_) {
    auto vl = MakeLabelMap(spec_, val_set_->info(), "--val " + opt_.val_path);
    local = vl.status();
    if (vl.ok()) val_labels_ = *vl;
  }
  return AgreeOnStatus(local, world_.comm);
}

Status Trainer::PlanEpochs() {
  auto sampler = EpochSampler::Create(train_set_->size(), world_.size, world_.rank, opt_.batch,
                                      seed_, opt_.shuffle);
  CF_RETURN_IF_ERROR(
      AgreeOnStatus(sampler.status().WithContext("--train " + opt_.train_path), world_.comm));
  sampler_ = std::make_unique<EpochSampler>(*sampler);
  steps_per_epoch_ = sampler_->steps_per_epoch();
  total_steps_ = steps_per_epoch_ * opt_.epochs;
  if (opt_.max_steps > 0) total_steps_ = std::min(total_steps_, opt_.max_steps);
  if (val_set_) {
    for (int64_t i = world_.rank; i < val_set_->size(); i += world_.size) val_indices_.push_back(i);
  }
  return Status::Ok();
}

// Staging: a node-local directory, memory, or none (read the datasets where they are).
Status Trainer::Stage() {
  if (opt_.stage == "memory") return StageIntoMemory();
  if (opt_.stage != "none") CF_RETURN_IF_ERROR(StageIntoDirectory());
  train_source_ = MakeDatasetSource(train_set_.get());
  if (val_set_) val_source_ = MakeDatasetSource(val_set_.get());
  return Status::Ok();
}

Status Trainer::StageIntoDirectory() {
  CF_ASSIGN_OR_RETURN(std::string staged,
                      StageToDirectory(*train_set_, opt_.stage, "train", world_));
  CF_ASSIGN_OR_RETURN(train_set_, OpenDatasetEverywhere(staged, spec_, "--train (staged)", world_));
  if (val_set_) {
    CF_ASSIGN_OR_RETURN(std::string sv, StageToDirectory(*val_set_, opt_.stage, "val", world_));
    CF_ASSIGN_OR_RETURN(val_set_, OpenDatasetEverywhere(sv, spec_, "--val (staged)", world_));
  }
  return Status::Ok();
}

Status Trainer::StageIntoMemory() {
  auto t0 = Clock::now();
  auto src = StageInMemory(*train_set_, sampler_->SamplesOfThisRank());
  Status local = src.status().WithContext("--stage=memory --train " + opt_.train_path);
  if (src.ok()) train_source_ = std::move(src).value();
  if (local.ok() && val_set_) {
    auto vs = StageInMemory(*val_set_, val_indices_);
    local = vs.status().WithContext("--stage=memory --val " + opt_.val_path);
    if (vs.ok()) val_source_ = std::move(vs).value();
  }
  CF_RETURN_IF_ERROR(AgreeOnStatus(local, world_.comm));
  if (root()) {
    CF_LOG(INFO) << "staged the dataset into memory in " << Seconds(t0, Clock::now()) << " s";
  }
  return Status::Ok();
}

StatusOr<std::unique_ptr<Network>> Trainer::CreateNetworkOnEveryRank(const NetworkOptions& o,
                                                                      const std::string& what) {
  auto net = cosmoflow::CreateNetworkOnEveryRank(spec_, o, world_.comm);
  if (!net.ok()) return net.status().WithContext(what);
  if (root()) {
    for (const auto& k : (*net)->ChosenKernels()) {
      if (k.op.rfind("conv", 0) != 0) continue;
      CF_LOG(INFO) << what << ": " << k.op << " " << DescribeKernel(k);
    }
  }
  return net;
}

Status Trainer::BuildNetwork() {
  // Dropout masks differ per rank (each rank sees other samples).
  NetworkOptions no;
  no.batch = opt_.batch;
  no.precision = precision_;
  no.training = true;
  no.seed = MixSeed(seed_, static_cast<uint64_t>(world_.rank), 0xd70f);
  no.covariance_gradient_head_only = opt_.covariance_gradient == "head";
  no.kernel_selection = opt_.deterministic || opt_.kernel_selection == "rule" ? KernelSelection::kRule
                                                                              : KernelSelection::kMeasure;
  no.kernel_cache = opt_.kernel_cache == "none" ? "" : opt_.kernel_cache.empty() ? DefaultKernelCachePath()
                                                                                    : opt_.kernel_cache;
  if (HasBatchNorm(spec_)) {
    // batch_norm's statistics span every rank, on a communicator of their own.
    MPI_Comm_dup(world_.comm, &stats_comm_);
    no.allreduce_sum = BatchStatisticsAllreduce(stats_comm_);
  }
  CF_ASSIGN_OR_RETURN(net_, CreateNetworkOnEveryRank(no, "building network '" + spec_.name + "'"));
  if (val_set_) {
    NetworkOptions vo = no;
    vo.training = false;
    CF_ASSIGN_OR_RETURN(val_net_, CreateNetworkOnEveryRank(vo, "building validation network"));
  }
  net_->InitParameters(seed_);
  net_->ParametersUpdated();
  return Status::Ok();
}

Status Trainer::BuildOptimizerAndSchedule() {
  // core/nn's optimizers (SGD with L2 weight decay, AdamW-style decoupled decay for Adam).
  OptimizerConfig oc;
  oc.name = opt_.optimizer;
  oc.momentum = static_cast<float>(opt_.momentum);
  oc.weight_decay = static_cast<float>(opt_.weight_decay);
  auto optimizer = Optimizer::Create(oc);
  CF_RETURN_IF_ERROR(AgreeOnStatus(optimizer.status(), world_.comm));
  optimizer_ = std::move(optimizer).value();

  // The schedule spans --epochs even when --max-steps stops earlier, so that a run cut short and
  // resumed follows the same learning rates as an uninterrupted one.
  auto schedule = LrRecipeSchedule::Create(opt_.lr, sampler_->global_batch(), steps_per_epoch_,
                                           steps_per_epoch_ * opt_.epochs);
  CF_RETURN_IF_ERROR(AgreeOnStatus(schedule.status(), world_.comm));
  schedule_ = std::make_unique<LrRecipeSchedule>(*schedule);
  return Status::Ok();
}

void Trainer::BuildReducer() {
  int thread_level = MPI_THREAD_SINGLE;
  MPI_Query_thread(&thread_level);
  auto mode = opt_.allreduce == "thread" ? GradientAllreducer::Mode::kThread
                                         : GradientAllreducer::Mode::kNonblocking;
  if (mode == GradientAllreducer::Mode::kThread && thread_level < MPI_THREAD_SERIALIZED) {
    if (root()) {
      CF_LOG(WARNING) << "MPI lacks MPI_THREAD_SERIALIZED; using --allreduce=nonblocking";
    }
    mode = GradientAllreducer::Mode::kNonblocking;
  }
  if (mode == GradientAllreducer::Mode::kThread && HasBatchNorm(spec_)) {
    // batch_norm allreduces its statistics from the training thread inside Backward, while the
    // communication thread would be allreducing gradient buckets: MPI calls from one thread only.
    if (root()) {
      CF_LOG(INFO) << "spec has batch_norm: using --allreduce=nonblocking";
    }
    mode = GradientAllreducer::Mode::kNonblocking;
  }
  reducer_ = std::make_unique<GradientAllreducer>(
      &net_->parameters(), world_.comm, static_cast<int64_t>(opt_.bucket_mb * (1 << 20)), mode);
}

Status Trainer::Resume() {
  CF_ASSIGN_OR_RETURN(std::string path, ChooseCheckpoint());
  if (path.empty()) {
    // Fresh start: identical initial weights on every rank (same seed), checked once.
    if (!SameOnAllRanks(WeightsChecksum(net_->parameters()), world_.comm)) {
      return InternalError("initial weights differ between ranks");
    }
    return Status::Ok();
  }

  auto ckpt = ReadCheckpoint(path);
  Status local = ckpt.status().WithContext("--resume: " + path);
  if (local.ok()) local = RestoreFrom(*ckpt, path);
  CF_RETURN_IF_ERROR(AgreeOnStatus(local, world_.comm));
  net_->ParametersUpdated();
  net_->SetTrainingStep(
      static_cast<uint64_t>(ckpt->state.step));  // same dropout masks as without a stop
  step_ = start_step_ = ckpt->state.step;
  samples_seen_ = ckpt->state.samples_seen;
  last_saved_step_ = step_;
  resumed_from_ = path;
  final_checkpoint_ = path;
  if (ckpt->state.rng_seed != seed_) {
    // The run's seed fixes shuffling, augmentation and dropout; keep the checkpoint's so the
    // resumed run continues the same sequence.
    if (root()) {
      CF_LOG(WARNING) << "--seed=" << seed_ << " ignored: resuming run seeded "
                      << ckpt->state.rng_seed;
    }
    seed_ = ckpt->state.rng_seed;
    auto sampler = EpochSampler::Create(train_set_->size(), world_.size, world_.rank, opt_.batch,
                                        seed_, opt_.shuffle);
    sampler_ = std::make_unique<EpochSampler>(*sampler);
  }
  if (root()) {
    CF_LOG(INFO) << "resumed from " << path << " at step " << step_ << " (epoch "
                 << step_ / steps_per_epoch_ << ")";
  }
  return Status::Ok();
}

// Rank 0 chooses the checkpoint (verifying checksums, skipping corrupt ones) and broadcasts its
// path; empty for a fresh start.
StatusOr<std::string> Trainer::ChooseCheckpoint() {
  std::string path;
  Status local;
  if (root() && opt_.resume != "never") {
    if (opt_.resume == "auto") {
      auto found = FindLatestCheckpoint(ckpt_dir_);
      if (found.ok())
        path = *found;
      else if (found.status().code() != StatusCode::kNotFound)
        local = found.status();
    } else {
      path = opt_.resume;
    }
  }
  CF_RETURN_IF_ERROR(AgreeOnStatus(local, world_.comm));
  return BroadcastString(path, world_.comm);
}

// Checks that checkpoint `c` continues this run, then loads its weights and optimizer state.
Status Trainer::RestoreFrom(const Checkpoint& c, const std::string& path) {
  const auto gb = c.provenance.find("global_batch");
  if (c.spec.ToJson() != spec_.ToJson()) {
    return FailedPreconditionError("checkpoint " + path + " is for model '" + c.spec.name +
                                   "' (a different spec) but this run trains '" + spec_.name +
                                   "'; use another --out or --resume=never");
  }
  if (gb != c.provenance.end() && gb->second != std::to_string(sampler_->global_batch())) {
    return FailedPreconditionError("checkpoint " + path + " was written with global batch " +
                                   gb->second + " but this run has " +
                                   std::to_string(sampler_->global_batch()) +
                                   " (ranks x --batch); exact resume needs the same");
  }
  if (c.state.optimizer != optimizer_->name()) {
    return FailedPreconditionError("checkpoint " + path + " holds '" + c.state.optimizer +
                                   "' optimizer state but this run uses '" + optimizer_->name() +
                                   "'");
  }
  CF_RETURN_IF_ERROR(net_->LoadParameters(c.weights).WithContext("checkpoint " + path));
  return optimizer_->RestoreState(net_->parameters(), c.optimizer_state)
      .WithContext("checkpoint " + path);
}

// ---- checkpoints, validation, logs ----

Status Trainer::SaveCheckpoint() {
  if (last_saved_step_ == step_) return Status::Ok();
  Status local;
  if (root()) {
    Checkpoint c;
    c.spec = spec_;
    c.weights = net_->ExportParameters();
    c.optimizer_state = optimizer_->ExportState(net_->parameters());
    c.state.step = step_;
    c.state.epoch = step_ / steps_per_epoch_;
    c.state.samples_seen = samples_seen_;
    c.state.rng_seed = seed_;
    c.state.optimizer = optimizer_->name();
    c.calibration = calibration_;  // fitted on the validation just before (empty without a head)
    c.provenance = {{"dataset", opt_.train_path},
                    {"ranks", std::to_string(world_.size)},
                    {"global_batch", std::to_string(sampler_->global_batch())},
                    {"recipe", LrRecipeName(opt_.lr.recipe)},
                    {"precision", PrecisionName(precision_)},
                    {"git_revision", COSMOFLOW_GIT_REV},
                    {"command", command_line_}};
    const auto t0 = Clock::now();
    auto saved = SaveCheckpointToDir(ckpt_dir_, c, opt_.keep_checkpoints);
    local = saved.status().WithContext("writing a checkpoint to " + ckpt_dir_);
    if (saved.ok()) {
      CF_LOG(INFO) << "checkpoint " << *saved << " (" << Seconds(t0, Clock::now()) << " s)";
      final_checkpoint_ = *saved;
    }
  }
  CF_RETURN_IF_ERROR(AgreeOnStatus(local, world_.comm));
  last_saved_step_ = step_;
  return Status::Ok();
}

StatusOr<ValResult> Trainer::Validate() {
  const size_t outputs = spec_.outputs.size();
  // sums: loss, abs err, count, rel err per output
  std::vector<double> sums(3 + outputs, 0.0);
  std::vector<float> rows;  // ValidationRowWidth(spec_) floats per sample (uncertainty_run.h)
  Status local = val_net_->LoadParameters(net_->ExportParameters());
  if (local.ok()) {
    val_net_->ParametersUpdated();
    local = RunValidation(sums, rows);
  }
  CF_RETURN_IF_ERROR(AgreeOnStatus(local, world_.comm));
  AllreduceSum(sums, world_.comm);
  std::vector<float> all = GatherToRoot(rows, world_.comm);
  ValResult r;
  r.rel_err.assign(outputs, 0);
  r.count = static_cast<int64_t>(sums[2]);
  if (r.count > 0) {
    r.loss = sums[0] / (r.count * outputs);
    r.mae = sums[1] / (r.count * outputs);
    for (size_t o = 0; o < outputs; ++o) r.rel_err[o] = sums[3 + o] / r.count;
  }
  if (root()) WriteValidationPredictions(all);
  return r;
}

// This rank's validation samples through val_net_, accumulated into `sums` and `rows`.
Status Trainer::RunValidation(std::vector<double>& sums, std::vector<float>& rows) {
  const int b = opt_.batch;
  const int64_t n = static_cast<int64_t>(val_indices_.size());
  BatchPlan plan;
  plan.num_batches = (n + b - 1) / b;
  const std::vector<int64_t>& idx = val_indices_;
  plan.indices = [&idx, b, n](int64_t k) {
    std::vector<int64_t> out(b);
    for (int i = 0; i < b; ++i) out[i] = idx[std::min(n - 1, k * b + i)];
    return out;
  };
  plan.valid = [b, n](int64_t k) { return static_cast<int>(std::min<int64_t>(b, n - k * b)); };
  PrefetchConfig lc;
  lc.batch = b;
  lc.queue_depth = opt_.prefetch;
  lc.transform = spec_.input_transform;
  lc.labels = val_labels_;
  PrefetchLoader loader(val_source_.get(), plan, lc);
  std::vector<float> pred(static_cast<size_t>(b) * spec_.NetworkOutputs());
  while (const PrefetchedBatch* batch = loader.Next(nullptr)) {
    if (!batch->status.ok()) {
      Status s = batch->status.WithContext("--val " + opt_.val_path);
      loader.Release(batch);
      return s;
    }
    val_net_->Forward(batch->src.data(), pred.data());
    AccumulateValidation(*batch, pred, sums, rows);
    loader.Release(batch);
  }
  return Status::Ok();
}

void Trainer::AccumulateValidation(const PrefetchedBatch& batch, const std::vector<float>& pred,
                                   std::vector<double>& sums, std::vector<float>& rows) const {
  const size_t outputs = spec_.outputs.size(), width = spec_.NetworkOutputs();
  for (int i = 0; i < batch.valid; ++i) {
    const float* head = &pred[i * width];  // the means come first in every head
    const float* label = &batch.labels[i * outputs];
    rows.push_back(static_cast<float>(batch.indices[i]));
    for (size_t o = 0; o < outputs; ++o) rows.push_back(batch.physical[i * outputs + o]);
    for (size_t o = 0; o < outputs; ++o) {
      const double y = head[o], t = label[o];
      const double phys_pred = spec_.outputs[o].offset + spec_.outputs[o].scale * y;
      const double phys_true = batch.physical[i * outputs + o];
      rows.push_back(static_cast<float>(phys_pred));
      sums[1] += std::fabs(y - t);
      sums[3 + o] += std::fabs(phys_pred - phys_true) / std::max(1e-12, std::fabs(phys_true));
    }
    rows.insert(rows.end(), label, label + outputs);
    rows.insert(rows.end(), head, head + width);
    sums[0] += ValidationLossSum(spec_, head, label);
    sums[2] += 1;
  }
}

// val_predictions.csv: one row per validation sample, physical units, sorted by index; with an
// uncertainty head also the calibration fitted on them.
void Trainer::WriteValidationPredictions(const std::vector<float>& all) {
  posteriors_ = DecodeValidationRows(spec_, all);
  FitValidationCalibration(posteriors_);
  const std::string path = (fs::path(opt_.out_dir) / "val_predictions.csv").string();
  if (!WriteFileAtomically(path, ValidationCsv(spec_, posteriors_, calibration_))) {
    CF_LOG(WARNING) << path << ": cannot write";
  }
}

void Trainer::FitValidationCalibration(const ValidationPosteriors& v) {
  if (prior_low_.empty()) {
    Status s = LabelRange(*train_set_, train_labels_.column, &prior_low_, &prior_high_);
    if (!s.ok()) {
      CF_LOG(WARNING) << "--train " << opt_.train_path << ": " << s.message();
      prior_low_.clear();
      prior_high_.clear();
    }
  }
  if (spec_.uncertainty == UncertaintyHead::kNone) return;
  JointFit joint;
  auto fitted = FitCalibration(spec_, v.truth, v.mean, v.cov, prior_low_, prior_high_,
                               *ParseCalibrationForm(opt_.calibration), &joint);
  if (!fitted.ok()) {
    CF_LOG(WARNING) << "no calibration for this checkpoint: " << fitted.status().message();
    calibration_ = {};
    return;
  }
  calibration_ = *fitted;
  CF_LOG(INFO) << "calibration on " << calibration_.samples << " validation cubes: "
               << DescribeCalibration(calibration_, spec_, &joint);
}

void Trainer::LogValidation(const ValResult& val) {
  if (!root()) return;
  std::ostringstream os;
  os << "validation epoch " << (step_ - 1) / steps_per_epoch_ + 1 << ": loss " << val.loss
     << " MAE " << val.mae << " (normalised), mean relative error";
  for (size_t o = 0; o < spec_.outputs.size(); ++o)
    os << " " << spec_.outputs[o].name << " " << 100 * val.rel_err[o] << "%";
  os << " over " << val.count << " cubes";
  CF_LOG(INFO) << os.str();
  LogRow row;
  row.kind = "val";
  row.epoch = (step_ - 1) / steps_per_epoch_;
  row.step = step_;
  row.samples_seen = samples_seen_;
  row.lr = lr_;
  row.loss = val.loss;
  row.mae = val.mae;
  row.rel_err = val.rel_err;
  row.elapsed_s = Seconds(run_start_, Clock::now());
  if (log_) log_->Write(row);
}

void Trainer::LogProgress(double window_loss) {
  if (!root() || window_steps_ == 0) return;
  const double step_time = window_time_ / window_steps_;
  const double sps = sampler_->global_batch() / std::max(step_time, 1e-12);
  const double wait_frac = window_wait_ / std::max(window_time_, 1e-12);
  const double comm_frac = window_comm_ / std::max(window_time_, 1e-12);
  const double eta = step_time * (total_steps_ - step_);
  const int64_t epoch = (step_ - 1) / steps_per_epoch_;
  char line[512];
  std::snprintf(line, sizeof(line),
                "epoch %lld/%d step %lld/%lld loss %.5f lr %.3g samples/s %.2f data-wait %.1f%% "
                "comm %.1f%% ETA %s",
                static_cast<long long>(epoch + 1), opt_.epochs, static_cast<long long>(step_),
                static_cast<long long>(total_steps_), window_loss, lr_, sps, 100 * wait_frac,
                100 * comm_frac, FormatDuration(eta).c_str());
  CF_LOG(INFO) << line;
  LogRow row;
  row.kind = "train";
  row.epoch = epoch;
  row.step = step_;
  row.samples_seen = samples_seen_;
  row.lr = lr_;
  row.loss = window_loss;
  row.samples_per_s = sps;
  row.data_wait_frac = wait_frac;
  row.comm_frac = comm_frac;
  row.elapsed_s = Seconds(run_start_, Clock::now());
  if (log_) log_->Write(row);
}

void Trainer::WriteSummary(const std::string& outcome) {
  if (!root()) return;
  nlohmann::json j;
  j["outcome"] = outcome;
  j["spec"] = spec_.name;
  j["precision"] = PrecisionName(precision_);
  j["ranks"] = world_.size;
  j["batch_per_rank"] = opt_.batch;
  j["global_batch"] = sampler_ ? sampler_->global_batch() : 0;
  j["recipe"] = LrRecipeName(opt_.lr.recipe);
  j["optimizer"] = opt_.optimizer;
  j["seed"] = seed_;
  j["steps_per_epoch"] = steps_per_epoch_;
  j["total_steps"] = total_steps_;
  j["start_step"] = start_step_;
  j["final_step"] = step_;
  j["samples_seen"] = samples_seen_;
  j["resumed_from"] = resumed_from_;
  j["parameters"] = spec_.NumParameters();
  j["gradient_bytes"] = reducer_ ? reducer_->total_bytes() : 0;
  j["gradient_buckets"] = reducer_ ? reducer_->num_buckets() : 0;
  j["allreduce"] = opt_.allreduce;
  if (net_) j["kernels"] = FormatKernelOptions(PinnedKernels(net_->ChosenKernels()));
  AddTimingSummary(j);
  j["elapsed_s"] = Seconds(run_start_, Clock::now());
  j["git_revision"] = COSMOFLOW_GIT_REV;
  j["uncertainty"] = UncertaintyHeadName(spec_.uncertainty);
  if (!calibration_.empty()) j["calibration_sigma_scale"] = calibration_.sigma_scale;
  if (calibration_.has_exponent()) j["calibration_sigma_exponent"] = calibration_.sigma_exponent;
  if (calibration_.has_edge()) j["calibration_sigma_edge"] = calibration_.sigma_edge;
  if (have_val_) {
    j["val_loss"] = last_val_.loss;
    j["val_mae"] = last_val_.mae;
    nlohmann::json rel;
    for (size_t o = 0; o < spec_.outputs.size(); ++o)
      rel[spec_.outputs[o].name] = last_val_.rel_err[o];
    j["val_rel_err"] = rel;
  }
  const std::string path = (fs::path(opt_.out_dir) / "run.json").string();
  if (!WriteFileAtomically(path, j.dump(2, ' ', false, nlohmann::json::error_handler_t::replace) + "\n")) {
    CF_LOG(WARNING) << path << ": cannot write";
  }
}

// The first steps include oneDNN's JIT and page faults; leave them out of the medians.
std::vector<double> WithoutWarmup(const std::vector<double>& v) {
  const size_t skip = v.size() > 4 ? 2 : 0;
  return std::vector<double>(v.begin() + skip, v.end());
}

double Sum(const std::vector<double>& v) {
  double s = 0;
  for (double x : v) s += x;
  return s;
}

void Trainer::AddTimingSummary(nlohmann::json& j) const {
  const auto steps = WithoutWarmup(step_seconds_), waits = WithoutWarmup(data_wait_seconds_),
             comms = WithoutWarmup(comm_wait_seconds_), spans = WithoutWarmup(comm_span_seconds_);
  const double total = Sum(steps);
  j["timed_steps"] = steps.size();
  j["median_step_s"] = Median(steps);
  {
    // Step-time spread: synchronous training runs at the pace of the slowest rank, so jitter is an
    // input of the scaling model (docs/training.md).
    double mean = steps.empty() ? 0 : total / steps.size(), var = 0;
    for (double x : steps) var += (x - mean) * (x - mean);
    j["mean_step_s"] = mean;
    j["stdev_step_s"] = steps.size() > 1 ? std::sqrt(var / (steps.size() - 1)) : 0.0;
  }
  j["samples_per_s"] = steps.empty() ? 0.0 : (sampler_->global_batch() / Median(steps));
  j["data_wait_frac"] = total > 0 ? Sum(waits) / total : 0.0;
  j["comm_wait_frac"] = total > 0 ? Sum(comms) / total : 0.0;
  j["median_comm_wait_s"] = Median(comms);
  // comm wait = step-boundary agreement (where a rank waits for a slower one) + gradient wait.
  j["median_grad_wait_s"] = Median(WithoutWarmup(grad_wait_seconds_));
  j["median_comm_span_s"] = Median(spans);
}

// ---- the training loop ----

int Trainer::Run() {
  run_start_ = Clock::now();
  InstallStopSignalHandlers();
  Status setup = Setup();
  if (!setup.ok()) return Fail(setup);
  LogRunDescription();
  // Collective: every rank sends its host name; rank 0 logs the map (Slurm names a lost host).
  const std::string rank_hosts = DescribeRankHosts(world_.comm);
  if (root()) {
    CF_LOG(INFO) << "ranks by host: " << rank_hosts;
  }
  peer_probe_ = PeerProbe::Create(world_.comm);  // collective
  watchdog_ = std::make_unique<CollectiveWatchdog>(
      world_.comm, world_.rank, std::chrono::milliseconds(int64_t(opt_.watchdog_timeout_s * 1000)),
      [probe = peer_probe_.get()] { return probe->Describe(std::chrono::seconds(2)); });

  PrefetchLoader loader(train_source_.get(), TrainingPlan(), TrainingLoaderConfig());
  const size_t outputs = spec_.NetworkOutputs();
  pred_.assign(opt_.batch * outputs, 0.0f);
  diff_.assign(opt_.batch * outputs, 0.0f);
  while (step_ < total_steps_) {
    const auto t0 = Clock::now();
    StepTimes times;
    watchdog_->Enter("the input pipeline", step_);
    const PrefetchedBatch* batch = loader.Next(&times.data_wait);
    watchdog_->Enter("the step-boundary allreduce", step_);
    if (std::optional<int> code = StepBoundary(loader, batch, &times.comm)) return *code;
    watchdog_->Enter("the training step (forward, backward, gradient allreduce)", step_);
    TrainStep(loader, batch, &times.comm);
    RecordTiming(Seconds(t0, Clock::now()), times);
    watchdog_->StepTook(Seconds(t0, Clock::now()));
    watchdog_->Enter("the progress and weight checks", step_);
    std::optional<int> code = MaybeLogProgress();
    if (!code) code = MaybeCheckWeights();
    watchdog_->Enter("the batch_norm statistics pass", step_);
    if (!code) code = MaybeRecomputeStatistics();
    watchdog_->Enter("validation", step_);
    if (!code) code = MaybeValidate();
    watchdog_->Enter("checkpointing", step_);
    if (!code) code = MaybeCheckpoint();
    if (code) return *code;
  }
  watchdog_->Enter("the final validation and checkpoint", step_);
  return Finish();
}

void Trainer::LogRunDescription() const {
  if (!root()) return;
  CF_LOG(INFO) << "model " << spec_.name << " (" << spec_.NumParameters() << " parameters, "
               << PrecisionName(precision_) << "), " << world_.size << " ranks x batch "
               << opt_.batch << " = global batch " << sampler_->global_batch() << ", "
               << steps_per_epoch_ << " steps/epoch, " << total_steps_ << " steps, recipe "
               << LrRecipeName(opt_.lr.recipe) << " (" << optimizer_->name() << ", peak lr "
               << schedule_->peak_lr() << "), " << reducer_->num_buckets() << " gradient buckets, "
               << reducer_->total_bytes() / 1e6 << " MB in all, allreduce " << opt_.allreduce;
  if (spec_.uncertainty != UncertaintyHead::kNone) {
    CF_LOG(INFO) << "uncertainty head " << UncertaintyHeadName(spec_.uncertainty)
                 << ": Gaussian NLL after " << opt_.mse_warmup_epochs
                 << " epoch(s) of MSE on the means; means trained by " << opt_.mean_gradient
                 << ", covariance gradient to " << (opt_.covariance_gradient == "head" ? "the last layer only" : "every layer");
  }
}

// Batches of steps [step_, total_steps_): this rank's share of each global batch.
BatchPlan Trainer::TrainingPlan() const {
  const int64_t spe = steps_per_epoch_, first = step_;
  BatchPlan plan;
  plan.num_batches = std::max<int64_t>(0, total_steps_ - first);
  EpochSampler sampler = *sampler_;
  plan.indices = [sampler, spe, first](int64_t k) mutable {
    const int64_t step = first + k;
    return sampler.LocalBatch(step / spe, step % spe);
  };
  plan.epoch = [spe, first](int64_t k) { return (first + k) / spe; };
  return plan;
}

PrefetchConfig Trainer::TrainingLoaderConfig() const {
  PrefetchConfig lc;
  lc.batch = opt_.batch;
  lc.queue_depth = opt_.prefetch;
  lc.augment = opt_.augment;
  lc.augment_shift = opt_.augment_shift;
  lc.seed = seed_;
  lc.transform = spec_.input_transform;
  lc.labels = train_labels_;
  return lc;
}

// The step boundary: one tiny allreduce tells every rank whether any rank was signalled or failed
// to read its batch, so all of them take the same branch. Sets *comm to the time it took.
std::optional<int> Trainer::StepBoundary(PrefetchLoader& loader, const PrefetchedBatch* batch,
                                         double* comm) {
  Status local = batch ? batch->status
                       : InternalError("input pipeline ended before step " + std::to_string(step_));
  MaybeDieForTests();
  int flags[2] = {StopRequested() ? 1 : 0, local.ok() ? 0 : 1};
  int any[2] = {0, 0};
  const auto tc = Clock::now();
  MPI_Allreduce(flags, any, 2, MPI_INT, MPI_MAX, world_.comm);
  *comm = Seconds(tc, Clock::now());
  if (any[1]) return FailRun(AgreeOnStatus(local, world_.comm));
  if (any[0]) {
    loader.Release(batch);
    return StopForRequeue();
  }
  return std::nullopt;
}

void Trainer::MaybeDieForTests() const {
  if (step_ == opt_.debug_die_at_step && world_.rank == opt_.debug_die_rank) {
    std::fprintf(stderr, "cosmoflow-train: rank %d: --debug-die-at-step=%lld: dying now\n",
                 world_.rank, static_cast<long long>(step_));
    std::fflush(stderr);
    std::raise(SIGKILL);
  }
}

int Trainer::StopForRequeue() {
  CF_LOG(WARNING) << "stop requested"
                  << (StopRequested() ? " (signal " + std::to_string(StopSignal()) + " here)" : "")
                  << ": checkpointing at step " << step_ << " and exiting with " << kRequeueExitCode
                  << " for requeue";
  Status s = SaveCheckpoint();
  WriteSummary(s.ok() ? "stopped" : "error");
  if (!s.ok()) return Fail(s);
  return kRequeueExitCode;
}

// Forward, loss, backward with the gradient allreduce overlapped, optimizer step. Adds the
// gradient wait to *comm.
void Trainer::TrainStep(PrefetchLoader& loader, const PrefetchedBatch* batch, double* comm) {
  lr_ = schedule_->At(step_);
  GradientAllreducer* reducer = reducer_.get();
  TrainStepHooks hooks;
  hooks.before_backward = [reducer] { reducer->BeginStep(); };
  hooks.on_grad_ready = [reducer](int i) { reducer->OnGradReady(i); };
  hooks.after_backward = [&loader, batch, reducer] {
    // Only now may the reader reuse the buffer: the first layer's weight gradient reads the input.
    loader.Release(batch);
    reducer->FinishStep();
  };
  // MSE, or with an uncertainty head the Gaussian NLL after the MSE warm-up (uncertainty_run.h).
  const StepLossConfig config{opt_.mse_warmup_epochs * steps_per_epoch_,
                              *ParseMeanGradient(opt_.mean_gradient)};
  const BatchLoss loss = [this, &config](const float* pred, const float* labels, float* diff) {
    return StepLoss(spec_, config, step_, pred, labels, opt_.batch, diff);
  };
  window_loss_ += TrainOnBatch(*net_, *optimizer_, loss, batch->src.data(), batch->labels.data(),
                               static_cast<float>(lr_), pred_, diff_, hooks);
  *comm += reducer_->last_wait_seconds();
  ++step_;
  samples_seen_ += sampler_->global_batch();
  if (opt_.debug_step_sleep > 0) {
    std::this_thread::sleep_for(std::chrono::duration<double>(opt_.debug_step_sleep));
  }
  if (opt_.debug_step_jitter > 0) {
    const double s = opt_.debug_step_jitter;
    std::normal_distribution<double> sleep_s(3 * s, s);
    std::this_thread::sleep_for(std::chrono::duration<double>(std::max(0.0, sleep_s(jitter_rng_))));
  }
}

void Trainer::RecordTiming(double step_seconds, const StepTimes& times) {
  step_seconds_.push_back(step_seconds);
  data_wait_seconds_.push_back(times.data_wait);
  comm_wait_seconds_.push_back(times.comm);
  grad_wait_seconds_.push_back(reducer_->last_wait_seconds());
  comm_span_seconds_.push_back(reducer_->last_comm_span_seconds());
  window_time_ += step_seconds;
  window_wait_ += times.data_wait;
  window_comm_ += times.comm;
  ++window_steps_;
}

// Every --log-every steps, at epoch ends and at the last step: the loss over the ranks since the
// last report; stops every rank if it is not finite.
std::optional<int> Trainer::MaybeLogProgress() {
  if (!(step_ % opt_.log_every == 0 || EpochEnd() || step_ == total_steps_)) return std::nullopt;
  std::vector<double> l = {window_loss_, static_cast<double>(window_steps_)};
  AllreduceSum(l, world_.comm);
  LogProgress(l[0] / std::max(1.0, l[1]));
  if (!std::isfinite(l[0])) {  // the same value on every rank, so all of them stop here
    return FailRun(OutOfRangeError("training diverged: loss is " + std::to_string(l[0]) +
                                   " at step " + std::to_string(step_) +
                                   " (lower --lr or check the data)"));
  }
  window_loss_ = window_time_ = window_wait_ = window_comm_ = 0;
  window_steps_ = 0;
  return std::nullopt;
}

std::optional<int> Trainer::MaybeCheckWeights() {
  const int64_t every =
      opt_.check_weights_every > 0 ? opt_.check_weights_every : (opt_.deterministic ? 100 : 0);
  if (every <= 0 || step_ % every != 0) return std::nullopt;
  if (!SameOnAllRanks(WeightsChecksum(net_->parameters()), world_.comm)) {
    return FailRun(
        InternalError("weights differ between ranks after step " + std::to_string(step_)));
  }
  return std::nullopt;
}

std::optional<int> Trainer::MaybeRecomputeStatistics() {
  if (opt_.bn_statistics_batches == 0 || !(EpochEnd() || step_ == total_steps_)) return std::nullopt;
  const bool has_batch_norm = std::any_of(spec_.layers.begin(), spec_.layers.end(),
                                          [](const LayerSpec& l) { return l.type == LayerType::kBatchNorm; });
  if (!has_batch_norm) return std::nullopt;
  Status s = RecomputeStatistics();
  if (!s.ok()) return FailRun(s);
  return std::nullopt;
}

// The running statistics of every batch_norm layer set to the population statistics of the first
// --bn-statistics-batches batches of the epoch just trained (as the training read them, augmented),
// so that validation, calibration and the checkpoint use the weights' own statistics.
Status Trainer::RecomputeStatistics() {
  const auto t0 = Clock::now();
  const int64_t spe = steps_per_epoch_, epoch = (step_ - 1) / spe;
  BatchPlan plan;
  plan.num_batches = std::min<int64_t>(opt_.bn_statistics_batches, spe);
  EpochSampler sampler = *sampler_;
  plan.indices = [sampler, epoch](int64_t k) mutable { return sampler.LocalBatch(epoch, k); };
  plan.epoch = [epoch](int64_t) { return epoch; };
  PrefetchLoader loader(train_source_.get(), plan, TrainingLoaderConfig());
  net_->BeginStatisticsPass();
  Status status;
  for (int64_t k = 0; k < plan.num_batches && status.ok(); ++k) {
    const PrefetchedBatch* batch = loader.Next(nullptr);
    const Status local = batch ? batch->status : InternalError("the loader ended before the pass did");
    status = AgreeOnStatus(local, world_.comm);  // every rank forwards, or none (batch_norm allreduces)
    if (status.ok()) net_->Forward(batch->src.data(), pred_.data());
    loader.Release(batch);
  }
  net_->EndStatisticsPass();
  if (status.ok() && root()) {
    CF_LOG(INFO) << "batch_norm statistics from " << plan.num_batches << " batches of epoch " << epoch + 1
                 << " (" << Seconds(t0, Clock::now()) << " s)";
  }
  return status.WithContext("recomputing the batch_norm statistics");
}

std::optional<int> Trainer::MaybeValidate() {
  if (!val_set_ || !(EpochEnd() || step_ == total_steps_)) return std::nullopt;
  auto val = Validate();
  if (!val.ok()) return FailRun(val.status());
  last_val_ = *val;
  have_val_ = true;
  LogValidation(*val);
  return std::nullopt;
}

std::optional<int> Trainer::MaybeCheckpoint() {
  const bool periodic = opt_.checkpoint_every > 0 && step_ % opt_.checkpoint_every == 0;
  if (!(periodic || EpochEnd() || step_ == total_steps_)) return std::nullopt;
  Status s = SaveCheckpoint();
  if (!s.ok()) return FailRun(s);
  return std::nullopt;
}

int Trainer::Finish() {
  // A run resumed at its final step validates (an ensemble needs its posteriors) and writes its
  // checkpoint here (no-op otherwise).
  if (val_set_ && !have_val_) {
    auto val = Validate();
    if (!val.ok()) return Fail(val.status());
  }
  Status s = SaveCheckpoint();
  if (!s.ok()) return Fail(s);
  WriteSummary("finished");
  if (root()) {
    CF_LOG(INFO) << "training finished at step " << step_ << " in "
                 << FormatDuration(Seconds(run_start_, Clock::now()));
  }
  return kExitOk;
}

// What an ensemble keeps of a finished member run (its trainer, networks and all, is gone).
struct MemberResult {
  ModelSpec spec;
  std::string checkpoint;  // relative to the ensemble's run directory
  ValidationPosteriors posteriors;
  std::vector<double> prior_low, prior_high;
};

// Rank 0, once every member has finished: the members' validation posteriors combined as a
// mixture (OUT/val_predictions.csv), the calibration fitted on them and the manifest.
// The members the ensemble keeps (all without a validation set), with the reason logged.
std::vector<MemberResult> KeptMembers(const TrainerOptions& o, const std::vector<MemberResult>& all) {
  if (o.val_path.empty()) return all;
  std::vector<ValidationPosteriors> posteriors;
  for (const MemberResult& m : all) posteriors.push_back(m.posteriors);
  std::vector<double> errors;
  const std::vector<int> kept = SelectMembers(all[0].spec, posteriors, o.ensemble_prune_ratio, &errors);
  std::vector<MemberResult> out;
  for (int k : kept) out.push_back(all[size_t(k)]);
  std::ostringstream os;
  os << "ensemble members' validation MSE (normalised, summed over outputs):";
  for (size_t k = 0; k < all.size(); ++k)
    os << " m" << k << " " << errors[k]
       << (std::find(kept.begin(), kept.end(), int(k)) == kept.end() ? " (left out)" : "");
  CF_LOG(INFO) << os.str() << "; keeping " << kept.size() << " of " << all.size()
               << " (--ensemble-prune-ratio " << o.ensemble_prune_ratio << " x the median)";
  return out;
}

Status FinishEnsemble(const TrainerOptions& o, const std::vector<MemberResult>& all) {
  const std::vector<MemberResult> members = KeptMembers(o, all);
  const ModelSpec& spec = members[0].spec;
  Calibration calibration;
  if (!o.val_path.empty()) {
    std::vector<ValidationPosteriors> posteriors;
    for (const MemberResult& m : members) posteriors.push_back(m.posteriors);
    CF_ASSIGN_OR_RETURN(ValidationPosteriors mixture, CombineMembers(spec, posteriors));
    JointFit joint;
    auto fitted = FitCalibration(spec, mixture.truth, mixture.mean, mixture.cov, members[0].prior_low,
                                 members[0].prior_high, *ParseCalibrationForm(o.calibration), &joint);
    if (fitted.ok()) {
      calibration = *fitted;
      CF_LOG(INFO) << "ensemble calibration on " << calibration.samples << " validation cubes: "
                   << DescribeCalibration(calibration, spec, &joint);
    } else {
      CF_LOG(WARNING) << "the ensemble gets no calibration: " << fitted.status().message();
    }
    const std::string path = (fs::path(o.out_dir) / "val_predictions.csv").string();
    if (!WriteFileAtomically(path, ValidationCsv(spec, mixture, calibration))) {
      CF_LOG(WARNING) << path << ": cannot write";
    }
  }
  std::vector<std::string> checkpoints;
  for (const MemberResult& m : members) checkpoints.push_back(m.checkpoint);
  return WriteEnsembleForRun(o.out_dir, checkpoints, calibration, spec);
}

// A deep ensemble: members k = 0..K-1 trained one after the other, each an ordinary run in
// OUT/members/m<k> with seed --seed + k (initialisation, shuffling, augmentation, dropout), then
// OUT/ensemble.json. Rerunning the command resumes: finished members only validate again.
int RunEnsemble(const TrainerOptions& options, const MpiWorld& world, const std::string& command_line) {
  const auto start = Clock::now();
  std::vector<MemberResult> members;
  for (int k = 0; k < options.members; ++k) {
    TrainerOptions m = options;
    const std::string rel = "members/m" + std::to_string(k);
    m.out_dir = (fs::path(options.out_dir) / rel).string();
    m.seed = options.seed + static_cast<uint64_t>(k);
    if (world.rank == 0) {
      CF_LOG(INFO) << "ensemble member " << k + 1 << " of " << options.members << ": " << m.out_dir << ", seed "
                   << m.seed;
    }
    Trainer trainer(m, world, command_line);
    const int code = trainer.Run();
    if (code != kExitOk) return code;
    members.push_back({trainer.spec(),
                       rel + "/checkpoints/" + fs::path(trainer.final_checkpoint()).filename().string(),
                       trainer.posteriors(), trainer.prior_low(), trainer.prior_high()});
  }
  Status local;
  if (world.rank == 0) local = FinishEnsemble(options, members).WithContext("--out=" + options.out_dir);
  Status s = AgreeOnStatus(local, world.comm);
  if (!s.ok()) {
    if (world.rank == 0) std::fprintf(stderr, "cosmoflow-train: error: %s\n", s.ToString().c_str());
    return kExitError;
  }
  if (world.rank == 0) {
    CF_LOG(INFO) << "ensemble of " << options.members << " trained in " << FormatDuration(Seconds(start, Clock::now()))
                 << ": " << options.out_dir << "/" << kEnsembleManifestName;
  }
  return kExitOk;
}

}  // namespace

int RunTraining(const TrainerOptions& options, const MpiWorld& world,
                const std::string& command_line) {
  if (options.members > 1) return RunEnsemble(options, world, command_line);
  Trainer trainer(options, world, command_line);
  return trainer.Run();
}

}  // namespace cosmoflow
