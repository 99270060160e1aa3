#include "synth/universe.h"

#include <fftw3.h>
#include <omp.h>
#include <sys/mman.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <mutex>
#include <new>
#include <sstream>

#include "synth/pm_kernels.h"
#include "synth/random.h"

namespace cosmoflow {
namespace synth {
namespace {

// FFTW's planner is not thread-safe, and fftwf_init_threads must run once before any plan.
std::mutex& PlannerMutex() {
  static std::mutex m;
  return m;
}

void InitFftwThreadsOnce() {
  static std::once_flag once;
  std::call_once(once, [] { fftwf_init_threads(); });
}

// Large work arrays (8-25 MB each at 128^3) on 2 MiB pages where the kernel allows it
// (transparent huge pages in madvise mode): the mesh kernels touch several planes of such arrays
// per particle, and with 4 KiB pages most of those touches miss the TLB.
void* AllocLarge(size_t bytes) {
  constexpr size_t kHuge = size_t{2} << 20;
  if (bytes < 2 * kHuge) return std::aligned_alloc(64, (bytes + 63) / 64 * 64);
  const size_t rounded = (bytes + kHuge - 1) / kHuge * kHuge;
  void* p = std::aligned_alloc(kHuge, rounded);
  if (p) madvise(p, rounded, MADV_HUGEPAGE);  // advice only: ignored where THP is off
  return p;
}

struct FreeLarge {
  void operator()(void* p) const { std::free(p); }
};
using FloatBuffer = std::unique_ptr<float, FreeLarge>;
using ComplexBuffer = std::unique_ptr<fftwf_complex, FreeLarge>;

// std::vector storage from AllocLarge.
template <typename T>
struct LargeAllocator {
  using value_type = T;
  LargeAllocator() = default;
  template <typename U>
  LargeAllocator(const LargeAllocator<U>&) {}
  T* allocate(size_t n) {
    void* p = AllocLarge(n * sizeof(T));
    if (!p) throw std::bad_alloc();
    return static_cast<T*>(p);
  }
  void deallocate(T* p, size_t) { std::free(p); }
  template <typename U>
  bool operator==(const LargeAllocator<U>&) const {
    return true;
  }
  template <typename U>
  bool operator!=(const LargeAllocator<U>&) const {
    return false;
  }
};
template <typename T>
using LargeVector = std::vector<T, LargeAllocator<T>>;

struct PlanDeleter {
  void operator()(fftwf_plan_s* p) const {
    std::lock_guard<std::mutex> lock(PlannerMutex());
    fftwf_destroy_plan(p);
  }
};
using Plan = std::unique_ptr<fftwf_plan_s, PlanDeleter>;

FloatBuffer AllocFloat(size_t n) { return FloatBuffer(static_cast<float*>(AllocLarge(n * 4))); }
ComplexBuffer AllocComplex(size_t n) {
  return ComplexBuffer(static_cast<fftwf_complex*>(AllocLarge(n * sizeof(fftwf_complex))));
}

// Signed frequency index of position i on an n-point axis.
inline int Freq(int i, int n) { return i <= n / 2 ? i : i - n; }

// Adds the CPU time of the calling thread over its scope to *acc (the per-stage profile): other
// load on shared cores stretches wall time but hardly this; with one thread per cube (the
// default) it is the whole cost of the stage.
double ThreadCpuSeconds() {
  timespec ts{};
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
  return ts.tv_sec + 1e-9 * ts.tv_nsec;
}
class StageTimer {
 public:
  explicit StageTimer(double* acc) : acc_(acc), start_(ThreadCpuSeconds()) {}
  ~StageTimer() { *acc_ += ThreadCpuSeconds() - start_; }

