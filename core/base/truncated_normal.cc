#include "core/base/truncated_normal.h"

#include <algorithm>
#include <cmath>

namespace cosmoflow {
namespace {

constexpr double kInvSqrt2Pi = 0.39894228040143267794;

}  // namespace

double NormalMassBetween(double a, double b) {
  constexpr double kInvSqrt2 = 0.70710678118654752440;
  if (a > 0) return 0.5 * (std::erfc(a * kInvSqrt2) - std::erfc(b * kInvSqrt2));
  return 0.5 * (std::erfc(-b * kInvSqrt2) - std::erfc(-a * kInvSqrt2));
}

double TruncatedLocation(double mean, double sigma, double low, double high) {
  if (!std::isfinite(low) || !std::isfinite(high)) return mean;
  if (mean - low >= 8 * sigma && high - mean >= 8 * sigma) return mean;
  const double tol = 1e-10 * (high - low);
  double lo = low - kLocationReach * sigma, hi = high + kLocationReach * sigma;
  double x = std::min(hi, std::max(lo, mean));
  // Newton steps on the truncated mean (its slope in the location is the truncated variance over
  // sigma^2, in (0, 1]), kept inside the bracket, else its midpoint.
  for (int it = 0; it < 100; ++it) {
    const double a = (low - x) / sigma, b = (high - x) / sigma;
    const double mass = std::max(1e-300, NormalMassBetween(a, b));
    const double pa = kInvSqrt2Pi * std::exp(-0.5 * a * a);
    const double pb = kInvSqrt2Pi * std::exp(-0.5 * b * b);
    const double shift = (pa - pb) / mass;
    const double f = x + sigma * shift - mean;
    if (std::abs(f) <= tol) break;
    (f < 0 ? lo : hi) = x;
    if (hi - lo <= tol) break;
    const double slope = 1 + (a * pa - b * pb) / mass - shift * shift;
    const double step = x - f / std::max(slope, 1e-12);
    x = step > lo && step < hi ? step : 0.5 * (lo + hi);
  }
  return x;
}

Interval TruncatedInterval(double mean, double sigma, double low, double high, double level) {
  const bool bounded = std::isfinite(low) && std::isfinite(high);
  const double loc = bounded ? TruncatedLocation(mean, sigma, low, high) : mean;
  const double a = bounded ? (low - loc) / sigma : -40.0, b = bounded ? (high - loc) / sigma : 40.0;
  const double mass = std::max(1e-300, NormalMassBetween(a, b));
  // The standardised point below which `fraction` of the truncated mass lies, by bisection on the
  // mass from a (monotone, so 200 halvings of [a, b] reach double precision).
  auto quantile = [&](double fraction) {
    double lo = a, hi = b;
    for (int it = 0; it < 200 && hi - lo > 1e-15 * std::max(1.0, std::abs(lo)); ++it) {
      const double mid = 0.5 * (lo + hi);
      (NormalMassBetween(a, mid) < fraction * mass ? lo : hi) = mid;
    }
    return 0.5 * (lo + hi);
  };
  return {loc + sigma * quantile(0.5 * (1 - level)), loc + sigma * quantile(0.5 * (1 + level))};
}

}  // namespace cosmoflow
