// The particle mesh's per-particle kernels (synth/universe.cc runs them on each thread's share of
// the particles): mass assignment to a periodic grid of g^3 cells (NGP and CIC, in fixed point)
// and the fused kick-drift pass that interpolates the mesh force back to the particles with the
// same CIC kernel. Header-only templates, so that the position accessor inlines into the loops,
// and separate from the generator so that tests check them against naive references.
//
// Every loop over particles is written to vectorise across particles (no branches, no calls but
// inlined ones; gathers for the mesh reads). universe.cc is compiled with -fno-trapping-math,
// which lets GCC if-convert the float selects; without it the kernels give the same results,
// unvectorised.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>

namespace cosmoflow {
namespace synth {
namespace pm {

// Mass is accumulated in fixed point (kMassOne per particle) in 64-bit integers: integer sums do
// not depend on the order of addition, so a grid is the same for any thread count or chunking
// (float partial sums would differ in the last bit, and the particle mesh amplifies that).
constexpr int64_t kMassOne = int64_t{1} << 24;
constexpr float kMassOneF = static_cast<float>(kMassOne);

// The CIC kernel along one axis for a coordinate x in [0, g] (cell units, centres at i + 0.5):
// cells i0 and i1 = i0 + 1 (periodic, so x == g acts as 0) with weights 1 - t and t.
struct CicAxis {
  int i0, i1;
  float t;
};
inline CicAxis CicAxisOf(float x, int g) {
  const float xs = x - 0.5f;
  const float f = std::floor(xs);
  const int i0 = static_cast<int>(f);
  return CicAxis{i0 < 0 ? i0 + g : i0, i0 + 1 >= g ? i0 + 1 - g : i0 + 1, xs - f};
}

// Assignment runs in chunks: the cells (and CIC's masses) of kChunk particles in one loop that
// vectorises, then their adds in a scalar one (two lanes of a scatter may hit one cell).
constexpr int kChunk = 64;

// Adds particles [begin, end) to `grid` (g^3 cells, index (a g + b) g + e), each a mass of
// kMassOne in the cell that holds it (NGP). cell(p, &x, &y, &w) gives particle p's position in
// cell units, in [0, g] (g itself lands in cell g - 1).
template <typename Cell>
void AssignNgp(int64_t* grid, int g, int64_t begin, int64_t end, Cell cell) {
  int64_t at[kChunk];
  for (int64_t p0 = begin; p0 < end; p0 += kChunk) {
    const int n = static_cast<int>(std::min<int64_t>(kChunk, end - p0));
#pragma omp simd
    for (int i = 0; i < n; ++i) {
      float x, y, w;
      cell(p0 + i, &x, &y, &w);
      const int64_t a = std::min(static_cast<int>(x), g - 1);
      const int64_t b = std::min(static_cast<int>(y), g - 1);
      const int64_t e = std::min(static_cast<int>(w), g - 1);
      at[i] = (a * g + b) * g + e;
    }
    for (int i = 0; i < n; ++i) grid[at[i]] += kMassOne;
  }
}

// As AssignNgp, by CIC: each particle a cell-sized cube, its mass shared by the 8 cells it
// overlaps (x == g wraps to 0), each share rounded to the fixed point. A share is at most
// kMassOne, so it fits an int32.
template <typename Cell>
void AssignCic(int64_t* grid, int g, int64_t begin, int64_t end, Cell cell) {
  int32_t ix[2][kChunk], iy[2][kChunk], iz[2][kChunk], m[8][kChunk];
  for (int64_t p0 = begin; p0 < end; p0 += kChunk) {
    const int n = static_cast<int>(std::min<int64_t>(kChunk, end - p0));
#pragma omp simd
    for (int i = 0; i < n; ++i) {
      float x, y, w;
      cell(p0 + i, &x, &y, &w);
      const CicAxis cx = CicAxisOf(x, g), cy = CicAxisOf(y, g), cw = CicAxisOf(w, g);
      ix[0][i] = cx.i0, ix[1][i] = cx.i1, iy[0][i] = cy.i0, iy[1][i] = cy.i1;
      iz[0][i] = cw.i0, iz[1][i] = cw.i1;
      const float wx[2] = {1 - cx.t, cx.t}, wy[2] = {1 - cy.t, cy.t}, ww[2] = {1 - cw.t, cw.t};
      for (int c = 0; c < 8; ++c) {
        const float wab = wx[c >> 2] * wy[(c >> 1) & 1] * kMassOneF;
        m[c][i] = static_cast<int32_t>(wab * ww[c & 1] + 0.5f);
      }
    }
    for (int i = 0; i < n; ++i) {
      for (int c = 0; c < 8; ++c) {
        const int64_t row = int64_t{ix[c >> 2][i]} * g + iy[(c >> 1) & 1][i];
        grid[row * g + iz[c & 1][i]] += m[c][i];
      }
    }
  }
}

// The arrays one kick-drift pass reads and writes: comoving positions (Mpc/h, in [0, box)) and
// momenta per axis, the 2LPT displacements psi1/psi2 per axis (read with COLA only), and the
// force on the g^3 mesh, x y z interleaved per cell (so that a corner's three components are
// adjacent).
struct KickDriftArrays {
  float* pos[3];
  float* mom[3];
  const float* psi1[3];
  const float* psi2[3];
  const float* force;
};

// Its factors: cell units per Mpc/h (g / box), the kick and drift factors, the box (Mpc/h),
// COLA's lpt1/lpt2 (the 2LPT trajectory's acceleration times the kick factor) and dd1/dd2 (its
// D1 and D2 increments over the drift), and the mesh side g.
struct KickDriftFactors {
  float inv_cell, kick, drift, box, lpt1, lpt2, dd1, dd2;
  int g;
};

// Particles [begin, end) of one kick-drift pass: mom += kick F(pos), F interpolated from the mesh
// with the CIC kernel used for density (the same kernel both ways avoids self-forces), then
// pos += drift mom, wrapped into [0, box). With kCola the kick also subtracts lpt1 psi1 + lpt2
// psi2 and the drift adds dd1 psi1 + dd2 psi2 (COLA: mom is the residual from the 2LPT
// trajectory). Index is the type of the force mesh's indices: int32_t (3 g^3 < 2^31) lets one
// gather fetch 16 lanes with AVX-512, 8 with AVX2; int64_t serves any mesh.
template <bool kCola, typename Index>
void KickDriftRange(const KickDriftArrays& a, const KickDriftFactors& k, int64_t begin,
                    int64_t end) {
  float* __restrict px = a.pos[0], * __restrict py = a.pos[1], * __restrict pz = a.pos[2];
  float* __restrict mx = a.mom[0], * __restrict my = a.mom[1], * __restrict mz = a.mom[2];
  const float* __restrict s1x = a.psi1[0];
  const float* __restrict s1y = a.psi1[1];
  const float* __restrict s1z = a.psi1[2];
  const float* __restrict s2x = a.psi2[0];
  const float* __restrict s2y = a.psi2[1];
  const float* __restrict s2z = a.psi2[2];
  const float* __restrict f = a.force;
  const float inv_cell = k.inv_cell, fk = k.kick, fd = k.drift, box = k.box;
  const float l1 = k.lpt1, l2 = k.lpt2, d1 = k.dd1, d2 = k.dd2;
  const int g = k.g;
  const Index gi = g;
  // A step moves a particle by far less than a box (a few Mpc/h), so one add or subtract wraps
  // it; the last select only keeps a rounding case (x + box == box in float) inside [0, box).
  auto wrap = [box](float x) {
    x = x < 0 ? x + box : x;
    x = x >= box ? x - box : x;
    return x >= 0 && x < box ? x : 0.0f;
  };
#pragma omp simd
  for (int64_t p = begin; p < end; ++p) {
    const CicAxis cx = CicAxisOf(px[p] * inv_cell, g), cy = CicAxisOf(py[p] * inv_cell, g),
                  cw = CicAxisOf(pz[p] * inv_cell, g);
    const Index r0 = cx.i0 * gi, r1 = cx.i1 * gi, e0 = 3 * Index{cw.i0}, e1 = 3 * Index{cw.i1};
    const Index l00 = 3 * (r0 + cy.i0) * gi, l01 = 3 * (r0 + cy.i1) * gi;
    const Index l10 = 3 * (r1 + cy.i0) * gi, l11 = 3 * (r1 + cy.i1) * gi;
    const float w00 = (1 - cx.t) * (1 - cy.t), w01 = (1 - cx.t) * cy.t;
    const float w10 = cx.t * (1 - cy.t), w11 = cx.t * cy.t;
    const float u0 = 1 - cw.t, u1 = cw.t;
    float ax = 0, ay = 0, aw = 0;
    auto corner = [&](Index at, float w) {
      ax += w * f[at];
      ay += w * f[at + 1];
      aw += w * f[at + 2];
    };
    corner(l00 + e0, w00 * u0);
    corner(l00 + e1, w00 * u1);
    corner(l01 + e0, w01 * u0);
    corner(l01 + e1, w01 * u1);
    corner(l10 + e0, w10 * u0);
    corner(l10 + e1, w10 * u1);
    corner(l11 + e0, w11 * u0);
    corner(l11 + e1, w11 * u1);
    if constexpr (kCola) {
      mx[p] += fk * ax - (l1 * s1x[p] + l2 * s2x[p]);
      my[p] += fk * ay - (l1 * s1y[p] + l2 * s2y[p]);
      mz[p] += fk * aw - (l1 * s1z[p] + l2 * s2z[p]);
      px[p] = wrap(px[p] + fd * mx[p] + (d1 * s1x[p] + d2 * s2x[p]));
      py[p] = wrap(py[p] + fd * my[p] + (d1 * s1y[p] + d2 * s2y[p]));
      pz[p] = wrap(pz[p] + fd * mz[p] + (d1 * s1z[p] + d2 * s2z[p]));
    } else {
      mx[p] += fk * ax;
      my[p] += fk * ay;
      mz[p] += fk * aw;
      px[p] = wrap(px[p] + fd * mx[p]);
      py[p] = wrap(py[p] + fd * my[p]);
      pz[p] = wrap(pz[p] + fd * mz[p]);
    }
  }
}

}  // namespace pm
}  // namespace synth
}  // namespace cosmoflow
