#include "synth/pm_kernels.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <random>
#include <vector>

namespace cosmoflow {
namespace synth {
namespace pm {
namespace {

// Particles at random positions in cell units in [0, g), with a few on the boundaries (0 and g,
// which the kernels accept), in a count that is not a multiple of the kernels' chunk.
struct Cloud {
  std::vector<float> x, y, w;
  explicit Cloud(int g, int n = 1000, unsigned seed = 3) {
    std::mt19937 rng(seed);
    std::uniform_real_distribution<float> u(0.0f, static_cast<float>(g));
    for (int p = 0; p < n; ++p) {
      x.push_back(u(rng));
      y.push_back(u(rng));
      w.push_back(u(rng));
    }
    x[0] = 0, y[0] = 0, w[0] = 0;
    x[1] = static_cast<float>(g), y[1] = 0.5f, w[1] = static_cast<float>(g);
    x[2] = 0.5f, y[2] = static_cast<float>(g) - 0.5f, w[2] = 3.25f;
  }
  int64_t size() const { return static_cast<int64_t>(x.size()); }
  auto Cell() const {
    return [this](int64_t p, float* a, float* b, float* c) {
      *a = x[p];
      *b = y[p];
      *c = w[p];
    };
  }
};

int Wrap(int i, int g) { return ((i % g) + g) % g; }

// The naive CIC kernel in double: visit(cell, weight) for each of the 8 cells that a cell-sized
// cube at (x, y, w) (cell units, centres at i + 0.5) overlaps, on a periodic grid of g^3 cells.
template <typename Visit>
void ForEachCicCorner(const double x[3], int g, Visit visit) {
  double c[3];
  int i[3];
  for (int axis = 0; axis < 3; ++axis) {
    c[axis] = x[axis] - 0.5;
    i[axis] = static_cast<int>(std::floor(c[axis]));
  }
  for (int corner = 0; corner < 8; ++corner) {
    double weight = 1;
    int cell[3];
    for (int axis = 0; axis < 3; ++axis) {
      const int up = (corner >> (2 - axis)) & 1;
      const double t = c[axis] - i[axis];
      weight *= up ? t : 1 - t;
      cell[axis] = Wrap(i[axis] + up, g);
    }
    visit((int64_t{cell[0]} * g + cell[1]) * g + cell[2], weight);
  }
}

TEST(PmKernelsTest, CicAxisSplitsBetweenNeighbouringCentresAndWraps) {
  const CicAxis centre = CicAxisOf(0.5f, 8);
  EXPECT_EQ(centre.i0, 0);
  EXPECT_EQ(centre.i1, 1);
  EXPECT_FLOAT_EQ(centre.t, 0.0f);
  const CicAxis inside = CicAxisOf(3.75f, 8);  // 3.25 past cell 0's centre: cells 3 and 4
  EXPECT_EQ(inside.i0, 3);
  EXPECT_EQ(inside.i1, 4);
  EXPECT_FLOAT_EQ(inside.t, 0.25f);
  const CicAxis low = CicAxisOf(0.0f, 8);  // half in cell 7, half in cell 0
  EXPECT_EQ(low.i0, 7);
  EXPECT_EQ(low.i1, 0);
  EXPECT_FLOAT_EQ(low.t, 0.5f);
  const CicAxis high = CicAxisOf(8.0f, 8);  // g acts as 0
  EXPECT_EQ(high.i0, 7);
  EXPECT_EQ(high.i1, 0);
  EXPECT_FLOAT_EQ(high.t, 0.5f);
}

TEST(PmKernelsTest, NgpCountsEachParticleInItsCell) {
  const int g = 8;
  const Cloud cloud(g);
  std::vector<int64_t> grid(g * g * g, 0), naive(g * g * g, 0);
  AssignNgp(grid.data(), g, 0, cloud.size(), cloud.Cell());
  for (int64_t p = 0; p < cloud.size(); ++p) {
    const int a = std::min(static_cast<int>(std::floor(cloud.x[p])), g - 1);
    const int b = std::min(static_cast<int>(std::floor(cloud.y[p])), g - 1);
    const int e = std::min(static_cast<int>(std::floor(cloud.w[p])), g - 1);
    naive[(a * g + b) * g + e] += kMassOne;
  }
  EXPECT_EQ(grid, naive);
}

TEST(PmKernelsTest, CicMatchesNaiveSharesAndConservesMass) {
  const int g = 8;
  const Cloud cloud(g);
  std::vector<int64_t> grid(g * g * g, 0);
  AssignCic(grid.data(), g, 0, cloud.size(), cloud.Cell());
  // Naive: each corner's exact share in double; the kernel rounds each share to the fixed point,
  // so a cell may differ by up to one unit per contribution.
  std::vector<double> exact(g * g * g, 0.0);
  std::vector<int> contributions(g * g * g, 0);
  for (int64_t p = 0; p < cloud.size(); ++p) {
    const double x[3] = {cloud.x[p], cloud.y[p], cloud.w[p]};
    ForEachCicCorner(x, g, [&](int64_t v, double share) {
      exact[v] += share * kMassOne;
      ++contributions[v];
    });
  }
  int64_t total = 0;
  for (int v = 0; v < g * g * g; ++v) {
    EXPECT_LE(std::abs(static_cast<double>(grid[v]) - exact[v]), contributions[v]) << "cell " << v;
    total += grid[v];
  }
  EXPECT_LE(std::abs(static_cast<double>(total) - cloud.size() * static_cast<double>(kMassOne)),
            4.0 * cloud.size());
}

TEST(PmKernelsTest, AssignmentDoesNotDependOnHowParticlesAreSplit) {
  const int g = 8;
  const Cloud cloud(g);
  for (const bool cic : {false, true}) {
    std::vector<int64_t> whole(g * g * g, 0), split(g * g * g, 0);
    auto assign = [&](std::vector<int64_t>* grid, int64_t begin, int64_t end) {
      if (cic) {
        AssignCic(grid->data(), g, begin, end, cloud.Cell());
      } else {
        AssignNgp(grid->data(), g, begin, end, cloud.Cell());
      }
    };
    assign(&whole, 0, cloud.size());
    assign(&split, 0, 333);
    assign(&split, 333, 700);
    assign(&split, 700, cloud.size());
    EXPECT_EQ(whole, split) << (cic ? "CIC" : "NGP");
  }
}

// One kick-drift pass in double with the CIC weights written out: the reference the kernel's
// float pass must match.
struct Particles {
  std::vector<float> pos[3], mom[3], psi1[3], psi2[3];
};

void NaiveKickDrift(const std::vector<float>& force, const KickDriftFactors& k, bool cola,
                    Particles* s, int64_t p) {
  const double x[3] = {s->pos[0][p] * double{k.inv_cell}, s->pos[1][p] * double{k.inv_cell},
                       s->pos[2][p] * double{k.inv_cell}};
  double acc[3] = {0, 0, 0};
  ForEachCicCorner(x, k.g, [&](int64_t v, double weight) {
    for (int axis = 0; axis < 3; ++axis) acc[axis] += weight * force[3 * v + axis];
  });
  for (int axis = 0; axis < 3; ++axis) {
    const double s1 = s->psi1[axis][p], s2 = s->psi2[axis][p];
    double m = s->mom[axis][p] + double{k.kick} * acc[axis];
    double x = s->pos[axis][p];
    if (cola) m -= double{k.lpt1} * s1 + double{k.lpt2} * s2;
    x += double{k.drift} * m;
    if (cola) x += double{k.dd1} * s1 + double{k.dd2} * s2;
    x -= k.box * std::floor(x / k.box);
    s->mom[axis][p] = static_cast<float>(m);
    s->pos[axis][p] = static_cast<float>(x);
  }
}

template <bool kCola, typename Index>
void KernelKickDrift(const std::vector<float>& force, const KickDriftFactors& k, Particles* s) {
  KickDriftArrays a{};
  for (int axis = 0; axis < 3; ++axis) {
    a.pos[axis] = s->pos[axis].data();
    a.mom[axis] = s->mom[axis].data();
    a.psi1[axis] = s->psi1[axis].data();
    a.psi2[axis] = s->psi2[axis].data();
  }
  a.force = force.data();
  const int64_t n = static_cast<int64_t>(s->pos[0].size());
  KickDriftRange<kCola, Index>(a, k, 0, n / 2);  // in two ranges, as two threads run it
  KickDriftRange<kCola, Index>(a, k, n / 2, n);
}

TEST(PmKernelsTest, KickDriftMatchesNaiveCicInterpolationWithBothIndexWidths) {
  const int g = 8, n = 1000;
  const float box = 16;  // 2 Mpc/h cells
  std::mt19937 rng(11);
  std::uniform_real_distribution<float> u(-1.0f, 1.0f), in_box(0.0f, box);
  std::vector<float> force(3 * g * g * g);
  for (float& f : force) f = u(rng);
  Particles start;
  for (int axis = 0; axis < 3; ++axis) {
    for (int p = 0; p < n; ++p) {
      start.pos[axis].push_back(in_box(rng));
      start.mom[axis].push_back(u(rng));
      start.psi1[axis].push_back(u(rng));
      start.psi2[axis].push_back(0.1f * u(rng));
    }
  }
  // Drifts of up to ~1.5 Mpc/h, so that some particles cross the box's faces and wrap.
  const KickDriftFactors k{g / box, 0.3f, 0.8f, box, 0.05f, 0.02f, 0.4f, 0.1f, g};
  for (const bool cola : {false, true}) {
    Particles narrow = start, wide = start, naive = start;
    if (cola) {
      KernelKickDrift<true, int32_t>(force, k, &narrow);
      KernelKickDrift<true, int64_t>(force, k, &wide);
    } else {
      KernelKickDrift<false, int32_t>(force, k, &narrow);
      KernelKickDrift<false, int64_t>(force, k, &wide);
    }
    for (int p = 0; p < n; ++p) NaiveKickDrift(force, k, cola, &naive, p);
    int wrapped = 0;
    for (int axis = 0; axis < 3; ++axis) {
      EXPECT_EQ(narrow.pos[axis], wide.pos[axis]);  // the index width changes no result
      EXPECT_EQ(narrow.mom[axis], wide.mom[axis]);
      for (int p = 0; p < n; ++p) {
        EXPECT_NEAR(narrow.mom[axis][p], naive.mom[axis][p], 1e-5f) << "particle " << p;
        const float x = narrow.pos[axis][p];
        EXPECT_TRUE(x >= 0 && x < box) << "particle " << p << " at " << x;
        float d = std::abs(x - naive.pos[axis][p]);
        d = std::min(d, box - d);  // periodic distance
        EXPECT_LT(d, 1e-4f) << "particle " << p;
        const float moved = start.pos[axis][p] + k.drift * narrow.mom[axis][p];
        wrapped += moved < 0 || moved >= box;
      }
    }
    EXPECT_GT(wrapped, 10) << "the test must make particles cross the box's faces";
  }
}

}  // namespace
}  // namespace pm
}  // namespace synth
}  // namespace cosmoflow
