// Synthetic dark-matter universes: a Gaussian random field with the linear power spectrum of a
// flat LambdaCDM cosmology, particles moved by Lagrangian perturbation theory, counted per
// voxel into an int16 cube with one channel per redshift; optionally (by default) evolved by a
// particle-mesh N-body code.
//
// Recipe (per sample):
//  1. White noise w_j ~ N(0, 1) on the particle grid (N_p^3 points, spacing L / N_p, L = side x
//     voxel size), drawn by the counter-based generator of random.h from (seed, sample index).
//  2. Forward FFT and colouring: delta_k = W_k sqrt(P(k) / dV), dV = (L / N_p)^3, which gives
//     <|delta(k)|^2> = V P(k) for the continuous transform (delta(k) = dV DFT(delta)). The k = 0
//     mode is zeroed (the box has the mean density). This is the z = 0 linear density field.
//  3. Zel'dovich displacement Psi1(k) = i k / k^2 delta(k) (so div Psi1 = -delta), and with 2LPT
//     Psi2(k) = i k phi2(k), phi2(k) = -S(k) / k^2, S = sum_{a<b} (phi_aa phi_bb - phi_ab^2),
//     phi_ab(k) = k_a k_b / k^2 delta(k) (Scoccimarro 1998, MNRAS 299, 1097; Crocce, Pueblas &
//     Scoccimarro 2006, MNRAS 373, 369, eqs. 2-5).
//  4. For each redshift z (displacements za, 2lpt): x = q + D(z) Psi1 + D2(z) Psi2, periodic in
//     the box; all channels share one initial field, as snapshots of one simulation do. The field
//     that moves the particles is Gaussian-truncated at R(z) ~ 1/k_nl(z) (see `smoothing`).
//  4'. Particle mesh (displacement pm, the default): 2LPT positions and momenta at z_init = 9,
//     then kick-drift-kick steps in a with FastPM's factors (Feng et al. 2016, MNRAS 463, 2273),
//     gravity from a CIC density on a mesh of one cell per voxel (Poisson equation solved by FFT,
//     force -grad phi by a 4-point finite difference of phi, or the exact i k gradient; CIC
//     interpolation back to the particles).
//     Snapshots are taken at the channel redshifts.
//  5. Mass assignment into side^3 voxels: NGP (nearest grid point, as the CosmoFlow data are
//     counted) or CIC (cloud in cell; Hockney & Eastwood 1981), then int16.
// Lagrangian positions q are the centres of the particle grid cells. With NGP, sum of counts =
// N_p^3 exactly, so the mean count per voxel is (N_p / side)^3 exactly. CIC counts are rounded to
// the nearest integer per voxel: the total is then only approximately conserved. Mass is summed in
// fixed point, so results do not depend on the thread count.
//
// Zel'dovich/2LPT move particles on straight lines and never bind them into haloes: voids and
// filaments look right, but the densest voxels hold far fewer particles than in an N-body run.
// The particle mesh forms haloes down to its force resolution (~2-3 voxels) and reproduces the
// real CosmoFlow cubes' count statistics closely (docs/data.md has the comparison).
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "core/base/status.h"
#include "core/io/cube.h"
#include "synth/cosmology.h"

