// Uncertainty heads: the spec field, the posterior a head output stands for (against hand
// computations), the Gaussian NLL and its gradient (against finite differences), ensemble mixtures,
// and the calibration fit on miscalibrated toys with known noise.
#include "core/nn/uncertainty.h"

#include <gtest/gtest.h>

#include <cmath>
#include <random>
#include <vector>

#include "core/nn/loss.h"
#include "core/nn/network.h"
#include "core/nn/spec.h"

namespace cosmoflow {
namespace {

// The mean of N(loc, s^2) truncated to [low, high], by Simpson's rule (independent of the
// closed form TruncatedLocation inverts).
double TruncatedMeanByQuadrature(double loc, double s, double low, double high) {
  constexpr int kIntervals = 4000;
  const double h = (high - low) / kIntervals;
  const double peak = (std::min(high, std::max(low, loc)) - loc) / s;  // the largest density's z
  double mass = 0, first = 0;
  for (int i = 0; i <= kIntervals; ++i) {
    const double x = low + i * h, z = (x - loc) / s;
    const double w = (i == 0 || i == kIntervals ? 1 : i % 2 ? 4 : 2) * std::exp(0.5 * (peak * peak - z * z));
    mass += w, first += w * x;
  }
  return first / mass;
}

ModelSpec TinyWithHead(UncertaintyHead head) {
  ModelSpec s = *BuiltinSpec("tiny32");
  s.uncertainty = head;
  s.layers.back().units = HeadWidth(head, 3);
  return s;
}

TEST(UncertaintySpecTest, HeadWidthsAndJson) {
  EXPECT_EQ(HeadWidth(UncertaintyHead::kNone, 3), 3);
  EXPECT_EQ(HeadWidth(UncertaintyHead::kGaussian, 3), 6);
  EXPECT_EQ(HeadWidth(UncertaintyHead::kGaussianFull, 3), 9);
  EXPECT_EQ(HeadWidth(UncertaintyHead::kGaussianFull, 4), 14);
  for (auto head : {UncertaintyHead::kGaussian, UncertaintyHead::kGaussianFull}) {
    ModelSpec s = TinyWithHead(head);
    ASSERT_TRUE(s.Validate().ok()) << s.Validate().ToString();
    EXPECT_EQ(s.NetworkOutputs(), HeadWidth(head, 3));
    const std::string json = s.ToJson();
    EXPECT_NE(json.find(std::string("\"uncertainty\":\"") + UncertaintyHeadName(head) + "\""),
              std::string::npos);
    auto back = ModelSpec::FromJson(json);
    ASSERT_TRUE(back.ok()) << back.status().ToString();
    EXPECT_EQ(back->uncertainty, head);
    EXPECT_EQ(back->ToJson(), json);
  }
  // No head: the JSON stays what it was (no key), so existing checkpoints and specs are unchanged.
  EXPECT_EQ(BuiltinSpec("tiny32")->ToJson().find("uncertainty"), std::string::npos);
}

TEST(UncertaintySpecTest, IncompatibleOutputsAreRefusedNamingTheField) {
  ModelSpec s = TinyWithHead(UncertaintyHead::kGaussianFull);
  s.layers.back().units = 3;  // the means only
  Status st = s.Validate();
  ASSERT_FALSE(st.ok());
  EXPECT_NE(st.message().find("uncertainty 'gaussian_full'"), std::string::npos) << st.message();
  EXPECT_NE(st.message().find("9 units"), std::string::npos) << st.message();
  EXPECT_NE(st.message().find("got 3"), std::string::npos) << st.message();

  s = TinyWithHead(UncertaintyHead::kGaussian);
  s.layers.back().units = 9;
  st = s.Validate();
  ASSERT_FALSE(st.ok());
  EXPECT_NE(st.message().find("uncertainty 'gaussian'"), std::string::npos) << st.message();
  EXPECT_NE(st.message().find("6 units"), std::string::npos) << st.message();

  // A bounded last layer would bound the log-variances.
  ModelSpec m = *BuiltinSpec("mlperf64");
  m.uncertainty = UncertaintyHead::kGaussian;
  m.layers[m.layers.size() - 2].units = 8;
  st = m.Validate();
  ASSERT_FALSE(st.ok());
  EXPECT_NE(st.message().find("scaled_tanh"), std::string::npos) << st.message();

  auto r = ModelSpec::FromJson(R"({"input_channels":1,"input_side":8,"outputs":[{"name":"a"}],
      "uncertainty":"laplace","layers":[{"type":"flatten"},{"type":"dense","units":2}]})");
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("'uncertainty'"), std::string::npos) << r.status().message();
  EXPECT_NE(r.status().message().find("laplace"), std::string::npos) << r.status().message();
}

// The inverse of a 3x3 matrix by cofactors: independent of the forward substitution under test.
std::vector<double> Inverse3(const std::vector<double>& a) {
  auto at = [&](int i, int j) { return a[i * 3 + j]; };
  std::vector<double> c(9);
  for (int i = 0; i < 3; ++i)
    for (int j = 0; j < 3; ++j) {
      const int r0 = (i + 1) % 3, r1 = (i + 2) % 3, c0 = (j + 1) % 3, c1 = (j + 2) % 3;
      c[j * 3 + i] = at(r0, c0) * at(r1, c1) - at(r0, c1) * at(r1, c0);  // adjugate (transposed)
    }
  const double det = at(0, 0) * c[0] + at(0, 1) * c[3] + at(0, 2) * c[6];
  for (auto& v : c) v /= det;
  return c;
}