 private:
  double* acc_;
  double start_;
};

// x (cell units, any value) wrapped into [0, g) as a float that is strictly below g.
inline float WrapCell(double x, int g) {
  x -= g * std::floor(x / g);
  const float f = static_cast<float>(x);
  return f < static_cast<float>(g) ? f : 0.0f;
}

std::string Num(double v) {
  std::ostringstream s;
  s << v;
  return s.str();
}

Status VoxelOverflow(uint64_t index, int channel) {
  return OutOfRangeError("synth: sample " + std::to_string(index) + " channel " +
                         std::to_string(channel) + " has a voxel with more than 32767 particles");
}

}  // namespace

const char* DisplacementName(Displacement d) {
  switch (d) {
    case Displacement::k2Lpt:
      return "2lpt";
    case Displacement::kPm:
      return "pm";
    default:
      return "za";
  }
}
const char* MassAssignmentName(MassAssignment m) {
  return m == MassAssignment::kCic ? "cic" : "ngp";
}

StatusOr<Displacement> ParseDisplacement(const std::string& name) {
  if (name == "za" || name == "zeldovich") return Displacement::kZeldovich;
  if (name == "2lpt") return Displacement::k2Lpt;
  if (name == "pm") return Displacement::kPm;
  return InvalidArgumentError("displacement '" + name + "' is not one of za, 2lpt, pm");
}

const char* PmGradientName(PmGradient g) { return g == PmGradient::kSpectral ? "ik" : "fd4"; }

StatusOr<PmGradient> ParsePmGradient(const std::string& name) {
  if (name == "fd4") return PmGradient::kFiniteDifference;
  if (name == "ik") return PmGradient::kSpectral;
  return InvalidArgumentError("pm gradient '" + name + "' is not one of fd4, ik");
}

const char* PmStepSpacingName(PmStepSpacing s) { return s == PmStepSpacing::kLogA ? "loga" : "a"; }

StatusOr<PmStepSpacing> ParsePmStepSpacing(const std::string& name) {
  if (name == "a") return PmStepSpacing::kLinearA;
  if (name == "loga") return PmStepSpacing::kLogA;
  return InvalidArgumentError("pm step spacing '" + name + "' is not one of a, loga");
}

const char* PmSchemeName(PmScheme s) { return s == PmScheme::kCola ? "cola" : "pm"; }

StatusOr<PmScheme> ParsePmScheme(const std::string& name) {
  if (name == "pm") return PmScheme::kPm;
  if (name == "cola") return PmScheme::kCola;
  return InvalidArgumentError("pm scheme '" + name + "' is not one of pm, cola");
}

StatusOr<MassAssignment> ParseMassAssignment(const std::string& name) {
  if (name == "ngp") return MassAssignment::kNgp;
  if (name == "cic") return MassAssignment::kCic;
  return InvalidArgumentError("mass assignment '" + name + "' is not one of ngp, cic");
}

Status UniverseOptions::Validate() const {
  if (side < 4 || side > 1024)
    return InvalidArgumentError("side = " + Num(side) + ": must be in 4..1024");
  const int np = particle_grid();
  if (np < 4 || np % 2 != 0) {
    return InvalidArgumentError("particles per side = " + Num(np) + ": must be even and >= 4");
  }
  if (static_cast<double>(np) * np * np > 2147483647.0) {
    return InvalidArgumentError("particles per side = " + Num(np) + ": more than 2^31 particles");
  }
  if (!(voxel_size > 0 && voxel_size < 1e4)) {
    return InvalidArgumentError("voxel size = " + Num(voxel_size) + " Mpc/h: must be in (0, 1e4)");
  }
  if (redshifts.empty()) return InvalidArgumentError("redshifts: need at least one");
  if (redshifts.size() > 64) return InvalidArgumentError("redshifts: at most 64 channels");
  for (double z : redshifts) {
    if (!(z >= 0 && z < 1000))
      return InvalidArgumentError("redshift " + Num(z) + ": must be in [0, 1000)");
  }
  if (threads < 0) return InvalidArgumentError("threads = " + Num(threads) + ": must be >= 0");
  if (displacement == Displacement::kPm) {
    if (pm_steps < 1 || pm_steps > 1000)
      return InvalidArgumentError("pm steps = " + Num(pm_steps) + ": must be in 1..1000");
    if (!(pm_initial_redshift > 0 && pm_initial_redshift < 1000)) {
      return InvalidArgumentError("pm initial redshift = " + Num(pm_initial_redshift) +
                                  ": must be in (0, 1000)");
    }
    if (pm_mesh_factor < 1 || pm_mesh_factor > 3)
      return InvalidArgumentError("pm mesh factor = " + Num(pm_mesh_factor) +
                                  ": must be 1, 2 or 3");
    if (particles_per_side > 0 && particles_per_side != side) {
      return InvalidArgumentError("particles per side = " + Num(particles_per_side) +
                                  ": the particle mesh needs one particle per voxel (= side)");
    }
  }
  if (!(smoothing_nl_factor >= 0 && smoothing_nl_factor < 100)) {
    return InvalidArgumentError("smoothing factor = " + Num(smoothing_nl_factor) +
                                ": must be in [0, 100)");
  }
  return Status::Ok();
}

struct UniverseGenerator::Impl {
  int n = 0;             // particle grid side
  int nc = 0;            // n / 2 + 1
  size_t real_size = 0;  // n^3
  size_t complex_size = 0;
  int threads = 1;
  FloatBuffer real;              // white noise, then the 2LPT source
  ComplexBuffer delta_k;         // coloured z = 0 linear field (scaled by 1/n^3), kept intact
  ComplexBuffer field_k;         // the (smoothed) field that moves particles; then the 2LPT S_k
  ComplexBuffer scratch_k;       // c2r destroys its input: every transform starts from a copy
  FloatBuffer psi1[3], psi2[3];  // displacements in Mpc/h
  Plan r2c, c2r;
  std::vector<double> amplitude;  // sqrt(P(k)/dV)/n^3 indexed by integer |k/k_f|^2
  double stage_seconds[UniverseGenerator::kNumStages] = {};
  double* Stage(UniverseGenerator::Stage s) { return &stage_seconds[s]; }

  // Visits every stored mode (i, j, k) of the r2c half-space of an nn^3 grid with signed
  // frequencies and its flat index, in parallel.
  template <typename Visit>
  void ForEachModeOf(int nn, Visit visit) {
    const int ncc = nn / 2 + 1;
#pragma omp parallel for num_threads(threads) schedule(static)
    for (int i = 0; i < nn; ++i) {
      const int fi = Freq(i, nn);
      for (int j = 0; j < nn; ++j) {
        const int fj = Freq(j, nn);
        for (int k = 0; k < ncc; ++k) visit(fi, fj, k, (size_t(i) * nn + j) * ncc + k);
      }
    }
  }
  template <typename Visit>
  void ForEachMode(Visit visit) {
    ForEachModeOf(n, visit);
  }

  // dst = c2r(src * f(kx, ky, kz)), where f returns a real factor and `odd` says that the factor
  // is multiplied by i (first derivatives). Frequencies are signed integers (units of k_f).
  // Nyquist planes of an odd factor's axis are zeroed by the callers: i k at k = k_Nyquist has no
  // Hermitian partner, so keeping it would leave an imaginary part that c2r silently drops.
  template <typename Factor>
  void Derived(const fftwf_complex* src, float* dst, bool odd, Factor f) {
    DerivedOn(n, scratch_k.get(), c2r.get(), src, dst, odd, f);
  }
  // The same on any grid: nn^3, its c2r plan and a scratch half-space.
  template <typename Factor>
  void DerivedOn(int nn, fftwf_complex* out, fftwf_plan_s* plan, const fftwf_complex* src,
                 float* dst, bool odd, Factor f) {
    ForEachModeOf(nn, [&](int fi, int fj, int fk, size_t idx) {
      const float re = src[idx][0], im = src[idx][1];
      const float c = static_cast<float>(f(fi, fj, fk));
      if (odd) {  // i c (re + i im) = -c im + i c re
        out[idx][0] = -c * im;
        out[idx][1] = c * re;
      } else {
        out[idx][0] = c * re;
        out[idx][1] = c * im;
      }
    });
    fftwf_execute_dft_c2r(plan, out, dst);
  }

  void Colour(const Cosmology& cosmology, double box, uint64_t seed, uint64_t index) {
    StageTimer timer(Stage(UniverseGenerator::kNoise));
    const uint64_t key = StreamKey(seed, index, RandomStream::kWhiteNoise);
    float* w = real.get();
    // Grid points 2q and 2q+1 take the two deviates of counter q (n^3 is even).
    const int64_t pairs = static_cast<int64_t>(real_size / 2);
#pragma omp parallel for num_threads(threads) schedule(static)
    for (int64_t q = 0; q < pairs; ++q) {
      double z0, z1;
      RandomNormalPair(key, q, &z0, &z1);
      w[2 * q] = static_cast<float>(z0);
      w[2 * q + 1] = static_cast<float>(z1);
    }
    fftwf_execute_dft_r2c(r2c.get(), w, delta_k.get());

    // |k|^2 / k_f^2 is an integer m <= 3 (n/2)^2: tabulating by m evaluates P(k) a few thousand
    // times instead of once per mode.
    const double kf = 2 * M_PI / box;
    const double dv = std::pow(box / n, 3);
    const double inv_n3 = 1.0 / static_cast<double>(real_size);
    const int m_max = 3 * (n / 2) * (n / 2);
    amplitude.assign(m_max + 1, 0.0);
    for (int m = 1; m <= m_max; ++m) {
      amplitude[m] = std::sqrt(cosmology.LinearPower(kf * std::sqrt(double(m))) / dv) * inv_n3;
    }
    fftwf_complex* d = delta_k.get();
    ForEachMode([&](int fi, int fj, int fk, size_t idx) {
      const float a = static_cast<float>(amplitude[fi * fi + fj * fj + fk * fk]);
      d[idx][0] *= a;
      d[idx][1] *= a;
    });
  }

