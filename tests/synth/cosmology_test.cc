#include "synth/cosmology.h"

#include <gtest/gtest.h>

#include <cmath>

namespace cosmoflow {
namespace synth {
namespace {

Cosmology Make(double omega_m, double sigma_8, double n_s,
               TransferFunction t = TransferFunction::kEisensteinHu) {
  CosmologyParams p;
  p.omega_m = omega_m;
  p.sigma_8 = sigma_8;
  p.n_s = n_s;
  auto c = Cosmology::Create(p, t);
  EXPECT_TRUE(c.ok()) << c.status().ToString();
  return *c;
}

// Carroll, Press & Turner 1992 (ARA&A 30, 499, eq. 29) fit of the growth factor: an independent
// approximation, good to ~1% for these parameters.
double CarrollPressTurner(double omega_m, double z) {
  auto g = [](double om, double ol) {
    return 2.5 * om / (std::pow(om, 4.0 / 7.0) - ol + (1 + om / 2) * (1 + ol / 70));
  };
  const double a3 = std::pow(1 + z, 3);
  const double om_z = omega_m * a3 / (omega_m * a3 + 1 - omega_m);
  return g(om_z, 1 - om_z) / (g(omega_m, 1 - omega_m) * (1 + z));
}

TEST(CosmologyTest, GrowthFactorMatchesKnownValues) {
  Cosmology c = Make(0.3, 0.8, 0.96);
  EXPECT_DOUBLE_EQ(c.GrowthFactor(0), 1.0);
  const double d1 = c.GrowthFactor(1.0);
  EXPECT_NEAR(d1, 0.61, 0.01);  // the textbook value for Omega_M = 0.3
  for (double z : {0.5, 1.0, 1.5, 3.0}) {
    EXPECT_NEAR(c.GrowthFactor(z) / CarrollPressTurner(0.3, z), 1.0, 0.01) << "z = " << z;
  }
  // Decreasing with z.
  EXPECT_GT(c.GrowthFactor(0.5), c.GrowthFactor(1.5));
  EXPECT_GT(c.GrowthFactor(1.5), c.GrowthFactor(3.0));
}

TEST(CosmologyTest, EinsteinDeSitterGrowthIsTheScaleFactor) {
  CosmologyParams p;
  p.omega_m = 1.0;
  auto c = Cosmology::Create(p);
  ASSERT_TRUE(c.ok());
  for (double z : {0.5, 1.0, 3.0, 9.0}) EXPECT_NEAR(c->GrowthFactor(z), 1 / (1 + z), 1e-6);
  // D2 = -3/7 D^2 exactly when Omega_M(z) = 1.
  EXPECT_NEAR(c->SecondOrderGrowthFactor(1.0), -3.0 / 7.0 * 0.25, 1e-6);
}

TEST(CosmologyTest, LowMatterDensityGrowsLessRecently) {
  // With less matter, growth freezes earlier, so D(z)/D(0) is larger at fixed z.
  EXPECT_GT(Make(0.25, 0.8, 0.96).GrowthFactor(1.0), Make(0.35, 0.8, 0.96).GrowthFactor(1.0));
}

TEST(CosmologyTest, Sigma8NormalisationHolds) {
  for (auto t : {TransferFunction::kEisensteinHu, TransferFunction::kBbks}) {
    for (double s8 : {0.78, 0.85, 0.95}) {
      Cosmology c = Make(0.3, s8, 0.96, t);
      EXPECT_NEAR(c.SigmaR(8.0), s8, 1e-6 * s8);
      // sigma(R) falls with R.
      EXPECT_GT(c.SigmaR(4.0), c.SigmaR(8.0));
      EXPECT_LT(c.SigmaR(16.0), c.SigmaR(8.0));
    }
  }
  // P scales with sigma_8^2.
  EXPECT_NEAR(Make(0.3, 0.9, 0.96).LinearPower(0.1) / Make(0.3, 0.8, 0.96).LinearPower(0.1),
              (0.9 * 0.9) / (0.8 * 0.8), 1e-9);
}

TEST(CosmologyTest, TransferFunctionsBehave) {
  Cosmology eh = Make(0.3, 0.8, 0.96);
  Cosmology bbks = Make(0.3, 0.8, 0.96, TransferFunction::kBbks);
  EXPECT_NEAR(eh.Transfer(1e-5), 1.0, 1e-3);
  EXPECT_NEAR(bbks.Transfer(1e-5), 1.0, 1e-3);
  // Monotone decline on large scales; the two fits agree to ~20% where both are valid.
  for (double k : {0.01, 0.05, 0.1, 0.3, 1.0}) {
    EXPECT_LT(eh.Transfer(k), 1.0);
    EXPECT_NEAR(eh.Transfer(k) / bbks.Transfer(k), 1.0, 0.2) << "k = " << k;
  }
  // Small-scale asymptote: T ~ ln(k)/k^2, so T(10)/T(1) is a few 1e-2 (not 1e-1, not 1e-4).
  const double ratio = eh.Transfer(10.0) / eh.Transfer(1.0);
  EXPECT_GT(ratio, 0.01);
  EXPECT_LT(ratio, 0.05);
  // The linear P(k) peaks near k ~ 0.02 h/Mpc for Omega_M h ~ 0.2.
  double kpeak = 0, pmax = 0;
  for (double lk = -3; lk < 0; lk += 0.01) {
    const double k = std::pow(10, lk);
    if (eh.LinearPower(k) > pmax) pmax = eh.LinearPower(k), kpeak = k;
  }
  EXPECT_GT(kpeak, 0.01);
  EXPECT_LT(kpeak, 0.03);
  // P(k = 0.1 h/Mpc) is ~5-7e3 (Mpc/h)^3 for this cosmology at z = 0.
  EXPECT_GT(eh.LinearPower(0.1), 4000);
  EXPECT_LT(eh.LinearPower(0.1), 8000);
}

TEST(CosmologyTest, RejectsUnphysicalParameters) {
  CosmologyParams p;
  p.omega_m = 1.5;
  auto c = Cosmology::Create(p);
  ASSERT_FALSE(c.ok());
  EXPECT_NE(c.status().message().find("Omega_M"), std::string::npos);
  p = CosmologyParams();
  p.sigma_8 = -1;
  EXPECT_NE(Cosmology::Create(p).status().message().find("sigma_8"), std::string::npos);
  p = CosmologyParams();
  p.omega_b = 0.5;
  EXPECT_NE(Cosmology::Create(p).status().message().find("Omega_b"), std::string::npos);
  EXPECT_FALSE(ParseTransferFunction("cdm").ok());
  EXPECT_TRUE(ParseTransferFunction("bbks").ok());
}

}  // namespace
}  // namespace synth
}  // namespace cosmoflow