TEST(UncertaintyTest, CovarianceFromCholeskyMatchesHandComputation) {
  // L = [[2, 0, 0], [0.5, 1, 0], [-1, 0.25, 4]]: log-diagonal log 2, 0, log 4; below the diagonal
  // row-major (1,0) = 0.5, (2,0) = -1, (2,1) = 0.25.
  const float raw[9] = {0.1f, -0.2f, 0.3f, std::log(2.f), 0.f, std::log(4.f), 0.5f, -1.f, 0.25f};
  double mean[3], cov[9];
  DecodeHead(UncertaintyHead::kGaussianFull, 3, raw, mean, cov);
  EXPECT_DOUBLE_EQ(mean[0], 0.1f);
  EXPECT_DOUBLE_EQ(mean[2], 0.3f);
  // Precision by hand: Lambda = L L^T.
  const double l[9] = {2, 0, 0, 0.5, 1, 0, -1, 0.25, 4};
  std::vector<double> precision(9, 0.0);
  for (int i = 0; i < 3; ++i)
    for (int j = 0; j < 3; ++j)
      for (int k = 0; k < 3; ++k) precision[i * 3 + j] += l[i * 3 + k] * l[j * 3 + k];
  EXPECT_DOUBLE_EQ(precision[0], 4.0);
  EXPECT_DOUBLE_EQ(precision[1], 1.0);      // 2 * 0.5
  EXPECT_DOUBLE_EQ(precision[8], 17.0625);  // 1 + 0.0625 + 16
  const std::vector<double> want = Inverse3(precision);
  for (int i = 0; i < 9; ++i) EXPECT_NEAR(cov[i], want[i], 1e-6 * (1 + std::abs(want[i]))) << i;
  EXPECT_NEAR(cov[1], cov[3], 1e-15);  // symmetric
  // By hand: det(Lambda) = (2 * 1 * 4)^2 = 64; Var(y0) = (1.25 * 17.0625 - 0.0625) / 64; and the
  // last output's variance is 1 / L_22^2 = 1/16 (the last row of a precision Cholesky factor).
  EXPECT_NEAR(cov[0], 21.265625 / 64, 1e-6);
  EXPECT_NEAR(cov[8], 1.0 / 16, 1e-7);
  EXPECT_NEAR(cov[2], 2.25 / 64, 1e-7);

  // The diagonal head: variances are exp(log-variance), no correlation.
  const float diag[6] = {1.f, 2.f, 3.f, std::log(0.25f), 0.f, std::log(9.f)};
  DecodeHead(UncertaintyHead::kGaussian, 3, diag, mean, cov);
  EXPECT_NEAR(cov[0], 0.25, 1e-7);
  EXPECT_NEAR(cov[4], 1.0, 1e-7);
  EXPECT_NEAR(cov[8], 9.0, 1e-6);
  EXPECT_EQ(cov[1], 0.0);
  // No head: zero covariance.
  DecodeHead(UncertaintyHead::kNone, 3, diag, mean, cov);
  for (double v : cov) EXPECT_EQ(v, 0.0);
}

TEST(UncertaintyTest, MixtureOfMembersMatchesHandComputation) {
  // Two members, p = 2: means (1, 2) and (3, 0); covariances I and [[2, 0.5], [0.5, 1]].
  // Mean (2, 1); mean covariance [[1.5, 0.25], [0.25, 1]]; spread of the means: deviations (-1, 1)
  // and (1, -1), (1/2) sum d d^T = [[1, -1], [-1, 1]]. Total [[2.5, -0.75], [-0.75, 2]].
  const double means[4] = {1, 2, 3, 0};
  const double covs[8] = {1, 0, 0, 1, 2, 0.5, 0.5, 1};
  double mean[2], cov[4];
  CombineMixture(2, 2, means, covs, mean, cov);
  EXPECT_DOUBLE_EQ(mean[0], 2.0);
  EXPECT_DOUBLE_EQ(mean[1], 1.0);
  EXPECT_DOUBLE_EQ(cov[0], 2.5);
  EXPECT_DOUBLE_EQ(cov[1], -0.75);
  EXPECT_DOUBLE_EQ(cov[2], -0.75);
  EXPECT_DOUBLE_EQ(cov[3], 2.0);
  // Three point predictors (zero covariance), p = 1: 0, 3, 6 -> mean 3, variance (9 + 0 + 9) / 3.
  const double points[3] = {0, 3, 6}, zeros[3] = {0, 0, 0};
  CombineMixture(1, 3, points, zeros, mean, cov);
  EXPECT_DOUBLE_EQ(mean[0], 3.0);
  EXPECT_DOUBLE_EQ(cov[0], 6.0);
}

// The NLL computed the textbook way from the decoded covariance: 0.5 log det(2 pi C) + 0.5 r^T C^-1
// r.
double ReferenceNll(UncertaintyHead head, const float* raw, const float* y) {
  double mean[3], cov[9];
  DecodeHead(head, 3, raw, mean, cov);
  const std::vector<double> inv = Inverse3(std::vector<double>(cov, cov + 9));
  const std::vector<double> c(cov, cov + 9);
  const double det = c[0] * (c[4] * c[8] - c[5] * c[7]) - c[1] * (c[3] * c[8] - c[5] * c[6]) +
                     c[2] * (c[3] * c[7] - c[4] * c[6]);
  double q = 0;
  for (int i = 0; i < 3; ++i)
    for (int j = 0; j < 3; ++j) q += (y[i] - mean[i]) * inv[i * 3 + j] * (y[j] - mean[j]);
  return 0.5 * (3 * std::log(2 * M_PI) + std::log(det) + q);
}

TEST(LossTest, GaussianNllValueMatchesTheTextbookDensity) {
  std::mt19937 rng(5);
  std::normal_distribution<float> n01(0.f, 1.f);
  for (auto head : {UncertaintyHead::kGaussian, UncertaintyHead::kGaussianFull}) {
    const int w = HeadWidth(head, 3), batch = 4;
    std::vector<float> pred(batch * w), y(batch * 3);
    for (auto& v : pred) v = 0.5f * n01(rng);
    for (auto& v : y) v = n01(rng);
    double want = 0;
    for (int b = 0; b < batch; ++b) want += ReferenceNll(head, &pred[b * w], &y[b * 3]);
    want /= batch * 3;
    EXPECT_NEAR(GaussianNll(head, 3, pred.data(), y.data(), batch, nullptr), want, 1e-5)
        << UncertaintyHeadName(head);
  }
}