  // field_k = delta_k * exp(-k^2 R^2 / 2) (a plain copy for R = 0).
  void Smooth(double box, double radius) {
    const double kf = 2 * M_PI / box;
    const int m_max = 3 * (n / 2) * (n / 2);
    std::vector<float> filter(m_max + 1);
    for (int m = 0; m <= m_max; ++m) {
      filter[m] = static_cast<float>(std::exp(-0.5 * m * kf * kf * radius * radius));
    }
    const fftwf_complex* src = delta_k.get();
    fftwf_complex* dst = field_k.get();
    ForEachMode([&](int fi, int fj, int fk, size_t idx) {
      const float f = filter[fi * fi + fj * fj + fk * fk];
      dst[idx][0] = src[idx][0] * f;
      dst[idx][1] = src[idx][1] * f;
    });
  }

  // Psi1 (and Psi2) from field_k; field_k is consumed by 2LPT.
  void Displacements(double box, bool second_order) {
    StageTimer timer(Stage(UniverseGenerator::kLpt));
    const double kf = 2 * M_PI / box;
    const int half = n / 2;
    const fftwf_complex* src = field_k.get();
    auto kvec = [](int fi, int fj, int fk, int a) { return a == 0 ? fi : a == 1 ? fj : fk; };
    // Psi1 = i k / k^2 delta (k in h/Mpc, so Psi in Mpc/h).
    for (int a = 0; a < 3; ++a) {
      Derived(src, psi1[a].get(), true, [&](int fi, int fj, int fk) {
        const int ka = kvec(fi, fj, fk, a);
        const int m = fi * fi + fj * fj + fk * fk;
        if (m == 0 || std::abs(ka) == half) return 0.0;
        return ka / (kf * m);
      });
    }
    if (!second_order) return;
    // phi_ab = k_a k_b / k^2 delta; S = sum_{a<b} phi_aa phi_bb - phi_ab^2. psi2[] hold the
    // diagonal terms until S is complete.
    for (int a = 0; a < 3; ++a) {
      Derived(src, psi2[a].get(), false, [&](int fi, int fj, int fk) {
        const int ka = kvec(fi, fj, fk, a);
        const int m = fi * fi + fj * fj + fk * fk;
        return m == 0 ? 0.0 : double(ka) * ka / m;
      });
    }
    float* s = real.get();
    const float *xx = psi2[0].get(), *yy = psi2[1].get(), *zz = psi2[2].get();
    const int64_t total = static_cast<int64_t>(real_size);
#pragma omp parallel for num_threads(threads) schedule(static)
    for (int64_t p = 0; p < total; ++p) s[p] = xx[p] * yy[p] + xx[p] * zz[p] + yy[p] * zz[p];
    const int pairs[3][2] = {{0, 1}, {0, 2}, {1, 2}};
    float* tmp = psi2[0].get();
    for (const auto& pr : pairs) {
      Derived(src, tmp, false, [&](int fi, int fj, int fk) {
        const int ka = kvec(fi, fj, fk, pr[0]), kb = kvec(fi, fj, fk, pr[1]);
        const int m = fi * fi + fj * fj + fk * fk;
        if (m == 0 || std::abs(ka) == half || std::abs(kb) == half) return 0.0;
        return double(ka) * kb / m;
      });
#pragma omp parallel for num_threads(threads) schedule(static)
      for (int64_t p = 0; p < total; ++p) s[p] -= tmp[p] * tmp[p];
    }
    // Psi2 = grad phi2 = i k phi2, phi2 = -S / k^2. The r2c result is unnormalised: divide by n^3.
    fftwf_execute_dft_r2c(r2c.get(), s, field_k.get());
    const double inv_n3 = 1.0 / static_cast<double>(real_size);
    for (int a = 0; a < 3; ++a) {
      Derived(field_k.get(), psi2[a].get(), true, [&](int fi, int fj, int fk) {
        const int ka = kvec(fi, fj, fk, a);
        const int m = fi * fi + fj * fj + fk * fk;
        if (m == 0 || std::abs(ka) == half) return 0.0;
        return -ka / (kf * m) * inv_n3;
      });
    }
  }

  LargeVector<int64_t> mass_grids;  // one per thread, in fixed point (pm::kMassOne per particle)
  LargeVector<float> mass;          // the summed grid, in particles

  // Sums the mass of every particle into the per-thread grids of g^3 cells (cell as in
  // pm::AssignNgp).
  template <typename Cell>
  void AccumulateMass(int g, bool cic, Cell cell) {
    const int64_t cells = int64_t{g} * g * g;
    mass_grids.assign(size_t(threads) * cells, 0);
    const int64_t particles = static_cast<int64_t>(real_size);
#pragma omp parallel num_threads(threads)
    {
      const int64_t t = omp_get_thread_num(), nt = omp_get_num_threads();
      int64_t* grid = mass_grids.data() + size_t(t) * cells;
      const int64_t begin = particles * t / nt, end = particles * (t + 1) / nt;
      if (cic) {
        pm::AssignCic(grid, g, begin, end, cell);
      } else {
        pm::AssignNgp(grid, g, begin, end, cell);
      }
    }
  }

  // dst[v] = mass in cell v (particles) * scale + offset, summed over the threads' grids.
  void SumMass(int g, float offset, float* dst, double scale = 1.0) {
    const int64_t cells = int64_t{g} * g * g;
    const int nt = threads;
    const int64_t* all = mass_grids.data();
#pragma omp parallel for num_threads(threads) schedule(static)
    for (int64_t v = 0; v < cells; ++v) {
      int64_t sum = 0;
      for (int t = 0; t < nt; ++t) sum += all[size_t(t) * cells + v];
      dst[v] = static_cast<float>(static_cast<double>(sum) / pm::kMassOne * scale) + offset;
    }
  }

  // The grid of g^3 cells in units of particles. pos(p, &x, &y, &w) gives particle p's position
  // in Mpc/h (any value: it is wrapped here).
  template <typename Pos>
  const float* Assign(int g, double box, bool cic, Pos pos) {
    const double inv_cell = g / box;
    AccumulateMass(g, cic, [&](int64_t p, float* x, float* y, float* w) {
      double px, py, pw;
      pos(p, &px, &py, &pw);
      *x = WrapCell(px * inv_cell, g);
      *y = WrapCell(py * inv_cell, g);
      *w = WrapCell(pw * inv_cell, g);
    });
    mass.resize(int64_t{g} * g * g);
    SumMass(g, 0.0f, mass.data());
    return mass.data();
  }

