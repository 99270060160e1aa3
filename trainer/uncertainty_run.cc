#include "trainer/uncertainty_run.h"

#include <algorithm>
#include <cmath>
#include <numeric>
#include <sstream>

#include "core/nn/checkpoint.h"

namespace cosmoflow {

double StepLoss(const ModelSpec& spec, const StepLossConfig& config, int64_t step,
                const float* pred, const float* labels, int batch, float* diff) {
  const int p = static_cast<int>(spec.outputs.size());
  if (spec.uncertainty == UncertaintyHead::kNone)
    return ComputeLoss(LossType::kMse, pred, labels, int64_t{batch} * p, diff);
  if (step < config.warmup_steps)
    return MeanSquaredErrorOfMeans(spec.uncertainty, p, pred, labels, batch, diff);
  return GaussianNll(spec.uncertainty, p, pred, labels, batch, diff, config.mean_gradient);
}

double ValidationLossSum(const ModelSpec& spec, const float* pred, const float* labels) {
  const int p = static_cast<int>(spec.outputs.size());
  if (spec.uncertainty != UncertaintyHead::kNone)
    return p * GaussianNll(spec.uncertainty, p, pred, labels, 1, nullptr);
  double sum = 0;
  for (int o = 0; o < p; ++o) sum += (double(pred[o]) - labels[o]) * (double(pred[o]) - labels[o]);
  return sum;
}

int ValidationRowWidth(const ModelSpec& spec) {
  return 1 + 3 * static_cast<int>(spec.outputs.size()) + spec.NetworkOutputs();
}

ValidationPosteriors DecodeValidationRows(const ModelSpec& spec, const std::vector<float>& rows) {
  const int p = static_cast<int>(spec.outputs.size()), width = ValidationRowWidth(spec);
  const size_t n = rows.size() / width;
  std::vector<size_t> order(n);
  std::iota(order.begin(), order.end(), size_t{0});
  std::sort(order.begin(), order.end(),
            [&](size_t a, size_t b) { return rows[a * width] < rows[b * width]; });
  ValidationPosteriors v;
  v.truth.resize(n * p);
  v.mean.resize(n * p);
  v.cov.resize(n * p * p);
  for (size_t k = 0; k < n; ++k) {
    const float* row = &rows[order[k] * width];
    v.index.push_back(static_cast<int64_t>(row[0]));
    v.physical_truth.insert(v.physical_truth.end(), row + 1, row + 1 + p);
    v.physical_mean.insert(v.physical_mean.end(), row + 1 + p, row + 1 + 2 * p);
    for (int o = 0; o < p; ++o) v.truth[k * p + o] = row[1 + 2 * p + o];
    DecodeHead(spec.uncertainty, p, row + 1 + 3 * p, &v.mean[k * p], &v.cov[k * p * p]);
  }
  return v;
}

std::string DescribeCalibration(const Calibration& c, const ModelSpec& spec,
                                const JointFit* joint) {
  std::ostringstream os;
  os << "sigma x";
  for (size_t o = 0; o < spec.outputs.size() && o < c.sigma_scale.size(); ++o) {
    os << (o ? ", " : " ") << spec.outputs[o].name << " " << c.sigma_scale[o];
    if (c.has_exponent()) os << " (exponent " << c.sigma_exponent[o] << ")";
    if (c.has_edge() && c.sigma_edge[o] != 0) os << " (edge " << c.sigma_edge[o] << ")";
  }
  if (joint && !joint->outputs.empty()) {
    os << "; joint (";
    for (size_t k = 0; k < joint->outputs.size(); ++k)
      os << (k ? ", " : "") << spec.outputs[size_t(joint->outputs[k])].name;
    os << "): covariance x " << joint->factor << " (in the factors above)";
  }
  return os.str();
}

std::string ValidationCsv(const ModelSpec& spec, const ValidationPosteriors& v,
                          const Calibration& calibration) {
  const size_t p = spec.outputs.size();
  const bool sigma = spec.uncertainty != UncertaintyHead::kNone;
  std::ostringstream csv;
  csv << "index";
  for (const auto& o : spec.outputs) csv << ",true_" << o.name;
  for (const auto& o : spec.outputs) csv << ",pred_" << o.name;
  if (sigma)
    for (const auto& o : spec.outputs) csv << ",sigma_" << o.name;
  csv << "\n";
  for (int64_t i = 0; i < v.size(); ++i) {
    csv << v.index[i];
    for (size_t o = 0; o < p; ++o) csv << "," << v.physical_truth[i * p + o];
    for (size_t o = 0; o < p; ++o) csv << "," << v.physical_mean[i * p + o];
    for (size_t o = 0; sigma && o < p; ++o) {
      const double sigma = std::sqrt(v.cov[(i * p + o) * p + o]);
      const double u = calibration.EdgeCoordinate(int(o), v.physical_mean[i * p + o]);
      csv << "," << calibration.Factor(int(o), sigma, u) * std::abs(spec.outputs[o].scale) * sigma;
    }
    csv << "\n";
  }
  return csv.str();
}

Status LabelRange(const Dataset& dataset, const std::vector<int>& column, std::vector<double>* low,
                  std::vector<double>* high) {
  const size_t p = column.size();
  low->assign(p, INFINITY);
  high->assign(p, -INFINITY);
  const size_t width = dataset.info().param_names.size();
  for (int s = 0; s < dataset.num_shards(); ++s) {
    CF_ASSIGN_OR_RETURN(std::vector<float> params, dataset.shard(s).ReadAllParams());
    for (size_t i = 0; i + width <= params.size(); i += width)
      for (size_t k = 0; k < p; ++k) {
        (*low)[k] = std::min((*low)[k], double(params[i + column[k]]));
        (*high)[k] = std::max((*high)[k], double(params[i + column[k]]));
      }
  }
  for (size_t k = 0; k < p; ++k)
    if (!((*low)[k] < (*high)[k]))
      return InvalidArgumentError(
          "training labels of output " + std::to_string(k) +
          " do not span a range (all equal?): no prior for the calibration");
  return Status::Ok();
}

std::vector<int> SelectMembers(const ModelSpec& spec,
                               const std::vector<ValidationPosteriors>& members, double max_ratio,
                               std::vector<double>* errors) {
  errors->clear();
  for (const ValidationPosteriors& m : members) {
    double sum = 0;
    for (size_t i = 0; i < m.mean.size(); ++i) sum += (m.mean[i] - m.truth[i]) * (m.mean[i] - m.truth[i]);
    errors->push_back(m.size() > 0 ? sum / double(m.size()) : 0.0);
  }
  std::vector<double> sorted = *errors;
  std::sort(sorted.begin(), sorted.end());
  const double median = sorted.empty() ? 0.0
                                       : (sorted.size() % 2 ? sorted[sorted.size() / 2]
                                                            : 0.5 * (sorted[sorted.size() / 2 - 1] +
                                                                     sorted[sorted.size() / 2]));
  std::vector<int> kept;
  for (size_t k = 0; k < members.size(); ++k)
    if (max_ratio <= 0 || (*errors)[k] <= max_ratio * median) kept.push_back(int(k));
  if (kept.empty() && !members.empty())  // cannot happen for max_ratio >= 1; keep the best anyway
    kept.push_back(int(std::min_element(errors->begin(), errors->end()) - errors->begin()));
  return kept;
}

StatusOr<ValidationPosteriors> CombineMembers(const ModelSpec& spec,
                                              const std::vector<ValidationPosteriors>& members) {
  if (members.empty()) return InvalidArgumentError("ensemble: no members to combine");
  const int p = static_cast<int>(spec.outputs.size()), k = static_cast<int>(members.size());
  ValidationPosteriors out = members[0];
  const int64_t n = out.size();
  std::vector<double> means(size_t(k) * p), covs(size_t(k) * p * p);
  for (int m = 1; m < k; ++m)
    if (members[m].index != out.index)
      return FailedPreconditionError("ensemble: member " + std::to_string(m) +
                                     " was validated on other samples than member 0");
  for (int64_t i = 0; i < n; ++i) {
    for (int m = 0; m < k; ++m) {
      std::copy_n(&members[m].mean[i * p], p, &means[size_t(m) * p]);
      std::copy_n(&members[m].cov[i * p * p], p * p, &covs[size_t(m) * p * p]);
    }
    CombineMixture(p, k, means.data(), covs.data(), &out.mean[i * p], &out.cov[i * p * p]);
    for (int o = 0; o < p; ++o)
      out.physical_mean[i * p + o] =
          spec.outputs[o].offset + spec.outputs[o].scale * float(out.mean[i * p + o]);
  }
  return out;
}

Status WriteEnsembleForRun(const std::string& out_dir,
                           const std::vector<std::string>& member_checkpoints,
                           const Calibration& calibration, const ModelSpec& spec) {
  EnsembleManifest manifest;
  for (size_t m = 0; m < member_checkpoints.size(); ++m) {
    auto ckpt = ReadCheckpoint(out_dir + "/" + member_checkpoints[m]);
    if (!ckpt.ok()) return ckpt.status().WithContext("ensemble member " + std::to_string(m));
    manifest.members.push_back({member_checkpoints[m], ckpt->checksum});
  }
  if (!calibration.empty()) manifest.calibration_json = CalibrationToJson(calibration, spec);
  return WriteEnsembleManifest(out_dir + "/" + kEnsembleManifestName, manifest);
}

}  // namespace cosmoflow
