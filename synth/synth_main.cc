// synth: synthetic dark-matter universes -> HDF5 dataset shards. See docs/data.md.
//
// Exit codes: 0 done (the shard paths on stdout, one a line), 1 a failure while generating or
// writing, 2 bad flags (synth_options.h).
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <memory>
#include <sstream>
#include <string>
#include <vector>

#include "core/io/dataset.h"
#include "synth/generator_pool.h"
#include "synth/synth_options.h"
#include "synth/universe.h"

#ifndef COSMOFLOW_GIT_REV
#define COSMOFLOW_GIT_REV "unknown"
#endif

using namespace cosmoflow;
using namespace cosmoflow::synth;

namespace {

std::string Join(const std::vector<double>& v) {
  std::ostringstream s;
  for (size_t i = 0; i < v.size(); ++i) s << (i ? "," : "") << v[i];
  return s.str();
}

int Fail(const Status& s, int code) {
  std::fprintf(stderr, "synth: %s\n", s.message().c_str());
  return code;
}

// What every shard records about how its cubes were made (the sample range is added per shard).
std::string Provenance(const SynthOptions& o) {
  const UniverseOptions& uo = o.universe;
  const ParamRanges& ranges = o.ranges;
  std::ostringstream prov;
  prov << "synth (git " COSMOFLOW_GIT_REV ")\ncommand: " << o.command_line
       << (o.preset.empty() ? std::string() : "\npreset: " + o.preset) << "\nseed=" << o.seed
       << " transfer=" << TransferFunctionName(uo.transfer)
       << " displacement=" << DisplacementName(uo.displacement)
       << " assignment=" << MassAssignmentName(uo.assignment)
       << (uo.displacement == Displacement::kPm
               ? " pm_steps=" + std::to_string(uo.pm_steps) +
                     " pm_initial_redshift=" + std::to_string(uo.pm_initial_redshift) +
                     " pm_gradient=" + PmGradientName(uo.pm_gradient) +
                     " pm_step_spacing=" + PmStepSpacingName(uo.pm_step_spacing) + " pm_scheme=" +
                     PmSchemeName(uo.pm_scheme) + " pm_mesh=" + std::to_string(uo.pm_mesh_factor)
               : std::string())
       << " smoothing="
       << (uo.smoothing < 0 ? "auto(" + std::to_string(uo.NlFactor()) + "/k_nl(z))"
                            : std::to_string(uo.smoothing))
       << " particles_per_side=" << uo.particle_grid() << " voxel_size_mpc_h=" << uo.voxel_size
       << " redshifts=" << Join(uo.redshifts) << " omega_b=" << o.base.omega_b << " h=" << o.base.h
       << "\nranges: Omega_M " << ranges.omega_m_min << ":" << ranges.omega_m_max << " sigma_8 "
       << ranges.sigma_8_min << ":" << ranges.sigma_8_max << " n_s " << ranges.n_s_min << ":"
       << ranges.n_s_max
       << (ranges.draws_h() ? " H0 " + std::to_string(100 * ranges.h_min) + ":" +
                                  std::to_string(100 * ranges.h_max) +
                                  " (box scales with H0/70; box_size_mpc_h is the value at H0 = 70)"
                            : std::string())
       << " (uniform)";
  return prov.str();
}

DatasetInfo DescribeDataset(const SynthOptions& o) {
  const UniverseOptions& uo = o.universe;
  DatasetInfo info;
  info.shape = CubeShape{static_cast<int>(uo.redshifts.size()), uo.side, uo.side, uo.side};
  info.param_names = {"Omega_M", "sigma_8", "n_s"};
  info.param_units = {"", "", ""};
  if (o.ranges.draws_h()) {  // the same name and unit as the MLPerf importer's 4th label
    info.param_names.push_back("H0");
    info.param_units.push_back("km/s/Mpc");
  }
  if (uo.scale_box_with_h) info.sample_fields = {kSampleBoxSize};  // each cube's own side
  info.redshifts = uo.redshifts;
  info.box_size_mpc_h = uo.box_size();
  info.generator = "synth " COSMOFLOW_GIT_REV " seed=" + std::to_string(o.seed);
  return info;
}

// Writes the samples from a GeneratorPool into shards of samples_per_shard cubes.
class ShardWriter {
 public:
  explicit ShardWriter(const SynthOptions& o)
      : o_(o), info_(DescribeDataset(o)), provenance_(Provenance(o)) {
    write_options_.compression_level = o.compression_level;
  }