  // Counts the particles at pos() into dst[side^3] as int16. Returns false if a voxel exceeds the
  // int16 range.
  template <typename Pos>
  bool DepositWith(const UniverseOptions& o, double box, Pos pos, int16_t* dst) {
    StageTimer timer(Stage(UniverseGenerator::kCounts));
    const int side = o.side;
    const int64_t voxels = int64_t{side} * side * side;
    const float* g = Assign(side, box, o.assignment == MassAssignment::kCic, pos);
    bool overflow = false;
#pragma omp parallel for num_threads(threads) schedule(static) reduction(|| : overflow)
    for (int64_t v = 0; v < voxels; ++v) {
      const float r = std::nearbyint(g[v]);
      if (r > 32767.0f) {
        overflow = true;
        dst[v] = 32767;
      } else {
        dst[v] = static_cast<int16_t>(r);
      }
    }
    return !overflow;
  }

  // Lagrangian position of particle p (centre of its particle-grid cell), Mpc/h.
  inline void Lagrangian(int64_t p, double spacing, double* x, double* y, double* w) const {
    const int64_t k = p % n, j = (p / n) % n, i = p / (int64_t{n} * n);
    *x = (i + 0.5) * spacing;
    *y = (j + 0.5) * spacing;
    *w = (k + 0.5) * spacing;
  }

  // Moves particles to x = q + d1 Psi1 + d2 Psi2 and counts them into dst[side^3].
  bool Deposit(const UniverseOptions& o, double box, double d1, double d2, int16_t* dst) {
    const double spacing = box / n;
    const bool second = d2 != 0.0 && psi2[0];
    const float *p1x = psi1[0].get(), *p1y = psi1[1].get(), *p1z = psi1[2].get();
    const float *p2x = psi2[0].get(), *p2y = psi2[1].get(), *p2z = psi2[2].get();
    return DepositWith(
        o, box,
        [&](int64_t p, double* x, double* y, double* w) {
          Lagrangian(p, spacing, x, y, w);
          *x += d1 * p1x[p];
          *y += d1 * p1y[p];
          *w += d1 * p1z[p];
          if (second) {
            *x += d2 * p2x[p];
            *y += d2 * p2y[p];
            *w += d2 * p2z[p];
          }
        },
        dst);
  }

  // ---- particle-mesh N-body (displacement kPm) ----
  // Comoving position (Mpc/h, in [0, L)) and momentum a^2 dx/dt per axis: six arrays in one
  // allocation (particle_storage), array k starting k x 576 bytes past a 4 KiB boundary. Six
  // allocations of their own would be 2 MiB-aligned alike, putting element p of every array at the
  // same address modulo 4 KiB; Intel cores then hold KickDrift's loads of one array behind its
  // stores to another ("4K aliasing" in the store buffer's address check).
  LargeVector<float> particle_storage;
  float* pos[3] = {};
  float* mom[3] = {};
  void AllocateParticles(int64_t particles) {
    constexpr int64_t kPage = 1024, kStagger = 144;  // floats: 4 KiB, 576 bytes
    const int64_t stride = (particles + kPage - 1) / kPage * kPage + kStagger;
    particle_storage.resize(size_t(6 * stride));
    for (int c = 0; c < 3; ++c) {
      pos[c] = particle_storage.data() + c * stride;
      mom[c] = particle_storage.data() + (3 + c) * stride;
    }
  }

  // Gravitational acceleration -grad phi on the particle grid's mesh, into `force` (x, y, z
  // interleaved per cell, so that a CIC gather touches 8 short runs), with laplacian phi =
  // 1.5 Omega_M delta / a (H0 = 1 units), delta from CIC of the particles. The gradient is a
  // 4-point finite difference of phi (one inverse FFT; pyCOLA's force is a 4-point difference of
  // the potential too) or the exact i k (three inverse FFTs).
  LargeVector<float> force;
  // The force mesh: the particle grid's own buffers and plans (pm_mesh_factor 1), or a finer
  // mesh of its own (factor 2 or 3: 8x or 27x the cells, for force resolution studies).
  int g = 0;
  size_t mesh_size = 0;
  float* mesh_real = nullptr;
  fftwf_complex *mesh_k = nullptr, *mesh_scratch = nullptr;
  fftwf_plan_s *mesh_r2c = nullptr, *mesh_c2r = nullptr;
  FloatBuffer fine_real;
  ComplexBuffer fine_k, fine_scratch;
  Plan fine_r2c, fine_c2r;

  void Forces(double box, double omega_m, double a, PmGradient gradient) {
    float* d = mesh_real;
    {
      StageTimer timer(Stage(UniverseGenerator::kMeshDensity));
      // Positions are in [0, box) already: no wrapping needed.
      const float inv_cell = static_cast<float>(g / box);
      const float *px = pos[0], *py = pos[1], *pz = pos[2];
      AccumulateMass(g, true, [&](int64_t p, float* x, float* y, float* w) {
        *x = px[p] * inv_cell;
        *y = py[p] * inv_cell;
        *w = pz[p] * inv_cell;
      });
      // delta = rho / mean - 1; the mean is N / g^3 particles per mesh cell.
      SumMass(g, -1.0f, d, static_cast<double>(mesh_size) / static_cast<double>(real_size));
    }
    force.resize(3 * mesh_size);
    StageTimer timer(Stage(UniverseGenerator::kMeshFft));
    fftwf_execute_dft_r2c(mesh_r2c, d, mesh_k);
    const double kf = 2 * M_PI / box;
    const double scale = 1.5 * omega_m / a / static_cast<double>(mesh_size);
    if (gradient == PmGradient::kFiniteDifference) {
      // phi = -(1.5 Omega_M / a) delta / k^2.
      DerivedOn(g, mesh_scratch, mesh_c2r, mesh_k, d, false, [&](int fi, int fj, int fk) {
        const int m = fi * fi + fj * fj + fk * fk;
        return m == 0 ? 0.0 : -scale / (kf * kf * m);
      });
      StageTimer gradient_timer(Stage(UniverseGenerator::kMeshGradient));
      FiniteDifferenceForce(d, box / g);
      return;
    }
    const int half = g / 2;
    for (int c = 0; c < 3; ++c) {
      // F = -grad phi = i k (1.5 Omega_M / a) delta / k^2.
      DerivedOn(g, mesh_scratch, mesh_c2r, mesh_k, d, true, [&](int fi, int fj, int fk) {
        const int kc = c == 0 ? fi : c == 1 ? fj : fk;
        const int m = fi * fi + fj * fj + fk * fk;
        if (m == 0 || std::abs(kc) == half) return 0.0;
        return kc / (kf * m) * scale;
      });
      float* f = force.data();
      const int64_t total = static_cast<int64_t>(mesh_size);
#pragma omp parallel for num_threads(threads) schedule(static)
      for (int64_t v = 0; v < total; ++v) f[3 * v + c] = d[v];
    }
  }

