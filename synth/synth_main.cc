// synth: synthetic dark-matter universes -> HDF5 dataset shards. See docs/data.md.
#include <sys/stat.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "core/io/dataset.h"
#include "core/base/flags.h"
#include "synth/generator_pool.h"
#include "synth/universe.h"

#ifndef COSMOFLOW_GIT_REV
#define COSMOFLOW_GIT_REV "unknown"
#endif

using namespace cosmoflow;
using namespace cosmoflow::synth;

namespace {

constexpr char kUsage[] =
    "usage: synth --out DIR|FILE.h5 [options]\n"
    "Generates dark-matter particle-count cubes: Eisenstein-Hu P(k) normalised to sigma_8, a\n"
    "Gaussian field, 2LPT initial conditions evolved by a particle-mesh N-body code (or truncated\n"
    "Zel'dovich / 2LPT alone), NGP/CIC counts,\n"
    "one channel per redshift, with (Omega_M, sigma_8, n_s) drawn uniformly per sample.\n"
    "Sample i is a pure function of (--seed, i): split work with --first-index.\n";

bool EndsWith(const std::string& s, const std::string& suffix) {
  return s.size() >= suffix.size() &&
         s.compare(s.size() - suffix.size(), suffix.size(), suffix) == 0;
}

std::string Join(const std::vector<double>& v) {
  std::ostringstream s;
  for (size_t i = 0; i < v.size(); ++i) s << (i ? "," : "") << v[i];
  return s.str();
}

int Fail(const Status& s, int code) {
  std::fprintf(stderr, "synth: %s\n", s.message().c_str());
  return code;
}

}  // namespace

