#include "synth/universe.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <functional>
#include <numeric>

#include "synth/random.h"

namespace cosmoflow {
namespace synth {
namespace {

Cosmology Make(double omega_m, double sigma_8, double n_s) {
  CosmologyParams p;
  p.omega_m = omega_m;
  p.sigma_8 = sigma_8;
  p.n_s = n_s;
  auto c = Cosmology::Create(p);
  EXPECT_TRUE(c.ok()) << c.status().ToString();
  return *c;
}

std::unique_ptr<UniverseGenerator> MakeGenerator(UniverseOptions o) {
  auto g = UniverseGenerator::Create(o);
  EXPECT_TRUE(g.ok()) << g.status().ToString();
  return g.ok() ? std::move(g).value() : nullptr;
}

// A particle-mesh cube of (0.3, 0.8, 0.96), seed 5, sample 0: side^3 voxels of 1 Mpc/h at
// `redshifts`, with `set` applied to the options (the one setting a test varies).
Cube PmCube(int side, std::vector<double> redshifts,
            const std::function<void(UniverseOptions&)>& set) {
  UniverseOptions o;
  o.side = side;
  o.voxel_size = 1.0;
  o.redshifts = std::move(redshifts);
  set(o);
  auto cube = MakeGenerator(o)->Generate(Make(0.3, 0.8, 0.96), 5, 0);
  EXPECT_TRUE(cube.ok());
  return std::move(cube).value();
}

double Variance(const int16_t* v, int64_t n) {
  double s = 0, s2 = 0;
  for (int64_t i = 0; i < n; ++i) s += v[i], s2 += double(v[i]) * v[i];
  const double m = s / n;
  return s2 / n - m * m;
}

// The generated linear field has the input power spectrum: averaged over 32 realisations of a
// 32^3 grid (box 128 Mpc/h), every bin with enough modes is within 6% of the model averaged over
// the same modes, and all bins together within 1.5%.
TEST(UniverseTest, LinearFieldHasTheInputPowerSpectrum) {
  UniverseOptions o;
  o.side = 32;
  o.voxel_size = 4.0;
  auto g = MakeGenerator(o);
  ASSERT_NE(g, nullptr);
  Cosmology c = Make(0.3, 0.8, 0.96);
  auto model = [&](double k) { return c.LinearPower(k); };
  const int realisations = 32;
  std::vector<double> power, expected;
  std::vector<int64_t> modes;
  std::vector<float> delta;
  for (int r = 0; r < realisations; ++r) {
    ASSERT_TRUE(g->LinearDensity(c, 11, r, &delta).ok());
    ASSERT_EQ(delta.size(), 32u * 32 * 32);
    PowerSpectrumBins bins = MeasurePowerSpectrum(delta.data(), 32, o.box_size(), model);
    if (power.empty()) {
      power.assign(bins.power.size(), 0);
      expected = bins.model;
      modes = bins.modes;
    }
    for (size_t b = 0; b < bins.power.size(); ++b) power[b] += bins.power[b] / realisations;
  }
  double sum_measured = 0, sum_expected = 0;
  for (size_t b = 0; b < power.size(); ++b) {
    sum_measured += power[b] * modes[b];
    sum_expected += expected[b] * modes[b];
    if (modes[b] * realisations >= 4000) {
      EXPECT_NEAR(power[b] / expected[b], 1.0, 0.06) << "bin " << b << " modes " << modes[b];
    }
  }
  EXPECT_NEAR(sum_measured / sum_expected, 1.0, 0.015);
}

// sigma_8 measured from the generated field (top-hat of 8 Mpc/h applied to the measured power,
// box 256 Mpc/h, 64^3) matches the requested value. Modes outside the box's range carry ~1% of
// sigma_8^2, hence the 3% tolerance.
TEST(UniverseTest, GeneratedFieldHasTheRequestedSigma8) {
  UniverseOptions o;
  o.side = 64;
  o.voxel_size = 4.0;
  auto g = MakeGenerator(o);
  ASSERT_NE(g, nullptr);
  for (double s8 : {0.8, 0.95}) {
    Cosmology c = Make(0.3, s8, 0.96);
    double sigma2 = 0;
    const int realisations = 4;
    std::vector<float> delta;
    for (int r = 0; r < realisations; ++r) {
      ASSERT_TRUE(g->LinearDensity(c, 5, r, &delta).ok());
      PowerSpectrumBins bins = MeasurePowerSpectrum(delta.data(), 64, o.box_size());
      const double volume = std::pow(o.box_size(), 3);
      for (size_t b = 0; b < bins.k.size(); ++b) {
        const double w = TopHatWindow(bins.k[b] * 8.0);
        sigma2 += bins.modes[b] * bins.power[b] * w * w / volume / realisations;
      }
    }
    EXPECT_NEAR(std::sqrt(sigma2) / s8, 1.0, 0.03) << "sigma_8 = " << s8;
  }
}

TEST(UniverseTest, CountsAreNonNegativeWithExactMean) {
  for (auto d : {Displacement::kZeldovich, Displacement::k2Lpt, Displacement::kPm}) {
    UniverseOptions o;
    o.side = 32;
    o.displacement = d;
    auto g = MakeGenerator(o);
    ASSERT_NE(g, nullptr);
    auto cube = g->Generate(Make(0.3, 0.8, 0.96), 1, 0);
    ASSERT_TRUE(cube.ok()) << cube.status().ToString();
    ASSERT_EQ(cube->shape(), (CubeShape{4, 32, 32, 32}));
    const int64_t voxels = cube->shape().voxels();
    for (int c = 0; c < 4; ++c) {
      const int16_t* v = cube->int16_data() + c * voxels;
      int64_t sum = 0;
      int16_t lo = 1;
      for (int64_t i = 0; i < voxels; ++i) sum += v[i], lo = std::min(lo, v[i]);
      // One particle per voxel, every particle counted once.
      EXPECT_EQ(sum, voxels) << DisplacementName(d) << " channel " << c;
      EXPECT_GE(lo, 0);
      EXPECT_GT(Variance(v, voxels), 0.1);  // particles did move
    }
  }
  // Two particles per side per voxel -> exactly 8 per voxel on average.
  UniverseOptions o;
  o.side = 32;
  o.displacement = Displacement::kZeldovich;
  o.particles_per_side = 64;
  o.redshifts = {0.0};
  auto g8 = MakeGenerator(o);
  ASSERT_NE(g8, nullptr);
  auto cube8 = g8->Generate(Make(0.3, 0.8, 0.96), 1, 0);
  ASSERT_TRUE(cube8.ok());
  int64_t sum = 0;
  const int64_t voxels = cube8->shape().voxels();
  for (int64_t i = 0; i < voxels; ++i) sum += cube8->int16_data()[i];
  EXPECT_EQ(sum, 8 * voxels);
  // The particle mesh needs one particle per voxel.
  o.displacement = Displacement::kPm;
  EXPECT_FALSE(UniverseGenerator::Create(o).ok());
}

TEST(UniverseTest, SameSeedGivesIdenticalBytesAndOtherSeedsDiffer) {
  for (auto d : {Displacement::kPm, Displacement::kZeldovich}) {
    for (auto m : {MassAssignment::kNgp, MassAssignment::kCic}) {
      UniverseOptions o;
      o.side = 32;
      o.threads = 2;
      o.displacement = d;
      o.assignment = m;
      Cosmology c = Make(0.31, 0.83, 0.95);
      auto a = MakeGenerator(o)->Generate(c, 42, 7);
      o.threads = 1;  // a different thread count must not change the bytes either
      auto b = MakeGenerator(o)->Generate(c, 42, 7);
      ASSERT_TRUE(a.ok() && b.ok());
      ASSERT_EQ(a->size_bytes(), b->size_bytes());
      EXPECT_EQ(std::memcmp(a->raw(), b->raw(), a->size_bytes()), 0)
          << DisplacementName(d) << " " << MassAssignmentName(m);
      auto other_index = MakeGenerator(o)->Generate(c, 42, 8);
      auto other_seed = MakeGenerator(o)->Generate(c, 43, 7);
      EXPECT_NE(std::memcmp(a->raw(), other_index->raw(), a->size_bytes()), 0);
      EXPECT_NE(std::memcmp(a->raw(), other_seed->raw(), a->size_bytes()), 0);
    }
  }
}

// Variance of counts summed over blocks of b^3 voxels (clustering on the scale of b voxels).
double BlockVariance(const int16_t* v, int side, int b) {
  const int nb = side / b;
  std::vector<int16_t> sums;
  for (int i = 0; i < nb; ++i)
    for (int j = 0; j < nb; ++j)
      for (int k = 0; k < nb; ++k) {
        int s = 0;
        for (int x = 0; x < b; ++x)
          for (int y = 0; y < b; ++y)
            for (int z = 0; z < b; ++z) s += v[((i * b + x) * side + j * b + y) * side + k * b + z];
        sums.push_back(static_cast<int16_t>(s));
      }
  return Variance(sums.data(), static_cast<int64_t>(sums.size()));
}

TEST(UniverseTest, HigherSigma8ClustersMore) {
  UniverseOptions o;
  o.side = 64;
  o.redshifts = {0.0};
  auto g = MakeGenerator(o);
  for (uint64_t seed : {3, 4}) {
    auto low = g->Generate(Make(0.3, 0.78, 0.96), seed, 0);
    auto high = g->Generate(Make(0.3, 0.95, 0.96), seed, 0);
    ASSERT_TRUE(low.ok() && high.ok());
    const int64_t n = low->shape().voxels();
    // Per voxel the truncation (stronger for higher sigma_8) eats part of the gain...
    EXPECT_GT(Variance(high->int16_data(), n), 1.01 * Variance(low->int16_data(), n));
    // ...on 4 Mpc/h blocks the extra power shows clearly.
    EXPECT_GT(BlockVariance(high->int16_data(), 64, 4),
              1.15 * BlockVariance(low->int16_data(), 64, 4));
  }
}

TEST(UniverseTest, HigherRedshiftClustersLess) {
  for (auto d : {Displacement::kZeldovich, Displacement::k2Lpt, Displacement::kPm}) {
    for (auto m : {MassAssignment::kNgp, MassAssignment::kCic}) {
      UniverseOptions o;
      o.side = 32;
      o.displacement = d;
      o.assignment = m;
      auto g = MakeGenerator(o);
      auto cube = g->Generate(Make(0.3, 0.8, 0.96), 9, 0);
      ASSERT_TRUE(cube.ok());
      const int64_t n = cube->shape().voxels();
      std::vector<double> var;
      for (int c = 0; c < 4; ++c) var.push_back(Variance(cube->int16_data() + c * n, n));
      for (int c = 1; c < 4; ++c) {
        EXPECT_LT(var[c], var[c - 1])
            << DisplacementName(d) << " " << MassAssignmentName(m) << " channel " << c;
      }
    }
  }
}

// The particle mesh keeps linear growth on large scales (FastPM's factors make it exact) and adds
// non-linear power on small scales. Compared with untruncated 2LPT from the same seed, bin by
// bin, so cosmic variance and the lattice/NGP response (common to both) cancel.
PowerSpectrumBins CountPower(const Cube& cube, int channel, double box) {
  const int64_t n = cube.shape().voxels();
  std::vector<float> delta(n);
  for (int64_t i = 0; i < n; ++i) delta[i] = cube.int16_data()[channel * n + i] - 1.0f;
  return MeasurePowerSpectrum(delta.data(), cube.shape().width, box);
}

TEST(UniverseTest, ParticleMeshFollowsLinearTheoryOnLargeScalesAndGrowsSmallOnes) {
  Cosmology c = Make(0.3, 0.8, 0.96);
  auto run = [&](Displacement d, double voxel) {
    UniverseOptions o;
    o.side = 64;
    o.voxel_size = voxel;
    o.redshifts = {0.0, 1.0};
    o.displacement = d;
    o.smoothing = 0;
    auto g = MakeGenerator(o);
    auto cube = g->Generate(c, 21, 0);
    EXPECT_TRUE(cube.ok());
    return std::move(cube).value();
  };
  // Large scales: 256 Mpc/h box, k < 0.1 h/Mpc.
  const Cube pm_big = run(Displacement::kPm, 4.0), lpt_big = run(Displacement::k2Lpt, 4.0);
  for (int ch = 0; ch < 2; ++ch) {
    const PowerSpectrumBins pm = CountPower(pm_big, ch, 256), lpt = CountPower(lpt_big, ch, 256);
    const double shot = 64.0;  // V / N: one particle per (4 Mpc/h)^3 voxel
    for (int b = 0; b < 4; ++b) {
      EXPECT_NEAR((pm.power[b] - shot) / (lpt.power[b] - shot), 1.0, 0.12)
          << "channel " << ch << " k = " << pm.k[b];
    }
  }
  // Small scales: 64 Mpc/h box, k ~ 0.6-0.9 h/Mpc at z = 0, where haloes form.
  const Cube pm_small = run(Displacement::kPm, 1.0), lpt_small = run(Displacement::k2Lpt, 1.0);
  const PowerSpectrumBins pm = CountPower(pm_small, 0, 64), lpt = CountPower(lpt_small, 0, 64);
  for (int b = 5; b < 9; ++b) {
    EXPECT_GT(pm.power[b], 2.0 * lpt.power[b]) << "k = " << pm.k[b];
  }
}

// The 4-point finite-difference force (the default) and the spectral i k force give the same
// large scales and nearly the same small ones: the difference is a smoothing of the force on the
// scale of two mesh cells.
TEST(UniverseTest, ParticleMeshGradientsAgree) {
  auto run = [](PmGradient gradient) {
    return PmCube(64, {0.0}, [&](UniverseOptions& o) { o.pm_gradient = gradient; });
  };
  const Cube fd = run(PmGradient::kFiniteDifference), ik = run(PmGradient::kSpectral);
  EXPECT_NE(std::memcmp(fd.raw(), ik.raw(), fd.size_bytes()), 0);  // really two force laws
  const PowerSpectrumBins pf = CountPower(fd, 0, 64), pk = CountPower(ik, 0, 64);
  for (int b = 0; b < 8; ++b) {  // k < 0.8 h/Mpc: within 10%
    EXPECT_NEAR(pf.power[b] / pk.power[b], 1.0, 0.10) << "k = " << pf.k[b];
  }
}

// A force mesh twice as fine resolves haloes better: more small-scale power and more empty
// voxels at z = 0, the same large scales.
TEST(UniverseTest, FinerForceMeshSharpensSmallScales) {
  auto run = [](int factor) {
    return PmCube(32, {0.0}, [&](UniverseOptions& o) { o.pm_mesh_factor = factor; });
  };
  const Cube coarse = run(1), fine = run(2);
  int64_t sum = 0, empty_coarse = 0, empty_fine = 0;
  for (int64_t v = 0; v < fine.shape().voxels(); ++v) {
    sum += fine.int16_data()[v];
    empty_coarse += coarse.int16_data()[v] == 0;
    empty_fine += fine.int16_data()[v] == 0;
  }
  EXPECT_EQ(sum, 32 * 32 * 32);  // mass conserved
  EXPECT_GT(empty_fine, empty_coarse);
  const PowerSpectrumBins pc = CountPower(coarse, 0, 32), pf = CountPower(fine, 0, 32);
  EXPECT_NEAR(pf.power[0] / pc.power[0], 1.0, 0.15);  // k = 0.2 h/Mpc
  EXPECT_GT(pf.power[12], 1.1 * pc.power[12]);        // k = 2.5 h/Mpc
  UniverseOptions bad;
  bad.pm_mesh_factor = 4;
  EXPECT_FALSE(bad.Validate().ok());
}

// The time nodes: every output is a node, pm_steps steps in all, shared by the intervals' lengths
// in a or ln a and spaced evenly in that variable. The MLPerf redshifts from z = 9 with 10 steps:
// lengths in a 0.15, 0.15, 0.267, 0.333 give 2, 2, 3, 3 steps; in ln a 0.92, 0.47, 0.51, 0.41
// give 4, 2, 2, 2.
TEST(UniverseTest, PmTimeNodesShareStepsByTheSpacingsVariable) {
  const double a_init = 0.1;
  const std::vector<double> outs = {0.25, 0.4, 2.0 / 3.0, 1.0};
  auto steps_per_interval = [&](const std::vector<double>& nodes) {
    std::vector<int> n(outs.size(), 0);
    size_t i = 0;
    for (size_t k = 1; k < nodes.size(); ++k) {
      ++n[i];
      if (std::fabs(nodes[k] - outs[i]) < 1e-12) ++i;
    }
    EXPECT_EQ(i, outs.size()) << "every output is a node";
    return n;
  };
  const auto lin = PmTimeNodes(a_init, outs, 10, PmStepSpacing::kLinearA);
  const auto log = PmTimeNodes(a_init, outs, 10, PmStepSpacing::kLogA);
  ASSERT_EQ(lin.size(), 11u);
  ASSERT_EQ(log.size(), 11u);
  EXPECT_EQ(steps_per_interval(lin), (std::vector<int>{2, 2, 3, 3}));
  EXPECT_EQ(steps_per_interval(log), (std::vector<int>{4, 2, 2, 2}));
  // Even in the variable within an interval: the first interval's four ln a steps are equal.
  for (int k = 1; k <= 4; ++k) EXPECT_NEAR(std::log(log[k] / log[k - 1]), std::log(2.5) / 4, 1e-12);
  EXPECT_NEAR(lin[1] - lin[0], 0.075, 1e-12);
  EXPECT_EQ(lin.front(), a_init);
  EXPECT_EQ(log.back(), 1.0);
  // Fewer steps than intervals: one per interval all the same.
  EXPECT_EQ(PmTimeNodes(a_init, outs, 2, PmStepSpacing::kLogA),
            (std::vector<double>{0.1, 0.25, 0.4, 2.0 / 3.0, 1.0}));
}

// Log spacing moves steps to early times (with the fine force mesh, where the steps matter): the
// z = 3 channel gets more small-scale power (4 steps instead of 2), z = 0 less (2 steps from
// z = 0.5 instead of 3); the mass and the large scales stay.
TEST(UniverseTest, LogStepSpacingChangesTheEarlyChannel) {
  auto run = [](PmStepSpacing spacing) {
    return PmCube(32, DefaultRedshifts(), [&](UniverseOptions& o) {
      o.pm_mesh_factor = 2;
      o.pm_step_spacing = spacing;
    });
  };
  const Cube lin = run(PmStepSpacing::kLinearA), log = run(PmStepSpacing::kLogA);
  const int64_t voxels = 32 * 32 * 32;
  int64_t sum = 0, differ = 0;
  for (int64_t v = 0; v < 4 * voxels; ++v) {
    sum += log.int16_data()[v];
    differ += log.int16_data()[v] != lin.int16_data()[v];
  }
  EXPECT_EQ(sum, 4 * voxels);  // mass conserved in every channel
  EXPECT_GT(differ, voxels / 10);
  const PowerSpectrumBins pl = CountPower(lin, 3, 32), pg = CountPower(log, 3, 32);
  EXPECT_NEAR(pg.power[0] / pl.power[0], 1.0, 0.1);  // k = 0.2 h/Mpc
  EXPECT_GT(pg.power[12], 1.01 * pl.power[12]);      // k = 2.5 h/Mpc: 4 steps to z = 3, not 2
  // z = 0 after 2 steps from z = 0.5 instead of 3: less small-scale power.
  EXPECT_LT(CountPower(log, 0, 32).power[12], 0.95 * CountPower(lin, 0, 32).power[12]);
  EXPECT_TRUE(ParsePmStepSpacing("loga").ok());
  EXPECT_FALSE(ParsePmStepSpacing("log").ok());
}

// COLA integrates each particle's residual from its 2LPT trajectory: with many steps it converges
// to the plain particle mesh (the same N-body problem), and with few it keeps the small-scale power
// that the plain scheme's few steps lose.
TEST(UniverseTest, ColaConvergesToTheParticleMeshAndKeepsSmallScalesInFewSteps) {
  auto run = [](PmScheme scheme, int steps) {
    return PmCube(64, {0.0}, [&](UniverseOptions& o) {
      o.pm_scheme = scheme;
      o.pm_steps = steps;
    });
  };
  const Cube ref = run(PmScheme::kPm, 40), cola40 = run(PmScheme::kCola, 40);
  const Cube pm4 = run(PmScheme::kPm, 4), cola4 = run(PmScheme::kCola, 4);
  int64_t sum = 0;
  for (int64_t v = 0; v < cola40.shape().voxels(); ++v) sum += cola40.int16_data()[v];
  EXPECT_EQ(sum, 64 * 64 * 64);  // mass conserved
  const PowerSpectrumBins pr = CountPower(ref, 0, 64), pc40 = CountPower(cola40, 0, 64);
  const PowerSpectrumBins pp4 = CountPower(pm4, 0, 64), pc4 = CountPower(cola4, 0, 64);
  for (size_t b = 0; b < pr.k.size() && pr.k[b] < 2.0; ++b) {
    EXPECT_NEAR(pc40.power[b] / pr.power[b], 1.0, 0.02) << "40 steps, k = " << pr.k[b];
    if (pr.k[b] > 1.0) {  // 4 steps: COLA within 8% where the plain scheme loses 15-25%
      EXPECT_NEAR(pc4.power[b] / pr.power[b], 1.0, 0.08) << "4 steps, k = " << pr.k[b];
      EXPECT_LT(pp4.power[b], 0.9 * pr.power[b]) << "k = " << pr.k[b];
    }
  }
  EXPECT_EQ(ParsePmScheme("cola").value(), PmScheme::kCola);
  EXPECT_FALSE(ParsePmScheme("fastpm").ok());
}

TEST(UniverseTest, SecondOrderChangesButDoesNotDominate) {
  UniverseOptions o;
  o.side = 32;
  o.redshifts = {0.0};
  o.assignment = MassAssignment::kNgp;
  Cosmology c = Make(0.3, 0.8, 0.96);
  o.displacement = Displacement::kZeldovich;  // explicit: the default is the particle mesh
  auto za = MakeGenerator(o)->Generate(c, 4, 0);
  o.displacement = Displacement::k2Lpt;
  auto lpt = MakeGenerator(o)->Generate(c, 4, 0);
  ASSERT_TRUE(za.ok() && lpt.ok());
  const int64_t n = za->shape().voxels();
  int64_t same = 0;
  for (int64_t i = 0; i < n; ++i) same += za->int16_data()[i] == lpt->int16_data()[i];
  EXPECT_LT(same, n);      // 2LPT moved particles
  EXPECT_GT(same, n / 4);  // ...but by a correction, not a different universe
}

// Second-order LPT reproduces the tree-level skewness of gravity, S3 = 34/7 (+ smoothing terms),
// where the Zel'dovich approximation gives 4 (+ the same terms) (Bernardeau et al. 2002, Phys.
// Rep. 367, 1, sec. 5.9). The difference, 6/7, fails if the sign or size of Psi2 is wrong.
TEST(UniverseTest, SecondOrderAddsTheRightSkewness) {
  Cosmology c = Make(0.3, 0.8, 0.96);
  double s3[2];
  for (int d = 0; d < 2; ++d) {
    UniverseOptions o;
    o.side = 32;
    o.voxel_size = 8;
    o.particles_per_side = 96;  // 27 particles per voxel: small shot noise
    o.redshifts = {0.0};
    o.smoothing = 12;  // weakly non-linear: sigma ~ 0.35
    o.displacement = d ? Displacement::k2Lpt : Displacement::kZeldovich;
    auto g = MakeGenerator(o);
    double m2 = 0, m3 = 0;
    int64_t count = 0;
    for (int s = 0; s < 6; ++s) {
      auto cube = g->Generate(c, 1, s);
      ASSERT_TRUE(cube.ok());
      const int16_t* v = cube->int16_data();
      for (int64_t i = 0; i < cube->shape().voxels(); ++i, ++count) {
        const double delta = v[i] / 27.0 - 1;
        m2 += delta * delta;
        m3 += delta * delta * delta;
      }
    }
    m2 /= count;
    m3 /= count;
    s3[d] = m3 / (m2 * m2);
  }
  EXPECT_GT(s3[0], 2.0);
  EXPECT_NEAR(s3[1] - s3[0], 6.0 / 7.0, 0.35) << "S3 za " << s3[0] << " 2lpt " << s3[1];
}

TEST(UniverseTest, DrawParamsIsReproducibleAndInRange) {
  ParamRanges r;
  ASSERT_TRUE(r.Validate().ok());
  double min_om = 1, max_om = 0;
  for (uint64_t i = 0; i < 2000; ++i) {
    CosmologyParams p = DrawParams(r, 17, i);
    EXPECT_GE(p.omega_m, 0.25);
    EXPECT_LE(p.omega_m, 0.35);
    EXPECT_GE(p.sigma_8, 0.78);
    EXPECT_LE(p.sigma_8, 0.95);
    EXPECT_GE(p.n_s, 0.90);
    EXPECT_LE(p.n_s, 1.00);
    min_om = std::min(min_om, p.omega_m);
    max_om = std::max(max_om, p.omega_m);
    EXPECT_DOUBLE_EQ(p.omega_b, 0.045);
    EXPECT_DOUBLE_EQ(p.h, 0.703);
  }
  EXPECT_LT(min_om, 0.255);  // spread over the whole range
  EXPECT_GT(max_om, 0.345);
  EXPECT_DOUBLE_EQ(DrawParams(r, 17, 5).sigma_8, DrawParams(r, 17, 5).sigma_8);
  EXPECT_NE(DrawParams(r, 17, 5).sigma_8, DrawParams(r, 18, 5).sigma_8);
  EXPECT_DOUBLE_EQ(DrawParams(r, 17, 5).h, 0.703);  // h is not drawn by default
  ParamRanges with_h = r;
  with_h.h_min = 0.63;
  with_h.h_max = 0.77;
  ASSERT_TRUE(with_h.Validate().ok());
  for (uint64_t i = 0; i < 200; ++i) {
    const CosmologyParams p = DrawParams(with_h, 17, i);
    EXPECT_GE(p.h, 0.63);
    EXPECT_LE(p.h, 0.77);
    EXPECT_DOUBLE_EQ(p.omega_m, DrawParams(r, 17, i).omega_m);  // the other draws are unchanged
  }
  UniverseOptions o;
  o.side = 128;
  EXPECT_DOUBLE_EQ(o.BoxSize(0.77), 128.0);
  o.scale_box_with_h = true;
  EXPECT_DOUBLE_EQ(o.BoxSize(0.77), 128.0 * 1.1);  // MLPerf: 128 H0/70 Mpc/h
  r.sigma_8_min = 1.0;
  r.sigma_8_max = 0.9;
  EXPECT_NE(r.Validate().message().find("sigma_8"), std::string::npos);
}

TEST(RandomTest, NormalPairsAreStandardAndIndependent) {
  const uint64_t key = StreamKey(5, 6, RandomStream::kWhiteNoise);
  const int n = 200000;
  double m = 0, v = 0, k4 = 0, cross = 0;
  for (int i = 0; i < n; ++i) {
    double a, b;
    RandomNormalPair(key, i, &a, &b);
    m += a + b;
    v += a * a + b * b;
    k4 += a * a * a * a + b * b * b * b;
    cross += a * b;
  }
  m /= 2 * n;
  v /= 2 * n;
  k4 /= 2 * n;
  EXPECT_NEAR(m, 0, 0.01);
  EXPECT_NEAR(v, 1, 0.01);
  EXPECT_NEAR(k4, 3, 0.05);  // Gaussian kurtosis
  EXPECT_NEAR(cross / n, 0, 0.01);
  EXPECT_NE(StreamKey(5, 6, RandomStream::kWhiteNoise), StreamKey(5, 7, RandomStream::kWhiteNoise));
  EXPECT_NE(StreamKey(5, 6, RandomStream::kWhiteNoise), StreamKey(6, 6, RandomStream::kWhiteNoise));
}

TEST(UniverseTest, RejectsBadOptions) {
  UniverseOptions o;
  o.side = 2;
  EXPECT_NE(UniverseGenerator::Create(o).status().message().find("side"), std::string::npos);
  o = UniverseOptions();
  o.redshifts = {0.0, -1.0};
  EXPECT_NE(UniverseGenerator::Create(o).status().message().find("redshift"), std::string::npos);
  o = UniverseOptions();
  o.particles_per_side = 33;
  EXPECT_NE(UniverseGenerator::Create(o).status().message().find("particles"), std::string::npos);
  o = UniverseOptions();
  o.voxel_size = 0;
  EXPECT_FALSE(UniverseGenerator::Create(o).ok());
}

}  // namespace
}  // namespace synth
}  // namespace cosmoflow