  // force = -grad phi by the 4-point central difference (8 (f[+1] - f[-1]) - (f[+2] - f[-2])) /
  // (12 h) along each axis, periodic; h is the cell size in Mpc/h.
  void FiniteDifferenceForce(const float* phi, double h) {
    std::vector<int> p1(g), p2(g), m1(g), m2(g);
    for (int i = 0; i < g; ++i) {
      p1[i] = (i + 1) % g;
      p2[i] = (i + 2) % g;
      m1[i] = (i + g - 1) % g;
      m2[i] = (i + g - 2) % g;
    }
    const float c1 = static_cast<float>(8.0 / (12.0 * h)),
                c2 = static_cast<float>(1.0 / (12.0 * h));
    float* out = force.data();
#pragma omp parallel for num_threads(threads) schedule(static)
    for (int i = 0; i < g; ++i) {
      for (int j = 0; j < g; ++j) {
        auto line = [&](int a, int b) { return phi + (size_t(a) * g + b) * g; };
        const float *row = line(i, j), *xp1 = line(p1[i], j), *xp2 = line(p2[i], j),
                    *xm1 = line(m1[i], j), *xm2 = line(m2[i], j), *yp1 = line(i, p1[j]),
                    *yp2 = line(i, p2[j]), *ym1 = line(i, m1[j]), *ym2 = line(i, m2[j]);
        float* f = out + 3 * (size_t(i) * g + j) * g;
        for (int k = 0; k < g; ++k) {
          f[3 * k + 0] = c2 * (xp2[k] - xm2[k]) - c1 * (xp1[k] - xm1[k]);
          f[3 * k + 1] = c2 * (yp2[k] - ym2[k]) - c1 * (yp1[k] - ym1[k]);
          f[3 * k + 2] = c2 * (row[p2[k]] - row[m2[k]]) - c1 * (row[p1[k]] - row[m1[k]]);
        }
      }
    }
  }

  // The force mesh of `factor`^3 cells per particle (see g above).
  Status SetUpMesh(int factor) {
    g = n * factor;
    mesh_size = size_t(g) * g * g;
    if (factor == 1) {
      mesh_real = real.get();
      mesh_k = field_k.get();
      mesh_scratch = scratch_k.get();
      mesh_r2c = r2c.get();
      mesh_c2r = c2r.get();
      return Status::Ok();
    }
    const size_t complex = size_t(g) * g * (g / 2 + 1);
    fine_real = AllocFloat(mesh_size);
    fine_k = AllocComplex(complex);
    fine_scratch = AllocComplex(complex);
    if (!fine_real || !fine_k || !fine_scratch)
      return ResourceExhaustedError("synth: cannot allocate a " + Num(g) + "^3 force mesh");
    {
      std::lock_guard<std::mutex> lock(PlannerMutex());
      fftwf_plan_with_nthreads(threads);
      fine_r2c.reset(fftwf_plan_dft_r2c_3d(g, g, g, fine_real.get(), fine_k.get(), FFTW_ESTIMATE));
      fine_c2r.reset(
          fftwf_plan_dft_c2r_3d(g, g, g, fine_scratch.get(), fine_real.get(), FFTW_ESTIMATE));
    }
    if (!fine_r2c || !fine_c2r)
      return InternalError("synth: FFTW could not plan a " + Num(g) + "^3 mesh");
    mesh_real = fine_real.get();
    mesh_k = fine_k.get();
    mesh_scratch = fine_scratch.get();
    mesh_r2c = fine_r2c.get();
    mesh_c2r = fine_c2r.get();
    return Status::Ok();
  }

  // COLA's share of one kick-drift pass (the plain scheme has none): the kick also adds
  // -(lpt1 psi1 + lpt2 psi2), the 2LPT trajectory's own acceleration times the kick factor, so that
  // mom holds the residual momentum; the drift also moves the particle along its 2LPT trajectory
  // by dd1 psi1 + dd2 psi2.
  struct ColaTerms {
    double lpt1 = 0, lpt2 = 0, dd1 = 0, dd2 = 0;
  };

  // One kick-drift pass over every particle (pm::KickDriftRange on each thread's share), with
  // COLA's terms when `cola` is given. Kick and drift are fused because both are per particle: one
  // pass over the arrays.
  void KickDrift(double box, double kick, double drift, const ColaTerms* cola) {
    // 32-bit force indices let a vector gather 16 (AVX-512) or 8 (AVX2) particles' forces at once;
    // meshes too large for them (g > 894) take 64-bit ones.
    const bool narrow = 3.0 * g * g * g < 2147483647.0;
    if (cola != nullptr) {
      return narrow ? KickDriftPass<true, int32_t>(box, kick, drift, *cola)
                    : KickDriftPass<true, int64_t>(box, kick, drift, *cola);
    }
    return narrow ? KickDriftPass<false, int32_t>(box, kick, drift, ColaTerms{})
                  : KickDriftPass<false, int64_t>(box, kick, drift, ColaTerms{});
  }

  template <bool kCola, typename Index>
  void KickDriftPass(double box, double kick, double drift, const ColaTerms& cola) {
    StageTimer timer(Stage(UniverseGenerator::kKickDrift));
    const pm::KickDriftArrays arrays{{pos[0], pos[1], pos[2]},
                                     {mom[0], mom[1], mom[2]},
                                     {psi1[0].get(), psi1[1].get(), psi1[2].get()},
                                     {psi2[0].get(), psi2[1].get(), psi2[2].get()},
                                     force.data()};
    const auto f = [](double v) { return static_cast<float>(v); };
    const pm::KickDriftFactors factors{f(g / box),   f(kick),     f(drift),    f(box), f(cola.lpt1),
                                       f(cola.lpt2), f(cola.dd1), f(cola.dd2), g};
    const int64_t particles = static_cast<int64_t>(real_size);
#pragma omp parallel num_threads(threads)
    {
      const int64_t t = omp_get_thread_num(), nt = omp_get_num_threads();
      pm::KickDriftRange<kCola, Index>(arrays, factors, particles * t / nt,
                                       particles * (t + 1) / nt);
    }
  }

