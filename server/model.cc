#include "server/model.h"

#include <sys/stat.h>

#include <algorithm>
#include <cassert>
#include <cmath>
#include <cstdio>
#include <functional>

#include "core/base/log.h"

namespace cosmoflow {

std::string ModelVersion(const Checkpoint& checkpoint) {
  char step[32];
  std::snprintf(step, sizeof(step), "%09lld", static_cast<long long>(checkpoint.state.step));
  return checkpoint.spec.name + "-" + step + "-" + checkpoint.checksum;
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
                                                    Precision precision, int64_t elements,
                                                    int outputs, double* forward1_seconds) {
  NetworkOptions net_options;
  net_options.batch = n;
  net_options.precision = precision;
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

  std::string file = path;
  struct stat st;
  if (::stat(path.c_str(), &st) != 0) return fail(NotFoundError("no such file or directory"));
  if (S_ISDIR(st.st_mode)) {
    auto latest = FindLatestCheckpoint(path);
    if (!latest.ok()) return fail(latest.status());
    file = *latest;
  }
  auto ckpt = ReadCheckpoint(file);
  if (!ckpt.ok()) return fail(ckpt.status());

  std::shared_ptr<Model> model(new Model());
  model->checkpoint_ = std::move(*ckpt);
  model->path_ = file;
  model->options_ = options;
  model->version_ = ModelVersion(model->checkpoint_);
  const ModelSpec& spec = model->checkpoint_.spec;
  if (Status s = spec.Validate(); !s.ok()) return fail(s);
  if (spec.outputs.empty()) return fail(InvalidArgumentError("the model spec has no outputs"));

  // The network weights are not needed after loading: drop the optimizer state (it can be as big
  // as the weights twice over) and keep the rest for ModelInfo.
  model->checkpoint_.optimizer_state.clear();
  model->checkpoint_.optimizer_state.shrink_to_fit();

  for (int n : BatchSizes(options.max_batch)) {
    auto net =
        BuildWarmNetwork(spec, model->checkpoint_.weights, n, options.precision,
                         model->input_elements(), model->num_outputs(), &model->forward1_seconds_);
    if (!net.ok()) return fail(net.status());
    model->networks_.push_back(std::move(*net));
  }
  // Weights now live in the networks; ModelInfo needs only names, not values.
  for (auto& t : model->checkpoint_.weights) {
    t.data.clear();
    t.data.shrink_to_fit();
  }
  model->normalised_.resize(size_t(options.max_batch) * model->num_outputs());
  model->load_seconds_ =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  model->loaded_at_unix_seconds_ =
      std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
  CF_LOG(INFO) << "loaded model " << model->version_ << " from " << file << " in "
               << model->load_seconds_ << " s (max batch " << options.max_batch << ", "
               << PrecisionName(options.precision) << ")";
  return model;
}

int64_t Model::input_elements() const {
  const auto& s = checkpoint_.spec;
  return int64_t{s.input_channels} * s.input_side * s.input_side * s.input_side;
}

void Model::Forward(int n, const float* src, float* physical_dst) {
  assert(n >= 1 && n <= options_.max_batch);
  for (int done = 0; done < n;) {
    // Greedy: the largest built size that fits; sizes include 1, so this always progresses.
    for (auto& net : networks_) {
      const int b = net->options().batch;
      if (b > n - done) continue;
      net->Forward(src + size_t(done) * input_elements(),
                   normalised_.data() + size_t(done) * num_outputs());
      done += b;
      break;
    }
  }
  const auto& outputs = checkpoint_.spec.outputs;
  const int p = num_outputs();
  for (int i = 0; i < n; ++i)
    for (int j = 0; j < p; ++j)
      physical_dst[i * p + j] = outputs[j].offset + outputs[j].scale * normalised_[i * p + j];
}

}  // namespace cosmoflow