namespace cosmoflow {
namespace synth {

enum class Displacement { kZeldovich, k2Lpt, kPm };
enum class MassAssignment { kNgp, kCic };
// How the particle mesh differentiates the potential: a 4-point finite difference of phi (one
// inverse FFT per step) or the exact spectral gradient i k phi (three).
enum class PmGradient { kFiniteDifference, kSpectral };
// How the particle mesh spaces its time steps: evenly in the scale factor a, or evenly in ln a
// (more steps at early times, where the high-redshift channels form).
enum class PmStepSpacing { kLinearA, kLogA };
// How the particle mesh integrates: plain kick-drift-kick of the particles (FastPM's factors), or
// COLA (Tassev, Zaldarriaga & Eisenstein 2013, JCAP 06, 036), the scheme of pyCOLA, which made the
// real CosmoFlow cubes: the steps integrate only each particle's residual from its 2LPT
// trajectory, x = q + D1 psi1 + D2 psi2 + x_res, kicked by the force minus the 2LPT trajectory's
// own acceleration, with pyCOLA's time-stepping ansatz (n_cola = -2.5).
enum class PmScheme { kPm, kCola };

const char* DisplacementName(Displacement d);      // "za", "2lpt", "pm"
const char* MassAssignmentName(MassAssignment m);  // "ngp", "cic"
StatusOr<Displacement> ParseDisplacement(const std::string& name);
StatusOr<MassAssignment> ParseMassAssignment(const std::string& name);
const char* PmGradientName(PmGradient g);  // "fd4", "ik"
StatusOr<PmGradient> ParsePmGradient(const std::string& name);
const char* PmStepSpacingName(PmStepSpacing s);  // "a", "loga"
StatusOr<PmStepSpacing> ParsePmStepSpacing(const std::string& name);
const char* PmSchemeName(PmScheme s);  // "pm", "cola"
StatusOr<PmScheme> ParsePmScheme(const std::string& name);

// The particle-mesh time nodes (scale factors) from a_init to the last of `output_as` (sorted,
// all > a_init), pm_steps steps in all: every output is a node, the steps are shared among the
// intervals between outputs in proportion to their length in a (kLinearA) or ln a (kLogA), at least
// one each, and spaced evenly in that variable within each interval.
std::vector<double> PmTimeNodes(double a_init, const std::vector<double>& output_as, int pm_steps,
                                PmStepSpacing spacing);

inline std::vector<double> DefaultRedshifts() { return {0.0, 0.5, 1.5, 3.0}; }

struct UniverseOptions {
  int side = 128;              // voxels per side of the output cube
  double voxel_size = 1.0;     // Mpc/h per voxel; the periodic box is side * voxel_size
  int particles_per_side = 0;  // N_p; 0 means side (one particle per voxel)
  // One output channel each; the real data's z = 0, 0.5, 1.5, 3 by default. (Built by a function:
  // GCC 12 warns falsely about a braced default here.)
  std::vector<double> redshifts = DefaultRedshifts();
  TransferFunction transfer = TransferFunction::kEisensteinHu;
  Displacement displacement = Displacement::kPm;  // see docs/data.md for the choice
  MassAssignment assignment = MassAssignment::kNgp;
  // Gaussian truncation of the field that moves the particles, exp(-k^2 R^2 / 2) ("truncated
  // Zel'dovich", Coles, Melott & Shandarin 1993, MNRAS 260, 765; T2LPT, Melott 1995): removes the
  // modes that have gone non-linear, whose shell crossing would otherwise smear the densest regions
  // out again. R > 0: in Mpc/h, for every channel; R = 0: none; R < 0: automatic and per channel,
  // R(z) = smoothing_nl_factor / k_nl(z), k_nl(z) the non-linear wavenumber at z (cosmology.h).
  // The automatic mode recomputes the displacements for each channel (one set of FFTs each).
  double smoothing = -1;
  // 0 = the tuned default for the displacement: 0.5 for Zel'dovich, 0.7 for 2LPT (the values
  // for which count variance falls monotonically with z on every seed tried and the cubes come
  // closest to the real ones; docs/data.md).
  double smoothing_nl_factor = 0;
  // Particle mesh (displacement kPm): 2LPT initial conditions at pm_initial_redshift, then
  // pm_steps kick-drift-kick steps (FastPM factors) to the lowest output redshift (at least one
  // between consecutive output redshifts), forces from a CIC density on the particle grid (one
  // mesh cell per voxel). Costs 2 FFTs (4 with the i k gradient) + 3 passes over the particles per
  // step.
  int pm_steps = 10;
  double pm_initial_redshift = 9.0;
  PmGradient pm_gradient = PmGradient::kFiniteDifference;
  PmStepSpacing pm_step_spacing = PmStepSpacing::kLinearA;
  PmScheme pm_scheme = PmScheme::kPm;
  // Force mesh cells per particle-grid cell along each axis: 1 (the default), 2 (8x the mesh
  // cells: forces resolved to ~1 cell of the output grid instead of ~2-3, at ~8x the mesh cost) or
  // 3 (27x: the mesh COLA codes commonly run, 3x the particle grid).
  int pm_mesh_factor = 1;
  double NlFactor() const {
    if (smoothing_nl_factor > 0) return smoothing_nl_factor;
    return displacement == Displacement::k2Lpt ? 0.7 : 0.5;
  }
  int threads = 0;  // OpenMP + FFTW threads; 0 = omp_get_max_threads()

  // MLPerf convention (the real CosmoFlow data): the box is fixed in Mpc, so in Mpc/h it scales
  // as h / 0.7: side * voxel_size * h / 0.7 Mpc/h (voxel_size is then the value at H0 = 70).
  bool scale_box_with_h = false;

