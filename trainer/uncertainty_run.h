// Uncertainty in training (a spec with an uncertainty head, or a deep ensemble; docs/training.md):
// the loss of one step, the validation posteriors and the calibration fitted on them, and the
// ensemble manifest written once every member has finished. No MPI here: the trainer gathers the
// validation rows on rank 0 and calls these there.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "core/base/status.h"
#include "core/io/dataset.h"
#include "core/nn/ensemble.h"
#include "core/nn/loss.h"
#include "core/nn/spec.h"
#include "core/nn/uncertainty.h"

namespace cosmoflow {

// How a step's loss is chosen: MSE for a spec without a head; with one, MSE on the means for the
// first warmup_steps steps, then the Gaussian NLL (MeanGradient: what trains the means).
struct StepLossConfig {
  int64_t warmup_steps = 0;
  MeanGradient mean_gradient = MeanGradient::kNll;
};
// pred/diff: batch x spec.NetworkOutputs(); labels: batch x P normalised.
double StepLoss(const ModelSpec& spec, const StepLossConfig& config, int64_t step,
                const float* pred, const float* labels, int batch, float* diff);
// The validation loss of one sample, summed over its P outputs: squared error for a spec without a
// head, P times the per-parameter Gaussian NLL with one (so that sum / (count * P) is the mean).
double ValidationLossSum(const ModelSpec& spec, const float* pred, const float* labels);

// One validation sample as gathered on rank 0: index, P physical truths, P physical means,
// P normalised truths, then the network's raw output (NetworkOutputs() floats).
int ValidationRowWidth(const ModelSpec& spec);

// The validation set's posteriors, in normalised units, sorted by sample index.
struct ValidationPosteriors {
  std::vector<int64_t> index;
  std::vector<float> physical_truth, physical_mean;  // n x P
  std::vector<double> truth, mean, cov;              // n x P, n x P, n x P x P
  int64_t size() const { return static_cast<int64_t>(index.size()); }
};
ValidationPosteriors DecodeValidationRows(const ModelSpec& spec, const std::vector<float>& rows);

// One line for the log: "sigma x Omega_M 1.04 (exponent 0.81), sigma_8 0.97 (exponent 0.9), ...".
// With the joint step of a power calibration (`joint`, if any and not empty), it ends with
// "; joint (Omega_M, sigma_8): covariance x 0.96 (in the factors above)".
std::string DescribeCalibration(const Calibration& c, const ModelSpec& spec,
                                const JointFit* joint = nullptr);

// val_predictions.csv: index, true_<p>..., pred_<p>..., and with an uncertainty
// sigma_<p>... (calibrated with `calibration`, physical units).
std::string ValidationCsv(const ModelSpec& spec, const ValidationPosteriors& v,
                          const Calibration& calibration);

// The physical range of each output's labels over a dataset (the prior the calibration truncates
// posteriors to); `column[k]` is the dataset column of output k (LabelMap).
Status LabelRange(const Dataset& dataset, const std::vector<int>& column, std::vector<double>* low,
                  std::vector<double>* high);

// The mixture of the members' validation posteriors (all on the same samples, same order).
StatusOr<ValidationPosteriors> CombineMembers(const ModelSpec& spec,
                                              const std::vector<ValidationPosteriors>& members);

// Which members an ensemble keeps: a member whose validation error (mean squared error of its
// means, normalised units, summed over the outputs) is above `max_ratio` times the median
// member's is left out (a run that failed to train drags the equal-weight mixture's mean and
// inflates its spread); at least one member is always kept; max_ratio <= 0 keeps all. Returns
// the kept indices, in order, and each member's error in *errors.
std::vector<int> SelectMembers(const ModelSpec& spec,
                               const std::vector<ValidationPosteriors>& members, double max_ratio,
                               std::vector<double>* errors);

// Writes "ensemble.json" in `out_dir`, listing `member_checkpoints` (paths relative to out_dir)
// with their checksums (each checkpoint is read and verified) and `calibration` (the factors
// fitted on the members' combined validation posteriors; may be empty).
Status WriteEnsembleForRun(const std::string& out_dir,
                           const std::vector<std::string>& member_checkpoints,
                           const Calibration& calibration, const ModelSpec& spec);

}  // namespace cosmoflow
