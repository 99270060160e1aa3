// Per-prediction uncertainty: the Gaussian posterior an uncertainty head's output stands for
// (spec.h describes the head layouts), the mixture of an ensemble's posteriors, and the post-hoc
// calibration of their widths.
//
// Units: normalised label units (n = (physical - offset) / scale) unless a name says physical.
// Covariances are p x p, row-major, in the spec's output order. All functions are pure and
// thread-safe.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "core/base/status.h"
#include "core/base/truncated_normal.h"
#include "core/nn/spec.h"

namespace cosmoflow {

// Log-variances (gaussian) are clamped to [-kLogVarianceLimit, kLogVarianceLimit] and log-diagonal
// Cholesky entries (gaussian_full) to half that, both when decoding and in the loss (whose gradient
// is zero beyond): sigma stays within e^+-20 normalised units, so exp() never overflows.
inline constexpr double kLogVarianceLimit = 40.0;

// The mean and covariance of one sample from its head output (HeadWidth(head, p) floats). For
// head none the covariance is zero.
void DecodeHead(UncertaintyHead head, int p, const float* raw, double* mean, double* cov);

// The lower-triangular Cholesky factor L (p x p row-major) of the precision the head encodes:
// gaussian_full as in spec.h; gaussian L = diag(exp(-log_variance / 2)). Not for head none.
void PrecisionCholesky(UncertaintyHead head, int p, const float* raw, double* l);
// Covariance = (L L^T)^-1 = L^-T L^-1, by forward substitution (no general matrix inverse).
void CovarianceFromPrecisionCholesky(int p, const double* l, double* cov);

// The equal-weight mixture of k posteriors (means k x p, covs k x p x p): its mean is the average
// mean, its covariance the average covariance plus the spread of the means,
// (1/k) sum_m (mu_m - mean)(mu_m - mean)^T (the mixture's exact second moment).
void CombineMixture(int p, int k, const double* means, const double* covs, double* mean,
                    double* cov);

// Post-hoc calibration of an uncertainty, per output: sigma -> s r (sigma / r)^b exp(e u^2), with s
// the sigma_scale, b the sigma_exponent, r the sigma_reference (normalised units), e the sigma_edge
// and u the edge coordinate of the served mean (EdgeCoordinate: -1 and 1 at the prior's ends, 0 at
// its centre). b = 1 (the default, and what an empty sigma_exponent means) is a plain factor; b < 1
// widens the narrowest posteriors and narrows the widest, where a head is over-confident where it
// claims most precision. e > 0 widens posteriors whose mean lies towards an edge of the prior, where
// a network's means are shrunk towards the centre and miss by more. Correlations are kept: the
// covariance is scaled as D C D with D the per-output factors.
struct Calibration {
  std::vector<double> sigma_scale;            // per output; empty = not calibrated (factor 1)
  std::vector<double> sigma_exponent;         // per output; empty = 1 for every output
  std::vector<double> sigma_reference;        // per output, with sigma_exponent: r > 0
  std::vector<double> sigma_edge;             // per output; empty = 0 for every output (needs a prior)
  std::vector<double> prior_low, prior_high;  // per output, physical units: the prior range the
                                              // fit truncated the posterior to (empty = none)
  int64_t samples = 0;                        // validation samples the factors were fitted on
  bool empty() const { return sigma_scale.empty(); }
  bool has_exponent() const { return !sigma_exponent.empty(); }
  bool has_edge() const { return !sigma_edge.empty(); }
  // u of output o's physical mean: (mean - centre) / half-width of the prior, clamped to
  // [-kEdgeReach, kEdgeReach]; 0 without an edge term.
  double EdgeCoordinate(int o, double physical_mean) const;
  // The factor that multiplies output o's sigma (normalised units) of this value, at edge
  // coordinate u: s (sigma/r)^(b-1) exp(e u^2).
  double Factor(int o, double sigma, double u = 0) const;
};
// Means beyond the prior widen no further than at this many half-widths from its centre (an
// out-of-distribution mean keeps a finite sigma).
inline constexpr double kEdgeReach = 3.0;
// sigma_edge is fitted, and accepted, in [-kEdgeLimit, kEdgeLimit].
inline constexpr double kEdgeLimit = 2.0;
// u of x on the range [low, high] (either unit), clamped as above.
double EdgeCoordinate(double x, double low, double high);

// How the trainer fits a calibration: one factor per output (kScale), a factor and an exponent per
// output (kPower), kPower followed by the joint step (kPowerJoint, FitJointFactor), or kPower
// followed by the edge term (kPowerEdge, FitSigmaEdge). kPower keeps every output's own truncated
// fit, so the joint regions of the truncated posterior are those of calibrated marginals;
// kPowerJoint instead matches the untruncated ellipse at the served mean, narrowing the block's
// marginals where truncation matters (near the prior's edges). kPowerEdge lets sigma depend on where
// the mean lies in the prior, for the outputs whose posterior is narrow next to it.
enum class CalibrationForm { kScale, kPower, kPowerJoint, kPowerEdge };
const char* CalibrationFormName(CalibrationForm f);  // "scale" | "power" | "power-joint" | "power-edge"
StatusOr<CalibrationForm> ParseCalibrationForm(const std::string& name);

// Positive finite factors, one per output; exponents (if any) in [0, 4] with positive finite
// references; edge terms (if any) in [-kEdgeLimit, kEdgeLimit], with a prior; a prior range, if
// any, finite with low < high. The message names the field
// ("calibration: sigma_scale.sigma_8 = -1 is not positive and finite").
Status ValidateCalibration(const Calibration& c, const ModelSpec& spec);
// JSON object keyed by output name:
//   {"samples": 512, "sigma_scale": {"Omega_M": 1.04, ...}, "sigma_exponent": {"Omega_M": 0.8, ...},
//    "sigma_reference": {"Omega_M": 0.11, ...}, "sigma_edge": {"Omega_M": 0.25, ...},
//    "prior": {"Omega_M": [0.25, 0.35], ...}}
// (sigma_exponent and sigma_reference only for a power calibration, sigma_edge only with an edge
// term).
std::string CalibrationToJson(const Calibration& c, const ModelSpec& spec);
// Parses and validates; every output must have a factor (and, if either object is present, an
// exponent and a reference; sigma_edge likewise), and no other name may appear.
StatusOr<Calibration> CalibrationFromJson(const std::string& json, const ModelSpec& spec);

// cov_ij *= f_i f_j with f_i = c.Factor(i, sqrt(cov_ii), u_i), u_i the edge coordinate of the
// normalised mean_i (a no-op for an empty calibration).
void ApplyCalibration(const Calibration& c, const ModelSpec& spec, const double* mean, double* cov);
// Normalised -> physical: mean_i = offset_i + scale_i mean_i, cov_ij *= scale_i scale_j.
void DenormalisePosterior(const ModelSpec& spec, double* mean, double* cov);

// Fits one sigma factor: the c > 0 that maximises the likelihood of the truths under the
// truncated posteriors of (mean, c sigma) on [low, high] (the prior), over n samples. Without a prior
// (low = -inf, high = +inf) that is c^2 = mean(z^2), z = (truth - mean) / sigma; with one, a 1-D
// search over log c in [-7, 7]. Fails (naming `what`) on no samples, a sigma that is not positive
// and finite, or a factor at the end of the search range.
StatusOr<double> FitSigmaScale(const double* truth, const double* mean, const double* sigma,
                               int64_t n, double low, double high, const std::string& what);

// A power calibration of one output: r is the geometric mean of the sigmas; b is searched over
// [0, 2] (a grid, then golden section), each b with its best factor s (FitSigmaScale's full search
// at b = 1; elsewhere, with a prior, a local search from the neighbouring exponent's factor),
// keeping the (s, b) of the highest truncated likelihood. Fails as FitSigmaScale does at b = 1.
struct PowerFit {
  double scale = 1, exponent = 1, reference = 1;
};
StatusOr<PowerFit> FitSigmaPower(const double* truth, const double* mean, const double* sigma,
                                 int64_t n, double low, double high, const std::string& what);

// The edge term of one output: with sigma the already calibrated sigmas and u the means' edge
// coordinates, the e in [-kEdgeLimit, kEdgeLimit] and factor k that maximise the truncated
// likelihood of (mean, k sigma exp(e u^2)) on [low, high] (a grid over e, then golden section, each e
// with its best k). Fails as FitSigmaScale does.
struct EdgeFit {
  double scale = 1, edge = 0;
};
StatusOr<EdgeFit> FitSigmaEdge(const double* truth, const double* mean, const double* sigma,
                               const double* u, int64_t n, double low, double high,
                               const std::string& what);

// The joint step of a power-joint calibration. Per-output fits match each marginal; the joint regions
// (the ellipses of a block of outputs) also depend on the correlations, which they leave alone. The
// block is the outputs whose calibrated posterior is narrow next to the prior (mean sigma below
// kJointPriorFraction of the prior's width, or no prior): for them the untruncated Gaussian
// likelihood is a fair model. The block's calibrated covariances are scaled by the k that
// maximises its Gaussian likelihood, k = mean(d^2) / q (d^2 the squared Mahalanobis distance of
// the truth, q the block's size). An empty block and k = 1 when fewer than two outputs qualify.
inline constexpr double kJointPriorFraction = 0.1;
struct JointFit {
  std::vector<int> outputs;  // the block, in output order
  double factor = 1;         // k, the covariance factor (sigma factor sqrt(k))
};
// `calibration` is the per-output fit; inputs as FitCalibration's. Fails on a block covariance that
// is not positive definite or a k that is not positive and finite (naming the sample).
StatusOr<JointFit> FitJointFactor(const ModelSpec& spec, const Calibration& calibration,
                                  const std::vector<double>& truth, const std::vector<double>& mean,
                                  const std::vector<double>& cov);

// Fits every output's calibration from n samples of normalised truths (n x p), means (n x p) and
// covariances (n x p x p); prior_low/high per output in physical units (empty = none), kept in the
// result. The power-joint form ends with the joint step (FitJointFactor), folded into the block's
// sigma_scale; `joint`, if given, receives it (an empty block for the other forms). The power-edge
// form fits an edge term (FitSigmaEdge, its k folded into sigma_scale) for the outputs whose
// calibrated posterior is narrow next to the prior (as the joint block is chosen); the others keep
// e = 0, since for a posterior as wide as the prior truncation already models the edges.
StatusOr<Calibration> FitCalibration(const ModelSpec& spec, const std::vector<double>& truth,
                                     const std::vector<double>& mean,
                                     const std::vector<double>& cov,
                                     const std::vector<double>& prior_low,
                                     const std::vector<double>& prior_high,
                                     CalibrationForm form = CalibrationForm::kScale,
                                     JointFit* joint = nullptr);

}  // namespace cosmoflow
