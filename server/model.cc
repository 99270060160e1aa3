#include "server/model.h"

#include <sys/stat.h>

#include <algorithm>
#include <cassert>
#include <cmath>
#include <cstdio>
#include <functional>

#include "core/base/log.h"
#include "core/nn/ensemble.h"

namespace cosmoflow {

std::string ModelVersion(const Checkpoint& checkpoint, const std::string& checksum) {
  char step[32];
  std::snprintf(step, sizeof(step), "%09lld", static_cast<long long>(checkpoint.state.step));
  return checkpoint.spec.name + "-" + step + "-" + checksum;
}

std::string ModelVersion(const Checkpoint& checkpoint) {
  return ModelVersion(checkpoint, checkpoint.checksum);
}

namespace {

// The batch sizes to build, largest first: max_batch and the powers of two below it.
std::vector<int> BatchSizes(int max_batch) {
  std::vector<int> sizes{max_batch};
  for (int b = 1; b < max_batch; b *= 2) sizes.push_back(b);
  std::sort(sizes.begin(), sizes.end(), std::greater<int>());
  return sizes;
}

// Time of one warm forward pass: the fastest of up to 3 passes within about a second, since a
// busy machine makes single passes slow at random.
double TimeForwardPass(Network& net, const float* src, float* dst) {
  double fastest = 1e9;
  const auto timing_start = std::chrono::steady_clock::now();
  for (int pass = 0; pass < 3; ++pass) {
    const auto t0 = std::chrono::steady_clock::now();
    net.Forward(src, dst);
    const auto t1 = std::chrono::steady_clock::now();
    fastest = std::min(fastest, std::chrono::duration<double>(t1 - t0).count());
    if (t1 - timing_start > std::chrono::seconds(1)) break;
  }
  return fastest;
}

// An inference network for batch n with `weights`, warmed up on zero cubes (`elements` floats each,
// `outputs` values out). For n = 1 also times a pass into *forward1_seconds (what one cube costs,
// for the batcher's automatic delay).
StatusOr<std::unique_ptr<Network>> BuildWarmNetwork(const ModelSpec& spec,
                                                    const std::vector<NamedTensor>& weights, int n,
                                                    const ModelOptions& options, int64_t elements,
                                                    int outputs, double* forward1_seconds) {
  NetworkOptions net_options;
  net_options.batch = n;
  net_options.precision = options.precision;
  net_options.kernel_selection = options.kernel_selection;
  net_options.kernel_cache = options.kernel_cache;
  net_options.training = false;
  auto net = Network::Create(spec, net_options);
  if (!net.ok())
    return net.status().WithContext("building the network for batch " + std::to_string(n));
  CF_RETURN_IF_ERROR((*net)->LoadParameters(weights));
  // Warm-up: the first pass pays for page faults and JIT; outputs must be finite or the
  // checkpoint is refused (a diverged model must not replace a working one).
  std::vector<float> warm_src(size_t(n) * elements, 0.f);
  std::vector<float> warm_dst(size_t(n) * outputs, 0.f);
  (*net)->Forward(warm_src.data(), warm_dst.data());
  if (n == 1) *forward1_seconds = TimeForwardPass(**net, warm_src.data(), warm_dst.data());
  for (float v : warm_dst)
    if (!std::isfinite(v))
      return DataLossError("warm-up forward pass gave a non-finite output (diverged weights?)");
  return std::move(net).value();
}

// The checkpoints `path` stands for: one (a file, or a directory's newest valid one), or an
// ensemble's members with the manifest's calibration and checksum.
struct Source {
  std::vector<Checkpoint> checkpoints;
  std::vector<std::string> files;
  std::string path;  // what Model::path() reports
  std::string checksum;
  Calibration calibration;
  bool ensemble = false;
};

StatusOr<Source> ReadSource(const std::string& path) {
  struct stat st;
  if (::stat(path.c_str(), &st) != 0) return NotFoundError("no such file or directory");
  Source src;
  if (const std::string manifest = FindEnsembleManifest(path); !manifest.empty()) {
    CF_ASSIGN_OR_RETURN(LoadedEnsemble e, LoadEnsemble(manifest));
    src.checkpoints = std::move(e.members);
    src.files = std::move(e.paths);
    src.path = manifest;
    src.checksum = e.checksum;
    src.calibration = std::move(e.calibration);
    src.ensemble = true;
    return src;
  }
  std::string file = path;
  if (S_ISDIR(st.st_mode)) {
    CF_ASSIGN_OR_RETURN(file, FindLatestCheckpoint(path));
  }
  CF_ASSIGN_OR_RETURN(Checkpoint ckpt, ReadCheckpoint(file));
  src.checksum = ckpt.checksum;
  src.calibration = ckpt.calibration;
  src.checkpoints.push_back(std::move(ckpt));
  src.files.push_back(file);
  src.path = file;
  return src;
}

}  // namespace

StatusOr<std::shared_ptr<Model>> Model::Load(const std::string& path, const ModelOptions& options) {
  const auto start = std::chrono::steady_clock::now();
  if (options.max_batch < 1 || options.max_batch > 256)
    return InvalidArgumentError("max batch " + std::to_string(options.max_batch) +
                                " is outside [1, 256]");
  auto fail = [&](const Status& s) {
    return Status(StatusCode::kFailedPrecondition,
                  "cannot load model from '" + path + "': " + s.message());
  };
  auto source = ReadSource(path);
  if (!source.ok()) return fail(source.status());
  Source& src = *source;
  const ModelSpec& spec = src.checkpoints[0].spec;
  if (Status s = spec.Validate(); !s.ok()) return fail(s);
  if (spec.outputs.empty()) return fail(InvalidArgumentError("the model spec has no outputs"));

  std::shared_ptr<Model> model(new Model());
  model->options_ = options;
  model->path_ = src.path;
  model->checksum_ = src.checksum;
  model->calibration_ = src.calibration;
  model->is_ensemble_ = src.ensemble;
  model->member_paths_ = src.files;
  for (size_t m = 0; m < src.checkpoints.size(); ++m) {
    Status s = model->BuildMember(src.checkpoints[m], src.files[m]);
    if (!s.ok() && src.ensemble)
      s = s.WithContext("member " + std::to_string(m) + " (" + src.files[m] + ")");
    if (!s.ok()) return fail(s);
    // The weights now live in the networks; ModelInfo needs only names, not values. The
    // optimizer state can be as big as the weights twice over.
    for (auto& t : src.checkpoints[m].weights) std::vector<float>().swap(t.data);
    src.checkpoints[m].optimizer_state.clear();
    src.checkpoints[m].optimizer_state.shrink_to_fit();
  }
  model->checkpoint_ = std::move(src.checkpoints[0]);
  model->version_ = ModelVersion(model->checkpoint_, model->checksum_);
  // `spec` referred to member 0's checkpoint, moved just above.
  const size_t p = model->checkpoint_.spec.outputs.size(), k = model->members_.size();
  model->raw_.resize(size_t(options.max_batch) * model->checkpoint_.spec.NetworkOutputs());
  model->means_.resize(size_t(options.max_batch) * k * p);
  model->covs_.resize(size_t(options.max_batch) * k * p * p);
  model->mix_.resize(p + p * p);
  model->load_seconds_ =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  model->loaded_at_unix_seconds_ =
      std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
  CF_LOG(INFO) << "loaded model " << model->version_ << " from " << model->path_ << " in "
               << model->load_seconds_ << " s (max batch " << options.max_batch << ", "
               << PrecisionName(options.precision) << ", uncertainty "
               << model->uncertainty_method() << ", " << k << " network(s) per cube)";
  return model;
}

Status Model::BuildMember(const Checkpoint& ckpt, const std::string& file) {
  const ModelSpec& spec = ckpt.spec;
  const int64_t elements =
      int64_t{spec.input_channels} * spec.input_side * spec.input_side * spec.input_side;
  Member member;
  double forward1 = 0;
  for (int n : BatchSizes(options_.max_batch)) {
    auto net = BuildWarmNetwork(spec, ckpt.weights, n, options_, elements,
                                spec.NetworkOutputs(), &forward1);
    if (!net.ok()) return net.status().WithContext(file);
    if (members_.empty()) {
      CF_LOG(INFO) << "batch " << n << " kernels: " << DescribeConvKernels((*net)->ChosenKernels());
    }
    member.networks.push_back(std::move(*net));
  }
  // What one cube costs, for the batcher's automatic delay: every member's pass.
  forward1_seconds_ += forward1;
  members_.push_back(std::move(member));
  return Status::Ok();
}

int64_t Model::input_elements() const {
  const auto& s = checkpoint_.spec;
  return int64_t{s.input_channels} * s.input_side * s.input_side * s.input_side;
}

bool Model::has_uncertainty() const {
  return checkpoint_.spec.uncertainty != UncertaintyHead::kNone || members_.size() > 1;
}

std::string Model::uncertainty_method() const {
  if (is_ensemble_) return has_uncertainty() ? "ensemble" : "none";
  return checkpoint_.spec.uncertainty == UncertaintyHead::kNone ? "none" : "gaussian";
}

void Model::RunMember(Member& member, int n, const float* src) {
  const int w = checkpoint_.spec.NetworkOutputs();
  for (int done = 0; done < n;) {
    // Greedy: the largest built size that fits; sizes include 1, so this always progresses.
    for (auto& net : member.networks) {
      const int b = net->options().batch;
      if (b > n - done) continue;
      net->Forward(src + size_t(done) * input_elements(), raw_.data() + size_t(done) * w);
      done += b;
      break;
    }
  }
}

void Model::Forward(int n, const float* src, float* physical_dst, double* physical_cov) {
  assert(n >= 1 && n <= options_.max_batch);
  const ModelSpec& spec = checkpoint_.spec;
  const int p = num_outputs(), w = spec.NetworkOutputs(), k = int(members_.size());
  // One batch through every member; member m's posterior of cube i at (i * k + m).
  for (int m = 0; m < k; ++m) {
    RunMember(members_[m], n, src);
    for (int i = 0; i < n; ++i) {
      const size_t at = size_t(i) * k + m;
      DecodeHead(spec.uncertainty, p, raw_.data() + size_t(i) * w, &means_[at * p], &covs_[at * p * p]);
    }
  }
  double* mean = mix_.data();
  double* cov = mix_.data() + p;
  for (int i = 0; i < n; ++i) {
    CombineMixture(p, k, &means_[size_t(i) * k * p], &covs_[size_t(i) * k * p * p], mean, cov);
    ApplyCalibration(calibration_, spec, mean, cov);
    for (int j = 0; j < p; ++j) {
      // In float, as the network's outputs always were: a single network's values stay bit-exact.
      const OutputSpec& o = spec.outputs[j];
      physical_dst[i * p + j] = o.offset + o.scale * static_cast<float>(mean[j]);
      for (int l = 0; l < p; ++l) cov[j * p + l] *= double(o.scale) * spec.outputs[l].scale;
    }
    if (physical_cov && has_uncertainty()) std::copy(cov, cov + p * p, physical_cov + size_t(i) * p * p);
  }
}

}  // namespace cosmoflow