  // Counts the particle-mesh particles (at pos) into dst[side^3]; false on an int16 overflow.
  bool DepositParticles(const UniverseOptions& o, double box, int16_t* dst) {
    return DepositWith(
        o, box,
        [&](int64_t p, double* x, double* y, double* w) {
          *x = pos[0][p];
          *y = pos[1][p];
          *w = pos[2][p];
        },
        dst);
  }

  // The particles at the start of the particle-mesh run: 2LPT positions x = q + d1 psi1 + d2 psi2
  // (wrapped into [0, box)) and momenta p = g_p1 psi1 + g_p2 psi2, from the displacements in
  // psi1/psi2.
  void StartParticles(double box, double d1, double d2, double g_p1, double g_p2) {
    const int64_t particles = static_cast<int64_t>(real_size);
    const double spacing = box / n;
    AllocateParticles(particles);
#pragma omp parallel for num_threads(threads) schedule(static)
    for (int64_t p = 0; p < particles; ++p) {
      double q[3];
      Lagrangian(p, spacing, &q[0], &q[1], &q[2]);
      for (int c = 0; c < 3; ++c) {
        const double s1 = psi1[c].get()[p], s2 = psi2[c].get()[p];
        double x = q[c] + d1 * s1 + d2 * s2;
        x -= box * std::floor(x / box);
        pos[c][p] = x >= box ? 0.0f : static_cast<float>(x);
        mom[c][p] = static_cast<float>(g_p1 * s1 + g_p2 * s2);
      }
    }
  }
};

std::vector<double> PmTimeNodes(double a_init, const std::vector<double>& output_as, int pm_steps,
                                PmStepSpacing spacing) {
  // Interval ends in the spacing's variable t (a or ln a); outputs come back exactly.
  const bool log_a = spacing == PmStepSpacing::kLogA;
  auto to_t = [&](double a) { return log_a ? std::log(a) : a; };
  auto to_a = [&](double t) { return log_a ? std::exp(t) : t; };
  std::vector<double> ends = {a_init};
  for (double a : output_as) {
    if (a - ends.back() > 1e-9) ends.push_back(a);
  }
  const int intervals = static_cast<int>(ends.size()) - 1;
  auto length = [&](int i) { return to_t(ends[i + 1]) - to_t(ends[i]); };
  std::vector<int> steps(intervals, 1);
  for (int extra = pm_steps - intervals; extra > 0; --extra) {
    // Give the next step to the interval with the longest steps.
    int best = 0;
    for (int i = 1; i < intervals; ++i) {
      if (length(i) / steps[i] > length(best) / steps[best]) best = i;
    }
    ++steps[best];
  }
  std::vector<double> nodes = {a_init};
  for (int i = 0; i < intervals; ++i) {
    for (int k = 1; k <= steps[i]; ++k) {
      nodes.push_back(k == steps[i] ? ends[i + 1] : to_a(to_t(ends[i]) + length(i) * k / steps[i]));
    }
  }
  return nodes;
}

UniverseGenerator::~UniverseGenerator() = default;

StatusOr<std::unique_ptr<UniverseGenerator>> UniverseGenerator::Create(
    const UniverseOptions& options) {
  CF_RETURN_IF_ERROR(options.Validate());
  std::unique_ptr<UniverseGenerator> g(new UniverseGenerator());
  g->options_ = options;
  g->impl_ = std::make_unique<Impl>();
  Impl& m = *g->impl_;
  m.n = options.particle_grid();
  m.nc = m.n / 2 + 1;
  m.real_size = size_t(m.n) * m.n * m.n;
  m.complex_size = size_t(m.n) * m.n * m.nc;
  m.threads = options.threads > 0 ? options.threads : omp_get_max_threads();
  m.real = AllocFloat(m.real_size);
  m.delta_k = AllocComplex(m.complex_size);
  m.field_k = AllocComplex(m.complex_size);
  m.scratch_k = AllocComplex(m.complex_size);
  // 2LPT needs Psi2; the particle mesh uses those buffers for 2LPT initial conditions and then
  // for its forces.
  const bool second_order = options.displacement != Displacement::kZeldovich;
  for (int a = 0; a < 3; ++a) m.psi1[a] = AllocFloat(m.real_size);
  if (second_order) {
    for (int a = 0; a < 3; ++a) m.psi2[a] = AllocFloat(m.real_size);
  }
  if (!m.real || !m.delta_k || !m.field_k || !m.scratch_k || !m.psi1[2] ||
      (second_order && !m.psi2[2])) {
    return ResourceExhaustedError("synth: cannot allocate work buffers for a " + Num(m.n) +
                                  "^3 particle grid");
  }
  InitFftwThreadsOnce();
  {
    // FFTW_ESTIMATE: the plan (hence the float rounding) does not depend on timing, so the same
    // seed gives the same bytes on every run.
    std::lock_guard<std::mutex> lock(PlannerMutex());
    fftwf_plan_with_nthreads(m.threads);
    m.r2c.reset(
        fftwf_plan_dft_r2c_3d(m.n, m.n, m.n, m.real.get(), m.scratch_k.get(), FFTW_ESTIMATE));
    m.c2r.reset(
        fftwf_plan_dft_c2r_3d(m.n, m.n, m.n, m.scratch_k.get(), m.real.get(), FFTW_ESTIMATE));
  }
  if (!m.r2c || !m.c2r)
    return InternalError("synth: FFTW could not plan a " + Num(m.n) + "^3 transform");
  if (options.displacement == Displacement::kPm)
    CF_RETURN_IF_ERROR(m.SetUpMesh(options.pm_mesh_factor));
  return g;
}

Status UniverseGenerator::LinearDensity(const Cosmology& cosmology, uint64_t seed, uint64_t index,
                                        std::vector<float>* delta) {
  Impl& m = *impl_;
  m.Colour(cosmology, options_.BoxSize(cosmology.params().h), seed, index);
  // FFTW's new-array execute needs arrays aligned like the planned ones: transform into m.real.
  m.Derived(m.delta_k.get(), m.real.get(), false, [](int, int, int) { return 1.0; });
  delta->assign(m.real.get(), m.real.get() + m.real_size);
  return Status::Ok();
}

double UniverseGenerator::SmoothingRadius(const Cosmology& cosmology, double z) const {
  if (options_.smoothing >= 0) return options_.smoothing;
  return options_.NlFactor() / cosmology.NonLinearWavenumber(z);
}

const char* UniverseGenerator::StageName(Stage s) {
  static const char* const kNames[kNumStages] = {
      "white noise + colour", "LPT displacements", "mesh density (CIC)", "mesh FFTs",
      "mesh gradient",        "kick + drift",      "counts (output)"};
  return s >= 0 && s < kNumStages ? kNames[s] : "?";
}

double UniverseGenerator::StageSeconds(Stage s) const { return impl_->stage_seconds[s]; }

StatusOr<Cube> UniverseGenerator::Generate(const Cosmology& cosmology, uint64_t seed,
                                           uint64_t index) {
  Impl& m = *impl_;
  const double box = options_.BoxSize(cosmology.params().h);
  const bool second_order = options_.displacement == Displacement::k2Lpt;
  m.Colour(cosmology, box, seed, index);
  const int side = options_.side;
  const int channels = static_cast<int>(options_.redshifts.size());
  Cube cube(CubeShape{channels, side, side, side}, DType::kInt16);
  const int64_t voxels = int64_t{side} * side * side;
  if (options_.displacement == Displacement::kPm) {
    CF_RETURN_IF_ERROR(ParticleMesh(cosmology, index, box, &cube));
    return cube;
  }
  // With a fixed (or no) truncation every channel is the same field scaled by D(z): compute the
  // displacements once. The automatic truncation depends on z, so each channel has its own.
  const bool per_channel = options_.smoothing < 0;
  for (int c = 0; c < channels; ++c) {
    const double z = options_.redshifts[c];
    if (c == 0 || per_channel) {
      m.Smooth(box, SmoothingRadius(cosmology, z));
      m.Displacements(box, second_order);
    }
    const double d1 = cosmology.GrowthFactor(z);
    const double d2 = second_order ? cosmology.SecondOrderGrowthFactor(z) : 0.0;
    if (!m.Deposit(options_, box, d1, d2, cube.int16_data() + c * voxels)) {
      return VoxelOverflow(index, c);
    }
  }
  return cube;
}

namespace {

// The particle mesh's time factors for one cosmology (FastPM, Feng et al. 2016, eqs. 20-24), with
// H0 = 1 and p = a^2 dx/dt: growth D1, D2, g_p(a) = a^3 E(a) dD/da (and its D2 twin) and
// g_f(a) = 1.5 Omega_M D(a) / a.
struct PmClock {
  const Cosmology& cosmology;
  double om;
  double E(double a) const { return std::sqrt(om / (a * a * a) + 1 - om); }
  double D1(double a) const { return cosmology.GrowthFactor(1 / a - 1); }
  double D2(double a) const { return cosmology.SecondOrderGrowthFactor(1 / a - 1); }
  template <typename F>
  static double Deriv(F f, double a) {
    const double h = 1e-4 * a;
    return (f(a + h) - f(a - h)) / (2 * h);
  }
  double Gp(double a) const {
    return a * a * a * E(a) * Deriv([this](double x) { return D1(x); }, a);
  }
  double Gp2(double a) const {
    return a * a * a * E(a) * Deriv([this](double x) { return D2(x); }, a);
  }
  double Gf(double a) const { return 1.5 * om * D1(a) / a; }
  // The plain scheme's factors: a kick of p from ai to af with the force at ac, a drift of x
  // from ai to af with p at ac.
  double Kick(double ai, double af, double ac) const { return (Gp(af) - Gp(ai)) / Gf(ac); }
  double Drift(double ai, double af, double ac) const { return (D1(af) - D1(ai)) / Gp(ac); }

