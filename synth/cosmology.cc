#include "synth/cosmology.h"

#include <cmath>
#include <sstream>

namespace cosmoflow {
namespace synth {
namespace {

std::string Num(double v) {
  std::ostringstream s;
  s << v;
  return s.str();
}

// Simpson's rule for f over [a, b] with n (even) intervals.
template <typename F>
double Simpson(F f, double a, double b, int n) {
  const double h = (b - a) / n;
  double sum = f(a) + f(b);
  for (int i = 1; i < n; ++i) sum += f(a + i * h) * (i % 2 ? 4.0 : 2.0);
  return sum * h / 3.0;
}

}  // namespace

const char* TransferFunctionName(TransferFunction t) {
  return t == TransferFunction::kBbks ? "bbks" : "eh98";
}

StatusOr<TransferFunction> ParseTransferFunction(const std::string& name) {
  if (name == "eh98" || name == "eh" || name == "eisenstein-hu")
    return TransferFunction::kEisensteinHu;
  if (name == "bbks") return TransferFunction::kBbks;
  return InvalidArgumentError("transfer function '" + name + "' is not one of eh98, bbks");
}

Status CosmologyParams::Validate() const {
  auto bad = [](const char* name, double v, const char* why) {
    return InvalidArgumentError(std::string(name) + " = " + Num(v) + ": " + why);
  };
  if (!(omega_m > 0 && omega_m <= 1)) return bad("Omega_M", omega_m, "must be in (0, 1]");
  if (!(omega_b > 0 && omega_b < omega_m))
    return bad("Omega_b", omega_b, "must be in (0, Omega_M)");
  if (!(sigma_8 > 0 && sigma_8 < 10)) return bad("sigma_8", sigma_8, "must be in (0, 10)");
  if (!(n_s > 0 && n_s < 3)) return bad("n_s", n_s, "must be in (0, 3)");
  if (!(h > 0 && h < 2)) return bad("h", h, "must be in (0, 2)");
  if (!(t_cmb > 0 && t_cmb < 10)) return bad("T_CMB", t_cmb, "must be in (0, 10) K");
  return Status::Ok();
}

StatusOr<Cosmology> Cosmology::Create(const CosmologyParams& params, TransferFunction transfer) {
  CF_RETURN_IF_ERROR(params.Validate());
  Cosmology c;
  c.params_ = params;
  c.transfer_ = transfer;

  // Eisenstein & Hu 1998, eqs. 2-24 (TFset_parameters in tf_fit.c).
  const double omhh = params.omega_m * params.h * params.h;
  const double obhh = params.omega_b * params.h * params.h;
  const double theta_cmb = params.t_cmb / 2.7;
  const double theta2 = theta_cmb * theta_cmb, theta4 = theta2 * theta2;
  EhScalars& e = c.eh_;
  e.f_baryon = params.omega_b / params.omega_m;
  const double z_equality = 2.50e4 * omhh / theta4;  // eq. 2
  e.k_equality = 0.0746 * omhh / theta2;             // eq. 3, 1/Mpc
  const double z_drag_b1 = 0.313 * std::pow(omhh, -0.419) * (1 + 0.607 * std::pow(omhh, 0.674));
  const double z_drag_b2 = 0.238 * std::pow(omhh, 0.223);
  const double z_drag = 1291 * std::pow(omhh, 0.251) / (1 + 0.659 * std::pow(omhh, 0.828)) *
                        (1 + z_drag_b1 * std::pow(obhh, z_drag_b2));   // eq. 4
  const double r_drag = 31.5 * obhh / theta4 * (1000 / (1 + z_drag));  // eq. 5
  const double r_equality = 31.5 * obhh / theta4 * (1000 / z_equality);
  e.sound_horizon = 2. / 3. / e.k_equality * std::sqrt(6. / r_equality) *
                    std::log((std::sqrt(1 + r_drag) + std::sqrt(r_drag + r_equality)) /
                             (1 + std::sqrt(r_equality)));  // eq. 6, Mpc
  e.k_silk = 1.6 * std::pow(obhh, 0.52) * std::pow(omhh, 0.73) *
             (1 + std::pow(10.4 * omhh, -0.95));  // eq. 7
  const double alpha_c_a1 = std::pow(46.9 * omhh, 0.670) * (1 + std::pow(32.1 * omhh, -0.532));
  const double alpha_c_a2 = std::pow(12.0 * omhh, 0.424) * (1 + std::pow(45.0 * omhh, -0.582));
  e.alpha_c = std::pow(alpha_c_a1, -e.f_baryon) *
              std::pow(alpha_c_a2, -e.f_baryon * e.f_baryon * e.f_baryon);  // eq. 11
  const double beta_c_b1 = 0.944 / (1 + std::pow(458 * omhh, -0.708));
  const double beta_c_b2 = std::pow(0.395 * omhh, -0.0266);
  e.beta_c = 1 / (1 + beta_c_b1 * (std::pow(1 - e.f_baryon, beta_c_b2) - 1));  // eq. 12
  const double y = z_equality / (1 + z_drag);
  const double sy = std::sqrt(1 + y);
  const double alpha_b_g = y * (-6 * sy + (2 + 3 * y) * std::log((sy + 1) / (sy - 1)));  // eq. 15
  e.alpha_b = 2.07 * e.k_equality * e.sound_horizon * std::pow(1 + r_drag, -0.75) * alpha_b_g;
  e.beta_node = 8.41 * std::pow(omhh, 0.435);  // eq. 23
  e.beta_b =
      0.5 + e.f_baryon + (3 - 2 * e.f_baryon) * std::sqrt(std::pow(17.2 * omhh, 2) + 1);  // eq. 24

  c.growth_today_ = c.UnnormalisedGrowth(1.0);
  c.amplitude_ = 1.0;
  const double s8 = c.SigmaR(8.0);
  if (!(s8 > 0) || !std::isfinite(s8)) {
    return InternalError("sigma(8 Mpc/h) of the unnormalised spectrum is " + Num(s8));
  }
  c.amplitude_ = (params.sigma_8 * params.sigma_8) / (s8 * s8);
  return c;
}

double Cosmology::EisensteinHuTransfer(double k_hmpc) const {
  const EhScalars& e = eh_;
  const double k = k_hmpc * params_.h;          // the fit is written in 1/Mpc
  const double q = k / (13.41 * e.k_equality);  // eq. 10
  const double xx = k * e.sound_horizon;
  const double q2 = q * q;
  // CDM part, eqs. 17-20.
  const double ln_beta = std::log(M_E + 1.8 * e.beta_c * q);
  const double ln_nobeta = std::log(M_E + 1.8 * q);
  const double c_alpha = 14.2 / e.alpha_c + 386 / (1 + 69.9 * std::pow(q, 1.08));
  const double c_noalpha = 14.2 + 386 / (1 + 69.9 * std::pow(q, 1.08));
  const double f = 1 / (1 + std::pow(xx / 5.4, 4));  // eq. 18
  const double t_c = f * ln_beta / (ln_beta + c_noalpha * q2) +
                     (1 - f) * ln_beta / (ln_beta + c_alpha * q2);  // eq. 17
  // Baryon part, eqs. 21-22.
  const double s_tilde = e.sound_horizon / std::cbrt(1 + std::pow(e.beta_node / xx, 3));
  const double xx_tilde = k * s_tilde;
  const double t_b_t0 = ln_nobeta / (ln_nobeta + c_noalpha * q2);
  const double sinc = xx_tilde > 1e-8 ? std::sin(xx_tilde) / xx_tilde : 1.0;
  const double t_b =
      sinc * (t_b_t0 / (1 + std::pow(xx / 5.2, 2)) + e.alpha_b / (1 + std::pow(e.beta_b / xx, 3)) *
                                                         std::exp(-std::pow(k / e.k_silk, 1.4)));
  return e.f_baryon * t_b + (1 - e.f_baryon) * t_c;  // eq. 16
}

double Cosmology::BbksTransfer(double k) const {
  const double om = params_.omega_m, ob = params_.omega_b, h = params_.h;
  const double gamma = om * h * std::exp(-ob * (1 + std::sqrt(2 * h) / om));
  const double q = k / gamma;
  if (q < 1e-8) return 1.0;
  return std::log(1 + 2.34 * q) / (2.34 * q) *
         std::pow(
             1 + 3.89 * q + std::pow(16.1 * q, 2) + std::pow(5.46 * q, 3) + std::pow(6.71 * q, 4),
             -0.25);
}

double Cosmology::Transfer(double k) const {
  if (k <= 0) return 1.0;
  return transfer_ == TransferFunction::kBbks ? BbksTransfer(k) : EisensteinHuTransfer(k);
}

double Cosmology::LinearPower(double k) const {
  if (k <= 0) return 0.0;
  const double t = Transfer(k);
  return amplitude_ * std::pow(k, params_.n_s) * t * t;
}

double TopHatWindow(double x) {
  if (std::fabs(x) < 1e-3) return 1 - x * x / 10;  // series: 1 - x^2/10 + O(x^4)
  return 3 * (std::sin(x) - x * std::cos(x)) / (x * x * x);
}

double Cosmology::SigmaR(double radius) const {
  // In ln k: sigma^2 = 1/(2 pi^2) \int dlnk k^3 P(k) W^2(kR). The integrand is smooth in ln k;
  // 4096 Simpson intervals over 18 e-folds resolve the BAO wiggles and the window's oscillations.
  auto integrand = [&](double lnk) {
    const double k = std::exp(lnk);
    const double w = TopHatWindow(k * radius);
    return k * k * k * LinearPower(k) * w * w;
  };
  const double s2 = Simpson(integrand, std::log(1e-5), std::log(1e3), 4096) / (2 * M_PI * M_PI);
  return std::sqrt(s2);
}

double Cosmology::NonLinearWavenumber(double z) const {
  // Cumulative trapezoid in ln k until the variance reaches 1 / D(z)^2.
  const double d = GrowthFactor(z);
  const double target = 1 / (d * d);
  const double dlnk = 0.001;
  double var = 0, lnk = std::log(1e-5);
  auto delta2 = [&](double lk) {
    const double k = std::exp(lk);
    return k * k * k * LinearPower(k) / (2 * M_PI * M_PI);
  };
  while (lnk < std::log(1e3)) {
    const double step = 0.5 * (delta2(lnk) + delta2(lnk + dlnk)) * dlnk;
    if (var + step >= target) return std::exp(lnk + dlnk * (target - var) / step);
    var += step;
    lnk += dlnk;
  }
  return 1e3;
}

double Cosmology::UnnormalisedGrowth(double a) const {
  // D(a) = (5/2) Omega_M E(a) \int_0^a da' / (a' E(a'))^3 with E = H/H0. Substituting a' = a u^2
  // removes the a'^(3/2) behaviour near 0 (the integrand ~ a'^{3/2}) and keeps Simpson accurate.
  const double om = params_.omega_m, ol = 1 - om;
  auto e_of = [&](double x) { return std::sqrt(om / (x * x * x) + ol); };
  auto integrand = [&](double u) {
    if (u <= 0) return 0.0;
    const double x = a * u * u;
    const double xe = x * e_of(x);
    return 2 * a * u / (xe * xe * xe);
  };
  return 2.5 * om * e_of(a) * Simpson(integrand, 0.0, 1.0, 2000);
}

double Cosmology::GrowthFactor(double z) const {
  return UnnormalisedGrowth(1 / (1 + z)) / growth_today_;
}

double Cosmology::OmegaMatter(double z) const {
  const double om = params_.omega_m;
  const double a3 = std::pow(1 + z, 3);
  return om * a3 / (om * a3 + 1 - om);
}

double Cosmology::SecondOrderGrowthFactor(double z) const {
  const double d = GrowthFactor(z);
  return -3.0 / 7.0 * d * d * std::pow(OmegaMatter(z), -1.0 / 143.0);
}

}  // namespace synth
}  // namespace cosmoflow