  double box_size() const { return side * voxel_size; }  // nominal (at h = 0.7 if scaled)
  double BoxSize(double h) const { return scale_box_with_h ? box_size() * h / 0.7 : box_size(); }
  int particle_grid() const { return particles_per_side > 0 ? particles_per_side : side; }
  // Checks sizes (side 4..1024, even particle grid, at most 2^31 particles), redshifts (>= 0,
  // at least one) and voxel size; errors name the option.
  Status Validate() const;
};

// Builds universes of one geometry. Owns FFTW plans and work buffers (about 13 N_p^3 floats for
// za, 16 for 2lpt, 22 plus 2 x threads x 8-byte mass grids for pm: ~200 MB at 128^3 for pm), so
// creating one is not free; reuse it for many samples. Not thread-safe: use one per thread (or a
// GeneratorPool). Output depends only on (cosmology, seed, index, options without `threads`):
// FFTW plans are made with FFTW_ESTIMATE and mass is summed in fixed point, so neither timing nor
// the thread count changes a byte (tested).
class UniverseGenerator {
 public:
  static StatusOr<std::unique_ptr<UniverseGenerator>> Create(const UniverseOptions& options);
  ~UniverseGenerator();

  const UniverseOptions& options() const { return options_; }

  // The z = 0 linear density contrast on the particle grid, N_p^3 floats in C order (x slowest).
  Status LinearDensity(const Cosmology& cosmology, uint64_t seed, uint64_t index,
                       std::vector<float>* delta);

  // The truncation radius (Mpc/h) used for the channel at redshift z (0 = none).
  double SmoothingRadius(const Cosmology& cosmology, double z) const;

  // A cube of shape (redshifts, side, side, side), int16 counts. Fails (OUT_OF_RANGE) if a voxel
  // would exceed 32767 particles rather than wrapping.
  StatusOr<Cube> Generate(const Cosmology& cosmology, uint64_t seed, uint64_t index);

  // CPU seconds of the calling thread spent in each stage of every Generate() so far (bench_synth's
  // profile; the whole cost with threads = 1).
  enum Stage {
    kNoise,
    kLpt,
    kMeshDensity,
    kMeshFft,
    kMeshGradient,
    kKickDrift,
    kCounts,
    kNumStages
  };
  static const char* StageName(Stage s);
  double StageSeconds(Stage s) const;

 private:
  UniverseGenerator() = default;
  Status ParticleMesh(const Cosmology& cosmology, uint64_t index, double box, Cube* cube);
  struct Impl;
  std::unique_ptr<Impl> impl_;
  UniverseOptions options_;
};

// Parameter ranges to draw from, uniformly and independently (the CosmoFlow ranges by default).
struct ParamRanges {
  double omega_m_min = 0.25, omega_m_max = 0.35;
  double sigma_8_min = 0.78, sigma_8_max = 0.95;
  double n_s_min = 0.90, n_s_max = 1.00;
  double h_min = 0, h_max = 0;  // h is drawn only when h_max > 0 (else CosmologyParams' h)
  bool draws_h() const { return h_max > 0; }
  Status Validate() const;  // min <= max, and every value within CosmologyParams' limits
};

// Draws (Omega_M, sigma_8, n_s[, h]) for sample `index`; a pure function of (ranges, seed, index).
CosmologyParams DrawParams(const ParamRanges& ranges, uint64_t seed, uint64_t index,
                           const CosmologyParams& base = {});

// Spherically averaged power spectrum of a real periodic field on an n^3 grid of side `box`
// (Mpc/h): bins of width k_f = 2 pi / box centred on multiples of k_f, up to the Nyquist
// frequency. P = |dV DFT(delta)|^2 / V. When `model` is set, each bin also holds the mean of
// model(|k|) over the same modes, which is what the measurement should match on average.
struct PowerSpectrumBins {
  std::vector<double> k;       // mean |k| of the modes in the bin, h/Mpc
  std::vector<double> power;   // mean measured P, (Mpc/h)^3
  std::vector<double> model;   // mean model P over the same modes (empty without a model)
  std::vector<int64_t> modes;  // number of modes (counting k and -k once each)
};
PowerSpectrumBins MeasurePowerSpectrum(const float* field, int n, double box,
                                       const std::function<double(double)>& model = nullptr);

}  // namespace synth
}  // namespace cosmoflow