// Central differences in double around float inputs, against the analytic gradient.
void ExpectGradientMatchesFiniteDifferences(UncertaintyHead head, MeanGradient mg) {
  std::mt19937 rng(11);
  std::normal_distribution<float> n01(0.f, 1.f);
  const int p = 3, w = HeadWidth(head, p), batch = 3;
  std::vector<float> pred(batch * w), y(batch * p), diff(batch * w);
  for (auto& v : pred) v = 0.6f * n01(rng);
  for (auto& v : y) v = n01(rng);
  GaussianNll(head, p, pred.data(), y.data(), batch, diff.data(), mg);
  for (int k = 0; k < batch * w; ++k) {
    const bool is_mean = k % w < p;
    double want;
    if (is_mean && mg == MeanGradient::kMse) {
      const int b = k / w, i = k % w;
      want = 2.0 * (pred[k] - y[b * p + i]) / (batch * p);  // the MSE's gradient
    } else {
      const float h = 1e-2f;
      std::vector<float> plus = pred, minus = pred;
      plus[k] += h;
      minus[k] -= h;
      const double fp = GaussianNll(head, p, plus.data(), y.data(), batch, nullptr);
      const double fm = GaussianNll(head, p, minus.data(), y.data(), batch, nullptr);
      want = (fp - fm) / (double(plus[k]) - double(minus[k]));
    }
    EXPECT_NEAR(diff[k], want, 2e-4 * (1 + std::abs(want)))
        << UncertaintyHeadName(head) << " " << MeanGradientName(mg) << " entry " << k % w
        << " of sample " << k / w;
  }
}

TEST(LossTest, GaussianNllGradientMatchesFiniteDifferences) {
  for (auto head : {UncertaintyHead::kGaussian, UncertaintyHead::kGaussianFull})
    for (auto mg : {MeanGradient::kNll, MeanGradient::kMse})
      ExpectGradientMatchesFiniteDifferences(head, mg);
}

TEST(LossTest, GaussianNllIsFiniteForExtremeHeadOutputs) {
  // Log entries far beyond the clamp: finite loss, finite gradients, zero for the clamped entries.
  const float pred[9] = {0.f, 0.f, 0.f, 500.f, -500.f, 0.f, 1e3f, -1e3f, 0.f};
  const float y[3] = {1.f, -1.f, 0.5f};
  float diff[9];
  const double nll = GaussianNll(UncertaintyHead::kGaussianFull, 3, pred, y, 1, diff);
  EXPECT_TRUE(std::isfinite(nll));
  for (float d : diff) EXPECT_TRUE(std::isfinite(d));
  EXPECT_EQ(diff[3], 0.f);
  EXPECT_EQ(diff[4], 0.f);
}

TEST(LossTest, MseOfMeansIgnoresTheCovarianceEntries) {
  const float pred[6] = {1.f, 2.f, 3.f, 7.f, 8.f, 9.f};
  const float y[3] = {0.f, 2.f, 5.f};
  float diff[6];
  const double mse = MeanSquaredErrorOfMeans(UncertaintyHead::kGaussian, 3, pred, y, 1, diff);
  float plain[3];
  EXPECT_DOUBLE_EQ(mse, ComputeLoss(LossType::kMse, pred, y, 3, plain));
  for (int i = 0; i < 3; ++i) EXPECT_EQ(diff[i], plain[i]);
  for (int i = 3; i < 6; ++i) EXPECT_EQ(diff[i], 0.f);
}

TEST(CalibrationTest, AppliesJsonRoundTripAndRefusesBadFactorsNamingTheField) {
  ModelSpec spec = TinyWithHead(UncertaintyHead::kGaussianFull);
  Calibration c;
  c.sigma_scale = {2.0, 0.5, 1.0};
  c.prior_low = {0.25, 0.78, 0.9};
  c.prior_high = {0.35, 0.95, 1.0};
  c.samples = 512;
  ASSERT_TRUE(ValidateCalibration(c, spec).ok());
  double cov[9] = {1, 1, 1, 1, 1, 1, 1, 1, 1}, mean[3] = {0, 0, 0};
  ApplyCalibration(c, spec, mean, cov);
  EXPECT_DOUBLE_EQ(cov[0], 4.0);
  EXPECT_DOUBLE_EQ(cov[1], 1.0);  // 2 * 0.5
  EXPECT_DOUBLE_EQ(cov[4], 0.25);
  EXPECT_DOUBLE_EQ(cov[8], 1.0);
  auto back = CalibrationFromJson(CalibrationToJson(c, spec), spec);
  ASSERT_TRUE(back.ok()) << back.status().ToString();
  EXPECT_EQ(back->sigma_scale, c.sigma_scale);
  EXPECT_EQ(back->prior_high, c.prior_high);
  EXPECT_EQ(back->samples, 512);

  for (double bad : {-1.0, 0.0, std::nan(""), double(INFINITY)}) {
    Calibration b = c;
    b.sigma_scale[1] = bad;
    Status st = ValidateCalibration(b, spec);
    ASSERT_FALSE(st.ok()) << bad;
    EXPECT_NE(st.message().find("sigma_scale.sigma_8"), std::string::npos) << st.message();
  }
  Calibration flipped = c;
  flipped.prior_low[2] = 1.1;
  EXPECT_NE(ValidateCalibration(flipped, spec).message().find("prior.n_s"), std::string::npos);
  auto missing = CalibrationFromJson(R"({"sigma_scale": {"Omega_M": 1, "sigma_8": 1}})", spec);
  ASSERT_FALSE(missing.ok());
  EXPECT_NE(missing.status().message().find("sigma_scale.n_s"), std::string::npos)
      << missing.status().message();
  auto extra = CalibrationFromJson(
      R"({"sigma_scale": {"Omega_M": 1, "sigma_8": 1, "n_s": 1, "H0": 1}})", spec);
  ASSERT_FALSE(extra.ok());
  EXPECT_NE(extra.status().message().find("sigma_scale.H0"), std::string::npos)
      << extra.status().message();
}

