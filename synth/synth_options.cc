#include "synth/synth_options.h"

#include <algorithm>
#include <sstream>
#include <thread>
#include <vector>

#include "core/base/flags.h"
#include "synth/mlperf.h"

namespace cosmoflow {
namespace synth {
namespace {

constexpr char kUsage[] =
    "usage: synth --out DIR|FILE.h5 [options]\n"
    "Generates dark-matter particle-count cubes: Eisenstein-Hu P(k) normalised to sigma_8, a\n"
    "Gaussian field, 2LPT initial conditions evolved by a particle-mesh N-body code (or truncated\n"
    "Zel'dovich / 2LPT alone), NGP/CIC counts,\n"
    "one channel per redshift, with (Omega_M, sigma_8, n_s) drawn uniformly per sample.\n"
    "Sample i is a pure function of (--seed, i): split work with --first-index.\n";

// The flags as given, before they are checked and turned into SynthOptions.
struct RawFlags {
  std::string out, redshifts = "0,0.5,1.5,3", ranges, omega_m, sigma_8, n_s, h0, transfer = "eh98",
                   displacement = "pm", assignment = "ngp", pm_gradient = "fd4",
                   pm_step_spacing = "a", pm_scheme = "pm", smoothing = "auto", prefix = "synth",
                   preset;
  int64_t samples = 1, side = 128, particles = 0, seed = 0, first_index = 0, samples_per_shard = 64,
          threads = 0, compress = 0, pm_steps = 10, threads_per_cube = 1, pm_mesh = 1;
  double voxel_size = 1.0, omega_b = 0.045, h = 0.703, smoothing_factor = 0, pm_z_init = 9;
  bool quiet = false, help = false;
};

void AddFlags(FlagParser& flags, RawFlags& f) {
  flags.AddString("preset", &f.preset,
                  "mlperf: the MLPerf CosmoFlow prior, geometry and evolution (docs/data.md); "
                  "any other flag given overrides the preset's value");
  flags.AddString("out", &f.out,
                  "output: a directory (shards <prefix>-<first index>.h5) or FILE.h5");
  flags.AddInt("samples", &f.samples, "number of cubes (default 1)");
  flags.AddInt("first-index", &f.first_index, "index of the first sample (default 0)");
  flags.AddInt("seed", &f.seed, "random seed (default 0)");
  flags.AddInt("side", &f.side, "voxels per side (default 128)");
  flags.AddDouble("voxel-size", &f.voxel_size, "Mpc/h per voxel (default 1)");
  flags.AddInt("particles-per-side", &f.particles,
               "particle grid side (default = side: 1 per voxel)");
  flags.AddString("redshifts", &f.redshifts,
                  "comma-separated, one channel each (default 0,0.5,1.5,3)");
  flags.AddString("ranges", &f.ranges,
                  "Omega_M,sigma_8,n_s ranges as MIN:MAX,MIN:MAX,MIN:MAX "
                  "(default 0.25:0.35,0.78:0.95,0.9:1.0)");
  flags.AddString("omega-m", &f.omega_m, "Omega_M range MIN:MAX (or a single value)");
  flags.AddString("sigma-8", &f.sigma_8, "sigma_8 range MIN:MAX (or a single value)");
  flags.AddString("n-s", &f.n_s, "n_s range MIN:MAX (or a single value)");
  flags.AddDouble("omega-b", &f.omega_b, "baryon density (default 0.045)");
  flags.AddDouble("h", &f.h, "H0 / 100 km/s/Mpc (default 0.703)");
  flags.AddString("h0", &f.h0,
                  "draw H0 (km/s/Mpc) from MIN:MAX too (e.g. 63:77, the MLPerf range): adds a 4th "
                  "label H0 and scales the box with H0/70 as the MLPerf data do");
  flags.AddString("transfer", &f.transfer, "eh98 (default) or bbks");
  flags.AddString(
      "displacement", &f.displacement,
      "pm (default: 2LPT + particle-mesh N-body), za or 2lpt (truncated LPT, ~10x faster)");
  flags.AddInt("pm-steps", &f.pm_steps, "particle-mesh time steps (default 10)");
  flags.AddDouble("pm-initial-redshift", &f.pm_z_init,
                  "particle-mesh start, 2LPT before it (default 9)");
  flags.AddString("pm-gradient", &f.pm_gradient,
                  "particle-mesh force: fd4 (default, 4-point difference of the potential) or ik "
                  "(spectral, 2 more FFTs per step)");
  flags.AddString("pm-step-spacing", &f.pm_step_spacing,
                  "particle-mesh steps even in a (default) or in loga (more steps at early times)");
  flags.AddString("pm-scheme", &f.pm_scheme,
                  "particle-mesh integration: pm (default, kick-drift-kick of the particles) or "
                  "cola (of their residual from 2LPT, as pyCOLA)");
  flags.AddInt(
      "pm-mesh", &f.pm_mesh,
      "particle-mesh force cells per voxel along each axis: 1 (default), 2 (8x cost) or 3 (27x)");
  flags.AddString("assignment", &f.assignment, "ngp (default) or cic");
  flags.AddString("smoothing", &f.smoothing,
                  "truncation: auto (default, R = factor/k_nl(z)), 0 (none) or R in Mpc/h");
  flags.AddDouble("smoothing-factor", &f.smoothing_factor,
                  "factor for --smoothing auto (default 0: 0.5 for za, 0.7 for 2lpt)");
  flags.AddInt("samples-per-shard", &f.samples_per_shard, "cubes per shard file (default 64)");
  flags.AddString("prefix", &f.prefix, "shard name prefix (default synth)");
  flags.AddInt("compress", &f.compress, "HDF5 gzip level 0..9 (default 0)");
  flags.AddInt("threads", &f.threads, "threads in all (default: all cores)");
  flags.AddInt("threads-per-cube", &f.threads_per_cube,
               "threads inside one cube (default 1: the others generate other cubes)");
  flags.AddBool("quiet", &f.quiet, "no progress lines");
  flags.AddBool("help", &f.help, "this text");
}

bool EndsWith(const std::string& s, const std::string& suffix) {
  return s.size() >= suffix.size() &&
         s.compare(s.size() - suffix.size(), suffix.size(), suffix) == 0;
}

// Counts, sizes, threads and file names.
Status CheckRunFlags(RawFlags& f, SynthOptions& o) {
  if (f.out.empty()) return InvalidArgumentError("--out DIR|FILE.h5 is required");
  if (f.samples < 1 || f.samples > 100000000) return InvalidArgumentError("--samples must be >= 1");
  if (f.first_index < 0 || f.seed < 0)
    return InvalidArgumentError("--first-index and --seed must be >= 0");
  if (f.samples_per_shard < 1) return InvalidArgumentError("--samples-per-shard must be >= 1");
  if (f.compress < 0 || f.compress > 9) return InvalidArgumentError("--compress must be 0..9");
  if (f.side < 4 || f.side > 1024) return InvalidArgumentError("--side must be in 4..1024");
  if (f.particles < 0 || f.particles > 2048) {
    return InvalidArgumentError("--particles-per-side must be in 0..2048");
  }
  if (f.threads < 0 || f.threads > 1024) return InvalidArgumentError("--threads must be >= 0");
  if (f.threads_per_cube < 1 || f.threads_per_cube > 1024) {
    return InvalidArgumentError("--threads-per-cube must be >= 1");
  }
  if (f.threads == 0) f.threads = std::max(1u, std::thread::hardware_concurrency());
  if (f.prefix.empty() || f.prefix.find('/') != std::string::npos) {
    return InvalidArgumentError("--prefix must be a plain file name");
  }
  o.out = f.out;
  o.prefix = f.prefix;
  o.single_file = EndsWith(f.out, ".h5");
  o.samples = f.samples;
  o.first_index = f.first_index;
  o.seed = f.seed;
  o.samples_per_shard = o.single_file ? f.samples : f.samples_per_shard;
  o.compression_level = static_cast<int>(f.compress);
  o.workers = static_cast<int>(std::max<int64_t>(1, f.threads / f.threads_per_cube));
  o.quiet = f.quiet;
  return Status::Ok();
}

// The universe: grid, redshifts, physics choices, truncation.
Status SetUniverse(const RawFlags& f, UniverseOptions& uo) {
  uo.side = static_cast<int>(f.side);
  uo.voxel_size = f.voxel_size;
  uo.particles_per_side = static_cast<int>(f.particles);
  uo.threads = static_cast<int>(f.threads_per_cube);
  uo.smoothing_nl_factor = f.smoothing_factor;
  if (f.pm_steps < 1 || f.pm_steps > 1000)
    return InvalidArgumentError("--pm-steps must be in 1..1000");
  uo.pm_steps = static_cast<int>(f.pm_steps);
  uo.pm_initial_redshift = f.pm_z_init;
  uo.pm_mesh_factor = static_cast<int>(f.pm_mesh);
  CF_ASSIGN_OR_RETURN(uo.redshifts, ParseDoubleList(f.redshifts, "--redshifts"));
  auto transfer = ParseTransferFunction(f.transfer);
  if (!transfer.ok()) return transfer.status().WithContext("--transfer");
  uo.transfer = *transfer;
  auto displacement = ParseDisplacement(f.displacement);
  if (!displacement.ok()) return displacement.status().WithContext("--displacement");
  uo.displacement = *displacement;
  auto gradient = ParsePmGradient(f.pm_gradient);
  if (!gradient.ok()) return gradient.status().WithContext("--pm-gradient");
  uo.pm_gradient = *gradient;
  auto spacing = ParsePmStepSpacing(f.pm_step_spacing);
  if (!spacing.ok()) return spacing.status().WithContext("--pm-step-spacing");
  uo.pm_step_spacing = *spacing;
  auto scheme = ParsePmScheme(f.pm_scheme);
  if (!scheme.ok()) return scheme.status().WithContext("--pm-scheme");
  uo.pm_scheme = *scheme;
  auto assignment = ParseMassAssignment(f.assignment);
  if (!assignment.ok()) return assignment.status().WithContext("--assignment");
  uo.assignment = *assignment;
  if (f.smoothing == "auto") {
    uo.smoothing = -1;
    if (!(f.smoothing_factor >= 0 && f.smoothing_factor < 100)) {
      return InvalidArgumentError("--smoothing-factor must be in [0, 100)");
    }
  } else {
    CF_ASSIGN_OR_RETURN(double r, ParseDouble(f.smoothing, "--smoothing"));
    if (r < 0) return InvalidArgumentError("--smoothing must be auto, 0 or a radius > 0");
    uo.smoothing = r;
  }
  return uo.Validate();
}

// "MIN:MAX" or a single value; empty leaves the default.
Status SetRange(const std::string& text, const char* flag, double* lo, double* hi) {
  if (text.empty()) return Status::Ok();
  if (text.find(':') == std::string::npos) {
    CF_ASSIGN_OR_RETURN(*lo, ParseDouble(text, flag));
    *hi = *lo;
    return Status::Ok();
  }
  CF_ASSIGN_OR_RETURN(auto r, ParseRange(text, flag));
  *lo = r.first;
  *hi = r.second;
  return Status::Ok();
}

// The parameter ranges (--ranges, then --omega-m/--sigma-8/--n-s over it, --h0) and the fixed
// cosmology, checked at the extremes so that a bad --omega-b fails before any work.
Status SetRanges(const RawFlags& f, SynthOptions& o) {
  std::string omega_m = f.omega_m, sigma_8 = f.sigma_8, n_s = f.n_s;
  if (!f.ranges.empty()) {
    std::vector<std::string> parts;
    std::stringstream ss(f.ranges);
    std::string part;
    while (std::getline(ss, part, ',')) parts.push_back(part);
    if (parts.size() != 3) {
      return InvalidArgumentError("--ranges: need 3 ranges MIN:MAX for Omega_M,sigma_8,n_s");
    }
    omega_m = omega_m.empty() ? parts[0] : omega_m;
    sigma_8 = sigma_8.empty() ? parts[1] : sigma_8;
    n_s = n_s.empty() ? parts[2] : n_s;
  }
  ParamRanges& ranges = o.ranges;
  CF_RETURN_IF_ERROR(SetRange(omega_m, "Omega_M range", &ranges.omega_m_min, &ranges.omega_m_max));
  CF_RETURN_IF_ERROR(SetRange(sigma_8, "sigma_8 range", &ranges.sigma_8_min, &ranges.sigma_8_max));
  CF_RETURN_IF_ERROR(SetRange(n_s, "n_s range", &ranges.n_s_min, &ranges.n_s_max));
  if (!f.h0.empty()) {
    double lo = 0, hi = 0;
    CF_RETURN_IF_ERROR(SetRange(f.h0, "H0 range", &lo, &hi));
    if (!(lo > 0)) return InvalidArgumentError("H0 range: values must be > 0 km/s/Mpc");
    ranges.h_min = lo / 100;
    ranges.h_max = hi / 100;
    o.universe.scale_box_with_h = true;
  }
  CF_RETURN_IF_ERROR(ranges.Validate());
  o.base.omega_b = f.omega_b;
  o.base.h = f.h;
  for (double om : {ranges.omega_m_min, ranges.omega_m_max}) {
    CosmologyParams p = o.base;
    p.omega_m = om;
    CF_RETURN_IF_ERROR(p.Validate());
  }
  return Status::Ok();
}

// "MIN:MAX" of MLPerf parameter p: p0 (1 + 0.1 u) at u = -1 and +1 (synth/mlperf.h).
std::string MlperfRangeText(int p) {
  std::ostringstream s;
  s.precision(10);
  s << MlperfUnitToPhysical(p, -1.0) << ":" << MlperfUnitToPhysical(p, 1.0);
  return s.str();
}

// Sets every preset field the command line did not set. The mlperf preset: the prior of the MLPerf
// CosmoFlow set (each parameter p0 (1 + 0.1 u), u uniform in [-1, 1], H0 included, box scaled
// by H0/70), its geometry (128^3 voxels of 1 Mpc/h at H0 = 70, one particle per voxel, z = 0,
// 0.5, 1.5, 3) and the evolution closest to its pyCOLA runs (2LPT at z = 9 + 10 PM steps, NGP
// counts). docs/data.md says why these settings.
Status ApplyPreset(const FlagParser& flags, RawFlags& f) {
  if (f.preset.empty()) return Status::Ok();
  if (f.preset != "mlperf") {
    return InvalidArgumentError("--preset '" + f.preset + "' is not one of: mlperf");
  }
  auto set = [&](const char* flag, auto* field, auto value) {
    if (!flags.Seen(flag)) *field = value;
  };
  set("side", &f.side, int64_t{kMlperfSide});
  set("voxel-size", &f.voxel_size, kMlperfNominalBoxMpcH / kMlperfSide);
  set("particles-per-side", &f.particles, int64_t{0});
  std::ostringstream z;
  for (size_t c = 0; c < kMlperfRedshifts.size(); ++c) z << (c ? "," : "") << kMlperfRedshifts[c];
  set("redshifts", &f.redshifts, z.str());
  set("displacement", &f.displacement, std::string("pm"));
  set("pm-steps", &f.pm_steps, int64_t{10});
  set("pm-initial-redshift", &f.pm_z_init, 9.0);
  set("pm-gradient", &f.pm_gradient, std::string("fd4"));
  set("pm-step-spacing", &f.pm_step_spacing, std::string("a"));
  set("pm-scheme", &f.pm_scheme, std::string("pm"));
  set("pm-mesh", &f.pm_mesh, int64_t{1});
  set("assignment", &f.assignment, std::string("ngp"));
  set("transfer", &f.transfer, std::string("eh98"));
  if (!flags.Seen("ranges")) {
    set("omega-m", &f.omega_m, MlperfRangeText(0));
    set("sigma-8", &f.sigma_8, MlperfRangeText(1));
    set("n-s", &f.n_s, MlperfRangeText(2));
  }
  set("h0", &f.h0, MlperfRangeText(3));
  set("prefix", &f.prefix, std::string("mlperf-synth"));
  return Status::Ok();
}

}  // namespace

StatusOr<SynthOptions> ParseSynthOptions(int argc, char** argv, bool* help) {
  RawFlags f;
  FlagParser flags;
  AddFlags(flags, f);
  Status s = flags.Parse(argc, argv, nullptr);
  *help = f.help;
  if (f.help) return SynthOptions();
  CF_RETURN_IF_ERROR(s);
  CF_RETURN_IF_ERROR(ApplyPreset(flags, f));
  SynthOptions o;
  o.preset = f.preset;
  CF_RETURN_IF_ERROR(CheckRunFlags(f, o));
  CF_RETURN_IF_ERROR(SetUniverse(f, o.universe));
  CF_RETURN_IF_ERROR(SetRanges(f, o));
  o.command_line = JoinCommandLine(argc, argv);
  return o;
}

std::string SynthUsageText() {
  RawFlags f;
  FlagParser flags;
  AddFlags(flags, f);
  return std::string(kUsage) + "\n" + flags.Usage();
}

}  // namespace synth
}  // namespace cosmoflow
