// Linear theory for flat LambdaCDM: transfer functions, the sigma_8-normalised matter power
// spectrum and the linear growth factor. Everything the synthetic-universe generator needs to turn
// (Omega_M, sigma_8, n_s) into a Gaussian initial density field.
//
// Units: wavenumbers k in h/Mpc, lengths in Mpc/h, P(k) in (Mpc/h)^3, with the Fourier convention
//   delta(k) = \int d^3x delta(x) e^{-ik.x},  <delta(k) delta*(k')> = (2 pi)^3 delta_D(k-k') P(k),
//   sigma^2(R) = 1/(2 pi^2) \int_0^inf dk k^2 P(k) W^2(kR),  W(x) = 3 (sin x - x cos x) / x^3
// (top-hat window; Peebles 1980, "The Large-Scale Structure of the Universe", eq. 25.11).
//
// Power spectrum: P(k) = A k^{n_s} T(k)^2, with A fixed so that sigma(8 Mpc/h) = sigma_8 today
// (z = 0). Transfer functions:
//  - Eisenstein & Hu 1998, ApJ 496, 605, "Baryonic features in the matter transfer function":
//    the full fit with baryon acoustic oscillations, eqs. 2-24 (T = f_b T_b + f_c T_c, eq. 16).
//    Constants as in the authors' tf_fit.c; T_CMB = 2.7255 K.
//  - BBKS: Bardeen, Bond, Kaiser & Szalay 1986, ApJ 304, 15, eq. G3,
//    T(q) = ln(1 + 2.34 q)/(2.34 q) [1 + 3.89 q + (16.1 q)^2 + (5.46 q)^3 + (6.71 q)^4]^{-1/4},
//    q = k / Gamma (k in h/Mpc), with Sugiyama's (1995, ApJS 100, 281) shape parameter
//    Gamma = Omega_M h exp(-Omega_b (1 + sqrt(2h) / Omega_M)).
//
// Growth factor (linear, growing mode, flat LambdaCDM without radiation; Heath 1977, MNRAS 179,
// 351; Peebles 1980 eq. 10.12):
//   D(a) \propto H(a) \int_0^a da' / (a' H(a'))^3,   H(a)/H0 = sqrt(Omega_M a^-3 + 1 - Omega_M),
// normalised to D(z = 0) = 1, so D(z) scales the z = 0 linear field back to redshift z.
// Second-order growth (for 2LPT): D2(a) = -3/7 D(a)^2 Omega_M(a)^{-1/143}
// (Bouchet et al. 1995, A&A 296, 575, eq. 45).
#pragma once

#include <string>

#include "core/base/status.h"

namespace cosmoflow {
namespace synth {

enum class TransferFunction { kEisensteinHu, kBbks };

const char* TransferFunctionName(TransferFunction t);  // "eh98", "bbks"
StatusOr<TransferFunction> ParseTransferFunction(const std::string& name);

struct CosmologyParams {
  double omega_m = 0.3;    // total matter density today, in units of the critical density
  double sigma_8 = 0.8;    // rms linear density contrast in top-hat spheres of 8 Mpc/h, z = 0
  double n_s = 0.96;       // primordial spectral index
  double omega_b = 0.045;  // baryon density
  double h = 0.703;        // H0 / (100 km/s/Mpc)
  double t_cmb = 2.7255;   // CMB temperature in K (only used by Eisenstein-Hu)

  // Checks the physical ranges this module supports (0 < Omega_b < Omega_M <= 1, 0 < h < 2, ...).
  // Errors name the parameter and its value.
  Status Validate() const;
};

// A flat LambdaCDM cosmology with its power spectrum normalised to sigma_8. Immutable after
// Create(); all methods are const and thread-safe.
class Cosmology {
 public:
  static StatusOr<Cosmology> Create(const CosmologyParams& params,
                                    TransferFunction transfer = TransferFunction::kEisensteinHu);

  const CosmologyParams& params() const { return params_; }
  TransferFunction transfer() const { return transfer_; }

  // Matter transfer function T(k), k in h/Mpc; T -> 1 as k -> 0.
  double Transfer(double k) const;
  // Linear matter power spectrum at z = 0 in (Mpc/h)^3, k in h/Mpc; 0 for k <= 0.
  double LinearPower(double k) const;
  // Normalisation A of P(k) = A k^n_s T(k)^2.
  double amplitude() const { return amplitude_; }

  // rms of the z = 0 linear field smoothed with a top-hat of radius R (Mpc/h), by numerical
  // integration of P(k) (Simpson's rule in ln k over 1e-5..1e3 h/Mpc).
  double SigmaR(double radius) const;

  // Non-linear wavenumber k_nl (h/Mpc) at redshift z: D(z)^2 / (2 pi^2) \int_0^{k_nl} k^2 P(k) dk
  // = 1 (the scale where the linear variance of the field reaches unity).
  double NonLinearWavenumber(double z = 0) const;

  // Linear growth factor, D(0) = 1, and the second-order factor D2 (negative; see above).
  double GrowthFactor(double z) const;
  double SecondOrderGrowthFactor(double z) const;
  // Omega_M(z) = Omega_M (1+z)^3 / (Omega_M (1+z)^3 + 1 - Omega_M).
  double OmegaMatter(double z) const;

 private:
  Cosmology() = default;
  double EisensteinHuTransfer(double k) const;
  double BbksTransfer(double k) const;
  double UnnormalisedGrowth(double a) const;  // H(a) \int_0^a da'/(a'H)^3, in H0 = 1 units

  CosmologyParams params_;
  TransferFunction transfer_ = TransferFunction::kEisensteinHu;
  double amplitude_ = 1;
  double growth_today_ = 1;  // UnnormalisedGrowth(1)

  // Eisenstein-Hu scalars that depend only on the cosmology (names follow tf_fit.c).
  struct EhScalars {
    double f_baryon = 0, k_equality = 0, sound_horizon = 0, k_silk = 0;
    double alpha_c = 0, beta_c = 0, alpha_b = 0, beta_b = 0, beta_node = 0;
  } eh_;
};

// Top-hat window in Fourier space, W(x) = 3 (sin x - x cos x) / x^3, with its series near 0.
double TopHatWindow(double x);

}  // namespace synth
}  // namespace cosmoflow