// The miscalibrated toy: predictions claim sigma_i but the truths scatter with k * sigma_i. The fit
// must recover k. With n = 20000 the estimate's own spread is about k / sqrt(2n) = 0.5% of k, so
// the 2% tolerance is 4 of those.
TEST(CalibrationTest, RecoversTheNoiseLevelOfAMiscalibratedToy) {
  std::mt19937_64 rng(3);
  std::normal_distribution<double> n01(0.0, 1.0);
  std::uniform_real_distribution<double> u(0.0, 1.0);
  const int64_t n = 20000;
  for (double k : {0.6, 1.0, 1.7}) {
    std::vector<double> truth(n), mean(n), sigma(n);
    for (int64_t i = 0; i < n; ++i) {
      mean[i] = u(rng);
      sigma[i] = 0.01 + 0.04 * u(rng);  // heteroscedastic: the factor is common, sigma is not
      truth[i] = mean[i] + k * sigma[i] * n01(rng);
    }
    auto c = FitSigmaScale(truth.data(), mean.data(), sigma.data(), n, -INFINITY, INFINITY, "toy");
    ASSERT_TRUE(c.ok()) << c.status().ToString();
    EXPECT_NEAR(*c, k, 0.02 * k) << "untruncated toy, k = " << k;
  }
}

// Truncated toy: truths from N(mean, (k sigma)^2) truncated to the prior [0, 1], with means near
// the edges, where truncation matters. The truncated fit recovers k (4% tolerance); the untruncated
// formula on the same data misses it by more than that, which is why the fit knows the prior.
TEST(CalibrationTest, TruncatedLocationInvertsTheTruncatedMean) {
  for (double s : {0.05, 0.3, 1.0, 3.0}) {
    for (double loc : {-3.0, -1.2, -0.97, -0.5, 0.0, 0.7, 1.5}) {
      if (std::abs(loc) - 1.0 > kLocationReach * s) continue;  // out of reach: below
      const double m = TruncatedMeanByQuadrature(loc, s, -1.0, 1.0);
      const double got = TruncatedLocation(m, s, -1.0, 1.0);
      EXPECT_NEAR(TruncatedMeanByQuadrature(got, s, -1.0, 1.0), m, 1e-7) << "s " << s << " loc " << loc;
      if (s <= 1.0) {  // the truncated mean moves with the location
        EXPECT_NEAR(got, loc, 1e-4) << "s " << s;
      }
    }
  }
  EXPECT_EQ(TruncatedLocation(0.3, 0.01, -1.0, 1.0), 0.3);  // 8 sigmas inside both ends
  EXPECT_EQ(TruncatedLocation(0.99, 0.5, -INFINITY, INFINITY), 0.99);
  // Out of reach (a mean outside the prior): the nearest end of the search range.
  EXPECT_NEAR(TruncatedLocation(1.5, 0.1, -1.0, 1.0), 1.0 + kLocationReach * 0.1, 1e-9);
  EXPECT_NEAR(TruncatedLocation(-1.5, 0.1, -1.0, 1.0), -1.0 - kLocationReach * 0.1, 1e-9);
}

// The truncated posterior's mass in [low, x], by Simpson quadrature of its density.
double TruncatedMassByQuadrature(double loc, double s, double low, double high, double x) {
  auto mass = [&](double to) {
    constexpr int kIntervals = 4000;
    const double h = (to - low) / kIntervals;
    double sum = 0;
    for (int i = 0; i <= kIntervals; ++i) {
      const double z = (low + i * h - loc) / s;
      sum += (i == 0 || i == kIntervals ? 1 : i % 2 ? 4 : 2) * std::exp(-0.5 * z * z);
    }
    return sum * h / 3;
  };
  return mass(x) / mass(high);
}

TEST(CalibrationTest, TruncatedIntervalHoldsItsLevelWithEqualTails) {
  // Inside the prior, at an end, and a posterior wider than the prior (n_s's case).
  for (double mean : {0.0, 0.7, -0.95}) {
    for (double s : {0.05, 0.3, 1.5}) {
      for (double level : {0.683, 0.954}) {
        const Interval iv = TruncatedInterval(mean, s, -1.0, 1.0, level);
        const double loc = TruncatedLocation(mean, s, -1.0, 1.0);
        ASSERT_LE(-1.0, iv.low);
        ASSERT_LT(iv.low, iv.high);
        ASSERT_LE(iv.high, 1.0);
        EXPECT_NEAR(TruncatedMassByQuadrature(loc, s, -1.0, 1.0, iv.low), 0.5 * (1 - level), 1e-6)
            << "mean " << mean << " s " << s;
        EXPECT_NEAR(TruncatedMassByQuadrature(loc, s, -1.0, 1.0, iv.high), 0.5 * (1 + level), 1e-6)
            << "mean " << mean << " s " << s;
      }
    }
  }
  // Without a prior: the Gaussian's own interval, mean -+ 1.95996 sigma at 95%.
  const Interval plain = TruncatedInterval(0.3, 0.01, -INFINITY, INFINITY, 0.95);
  EXPECT_NEAR(plain.low, 0.3 - 1.959964 * 0.01, 1e-7);
  EXPECT_NEAR(plain.high, 0.3 + 1.959964 * 0.01, 1e-7);
}

TEST(CalibrationTest, TruncatedFitRecoversTheNoiseLevelNearThePriorEdges) {
  std::mt19937_64 rng(4);
  std::normal_distribution<double> n01(0.0, 1.0);
  std::uniform_real_distribution<double> u(0.0, 1.0);
  const int64_t n = 20000;
  const double k = 1.5;
  // Truths from N(loc, (k sigma)^2) truncated to [0, 1], loc near an edge; served as that
  // posterior's mean with a sigma k times too small.
  const double served[2] = {TruncatedMeanByQuadrature(0.05, k * 0.2, 0.0, 1.0),
                            TruncatedMeanByQuadrature(0.95, k * 0.2, 0.0, 1.0)};
  std::vector<double> truth(n), mean(n), sigma(n, 0.2);
  for (int64_t i = 0; i < n; ++i) {
    const int edge = u(rng) < 0.5 ? 0 : 1;
    mean[i] = served[edge];
    double t;
    do t = (edge ? 0.95 : 0.05) + k * sigma[i] * n01(rng);
    while (t < 0.0 || t > 1.0);
    truth[i] = t;
  }
  auto truncated = FitSigmaScale(truth.data(), mean.data(), sigma.data(), n, 0.0, 1.0, "toy");
  ASSERT_TRUE(truncated.ok()) << truncated.status().ToString();
  EXPECT_NEAR(*truncated, k, 0.04 * k);
  auto naive =
      FitSigmaScale(truth.data(), mean.data(), sigma.data(), n, -INFINITY, INFINITY, "toy");
  ASSERT_TRUE(naive.ok());
  EXPECT_GT(std::abs(*naive - k), 0.04 * k) << "the toy does not exercise truncation";
}