  // COLA's (Tassev et al. 2013, appendix A.3, pyCOLA's n_cola = -2.5): over a step the residual
  // momentum is taken to follow u(a) = a^n_cola, not to stay constant, which with few steps
  // tracks the growth of the residual better. With Q(a) = a^3 E(a), dp/da = a^2 F / Q and
  // dx/da = p / Q.
  static constexpr double kNCola = -2.5;
  static double U(double a) { return std::pow(a, kNCola); }
  double Q(double a) const { return a * a * a * E(a); }
  double ColaKick(double ai, double af, double ac) const {
    return ac * ac / Q(ac) * (U(af) - U(ai)) / (kNCola * std::pow(ac, kNCola - 1));
  }
  double ColaDrift(double ai, double af, double ac) const {
    constexpr int kPanels = 64;  // Simpson's rule; the integrand is smooth
    const double h = (af - ai) / kPanels;
    double sum = 0;
    for (int i = 0; i <= kPanels; ++i) {
      const double a = ai + i * h;
      sum += (i == 0 || i == kPanels ? 1 : i % 2 ? 4 : 2) * U(a) / Q(a);
    }
    return sum * h / 3 / U(ac);
  }
  // The 2LPT trajectory x = q + D1 psi1 + D2 psi2 moves under the acceleration
  // 1.5 Omega_M / a (D1 psi1 + (D2 - D1^2) psi2) (the growth equations of D1 and D2), in the
  // units of the mesh force.
  double LptForce1(double a) const { return 1.5 * om * D1(a) / a; }
  double LptForce2(double a) const { return 1.5 * om * (D2(a) - D1(a) * D1(a)) / a; }
};

}  // namespace

Status UniverseGenerator::ParticleMesh(const Cosmology& cosmology, uint64_t index, double box,
                                       Cube* cube) {
  // Kick-drift-kick leapfrog in the scale factor with FastPM's modified factors, which make the
  // linear growth exact whatever the number of steps: with F = -grad phi, laplacian phi =
  // 1.5 Omega_M delta / a,
  //   drift  x += p(a_mid) [D(a1) - D(a0)] / g_p(a_mid),
  //   kick   p += F(a_r) [g_p(a1) - g_p(a0)] / g_f(a_r),
  // where a_r is the time at which F was computed. Initial conditions: 2LPT at z_init. COLA
  // (PmScheme::kCola) runs the same loop on the residual from 2LPT, with its own factors (PmClock).
  Impl& m = *impl_;
  const UniverseOptions& o = options_;
  const double om = cosmology.params().omega_m;
  const PmClock t{cosmology, om};
  // Initial conditions from 2LPT (the truncation does not apply: the N-body step handles the
  // non-linear scales).
  m.Smooth(box, 0.0);
  m.Displacements(box, true);
  const double a_init = 1 / (1 + o.pm_initial_redshift);
  const int64_t voxels = int64_t{o.side} * o.side * o.side;
  // Channels at or before z_init come straight from 2LPT.
  std::vector<std::pair<double, int>> outputs;  // (a, channel) for the N-body part
  for (int c = 0; c < static_cast<int>(o.redshifts.size()); ++c) {
    const double a = 1 / (1 + o.redshifts[c]);
    if (a > a_init) {
      outputs.emplace_back(a, c);
    } else if (!m.Deposit(o, box, t.D1(a), t.D2(a), cube->int16_data() + c * voxels)) {
      return VoxelOverflow(index, c);
    }
  }
  if (outputs.empty()) return Status::Ok();
  std::sort(outputs.begin(), outputs.end());
  std::vector<double> output_as;
  for (const auto& out : outputs) output_as.push_back(out.first);
  const std::vector<double> nodes = PmTimeNodes(a_init, output_as, o.pm_steps, o.pm_step_spacing);
  // COLA's particles start on their 2LPT trajectories with no residual momentum.
  const bool cola = o.pm_scheme == PmScheme::kCola;
  m.StartParticles(box, t.D1(a_init), t.D2(a_init), cola ? 0 : t.Gp(a_init),
                   cola ? 0 : t.Gp2(a_init));
  m.Forces(box, om, a_init, o.pm_gradient);
  auto kick = [&](double ai, double af, double ac) {
    return cola ? t.ColaKick(ai, af, ac) : t.Kick(ai, af, ac);
  };
  auto drift = [&](double ai, double af, double ac) {
    return cola ? t.ColaDrift(ai, af, ac) : t.Drift(ai, af, ac);
  };
  // Kick-drift-kick, with each step's closing half-kick merged into the next step's opening one:
  // both use the force at the shared node, so one pass over the particles does both.
  double carried_kick = 0;
  size_t next_output = 0;
  for (size_t s = 0; s + 1 < nodes.size(); ++s) {
    const double a0 = nodes[s], a1 = nodes[s + 1], am = 0.5 * (a0 + a1);
    const double k = carried_kick + kick(a0, am, a0);
    const Impl::ColaTerms terms{k * t.LptForce1(a0), k * t.LptForce2(a0), t.D1(a1) - t.D1(a0),
                                t.D2(a1) - t.D2(a0)};
    m.KickDrift(box, k, drift(a0, a1, am), cola ? &terms : nullptr);
    for (; next_output < outputs.size() && std::fabs(outputs[next_output].first - a1) < 1e-9;
         ++next_output) {
      const int c = outputs[next_output].second;
      if (!m.DepositParticles(o, box, cube->int16_data() + c * voxels))
        return VoxelOverflow(index, c);
    }
    if (s + 2 < nodes.size()) {  // the last node needs positions only
      m.Forces(box, om, a1, o.pm_gradient);
      carried_kick = kick(am, a1, a1);
    }
  }
  return Status::Ok();
}

Status ParamRanges::Validate() const {
  auto check = [](const char* name, double lo, double hi, double min_ok, double max_ok) {
    if (!(lo <= hi)) {
      return InvalidArgumentError(std::string("range of ") + name + " [" + Num(lo) + ", " +
                                  Num(hi) + "]: min > max");
    }
    if (!(lo > min_ok && hi < max_ok)) {
      return InvalidArgumentError(std::string("range of ") + name + " [" + Num(lo) + ", " +
                                  Num(hi) + "]: must lie in (" + Num(min_ok) + ", " + Num(max_ok) +
                                  ")");
    }
    return Status::Ok();
  };
  CF_RETURN_IF_ERROR(check("Omega_M", omega_m_min, omega_m_max, 0.045, 1.0000001));
  CF_RETURN_IF_ERROR(check("sigma_8", sigma_8_min, sigma_8_max, 0, 10));
  CF_RETURN_IF_ERROR(check("n_s", n_s_min, n_s_max, 0, 3));
  if (draws_h()) CF_RETURN_IF_ERROR(check("h", h_min, h_max, 0, 2));
  return Status::Ok();
}

CosmologyParams DrawParams(const ParamRanges& r, uint64_t seed, uint64_t index,
                           const CosmologyParams& base) {
  const uint64_t key = StreamKey(seed, index, RandomStream::kParameters);
  CosmologyParams p = base;
  p.omega_m = r.omega_m_min + (r.omega_m_max - r.omega_m_min) * RandomUniform(key, 0);
  p.sigma_8 = r.sigma_8_min + (r.sigma_8_max - r.sigma_8_min) * RandomUniform(key, 1);
  p.n_s = r.n_s_min + (r.n_s_max - r.n_s_min) * RandomUniform(key, 2);
  if (r.draws_h()) p.h = r.h_min + (r.h_max - r.h_min) * RandomUniform(key, 3);
  return p;
}

PowerSpectrumBins MeasurePowerSpectrum(const float* field, int n, double box,
                                       const std::function<double(double)>& model) {
  const int nc = n / 2 + 1;
  const size_t real_size = size_t(n) * n * n;
  FloatBuffer in = AllocFloat(real_size);
  ComplexBuffer out = AllocComplex(size_t(n) * n * nc);
  std::memcpy(in.get(), field, real_size * sizeof(float));
  Plan plan;
  {
    std::lock_guard<std::mutex> lock(PlannerMutex());
    InitFftwThreadsOnce();
    fftwf_plan_with_nthreads(1);
    plan.reset(fftwf_plan_dft_r2c_3d(n, n, n, in.get(), out.get(), FFTW_ESTIMATE));
  }
  fftwf_execute(plan.get());

  const double kf = 2 * M_PI / box;
  const double dv = std::pow(box / n, 3), volume = box * box * box;
  const int nbins = n / 2;  // bin b covers |k|/k_f in [b + 0.5, b + 1.5)
  std::vector<double> ksum(nbins, 0), psum(nbins, 0), msum(nbins, 0);
  std::vector<int64_t> count(nbins, 0);
  for (int i = 0; i < n; ++i) {
    const int fi = Freq(i, n);
    for (int j = 0; j < n; ++j) {
      const int fj = Freq(j, n);
      for (int k = 0; k < nc; ++k) {
        const double kmag = std::sqrt(double(fi * fi + fj * fj + k * k));
        const int b = static_cast<int>(std::floor(kmag - 0.5));
        if (kmag == 0 || b < 0 || b >= nbins) continue;
        // The r2c half-space holds k_z >= 0; modes with 0 < k_z < n/2 stand for their mirror too.
        const int weight = (k == 0 || k == n / 2) ? 1 : 2;
        const fftwf_complex& c = out.get()[(size_t(i) * n + j) * nc + k];
        const double p = (double(c[0]) * c[0] + double(c[1]) * c[1]) * dv * dv / volume;
        ksum[b] += weight * kmag * kf;
        psum[b] += weight * p;
        if (model) msum[b] += weight * model(kmag * kf);
        count[b] += weight;
      }
    }
  }
  PowerSpectrumBins bins;
  for (int b = 0; b < nbins; ++b) {
    if (count[b] == 0) continue;
    bins.k.push_back(ksum[b] / count[b]);
    bins.power.push_back(psum[b] / count[b]);
    if (model) bins.model.push_back(msum[b] / count[b]);
    bins.modes.push_back(count[b]);
  }
  return bins;
}

}  // namespace synth
}  // namespace cosmoflow