  // Before sample n (0-based in this run): closes the full shard and opens the next when due.
  Status BeginSample(int64_t n) {
    if (n % o_.samples_per_shard != 0) return Status::Ok();
    return StartShard(n);
  }
  Status Append(const Cube& cube, const std::vector<float>& labels,
                const std::vector<double>& sample_values) {
    return writer_->Append(cube, labels, {}, sample_values).WithContext(shard_path_);
  }
  Status Close() {
    if (!writer_) return Status::Ok();
    CF_RETURN_IF_ERROR(writer_->Close());
    shards_.push_back(shard_path_);
    writer_.reset();
    return Status::Ok();
  }
  const std::vector<std::string>& shards() const { return shards_; }

 private:
  Status StartShard(int64_t n) {
    CF_RETURN_IF_ERROR(Close());
    const int64_t index = o_.first_index + n;
    if (o_.single_file) {
      shard_path_ = o_.out;
    } else {
      char name[32];
      std::snprintf(name, sizeof(name), "-%08lld.h5", static_cast<long long>(index));
      shard_path_ = o_.out + "/" + o_.prefix + name;
    }
    info_.provenance = provenance_ + "\nsamples: " + std::to_string(index) + ".." +
                       std::to_string(index + std::min(o_.samples_per_shard, o_.samples - n) - 1);
    CF_ASSIGN_OR_RETURN(writer_, DatasetWriter::Create(shard_path_, info_, write_options_));
    return Status::Ok();
  }

  const SynthOptions& o_;
  DatasetInfo info_;
  const std::string provenance_;
  DatasetWriteOptions write_options_;
  std::unique_ptr<DatasetWriter> writer_;
  std::string shard_path_;
  std::vector<std::string> shards_;
};

// A progress line on stderr at most every 2 s, and after the last sample.
class Progress {
 public:
  explicit Progress(int64_t samples) : samples_(samples) {}
  void Done(int64_t n) {
    const auto now = std::chrono::steady_clock::now();
    if (std::chrono::duration<double>(now - last_).count() <= 2.0 && n + 1 != samples_) return;
    last_ = now;
    const double t = std::chrono::duration<double>(now - start_).count();
    const double rate = (n + 1) / t;
    std::fprintf(stderr, "synth: %lld/%lld cubes, %.2f cubes/s, ETA %.0f s\n",
                 static_cast<long long>(n + 1), static_cast<long long>(samples_), rate,
                 (samples_ - n - 1) / rate);
  }

 private:
  const int64_t samples_;
  const std::chrono::steady_clock::time_point start_ = std::chrono::steady_clock::now();
  std::chrono::steady_clock::time_point last_ = start_;
};

Status CreateOutputDirectory(const SynthOptions& o) {
  if (o.single_file) return Status::Ok();
  std::error_code ec;  // parents too, as mkdir -p: "--out runs/a/train" on a fresh machine
  std::filesystem::create_directories(o.out, ec);
  if (ec) return FailedPreconditionError(o.out + ": cannot create directory: " + ec.message());
  return Status::Ok();
}

// Generates every sample and writes the shards; *shards gets their paths.
Status Generate(const SynthOptions& o, std::vector<std::string>* shards) {
  CF_RETURN_IF_ERROR(CreateOutputDirectory(o));
  ShardWriter writer(o);
  CF_ASSIGN_OR_RETURN(
      auto pool, GeneratorPool::Create(o.universe, o.workers, o.ranges, o.base,
                                       static_cast<uint64_t>(o.seed), o.first_index, o.samples));
  Progress progress(o.samples);
  for (int64_t n = 0; n < o.samples; ++n) {
    CF_RETURN_IF_ERROR(writer.BeginSample(n));
    CF_ASSIGN_OR_RETURN(auto sample, pool->Next());
    const CosmologyParams& params = sample.params;
    std::vector<float> labels = {static_cast<float>(params.omega_m),
                                 static_cast<float>(params.sigma_8),
                                 static_cast<float>(params.n_s)};
    if (o.ranges.draws_h()) labels.push_back(static_cast<float>(100 * params.h));
    std::vector<double> sample_values;
    if (o.universe.scale_box_with_h) sample_values.push_back(o.universe.BoxSize(params.h));
    CF_RETURN_IF_ERROR(writer.Append(sample.cube, labels, sample_values));
    if (!o.quiet) progress.Done(n);
  }
  CF_RETURN_IF_ERROR(writer.Close());
  *shards = writer.shards();
  return Status::Ok();
}

}  // namespace

int main(int argc, char** argv) {
  bool help = false;
  auto options = ParseSynthOptions(argc, argv, &help);
  if (help) {
    std::fputs(SynthUsageText().c_str(), stdout);
    return 0;
  }
  if (!options.ok()) return Fail(options.status(), 2);
  std::vector<std::string> shards;
  if (Status s = Generate(*options, &shards); !s.ok()) return Fail(s, 1);
  for (const auto& p : shards) std::printf("%s\n", p.c_str());
  return 0;
}