// A parameter the data measure weakly: truths flat in [-1, 1], a Gaussian likelihood of width 0.5,
// served as the exact posterior's mean (pulled towards the middle) with a sigma claimed half the
// width. The fit recovers the width (its spread over seeds is 1.6% at this n): the truncated
// posterior of (mean, 0.5) is the exact one.
TEST(CalibrationTest, TruncatedFitRecoversTheLikelihoodWidthOfAFlatPrior) {
  std::mt19937_64 rng(5);
  std::normal_distribution<double> n01(0.0, 1.0);
  std::uniform_real_distribution<double> u(-1.0, 1.0);
  const int64_t n = 20000;
  const double tau = 0.5;
  std::vector<double> truth(n), mean(n), sigma(n, tau / 2);
  for (int64_t i = 0; i < n; ++i) {
    truth[i] = u(rng);
    mean[i] = TruncatedMeanByQuadrature(truth[i] + tau * n01(rng), tau, -1.0, 1.0);
  }
  auto c = FitSigmaScale(truth.data(), mean.data(), sigma.data(), n, -1.0, 1.0, "toy");
  ASSERT_TRUE(c.ok()) << c.status().ToString();
  EXPECT_NEAR(*c, 2.0, 0.1);
}

TEST(CalibrationTest, FitCalibrationPerOutputAndBadInput) {
  ModelSpec spec = TinyWithHead(UncertaintyHead::kGaussian);
  std::mt19937_64 rng(9);
  std::normal_distribution<double> n01(0.0, 1.0);
  const int64_t n = 8000;
  const double k[3] = {0.5, 1.0, 2.0};
  std::vector<double> truth(n * 3), mean(n * 3, 0.0), cov(n * 9, 0.0);
  for (int64_t i = 0; i < n; ++i)
    for (int o = 0; o < 3; ++o) {
      cov[(i * 3 + o) * 3 + o] = 0.01;  // sigma 0.1 claimed
      truth[i * 3 + o] = k[o] * 0.1 * n01(rng);
    }
  auto c = FitCalibration(spec, truth, mean, cov, {}, {});
  ASSERT_TRUE(c.ok()) << c.status().ToString();
  for (int o = 0; o < 3; ++o) EXPECT_NEAR(c->sigma_scale[o], k[o], 0.04 * k[o]) << o;
  EXPECT_EQ(c->samples, n);

  cov[(5 * 3 + 1) * 3 + 1] = -1.0;  // a negative variance: refused, naming the output
  auto bad = FitCalibration(spec, truth, mean, cov, {}, {});
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.status().message().find("sigma_8"), std::string::npos) << bad.status().message();
  EXPECT_FALSE(FitSigmaScale(nullptr, nullptr, nullptr, 0, -INFINITY, INFINITY, "empty").ok());
}

// A head whose sigma is right on average but whose spread is twice the true one's (the true
// sigma grows as the square root of the claimed): the power calibration recovers the exponent
// 0.5, the plain factor cannot, and the calibrated sigmas match the true ones.
TEST(CalibrationTest, PowerFitRecoversAnExponent) {
  std::mt19937_64 rng(21);
  std::normal_distribution<double> n01(0.0, 1.0);
  std::uniform_real_distribution<double> logu(std::log(0.02), std::log(0.5));
  const int64_t n = 20000;
  const double r_true = 0.1;
  std::vector<double> truth(n), mean(n, 0.0), sigma(n);
  for (int64_t i = 0; i < n; ++i) {
    sigma[i] = std::exp(logu(rng));
    const double true_sigma = 0.8 * r_true * std::sqrt(sigma[i] / r_true);
    truth[i] = true_sigma * n01(rng);
  }
  auto fit = FitSigmaPower(truth.data(), mean.data(), sigma.data(), n, -INFINITY, INFINITY, "toy");
  ASSERT_TRUE(fit.ok()) << fit.status().ToString();
  EXPECT_NEAR(fit->exponent, 0.5, 0.03);
  Calibration c;
  c.sigma_scale = {fit->scale};
  c.sigma_exponent = {fit->exponent};
  c.sigma_reference = {fit->reference};
  for (double s : {0.02, 0.1, 0.5}) {
    const double want = 0.8 * r_true * std::sqrt(s / r_true);
    EXPECT_NEAR(c.Factor(0, s) * s, want, 0.04 * want) << "sigma " << s;
  }
  // Truncated to a prior it still finds the exponent (on fewer samples: the truncated fit is a
  // search).
  auto bounded = FitSigmaPower(truth.data(), mean.data(), sigma.data(), 4000, -3.0, 3.0, "toy");
  ASSERT_TRUE(bounded.ok()) << bounded.status().ToString();
  EXPECT_NEAR(bounded->exponent, 0.5, 0.08);
}

// Mean NLL of truths under N(mean, sigma^2) truncated to [low, high] (a test-side reference).
double TruncatedNllReference(const std::vector<double>& t, const std::vector<double>& m,
                             const std::vector<double>& s, double low, double high) {
  double sum = 0;
  for (size_t i = 0; i < t.size(); ++i) {
    const double loc = TruncatedLocation(m[i], s[i], low, high);
    const double z = (t[i] - loc) / s[i];
    const double a = (low - loc) / s[i] / std::sqrt(2.0), b = (high - loc) / s[i] / std::sqrt(2.0);
    // The tail that keeps its digits: locations far outside the prior have masses near 1e-200.
    const double mass = a > 0 ? 0.5 * (std::erfc(a) - std::erfc(b)) : 0.5 * (std::erfc(-b) - std::erfc(-a));
    sum += std::log(s[i]) + 0.5 * z * z + std::log(mass);
  }
  return sum / double(t.size());
}

