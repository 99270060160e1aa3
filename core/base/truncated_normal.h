// The truncated Gaussian posterior of a served (mean, sigma) on a prior range: where it sits and
// its central intervals. Shared by the trainer's calibration fit (core/nn/uncertainty.h), the
// server's clients and their tests; tools/calibration.py holds the same arithmetic in Python.
#pragma once

namespace cosmoflow {

// Phi(b) - Phi(a) for a <= b (standard normal), from the tail that keeps its digits.
double NormalMassBetween(double a, double b);

// The truncated posterior of a served (mean, sigma) on the prior [low, high] is the Gaussian of
// scale sigma whose truncation to the prior has that mean: the served mean is a posterior mean,
// already pulled inside the prior, and a Gaussian centred on it would pull it a second time (the
// exact posterior of a flat prior and a Gaussian likelihood is centred on the likelihood's peak).
// Returns its location: `mean` itself without a finite prior or 8 sigmas inside both ends; else
// found within kLocationReach sigmas beyond the prior (a mean that no location there reaches, as
// one outside the prior, takes the nearest end). tools/calibration.py's location() is the same.
inline constexpr double kLocationReach = 30.0;
double TruncatedLocation(double mean, double sigma, double low, double high);

// The central interval holding `level` (in (0, 1)) of that truncated posterior: equal mass
// (1 - level) / 2 below and above it, inside [low, high]. Without a finite prior, mean -+ z sigma.
// tools/calibration.py's interval() is the same.
struct Interval {
  double low = 0, high = 0;
};
Interval TruncatedInterval(double mean, double sigma, double low, double high, double level);

}  // namespace cosmoflow
