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

  const int64_t elements = model->input_elements();
  const int p = model->num_outputs();
  std::vector<float> warm_src;
  std::vector<float> warm_dst;
  std::vector<int> sizes{options.max_batch};
  for (int b = 1; b < options.max_batch; b *= 2) sizes.push_back(b);
  std::sort(sizes.begin(), sizes.end(), std::greater<int>());
  for (int n : sizes) {
    NetworkOptions net_options;
    net_options.batch = n;
    net_options.precision = options.precision;
    net_options.training = false;
    auto net = Network::Create(spec, net_options);
    if (!net.ok())
      return fail(net.status().WithContext("building the network for batch " + std::to_string(n)));
    if (Status s = (*net)->LoadParameters(model->checkpoint_.weights); !s.ok()) return fail(s);
    // Warm-up: the first pass pays for page faults and JIT; outputs must be finite or the
    // checkpoint is refused (a diverged model must not replace a working one).
    warm_src.assign(size_t(n) * elements, 0.f);
    warm_dst.assign(size_t(n) * p, 0.f);
    (*net)->Forward(warm_src.data(), warm_dst.data());
    if (n == 1) {
      // Timed passes once warm: what one cube costs (for the batcher's automatic delay). The
      // fastest of up to 3 passes within about a second, since a busy machine makes single
      // passes slow at random.
      model->forward1_seconds_ = 1e9;
      const auto timing_start = std::chrono::steady_clock::now();
      for (int pass = 0; pass < 3; ++pass) {
        const auto t0 = std::chrono::steady_clock::now();
        (*net)->Forward(warm_src.data(), warm_dst.data());
        const auto t1 = std::chrono::steady_clock::now();
        model->forward1_seconds_ =
            std::min(model->forward1_seconds_, std::chrono::duration<double>(t1 - t0).count());
        if (t1 - timing_start > std::chrono::seconds(1)) break;
      }
    }
    for (float v : warm_dst)
      if (!std::isfinite(v))
        return fail(
            DataLossError("warm-up forward pass gave a non-finite output (diverged weights?)"));
    model->networks_.push_back(std::move(*net));
  }
  // Weights now live in the networks; ModelInfo needs only names, not values.
  for (auto& t : model->checkpoint_.weights) {
    t.data.clear();
    t.data.shrink_to_fit();
  }
  model->normalised_.resize(size_t(options.max_batch) * p);
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