// With a prior, each exponent's factor comes from a local search started at its neighbour's; the
// result must be as good as a brute force (FitSigmaScale's full search at every grid exponent).
TEST(CalibrationTest, PowerFitWithAPriorIsAsGoodAsABruteForce) {
  std::mt19937_64 rng(8);
  std::normal_distribution<double> n01(0.0, 1.0);
  std::uniform_real_distribution<double> logu(std::log(0.05), std::log(1.5)), u(-1.0, 1.0);
  const int64_t n = 3000;
  std::vector<double> truth, mean, sigma;
  while (int64_t(truth.size()) < n) {  // wide sigmas against a prior of [-1, 1]: truncation matters
    const double sg = std::exp(logu(rng)), loc = u(rng), width = 0.7 * std::pow(sg, 0.6);
    const double t = loc + width * n01(rng);
    if (t < -1.0 || t > 1.0) continue;
    const double m = TruncatedMeanByQuadrature(loc, width, -1.0, 1.0);  // the served mean
    truth.push_back(t), mean.push_back(m), sigma.push_back(sg);
  }
  auto fit = FitSigmaPower(truth.data(), mean.data(), sigma.data(), n, -1.0, 1.0, "toy");
  ASSERT_TRUE(fit.ok()) << fit.status().ToString();
  std::vector<double> work(n);
  auto transformed = [&](double b) {
    for (int64_t i = 0; i < n; ++i) work[i] = fit->reference * std::pow(sigma[i] / fit->reference, b);
    return work;
  };
  double brute = INFINITY;
  for (int g = 0; g <= 40; ++g) {
    std::vector<double> sb = transformed(0.05 * g);
    auto c = FitSigmaScale(truth.data(), mean.data(), sb.data(), n, -1.0, 1.0, "brute");
    if (!c.ok()) continue;
    for (double& v : sb) v *= *c;
    brute = std::min(brute, TruncatedNllReference(truth, mean, sb, -1.0, 1.0));
  }
  std::vector<double> mine = transformed(fit->exponent);
  for (double& v : mine) v *= fit->scale;
  EXPECT_LE(TruncatedNllReference(truth, mean, mine, -1.0, 1.0), brute + 1e-9);
  EXPECT_NEAR(fit->exponent, 0.6, 0.15);
}

// The joint step: unit marginals claimed and true, but a correlation of 0.6 claimed between the
// first two outputs whose errors are independent. The per-output fits leave the marginals alone
// (factors ~1), and the block's ellipses are then too small: E[d^2] = 2 / (1 - 0.6^2), so the
// joint factor is 1 / (1 - 0.36) = 1.5625. The third output's prior is only 4 sigma wide: it stays
// out of the block. Refitting on the calibrated posteriors finds nothing left (factor ~1).
TEST(CalibrationTest, PowerJointCalibrationFitsAJointFactorOnTheNarrowOutputs) {
  ModelSpec spec = TinyWithHead(UncertaintyHead::kGaussianFull);
  std::mt19937_64 rng(5);
  std::normal_distribution<double> n01(0.0, 1.0);
  const int64_t n = 4000;  // a truncated fit is a search: kept small
  const double rho = 0.6, half_width[3] = {1000, 1000, 2};
  std::vector<double> truth(n * 3), mean(n * 3, 0.0), cov(n * 9, 0.0), low(3), high(3);
  for (int o = 0; o < 3; ++o) {
    const OutputSpec& out = spec.outputs[o];
    const double a = out.offset - out.scale * half_width[o], b = out.offset + out.scale * half_width[o];
    low[o] = std::min(a, b), high[o] = std::max(a, b);
  }
  for (int64_t i = 0; i < n; ++i) {
    double* c = &cov[i * 9];
    c[0] = c[4] = c[8] = 1.0;
    c[1] = c[3] = rho;
    truth[i * 3 + 0] = n01(rng);
    truth[i * 3 + 1] = n01(rng);
    double z;
    do z = n01(rng); while (std::abs(z) > half_width[2]);  // inside the third output's prior
    truth[i * 3 + 2] = z;
  }
  // The scale form has no joint step: its factors are the per-output fits alone (~1 here).
  JointFit none;
  auto scale = FitCalibration(spec, truth, mean, cov, low, high, CalibrationForm::kScale, &none);
  ASSERT_TRUE(scale.ok()) << scale.status().ToString();
  EXPECT_TRUE(none.outputs.empty());
  for (int o = 0; o < 3; ++o) EXPECT_NEAR(scale->sigma_scale[o], 1.0, 0.05) << o;

  // The power form keeps the per-output fits too: with every claimed sigma at the reference its
  // factors are the scale form's, whatever the correlations.
  JointFit marginal;
  auto power = FitCalibration(spec, truth, mean, cov, low, high, CalibrationForm::kPower, &marginal);
  ASSERT_TRUE(power.ok()) << power.status().ToString();
  EXPECT_TRUE(marginal.outputs.empty());
  for (int o = 0; o < 3; ++o) EXPECT_NEAR(power->Factor(o, 1.0), scale->sigma_scale[o], 1e-4) << o;

  JointFit joint;
  auto c = FitCalibration(spec, truth, mean, cov, low, high, CalibrationForm::kPowerJoint, &joint);
  ASSERT_TRUE(c.ok()) << c.status().ToString();
  ASSERT_EQ(joint.outputs, (std::vector<int>{0, 1}));
  // d^2 has a spread about its size: 4000 samples give k to ~2.5% (one standard error).
  EXPECT_NEAR(joint.factor, 1.0 / (1 - rho * rho), 0.08 * joint.factor);
  // The power-joint form's block carries sqrt(k) on top of the per-output factors, the third
  // output nothing.
  for (int o = 0; o < 3; ++o)
    EXPECT_NEAR(c->Factor(o, 1.0), scale->sigma_scale[o] * (o < 2 ? std::sqrt(joint.factor) : 1.0), 1e-4)
        << o;
  auto again = FitJointFactor(spec, *c, truth, mean, cov);
  ASSERT_TRUE(again.ok()) << again.status().ToString();
  EXPECT_NEAR(again->factor, 1.0, 1e-9);

  // A block covariance that is not positive definite is refused, naming the sample.
  cov[7 * 9 + 1] = cov[7 * 9 + 3] = 1.5;  // |rho| > 1 in sample 7
  auto bad = FitJointFactor(spec, *c, truth, mean, cov);
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.status().message().find("sample 7"), std::string::npos) << bad.status().message();
}

