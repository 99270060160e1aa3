#include "core/nn/uncertainty.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <limits>
#include <nlohmann/json.hpp>

namespace cosmoflow {
namespace {

double Clamp(double v, double limit) { return std::min(limit, std::max(-limit, v)); }

// Mean negative log-likelihood (without the constant) of the truths under the truncated
// posteriors of (mean, c sigma) on [low, high] (TruncatedLocation).
double TruncatedNll(const double* truth, const double* mean, const double* sigma, int64_t n,
                    double low, double high, double log_c) {
  const double c = std::exp(log_c);
  const bool bounded = std::isfinite(low) || std::isfinite(high);
  double sum = 0;
  for (int64_t i = 0; i < n; ++i) {
    const double s = c * sigma[i];
    const double loc = TruncatedLocation(mean[i], s, low, high);
    const double z = (truth[i] - loc) / s;
    sum += std::log(s) + 0.5 * z * z;
    if (bounded)
      sum += std::log(std::max(1e-300, NormalMassBetween((low - loc) / s, (high - loc) / s)));
  }
  return sum / static_cast<double>(n);
}

// The minimum of a unimodal f on [a, b] by golden section, to a bracket of 1e-7: its midpoint.
template <typename F>
double GoldenMinimum(const F& f, double a, double b) {
  const double phi = 0.5 * (std::sqrt(5.0) - 1.0);
  double x1 = b - phi * (b - a), x2 = a + phi * (b - a), f1 = f(x1), f2 = f(x2);
  while (b - a > 1e-7) {
    if (f1 < f2) {
      b = x2, x2 = x1, f2 = f1, x1 = b - phi * (b - a), f1 = f(x1);
    } else {
      a = x1, x1 = x2, f1 = f2, x2 = a + phi * (b - a), f2 = f(x2);
    }
  }
  return 0.5 * (a + b);
}

}  // namespace

void PrecisionCholesky(UncertaintyHead head, int p, const float* raw, double* l) {
  std::fill(l, l + p * p, 0.0);
  if (head == UncertaintyHead::kGaussian) {
    for (int i = 0; i < p; ++i)
      l[i * p + i] = std::exp(-0.5 * Clamp(raw[p + i], kLogVarianceLimit));
    return;
  }
  for (int i = 0; i < p; ++i) l[i * p + i] = std::exp(Clamp(raw[p + i], 0.5 * kLogVarianceLimit));
  int k = 2 * p;
  for (int i = 1; i < p; ++i)
    for (int j = 0; j < i; ++j) l[i * p + j] = raw[k++];
}

void CovarianceFromPrecisionCholesky(int p, const double* l, double* cov) {
  // M = L^-1 (lower triangular), column by column: L m_j = e_j.
  std::vector<double> m(static_cast<size_t>(p) * p, 0.0);
  for (int j = 0; j < p; ++j) {
    for (int i = j; i < p; ++i) {
      double v = i == j ? 1.0 : 0.0;
      for (int k = j; k < i; ++k) v -= l[i * p + k] * m[k * p + j];
      m[i * p + j] = v / l[i * p + i];
    }
  }
  // Covariance = M^T M.
  for (int i = 0; i < p; ++i) {
    for (int j = 0; j < p; ++j) {
      double v = 0;
      for (int k = std::max(i, j); k < p; ++k) v += m[k * p + i] * m[k * p + j];
      cov[i * p + j] = v;
    }
  }
}

void DecodeHead(UncertaintyHead head, int p, const float* raw, double* mean, double* cov) {
  for (int i = 0; i < p; ++i) mean[i] = raw[i];
  std::fill(cov, cov + p * p, 0.0);
  if (head == UncertaintyHead::kNone) return;
  if (head == UncertaintyHead::kGaussian) {
    // The diagonal case needs no factorisation: the variances are the head's own entries.
    for (int i = 0; i < p; ++i) cov[i * p + i] = std::exp(Clamp(raw[p + i], kLogVarianceLimit));
    return;
  }
  std::vector<double> l(static_cast<size_t>(p) * p);
  PrecisionCholesky(head, p, raw, l.data());
  CovarianceFromPrecisionCholesky(p, l.data(), cov);
}

void CombineMixture(int p, int k, const double* means, const double* covs, double* mean,
                    double* cov) {
  std::fill(mean, mean + p, 0.0);
  std::fill(cov, cov + p * p, 0.0);
  for (int m = 0; m < k; ++m)
    for (int i = 0; i < p; ++i) mean[i] += means[m * p + i] / k;
  for (int m = 0; m < k; ++m) {
    const double* mu = means + m * p;
    for (int i = 0; i < p; ++i)
      for (int j = 0; j < p; ++j)
        cov[i * p + j] += (covs[(m * p + i) * p + j] + (mu[i] - mean[i]) * (mu[j] - mean[j])) / k;
  }
}

double EdgeCoordinate(double x, double low, double high) {
  const double u = (2.0 * x - (low + high)) / (high - low);
  return std::isfinite(u) ? std::min(kEdgeReach, std::max(-kEdgeReach, u)) : 0.0;
}

double Calibration::EdgeCoordinate(int o, double physical_mean) const {
  if (!has_edge() || prior_low.empty()) return 0.0;
  return cosmoflow::EdgeCoordinate(physical_mean, prior_low[o], prior_high[o]);
}

double Calibration::Factor(int o, double sigma, double u) const {
  if (empty()) return 1.0;
  const double edge = has_edge() ? std::exp(sigma_edge[o] * u * u) : 1.0;
  if (!has_exponent() || sigma_exponent[o] == 1.0) return sigma_scale[o] * edge;
  // A zero sigma stays zero (a head-less output inside an ensemble's mixture).
  if (!(sigma > 0)) return sigma_scale[o] * edge;
  return sigma_scale[o] * std::pow(sigma / sigma_reference[o], sigma_exponent[o] - 1.0) * edge;
}

const char* CalibrationFormName(CalibrationForm f) {
  switch (f) {
    case CalibrationForm::kScale: return "scale";
    case CalibrationForm::kPower: return "power";
    case CalibrationForm::kPowerJoint: return "power-joint";
    case CalibrationForm::kPowerEdge: return "power-edge";
  }
  return "?";
}

StatusOr<CalibrationForm> ParseCalibrationForm(const std::string& name) {
  for (CalibrationForm f : {CalibrationForm::kScale, CalibrationForm::kPower, CalibrationForm::kPowerJoint,
                            CalibrationForm::kPowerEdge})
    if (name == CalibrationFormName(f)) return f;
  return InvalidArgumentError("calibration form '" + name +
                              "': expected scale, power, power-joint or power-edge");
}

void ApplyCalibration(const Calibration& c, const ModelSpec& spec, const double* mean, double* cov) {
  if (c.empty()) return;
  const int p = static_cast<int>(spec.outputs.size());
  std::vector<double> f(p);
  for (int i = 0; i < p; ++i) {
    const double u = c.EdgeCoordinate(i, spec.outputs[i].offset + spec.outputs[i].scale * mean[i]);
    f[i] = c.Factor(i, std::sqrt(std::max(0.0, cov[i * p + i])), u);
  }
  for (int i = 0; i < p; ++i)
    for (int j = 0; j < p; ++j) cov[i * p + j] *= f[i] * f[j];
}

void DenormalisePosterior(const ModelSpec& spec, double* mean, double* cov) {
  const int p = static_cast<int>(spec.outputs.size());
  for (int i = 0; i < p; ++i) {
    const OutputSpec& o = spec.outputs[i];
    mean[i] = o.offset + o.scale * mean[i];
    for (int j = 0; j < p; ++j) cov[i * p + j] *= double(o.scale) * spec.outputs[j].scale;
  }
}

namespace {

Status ValidateExponents(const Calibration& c, const ModelSpec& spec) {
  const size_t p = spec.outputs.size();
  if (!c.has_exponent() && c.sigma_reference.empty()) return Status::Ok();
  if (c.sigma_exponent.size() != p || c.sigma_reference.size() != p) {
    return InvalidArgumentError("calibration: sigma_exponent and sigma_reference need a value for "
                                "each of the " + std::to_string(p) + " outputs");
  }
  for (size_t i = 0; i < p; ++i) {
    const double b = c.sigma_exponent[i], r = c.sigma_reference[i];
    if (!std::isfinite(b) || b < 0 || b > 4) {
      return InvalidArgumentError("calibration: sigma_exponent." + spec.outputs[i].name + " = " +
                                  std::to_string(b) + " is not in [0, 4]");
    }
    if (!(r > 0) || !std::isfinite(r)) {
      return InvalidArgumentError("calibration: sigma_reference." + spec.outputs[i].name + " = " +
                                  std::to_string(r) + " is not positive and finite");
    }
  }
  return Status::Ok();
}

std::string Short(double v) {
  char b[32];
  std::snprintf(b, sizeof(b), "%g", v);
  return b;
}

Status ValidateEdges(const Calibration& c, const ModelSpec& spec) {
  const size_t p = spec.outputs.size();
  if (!c.has_edge()) return Status::Ok();
  if (c.sigma_edge.size() != p)
    return InvalidArgumentError("calibration: sigma_edge needs a value for each of the " + std::to_string(p) +
                                " outputs");
  if (c.prior_low.empty()) return InvalidArgumentError("calibration: sigma_edge needs a prior range");
  for (size_t i = 0; i < p; ++i) {
    const double e = c.sigma_edge[i];
    if (!std::isfinite(e) || std::abs(e) > kEdgeLimit) {
      return InvalidArgumentError("calibration: sigma_edge." + spec.outputs[i].name + " = " + std::to_string(e) +
                                  " is not within +-" + Short(kEdgeLimit));
    }
  }
  return Status::Ok();
}

}  // namespace

Status ValidateCalibration(const Calibration& c, const ModelSpec& spec) {
  const size_t p = spec.outputs.size();
  if (c.empty()) return Status::Ok();
  if (c.sigma_scale.size() != p) {
    return InvalidArgumentError("calibration: sigma_scale has " +
                                std::to_string(c.sigma_scale.size()) +
                                " factors but the model has " + std::to_string(p) + " outputs");
  }
  for (size_t i = 0; i < p; ++i) {
    const double s = c.sigma_scale[i];
    if (!(s > 0) || !std::isfinite(s)) {
      return InvalidArgumentError("calibration: sigma_scale." + spec.outputs[i].name + " = " +
                                  std::to_string(s) + " is not positive and finite");
    }
  }
  CF_RETURN_IF_ERROR(ValidateExponents(c, spec));
  if (c.prior_low.empty() && c.prior_high.empty()) return ValidateEdges(c, spec);
  if (c.prior_low.size() != p || c.prior_high.size() != p) {
    return InvalidArgumentError("calibration: prior needs a range for each of the " +
                                std::to_string(p) + " outputs");
  }
  for (size_t i = 0; i < p; ++i) {
    if (!std::isfinite(c.prior_low[i]) || !std::isfinite(c.prior_high[i]) ||
        !(c.prior_low[i] < c.prior_high[i])) {
      return InvalidArgumentError(
          "calibration: prior." + spec.outputs[i].name + " = [" + std::to_string(c.prior_low[i]) +
          ", " + std::to_string(c.prior_high[i]) + "] is not a finite range with low < high");
    }
  }
  return ValidateEdges(c, spec);
}

namespace {

nlohmann::ordered_json PerOutput(const std::vector<double>& v, const ModelSpec& spec) {
  nlohmann::ordered_json j = nlohmann::ordered_json::object();
  for (size_t i = 0; i < spec.outputs.size() && i < v.size(); ++i) j[spec.outputs[i].name] = v[i];
  return j;
}

// The number per output of the object `key` of `j` into `out`; every output must have one and no
// other name may appear.
Status ReadPerOutput(const nlohmann::json& j, const std::string& key, const ModelSpec& spec,
                     std::vector<double>* out) {
  auto obj = j.find(key);
  if (obj == j.end() || !obj->is_object())
    return InvalidArgumentError("calibration: field '" + key +
                                "' must be an object keyed by output name");
  for (const OutputSpec& o : spec.outputs) {
    auto v = obj->find(o.name);
    if (v == obj->end() || !v->is_number())
      return InvalidArgumentError("calibration: " + key + "." + o.name + " is missing or not a number");
    out->push_back(v->get<double>());
  }
  for (const auto& item : obj->items()) {
    const std::string& name = item.key();  // not a structured binding: lambdas capture it
    bool known = std::any_of(spec.outputs.begin(), spec.outputs.end(),
                             [&](const OutputSpec& o) { return o.name == name; });
    if (!known)
      return InvalidArgumentError("calibration: " + key + "." + name + " names no output of the model");
  }
  return Status::Ok();
}

Status ReadPrior(const nlohmann::json& j, const ModelSpec& spec, Calibration* c) {
  auto prior = j.find("prior");
  if (prior == j.end()) return Status::Ok();
  for (const OutputSpec& o : spec.outputs) {
    auto r = prior->is_object() ? prior->find(o.name) : prior->end();
    if (r == prior->end() || !r->is_array() || r->size() != 2 || !(*r)[0].is_number() ||
        !(*r)[1].is_number())
      return InvalidArgumentError("calibration: prior." + o.name + " must be [low, high]");
    c->prior_low.push_back((*r)[0].get<double>());
    c->prior_high.push_back((*r)[1].get<double>());
  }
  return Status::Ok();
}

}  // namespace

std::string CalibrationToJson(const Calibration& c, const ModelSpec& spec) {
  nlohmann::ordered_json j;
  j["samples"] = c.samples;
  j["sigma_scale"] = PerOutput(c.sigma_scale, spec);
  if (c.has_exponent()) {
    j["sigma_exponent"] = PerOutput(c.sigma_exponent, spec);
    j["sigma_reference"] = PerOutput(c.sigma_reference, spec);
  }
  if (c.has_edge()) j["sigma_edge"] = PerOutput(c.sigma_edge, spec);
  nlohmann::ordered_json prior = nlohmann::ordered_json::object();
  for (size_t i = 0; i < spec.outputs.size() && i < c.prior_low.size() && i < c.prior_high.size(); ++i)
    prior[spec.outputs[i].name] = {c.prior_low[i], c.prior_high[i]};
  if (!prior.empty()) j["prior"] = prior;
  return j.dump();
}

StatusOr<Calibration> CalibrationFromJson(const std::string& text, const ModelSpec& spec) {
  nlohmann::json j;
  try {
    j = nlohmann::json::parse(text);
  } catch (const std::exception& e) {
    return InvalidArgumentError(std::string("calibration: not valid JSON: ") + e.what());
  }
  if (!j.is_object())
    return InvalidArgumentError("calibration: field 'sigma_scale' must be an object keyed by output name");
  Calibration c;
  if (auto n = j.find("samples"); n != j.end() && n->is_number_integer())
    c.samples = n->get<int64_t>();
  CF_RETURN_IF_ERROR(ReadPerOutput(j, "sigma_scale", spec, &c.sigma_scale));
  if (j.contains("sigma_exponent") || j.contains("sigma_reference")) {
    CF_RETURN_IF_ERROR(ReadPerOutput(j, "sigma_exponent", spec, &c.sigma_exponent));
    CF_RETURN_IF_ERROR(ReadPerOutput(j, "sigma_reference", spec, &c.sigma_reference));
  }
  if (j.contains("sigma_edge")) CF_RETURN_IF_ERROR(ReadPerOutput(j, "sigma_edge", spec, &c.sigma_edge));
  CF_RETURN_IF_ERROR(ReadPrior(j, spec, &c));
  CF_RETURN_IF_ERROR(ValidateCalibration(c, spec));
  return c;
}

StatusOr<double> FitSigmaScale(const double* truth, const double* mean, const double* sigma,
                               int64_t n, double low, double high, const std::string& what) {
  if (n <= 0) return InvalidArgumentError(what + ": no samples to fit a calibration on");
  double z2 = 0, sigma_sum = 0;
  for (int64_t i = 0; i < n; ++i) {
    if (!(sigma[i] > 0) || !std::isfinite(sigma[i]) || !std::isfinite(mean[i]) ||
        !std::isfinite(truth[i]))
      return InvalidArgumentError(what + ": sample " + std::to_string(i) + " has sigma " +
                                  std::to_string(sigma[i]) + " (must be positive and finite)");
    const double z = (truth[i] - mean[i]) / sigma[i];
    z2 += z * z;
    sigma_sum += sigma[i];
  }
  if (!std::isfinite(low) && !std::isfinite(high)) {
    const double c = std::sqrt(z2 / n);
    if (!(c > 0) || !std::isfinite(c))
      return InvalidArgumentError(what + ": fitted factor " + std::to_string(c));
    return c;
  }
  // Beyond a width of twice the prior range the truncated posterior is flat over the prior (density
  // within 3% of constant) and the likelihood no longer changes: stop the search there.
  const double width = high - low;
  const double mean_sigma = sigma_sum / n;
  const double hi_log = std::min(7.0, std::log(std::max(1e-12, 2.0 * width / mean_sigma)));
  const double lo_log = -7.0;
  if (!(hi_log > lo_log)) return InvalidArgumentError(what + ": sigma is far wider than the prior");
  // A coarse grid finds the basin (the truncated likelihood need not be convex in c), golden
  // section refines it.
  constexpr int kGrid = 280;
  int best = 0;
  double best_nll = std::numeric_limits<double>::infinity();
  for (int g = 0; g <= kGrid; ++g) {
    const double x = lo_log + (hi_log - lo_log) * g / kGrid;
    const double v = TruncatedNll(truth, mean, sigma, n, low, high, x);
    if (v < best_nll) best_nll = v, best = g;
  }
  if (best == 0)
    return InvalidArgumentError(what + ": the fitted factor is below e^-7 (sigma far too wide?)");
  const double step = (hi_log - lo_log) / kGrid;
  double a = lo_log + (best - 1) * step, b = lo_log + std::min(kGrid, best + 1) * step;
  return std::exp(GoldenMinimum(
      [&](double x) { return TruncatedNll(truth, mean, sigma, n, low, high, x); }, a, b));
}

namespace {

// The best factor for sigmas raised to `b` about `r`, and its mean NLL.
struct ExponentTrial {
  bool ok = false;
  double scale = 1, nll = 0;
};

// The truncated NLL's minimum in log c near x0: steps of 0.25 downhill until it rises, then golden
// section in that bracket. Neighbouring exponents have nearby best factors, so this replaces the
// full grid of FitSigmaScale (a tenth of the evaluations). Fails (ok = false) at the search range's
// low end, as FitSigmaScale does.
ExponentTrial LocalScale(const double* truth, const double* mean, const double* sigma, int64_t n,
                         double low, double high, double x0) {
  double sigma_sum = 0;
  for (int64_t i = 0; i < n; ++i) sigma_sum += sigma[i];
  const double lo = -7.0, hi = std::min(7.0, std::log(std::max(1e-12, 2.0 * (high - low) * n / sigma_sum)));
  if (!(hi > lo)) return {};
  auto f = [&](double x) { return TruncatedNll(truth, mean, sigma, n, low, high, x); };
  constexpr double kStep = 0.25;
  double x = std::min(hi, std::max(lo, x0)), fx = f(x);
  const double dir = f(std::max(lo, x - kStep)) < fx ? -1.0 : 1.0;
  for (;;) {
    const double next = std::min(hi, std::max(lo, x + dir * kStep));
    if (next == x) break;
    const double fn = f(next);
    if (!(fn < fx)) break;
    x = next, fx = fn;
  }
  if (x == lo) return {};
  double a = std::max(lo, x - kStep), b = std::min(hi, x + kStep);
  const double best = GoldenMinimum(f, a, b);
  return {true, std::exp(best), f(best)};
}

// Exponent b's trial; `log_hint` (the best log factor of a neighbouring exponent) starts a local
// search when the posterior is truncated. Without a prior the factor has a closed form.
ExponentTrial TryExponent(const double* truth, const double* mean, const double* sigma, int64_t n,
                          double low, double high, double r, double b, double log_hint,
                          std::vector<double>& work) {
  for (int64_t i = 0; i < n; ++i) work[i] = r * std::pow(sigma[i] / r, b);
  if (std::isfinite(low) || std::isfinite(high))
    return LocalScale(truth, mean, work.data(), n, low, high, log_hint);
  auto s = FitSigmaScale(truth, mean, work.data(), n, low, high, "power calibration");
  if (!s.ok()) return {};
  return {true, *s, TruncatedNll(truth, mean, work.data(), n, low, high, std::log(*s))};
}

// Golden section over x in [lo, hi] to 1e-4 of trial(x, log_hint) -> ExponentTrial, each search
// started from the best factor so far; keeps the lowest NLL seen in (*x_best, *best).
template <typename Trial>
void RefineGolden(const Trial& trial, double lo, double hi, double* x_best, ExponentTrial* best) {
  const double phi = 0.5 * (std::sqrt(5.0) - 1.0);
  while (hi - lo > 1e-4) {
    const double x1 = hi - phi * (hi - lo), x2 = lo + phi * (hi - lo), hint = std::log(best->scale);
    const ExponentTrial t1 = trial(x1, hint), t2 = trial(x2, hint);
    if (!t1.ok || !t2.ok) break;
    const bool first = t1.nll < t2.nll;
    if (first) hi = x2; else lo = x1;
    const ExponentTrial& t = first ? t1 : t2;
    if (t.nll < best->nll) *best = t, *x_best = first ? x1 : x2;
  }
}

}  // namespace

StatusOr<PowerFit> FitSigmaPower(const double* truth, const double* mean, const double* sigma,
                                 int64_t n, double low, double high, const std::string& what) {
  // FitSigmaScale checks the inputs and gives the error a caller should see; its full search at
  // b = 1 seeds the local searches of the other exponents.
  CF_ASSIGN_OR_RETURN(double plain, FitSigmaScale(truth, mean, sigma, n, low, high, what));
  double log_sum = 0;
  for (int64_t i = 0; i < n; ++i) log_sum += std::log(sigma[i]);
  PowerFit best{plain, 1.0, std::exp(log_sum / n)};
  std::vector<double> work(n);
  double best_nll = TruncatedNll(truth, mean, sigma, n, low, high, std::log(plain));
  // b in [0, 2] in steps of 0.05, each search started from its neighbour's factor (walking up from
  // b = 1 and down from it, so the start is always one step away).
  constexpr int kGrid = 40;
  for (int dir : {1, -1}) {
    double hint = std::log(plain);
    for (int g = kGrid / 2 + dir; g >= 0 && g <= kGrid; g += dir) {
      const double b = 2.0 * g / kGrid;
      ExponentTrial t = TryExponent(truth, mean, sigma, n, low, high, best.reference, b, hint, work);
      if (!t.ok) continue;
      hint = std::log(t.scale);
      if (t.nll < best_nll) best_nll = t.nll, best.scale = t.scale, best.exponent = b;
    }
  }
  // Golden section within one grid step either side.
  ExponentTrial kept{true, best.scale, best_nll};
  RefineGolden([&](double b, double hint) {
    return TryExponent(truth, mean, sigma, n, low, high, best.reference, b, hint, work);
  }, std::max(0.0, best.exponent - 0.05), std::min(2.0, best.exponent + 0.05), &best.exponent, &kept);
  best.scale = kept.scale;
  return best;
}

StatusOr<EdgeFit> FitSigmaEdge(const double* truth, const double* mean, const double* sigma,
                               const double* u, int64_t n, double low, double high,
                               const std::string& what) {
  CF_ASSIGN_OR_RETURN(double plain, FitSigmaScale(truth, mean, sigma, n, low, high, what));
  std::vector<double> work(n);
  auto trial = [&](double e, double log_hint) {
    for (int64_t i = 0; i < n; ++i) work[i] = sigma[i] * std::exp(e * u[i] * u[i]);
    return LocalScale(truth, mean, work.data(), n, low, high, log_hint);
  };
  EdgeFit best{plain, 0.0};
  double best_nll = TruncatedNll(truth, mean, sigma, n, low, high, std::log(plain));
  // e in steps of 0.1, walking out from 0 both ways so each search starts next to its neighbour's.
  constexpr double kStep = 0.1;
  const int steps = static_cast<int>(std::lround(kEdgeLimit / kStep));
  for (int dir : {1, -1}) {
    double hint = std::log(plain);
    for (int g = 1; g <= steps; ++g) {
      ExponentTrial t = trial(dir * g * kStep, hint);
      if (!t.ok) continue;
      hint = std::log(t.scale);
      if (t.nll < best_nll) best_nll = t.nll, best = {t.scale, dir * g * kStep};
    }
  }
  ExponentTrial kept{true, best.scale, best_nll};
  RefineGolden(trial, std::max(-kEdgeLimit, best.edge - kStep), std::min(kEdgeLimit, best.edge + kStep), &best.edge,
               &kept);
  best.scale = kept.scale;
  return best;
}

namespace {

// Output o's prior range in normalised units ([-inf, inf] without a prior).
void NormalisedPrior(const ModelSpec& spec, const std::vector<double>& prior_low,
                     const std::vector<double>& prior_high, int o, double* low, double* high) {
  *low = -std::numeric_limits<double>::infinity(), *high = -*low;
  if (prior_low.empty()) return;
  const OutputSpec& out = spec.outputs[o];
  const double a = (prior_low[o] - out.offset) / out.scale,
               b = (prior_high[o] - out.offset) / out.scale;
  *low = std::min(a, b), *high = std::max(a, b);
}

// d^2 = e^T C^-1 e for a q x q symmetric C (row-major), by Cholesky; false if C is not positive
// definite.
bool Mahalanobis2(int q, std::vector<double> c, const double* e, double* d2) {
  for (int j = 0; j < q; ++j) {
    for (int k = 0; k < j; ++k) c[j * q + j] -= c[j * q + k] * c[j * q + k];
    if (!(c[j * q + j] > 0)) return false;
    c[j * q + j] = std::sqrt(c[j * q + j]);
    for (int i = j + 1; i < q; ++i) {
      for (int k = 0; k < j; ++k) c[i * q + j] -= c[i * q + k] * c[j * q + k];
      c[i * q + j] /= c[j * q + j];
    }
  }
  *d2 = 0;
  std::vector<double> y(q);  // L y = e
  for (int i = 0; i < q; ++i) {
    double v = e[i];
    for (int k = 0; k < i; ++k) v -= c[i * q + k] * y[k];
    y[i] = v / c[i * q + i];
    *d2 += y[i] * y[i];
  }
  return true;
}

// The outputs of the joint block: mean calibrated sigma below kJointPriorFraction of the prior.
std::vector<int> JointBlock(const ModelSpec& spec, const Calibration& c, const std::vector<double>& mean,
                            const std::vector<double>& cov, int64_t n) {
  const int p = static_cast<int>(spec.outputs.size());
  std::vector<int> block;
  for (int o = 0; o < p; ++o) {
    double low, high, sigma_sum = 0;
    NormalisedPrior(spec, c.prior_low, c.prior_high, o, &low, &high);
    for (int64_t i = 0; i < n; ++i) {
      const double s = std::sqrt(std::max(0.0, cov[(i * p + o) * p + o]));
      sigma_sum += c.Factor(o, s, EdgeCoordinate(mean[i * p + o], low, high)) * s;
    }
    if (!std::isfinite(high - low) || sigma_sum / n < kJointPriorFraction * (high - low))
      block.push_back(o);
  }
  return block;
}

}  // namespace

StatusOr<JointFit> FitJointFactor(const ModelSpec& spec, const Calibration& calibration,
                                  const std::vector<double>& truth, const std::vector<double>& mean,
                                  const std::vector<double>& cov) {
  const int p = static_cast<int>(spec.outputs.size());
  const int64_t n = static_cast<int64_t>(truth.size()) / p;
  JointFit fit;
  if (n <= 0) return InvalidArgumentError("joint calibration: no samples");
  std::vector<int> block = JointBlock(spec, calibration, mean, cov, n);
  if (block.size() < 2) return fit;
  const int q = static_cast<int>(block.size());
  std::vector<double> full(size_t(p) * p), sub(size_t(q) * q), e(q);
  double d2_sum = 0;
  for (int64_t i = 0; i < n; ++i) {
    std::copy_n(&cov[size_t(i) * p * p], p * p, full.begin());
    ApplyCalibration(calibration, spec, &mean[size_t(i) * p], full.data());
    for (int a = 0; a < q; ++a) {
      e[a] = truth[i * p + block[a]] - mean[i * p + block[a]];
      for (int b = 0; b < q; ++b) sub[a * q + b] = full[block[a] * p + block[b]];
    }
    double d2;
    if (!Mahalanobis2(q, sub, e.data(), &d2) || !std::isfinite(d2))
      return InvalidArgumentError("joint calibration: sample " + std::to_string(i) +
                                  ": the block's covariance is not positive definite");
    d2_sum += d2;
  }
  fit.factor = d2_sum / double(n) / q;
  if (!(fit.factor > 0) || !std::isfinite(fit.factor))
    return InvalidArgumentError("joint calibration: fitted factor " + std::to_string(fit.factor));
  fit.outputs = std::move(block);
  return fit;
}

namespace {

// One output's fit, appended to c.
Status FitOutput(const std::vector<double>& t, const std::vector<double>& m,
                 const std::vector<double>& s, double low, double high, CalibrationForm form,
                 const std::string& what, Calibration* c) {
  const int64_t n = static_cast<int64_t>(t.size());
  if (form == CalibrationForm::kScale) {
    CF_ASSIGN_OR_RETURN(double f, FitSigmaScale(t.data(), m.data(), s.data(), n, low, high, what));
    c->sigma_scale.push_back(f);
    return Status::Ok();
  }
  CF_ASSIGN_OR_RETURN(PowerFit f, FitSigmaPower(t.data(), m.data(), s.data(), n, low, high, what));
  c->sigma_scale.push_back(f.scale);
  c->sigma_exponent.push_back(f.exponent);
  c->sigma_reference.push_back(f.reference);
  return Status::Ok();
}

// The power-edge form's edge terms on top of c's per-output fits (see FitCalibration).
Status FitEdges(const ModelSpec& spec, const std::vector<double>& truth, const std::vector<double>& mean,
                const std::vector<double>& cov, Calibration* c) {
  const int p = static_cast<int>(spec.outputs.size());
  const int64_t n = static_cast<int64_t>(truth.size()) / p;
  if (c->prior_low.empty()) return Status::Ok();
  const std::vector<int> narrow = JointBlock(spec, *c, mean, cov, n);
  c->sigma_edge.assign(size_t(p), 0.0);
  std::vector<double> t(n), m(n), s(n), u(n);
  for (int o : narrow) {
    double low, high;
    NormalisedPrior(spec, c->prior_low, c->prior_high, o, &low, &high);
    for (int64_t i = 0; i < n; ++i) {
      t[i] = truth[i * p + o];
      m[i] = mean[i * p + o];
      const double raw = std::sqrt(cov[(i * p + o) * p + o]);
      s[i] = c->Factor(o, raw) * raw;
      u[i] = EdgeCoordinate(m[i], low, high);
    }
    CF_ASSIGN_OR_RETURN(EdgeFit f, FitSigmaEdge(t.data(), m.data(), s.data(), u.data(), n, low, high,
                                                "edge calibration of " + spec.outputs[o].name));
    c->sigma_scale[size_t(o)] *= f.scale;
    c->sigma_edge[size_t(o)] = f.edge;
  }
  return Status::Ok();
}

}  // namespace

StatusOr<Calibration> FitCalibration(const ModelSpec& spec, const std::vector<double>& truth,
                                     const std::vector<double>& mean,
                                     const std::vector<double>& cov,
                                     const std::vector<double>& prior_low,
                                     const std::vector<double>& prior_high,
                                     CalibrationForm form, JointFit* joint) {
  const int p = static_cast<int>(spec.outputs.size());
  const int64_t n = static_cast<int64_t>(truth.size()) / p;
  if (mean.size() != truth.size() || cov.size() != truth.size() * p)
    return InvalidArgumentError("calibration fit: truth, mean and covariance sizes disagree");
  if (!prior_low.empty() && (prior_low.size() != size_t(p) || prior_high.size() != size_t(p)))
    return InvalidArgumentError("calibration fit: the prior needs a range per output");
  Calibration c;
  c.samples = n;
  c.prior_low = prior_low;
  c.prior_high = prior_high;
  std::vector<double> t(n), m(n), s(n);
  for (int o = 0; o < p; ++o) {
    for (int64_t i = 0; i < n; ++i) {
      t[i] = truth[i * p + o];
      m[i] = mean[i * p + o];
      s[i] = std::sqrt(cov[(i * p + o) * p + o]);
    }
    double low, high;
    NormalisedPrior(spec, prior_low, prior_high, o, &low, &high);
    CF_RETURN_IF_ERROR(
        FitOutput(t, m, s, low, high, form, "calibration fit of " + spec.outputs[o].name, &c));
  }
  if (form == CalibrationForm::kPowerEdge) CF_RETURN_IF_ERROR(FitEdges(spec, truth, mean, cov, &c));
  if (form == CalibrationForm::kPowerJoint) {
    CF_ASSIGN_OR_RETURN(JointFit j, FitJointFactor(spec, c, truth, mean, cov));
    for (int o : j.outputs) c.sigma_scale[size_t(o)] *= std::sqrt(j.factor);
    if (joint) *joint = j;
  }
  CF_RETURN_IF_ERROR(ValidateCalibration(c, spec));
  return c;
}

}  // namespace cosmoflow