int main(int argc, char** argv) {
  std::string out, redshifts_text = "0,0.5,1.5,3", ranges_text, omega_m_text, sigma_8_text,
                   n_s_text, h0_text, transfer_text = "eh98", displacement_text = "pm",
                   assignment_text = "ngp", smoothing_text = "auto", prefix = "synth";
  int64_t samples = 1, side = 128, particles = 0, seed = 0, first_index = 0, samples_per_shard = 64,
          threads = 0, compress = 0, pm_steps = 10, threads_per_cube = 1;
  double voxel_size = 1.0, omega_b = 0.045, h = 0.703, smoothing_factor = 0, pm_z_init = 9;
  bool quiet = false, help = false;
  FlagParser flags;
  flags.AddString("out", &out, "output: a directory (shards <prefix>-<first index>.h5) or FILE.h5");
  flags.AddInt("samples", &samples, "number of cubes (default 1)");
  flags.AddInt("first-index", &first_index, "index of the first sample (default 0)");
  flags.AddInt("seed", &seed, "random seed (default 0)");
  flags.AddInt("side", &side, "voxels per side (default 128)");
  flags.AddDouble("voxel-size", &voxel_size, "Mpc/h per voxel (default 1)");
  flags.AddInt("particles-per-side", &particles,
               "particle grid side (default = side: 1 per voxel)");
  flags.AddString("redshifts", &redshifts_text,
                  "comma-separated, one channel each (default 0,0.5,1.5,3)");
  flags.AddString("ranges", &ranges_text,
                  "Omega_M,sigma_8,n_s ranges as MIN:MAX,MIN:MAX,MIN:MAX "
                  "(default 0.25:0.35,0.78:0.95,0.9:1.0)");
  flags.AddString("omega-m", &omega_m_text, "Omega_M range MIN:MAX (or a single value)");
  flags.AddString("sigma-8", &sigma_8_text, "sigma_8 range MIN:MAX (or a single value)");
  flags.AddString("n-s", &n_s_text, "n_s range MIN:MAX (or a single value)");
  flags.AddDouble("omega-b", &omega_b, "baryon density (default 0.045)");
  flags.AddDouble("h", &h, "H0 / 100 km/s/Mpc (default 0.703)");
  flags.AddString("h0", &h0_text,
                  "draw H0 (km/s/Mpc) from MIN:MAX too (e.g. 63:77, the MLPerf range): adds a 4th "
                  "label H0 and scales the box with H0/70 as the MLPerf data do");
  flags.AddString("transfer", &transfer_text, "eh98 (default) or bbks");
  flags.AddString(
      "displacement", &displacement_text,
      "pm (default: 2LPT + particle-mesh N-body), za or 2lpt (truncated LPT, ~10x faster)");
  flags.AddInt("pm-steps", &pm_steps, "particle-mesh time steps (default 10)");
  flags.AddDouble("pm-initial-redshift", &pm_z_init,
                  "particle-mesh start, 2LPT before it (default 9)");
  flags.AddString("assignment", &assignment_text, "ngp (default) or cic");
  flags.AddString("smoothing", &smoothing_text,
                  "truncation: auto (default, R = factor/k_nl(z)), 0 (none) or R in Mpc/h");
  flags.AddDouble("smoothing-factor", &smoothing_factor,
                  "factor for --smoothing auto (default 0: 0.5 for za, 0.7 for 2lpt)");
  flags.AddInt("samples-per-shard", &samples_per_shard, "cubes per shard file (default 64)");
  flags.AddString("prefix", &prefix, "shard name prefix (default synth)");
  flags.AddInt("compress", &compress, "HDF5 gzip level 0..9 (default 0)");
  flags.AddInt("threads", &threads, "threads in all (default: all cores)");
  flags.AddInt("threads-per-cube", &threads_per_cube,
               "threads inside one cube (default 1: the others generate other cubes)");
  flags.AddBool("quiet", &quiet, "no progress lines");
  flags.AddBool("help", &help, "this text");
  Status s = flags.Parse(argc, argv, nullptr);
  if (help) {
    std::fprintf(stdout, "%s\n%s", kUsage, flags.Usage().c_str());
    return 0;
  }
  if (!s.ok()) return Fail(s, 2);
  if (out.empty()) return Fail(InvalidArgumentError("--out DIR|FILE.h5 is required"), 2);
  if (samples < 1 || samples > 100000000)
    return Fail(InvalidArgumentError("--samples must be >= 1"), 2);
  if (first_index < 0 || seed < 0)
    return Fail(InvalidArgumentError("--first-index and --seed must be >= 0"), 2);
  if (samples_per_shard < 1)
    return Fail(InvalidArgumentError("--samples-per-shard must be >= 1"), 2);
  if (compress < 0 || compress > 9) return Fail(InvalidArgumentError("--compress must be 0..9"), 2);
  if (side < 4 || side > 1024) return Fail(InvalidArgumentError("--side must be in 4..1024"), 2);
  if (particles < 0 || particles > 2048) {
    return Fail(InvalidArgumentError("--particles-per-side must be in 0..2048"), 2);
  }
  if (threads < 0 || threads > 1024) return Fail(InvalidArgumentError("--threads must be >= 0"), 2);
  if (threads_per_cube < 1 || threads_per_cube > 1024) {
    return Fail(InvalidArgumentError("--threads-per-cube must be >= 1"), 2);
  }
  if (threads == 0) threads = std::max(1u, std::thread::hardware_concurrency());
  const int workers = static_cast<int>(std::max<int64_t>(1, threads / threads_per_cube));
  if (prefix.empty() || prefix.find('/') != std::string::npos) {
    return Fail(InvalidArgumentError("--prefix must be a plain file name"), 2);
  }

  UniverseOptions uo;
  uo.side = static_cast<int>(side);
  uo.voxel_size = voxel_size;
  uo.particles_per_side = static_cast<int>(particles);
  uo.threads = static_cast<int>(threads_per_cube);
  uo.smoothing_nl_factor = smoothing_factor;
  if (pm_steps < 1 || pm_steps > 1000)
    return Fail(InvalidArgumentError("--pm-steps must be in 1..1000"), 2);
  uo.pm_steps = static_cast<int>(pm_steps);
  uo.pm_initial_redshift = pm_z_init;
  auto redshifts = ParseDoubleList(redshifts_text, "--redshifts");
  if (!redshifts.ok()) return Fail(redshifts.status(), 2);
  uo.redshifts = *redshifts;
  auto transfer = ParseTransferFunction(transfer_text);
  if (!transfer.ok()) return Fail(transfer.status().WithContext("--transfer"), 2);
  uo.transfer = *transfer;
  auto displacement = ParseDisplacement(displacement_text);
  if (!displacement.ok()) return Fail(displacement.status().WithContext("--displacement"), 2);
  uo.displacement = *displacement;
  auto assignment = ParseMassAssignment(assignment_text);
  if (!assignment.ok()) return Fail(assignment.status().WithContext("--assignment"), 2);
  uo.assignment = *assignment;
  if (smoothing_text == "auto") {
    uo.smoothing = -1;
    if (!(smoothing_factor >= 0 && smoothing_factor < 100)) {
      return Fail(InvalidArgumentError("--smoothing-factor must be in [0, 100)"), 2);
    }
  } else {
    auto r = ParseDouble(smoothing_text, "--smoothing");
    if (!r.ok()) return Fail(r.status(), 2);
    if (*r < 0) return Fail(InvalidArgumentError("--smoothing must be auto, 0 or a radius > 0"), 2);
    uo.smoothing = *r;
  }
  if (Status v = uo.Validate(); !v.ok()) return Fail(v, 2);

  ParamRanges ranges;
  if (!ranges_text.empty()) {
    std::vector<std::string> parts;
    std::stringstream ss(ranges_text);
    std::string part;
    while (std::getline(ss, part, ',')) parts.push_back(part);
    if (parts.size() != 3) {
      return Fail(InvalidArgumentError("--ranges: need 3 ranges MIN:MAX for Omega_M,sigma_8,n_s"),
                  2);
    }
    omega_m_text = omega_m_text.empty() ? parts[0] : omega_m_text;
    sigma_8_text = sigma_8_text.empty() ? parts[1] : sigma_8_text;
    n_s_text = n_s_text.empty() ? parts[2] : n_s_text;
  }
  auto set_range = [](const std::string& text, const char* flag, double* lo, double* hi) {
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
  };
  if (Status r = set_range(omega_m_text, "Omega_M range", &ranges.omega_m_min, &ranges.omega_m_max);
      !r.ok())
    return Fail(r, 2);
  if (Status r = set_range(sigma_8_text, "sigma_8 range", &ranges.sigma_8_min, &ranges.sigma_8_max);
      !r.ok())
    return Fail(r, 2);
  if (Status r = set_range(n_s_text, "n_s range", &ranges.n_s_min, &ranges.n_s_max); !r.ok())
    return Fail(r, 2);
  if (!h0_text.empty()) {
    double lo = 0, hi = 0;
    if (Status r = set_range(h0_text, "H0 range", &lo, &hi); !r.ok()) return Fail(r, 2);
    if (!(lo > 0)) return Fail(InvalidArgumentError("H0 range: values must be > 0 km/s/Mpc"), 2);
    ranges.h_min = lo / 100;
    ranges.h_max = hi / 100;
    uo.scale_box_with_h = true;
  }
  if (Status r = ranges.Validate(); !r.ok()) return Fail(r, 2);
  CosmologyParams base;
  base.omega_b = omega_b;
  base.h = h;
  // Validate the extremes of the ranges once, so a bad --omega-b fails before any work.
  for (double om : {ranges.omega_m_min, ranges.omega_m_max}) {
    CosmologyParams p = base;
    p.omega_m = om;
    if (Status v = p.Validate(); !v.ok()) return Fail(v, 2);
  }

  const bool single_file = EndsWith(out, ".h5");
  if (!single_file) {
    std::error_code ec;  // parents too, as mkdir -p: "--out runs/a/train" on a fresh machine
    std::filesystem::create_directories(out, ec);
    if (ec) return Fail(FailedPreconditionError(out + ": cannot create directory: " + ec.message()), 1);
  }
  if (single_file) samples_per_shard = samples;

  DatasetInfo info;
  info.shape = CubeShape{static_cast<int>(uo.redshifts.size()), uo.side, uo.side, uo.side};
  info.param_names = {"Omega_M", "sigma_8", "n_s"};
  info.param_units = {"", "", ""};
  if (ranges.draws_h()) {  // the same name and unit as the MLPerf importer's 4th label
    info.param_names.push_back("H0");
    info.param_units.push_back("km/s/Mpc");
  }
  info.redshifts = uo.redshifts;
  info.box_size_mpc_h = uo.box_size();
  info.generator = "synth " COSMOFLOW_GIT_REV " seed=" + std::to_string(seed);
  std::ostringstream prov;
  prov << "synth (git " COSMOFLOW_GIT_REV ")\ncommand: " << JoinCommandLine(argc, argv)
       << "\nseed=" << seed << " transfer=" << TransferFunctionName(uo.transfer)
       << " displacement=" << DisplacementName(uo.displacement)
       << " assignment=" << MassAssignmentName(uo.assignment)
       << (uo.displacement == Displacement::kPm
               ? " pm_steps=" + std::to_string(uo.pm_steps) +
                     " pm_initial_redshift=" + std::to_string(uo.pm_initial_redshift)
               : std::string())
       << " smoothing="
       << (uo.smoothing < 0 ? "auto(" + std::to_string(uo.NlFactor()) + "/k_nl(z))"
                            : std::to_string(uo.smoothing))
       << " particles_per_side=" << uo.particle_grid() << " voxel_size_mpc_h=" << uo.voxel_size
       << " redshifts=" << Join(uo.redshifts) << " omega_b=" << omega_b << " h=" << h
       << "\nranges: Omega_M " << ranges.omega_m_min << ":" << ranges.omega_m_max << " sigma_8 "
       << ranges.sigma_8_min << ":" << ranges.sigma_8_max << " n_s " << ranges.n_s_min << ":"
       << ranges.n_s_max
       << (ranges.draws_h() ? " H0 " + std::to_string(100 * ranges.h_min) + ":" +
                                  std::to_string(100 * ranges.h_max) +
                                  " (box scales with H0/70; box_size_mpc_h is the value at H0 = 70)"
                            : std::string())
       << " (uniform)";
  DatasetWriteOptions write_options;
  write_options.compression_level = static_cast<int>(compress);

  auto pool = GeneratorPool::Create(uo, workers, ranges, base, static_cast<uint64_t>(seed),
                                    first_index, samples);
  if (!pool.ok()) return Fail(pool.status(), 1);
  const auto start = std::chrono::steady_clock::now();
  auto last_progress = start;
  std::unique_ptr<DatasetWriter> writer;
  std::string shard_path;
  std::vector<std::string> shards;
  for (int64_t n = 0; n < samples; ++n) {
    const int64_t index = first_index + n;
    if (n % samples_per_shard == 0) {
      if (writer) {
        if (Status c = writer->Close(); !c.ok()) return Fail(c, 1);
        shards.push_back(shard_path);
      }
      if (single_file) {
        shard_path = out;
      } else {
        char name[32];
        std::snprintf(name, sizeof(name), "-%08lld.h5", static_cast<long long>(index));
        shard_path = out + "/" + prefix + name;
      }
      info.provenance = prov.str() + "\nsamples: " + std::to_string(index) + ".." +
                        std::to_string(index + std::min(samples_per_shard, samples - n) - 1);
      auto w = DatasetWriter::Create(shard_path, info, write_options);
      if (!w.ok()) return Fail(w.status(), 1);
      writer = std::move(w).value();
    }
    auto sample = (*pool)->Next();
    if (!sample.ok()) return Fail(sample.status(), 1);
    const CosmologyParams& params = sample->params;
    std::vector<float> labels = {static_cast<float>(params.omega_m),
                                 static_cast<float>(params.sigma_8),
                                 static_cast<float>(params.n_s)};
    if (ranges.draws_h()) labels.push_back(static_cast<float>(100 * params.h));
    Status a = writer->Append(sample->cube, labels);
    if (!a.ok()) return Fail(a.WithContext(shard_path), 1);
    const auto now = std::chrono::steady_clock::now();
    if (!quiet &&
        (std::chrono::duration<double>(now - last_progress).count() > 2.0 || n + 1 == samples)) {
      last_progress = now;
      const double t = std::chrono::duration<double>(now - start).count();
      const double rate = (n + 1) / t;
      std::fprintf(stderr, "synth: %lld/%lld cubes, %.2f cubes/s, ETA %.0f s\n",
                   static_cast<long long>(n + 1), static_cast<long long>(samples), rate,
                   (samples - n - 1) / rate);
    }
  }
  if (writer) {
    if (Status c = writer->Close(); !c.ok()) return Fail(c, 1);
    shards.push_back(shard_path);
  }
  for (const auto& p : shards) std::printf("%s\n", p.c_str());
  return 0;
}