TEST(CalibrationTest, CalibrationFormNamesRoundTripAndUnknownOnesAreRefused) {
  for (CalibrationForm f : {CalibrationForm::kScale, CalibrationForm::kPower, CalibrationForm::kPowerJoint,
                            CalibrationForm::kPowerEdge}) {
    auto parsed = ParseCalibrationForm(CalibrationFormName(f));
    ASSERT_TRUE(parsed.ok()) << CalibrationFormName(f);
    EXPECT_EQ(*parsed, f);
  }
  auto bad = ParseCalibrationForm("joint");
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.status().message().find("'joint'"), std::string::npos) << bad.status().message();
}

TEST(CalibrationTest, PowerCalibrationScalesTheCovarianceAndRoundTrips) {
  ModelSpec spec = TinyWithHead(UncertaintyHead::kGaussianFull);
  Calibration c;
  c.sigma_scale = {2.0, 1.0, 0.5};
  c.sigma_exponent = {0.5, 1.0, 2.0};
  c.sigma_reference = {0.1, 1.0, 1.0};
  c.samples = 7;
  // sigma 0.4, 1 and 2, correlated; f_i = s_i (sigma_i / r_i)^(b_i - 1) by hand.
  double cov[9] = {0.16, 0.1, 0.2, 0.1, 1.0, 0.3, 0.2, 0.3, 4.0};
  const double f[3] = {2.0 * std::pow(0.4 / 0.1, -0.5), 1.0, 0.5 * std::pow(2.0, 1.0)};
  double want[9];
  for (int i = 0; i < 3; ++i)
    for (int j = 0; j < 3; ++j) want[i * 3 + j] = cov[i * 3 + j] * f[i] * f[j];
  const double mean[3] = {0, 0, 0};
  ApplyCalibration(c, spec, mean, cov);
  for (int k = 0; k < 9; ++k) EXPECT_NEAR(cov[k], want[k], 1e-12) << k;

  auto back = CalibrationFromJson(CalibrationToJson(c, spec), spec);
  ASSERT_TRUE(back.ok()) << back.status().ToString();
  EXPECT_EQ(back->sigma_exponent, c.sigma_exponent);
  EXPECT_EQ(back->sigma_reference, c.sigma_reference);

  Calibration bad = c;
  bad.sigma_exponent[1] = -0.5;
  Status st = ValidateCalibration(bad, spec);
  ASSERT_FALSE(st.ok());
  EXPECT_NE(st.message().find("sigma_exponent.sigma_8"), std::string::npos) << st.message();
  bad = c;
  bad.sigma_reference[2] = 0;
  st = ValidateCalibration(bad, spec);
  ASSERT_FALSE(st.ok());
  EXPECT_NE(st.message().find("sigma_reference.n_s"), std::string::npos) << st.message();
  // An exponent object without a reference object is refused by name.
  std::string json = CalibrationToJson(c, spec);
  json.replace(json.find("\"sigma_reference\""), 17, "\"sigma_elsewhere\"");
  auto half = CalibrationFromJson(json, spec);
  ASSERT_FALSE(half.ok());
  EXPECT_NE(half.status().message().find("sigma_reference"), std::string::npos) << half.status().message();
}

// The prior range of `half_width` normalised units about 0 for each of spec's outputs, physical.
void SymmetricPrior(const ModelSpec& spec, const double* half_width, std::vector<double>* low,
                    std::vector<double>* high) {
  for (size_t o = 0; o < spec.outputs.size(); ++o) {
    const OutputSpec& out = spec.outputs[o];
    const double a = out.offset - out.scale * half_width[o], b = out.offset + out.scale * half_width[o];
    low->push_back(std::min(a, b)), high->push_back(std::max(a, b));
  }
}

TEST(CalibrationTest, EdgeTermScalesByTheMeansPlaceInThePriorAndRoundTrips) {
  ModelSpec spec = TinyWithHead(UncertaintyHead::kGaussianFull);
  Calibration c;
  c.sigma_scale = {2.0, 1.0, 0.5};
  c.sigma_edge = {0.5, 0.0, -0.25};
  const double half[3] = {10, 10, 10};
  SymmetricPrior(spec, half, &c.prior_low, &c.prior_high);
  ASSERT_TRUE(ValidateCalibration(c, spec).ok());
  // Means at u = 0.5, 1 and beyond the prior (u clamped to -kEdgeReach); f_i = s_i exp(e_i u_i^2).
  const double mean[3] = {5, 10, -45};
  const double f[3] = {2.0 * std::exp(0.5 * 0.25), 1.0, 0.5 * std::exp(-0.25 * kEdgeReach * kEdgeReach)};
  double cov[9] = {1, 0.5, 0.2, 0.5, 1, 0.3, 0.2, 0.3, 1}, want[9];
  for (int i = 0; i < 3; ++i)
    for (int j = 0; j < 3; ++j) want[i * 3 + j] = cov[i * 3 + j] * f[i] * f[j];
  ApplyCalibration(c, spec, mean, cov);
  for (int k = 0; k < 9; ++k) EXPECT_NEAR(cov[k], want[k], 1e-12) << k;
  // The physical mean's coordinate is the normalised one's (up to the sign of a negative scale).
  const OutputSpec& o0 = spec.outputs[0];
  EXPECT_NEAR(std::abs(c.EdgeCoordinate(0, o0.offset + o0.scale * 5.0)), 0.5, 1e-9);

  auto back = CalibrationFromJson(CalibrationToJson(c, spec), spec);
  ASSERT_TRUE(back.ok()) << back.status().ToString();
  EXPECT_EQ(back->sigma_edge, c.sigma_edge);

  Calibration bad = c;
  bad.sigma_edge[1] = kEdgeLimit + 0.5;
  Status st = ValidateCalibration(bad, spec);
  ASSERT_FALSE(st.ok());
  EXPECT_NE(st.message().find("sigma_edge.sigma_8"), std::string::npos) << st.message();
  bad = c;
  bad.prior_low.clear(), bad.prior_high.clear();
  st = ValidateCalibration(bad, spec);
  ASSERT_FALSE(st.ok());
  EXPECT_NE(st.message().find("sigma_edge needs a prior"), std::string::npos) << st.message();
}

// A toy whose errors grow towards the prior's edges, sigma_true = exp(e u^2) with claimed sigmas
// of 1: the power-edge form recovers e for the outputs narrow next to their prior and leaves the
// wide one (as wide as its prior) at 0. Truths are drawn from the truncated Gaussian at location L
// and the served mean is that distribution's mean, as the calibration reads a served mean.
TEST(CalibrationTest, PowerEdgeFitRecoversAKnownEdgeDependence) {
  ModelSpec spec = TinyWithHead(UncertaintyHead::kGaussianFull);
  std::mt19937_64 rng(11);
  std::normal_distribution<double> n01(0.0, 1.0);
  std::uniform_real_distribution<double> where(-0.95, 0.95);
  const int64_t n = 4000;
  const double half[3] = {15, 15, 1.5}, e_true[3] = {0.4, 0.0, 0.4};
  std::vector<double> truth(n * 3), mean(n * 3), cov(n * 9, 0.0), low, high;
  SymmetricPrior(spec, half, &low, &high);
  for (int64_t i = 0; i < n; ++i) {
    for (int o = 0; o < 3; ++o) {
      const double u = where(rng), loc = u * half[o], sigma = std::exp(e_true[o] * u * u);
      double t;
      do t = loc + sigma * n01(rng); while (std::abs(t) > half[o]);  // truths lie inside the prior
      const double a = (-half[o] - loc) / sigma, b = (half[o] - loc) / sigma;
      const double pdf_a = std::exp(-0.5 * a * a), pdf_b = std::exp(-0.5 * b * b);
      const double mass = std::sqrt(2 * M_PI) * NormalMassBetween(a, b);
      mean[i * 3 + o] = loc + sigma * (pdf_a - pdf_b) / mass, truth[i * 3 + o] = t;
      cov[(i * 3 + o) * 3 + o] = 1.0;
    }
  }
  auto c = FitCalibration(spec, truth, mean, cov, low, high, CalibrationForm::kPowerEdge);
  ASSERT_TRUE(c.ok()) << c.status().ToString();
  ASSERT_TRUE(c->has_edge());
  // 4000 samples pin e to ~0.03 (one standard error) here.
  EXPECT_NEAR(c->sigma_edge[0], 0.4, 0.1);
  EXPECT_NEAR(c->sigma_edge[1], 0.0, 0.1);
  EXPECT_EQ(c->sigma_edge[2], 0.0);  // a posterior as wide as its prior gets no edge term
  // At the centre the factor is the typical sigma there (1), at an edge exp(0.4) for output 0.
  EXPECT_NEAR(c->Factor(0, 1.0, 0.0), 1.0, 0.1);
  EXPECT_NEAR(c->Factor(0, 1.0, 1.0), std::exp(0.4), 0.15);
  // Without a prior there is no edge to fit: the form is the power form's.
  auto free = FitCalibration(spec, truth, mean, cov, {}, {}, CalibrationForm::kPowerEdge);
  ASSERT_TRUE(free.ok()) << free.status().ToString();
  EXPECT_FALSE(free->has_edge());
}

// Every parameter's gradient after one Backward of `net` from `diff`.
std::vector<std::vector<float>> Gradients(Network& net, const std::vector<float>& x,
                                          const std::vector<float>& diff) {
  std::vector<float> y(diff.size());
  net.Forward(x.data(), y.data());
  net.Backward(diff.data());
  std::vector<std::vector<float>> g;
  for (const Parameter& p : net.parameters()) g.emplace_back(p.grad, p.grad + p.numel());
  return g;
}

// covariance_gradient_head_only: the layers below the last learn exactly what they would learn
// with the covariance outputs' gradient zeroed, while the last layer's own gradient still sees it.
TEST(CovarianceGradientTest, HeadOnlyStopsAtTheLastLayer) {
  const ModelSpec spec = TinyWithHead(UncertaintyHead::kGaussianFull);
  const int batch = 2, w = spec.NetworkOutputs(), p = 3;
  auto make = [&](bool head_only) {
    NetworkOptions o;
    o.batch = batch;
    o.training = true;
    o.seed = 5;
    o.covariance_gradient_head_only = head_only;
    auto net = Network::Create(spec, o);
    EXPECT_TRUE(net.ok()) << net.status().ToString();
    return std::move(net).value();
  };
  std::mt19937_64 rng(3);
  std::uniform_real_distribution<float> u(0.f, 2.f), d(-1.f, 1.f);
  std::vector<float> x(size_t(batch) * spec.input_channels * 32 * 32 * 32);
  for (float& v : x) v = u(rng);
  std::vector<float> diff(size_t(batch) * w), means_only(diff);
  for (int i = 0; i < batch * w; ++i) {
    diff[i] = d(rng);
    means_only[i] = i % w < p ? diff[i] : 0.f;
  }
  auto head_only = Gradients(*make(true), x, diff);
  auto full = Gradients(*make(false), x, diff);
  auto zeroed = Gradients(*make(false), x, means_only);
  const size_t n = head_only.size();
  ASSERT_EQ(n, full.size());
  ASSERT_GE(n, 4u);
  for (size_t t = 0; t + 2 < n; ++t) {  // below the last layer: as if the covariance had no gradient
    EXPECT_EQ(head_only[t], zeroed[t]) << "parameter " << t;
    EXPECT_NE(head_only[t], full[t]) << "parameter " << t << ": the test does not exercise the cut";
  }
  for (size_t t = n - 2; t < n; ++t) EXPECT_EQ(head_only[t], full[t]) << "last layer, parameter " << t;
}

}  // namespace
}  // namespace cosmoflow
