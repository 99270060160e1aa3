// Fuzz target: the checkpoint reader above HDF5. libhdf5 itself is known to crash on crafted
// files, so the target does not feed it raw bytes; it writes real HDF5 checkpoints whose contents
// the input chooses (tensors dropped, renamed, duplicated or reshaped; spec layer sizes changed;
// calibration factors, exponents, references and prior ranges of any double, including NaN and negatives; odd state and
// optimizer names) and reads them back. Properties: no crash or sanitizer report; a checkpoint the
// reader accepts round-trips (the same tensors, state and calibration) and loading it into a
// network built from its spec either works or fails with a status.
#include <cmath>
#include <vector>

#include "core/nn/checkpoint.h"
#include "core/nn/network.h"
#include "fuzz/fuzz_util.h"

using namespace cosmoflow;

namespace {

constexpr char kSpec[] = R"({"name": "fuzz8", "input_channels": 1, "input_side": 8,
  "input_transform": "log1p", "uncertainty": "gaussian",
  "outputs": [{"name": "Omega_M", "offset": 0.3, "scale": 0.05}, {"name": "sigma_8", "offset": 0.8, "scale": 0.08}],
  "layers": [{"type": "conv3d", "filters": 2, "kernel": 3}, {"type": "batch_norm"},
             {"type": "leaky_relu", "alpha": 0.1}, {"type": "max_pool", "size": 2}, {"type": "flatten"},
             {"type": "dense", "units": 4}]})";

const Checkpoint& Valid() {
  static const Checkpoint ckpt = [] {
    auto spec = ModelSpec::FromJson(kSpec);
    FUZZ_CHECK(spec.ok());
    NetworkOptions options;
    options.batch = 1;
    auto net = Network::Create(*spec, options);
    FUZZ_CHECK(net.ok());
    (*net)->InitParameters(1);
    Checkpoint c;
    c.spec = *spec;
    c.weights = (*net)->ExportParameters();
    return c;
  }();
  return ckpt;
}

void MutateTensors(fuzz::Input& in, std::vector<NamedTensor>* tensors) {
  for (int ops = in.Byte() % 4; ops > 0; --ops) {
    if (tensors->empty()) return;
    NamedTensor& t = (*tensors)[in.Byte() % tensors->size()];
    switch (in.Byte() % 4) {
      case 0: tensors->erase(tensors->begin() + (&t - tensors->data())); break;
      case 1: tensors->push_back(t); break;
      case 2: t.name = std::string(in.Bytes(24)); break;
      default: {  // a new shape (at most 4 dimensions of 0..15), the data resized to match
        t.shape.assign(in.Byte() % 5, 0);
        for (auto& d : t.shape) d = in.Byte() % 16;
        t.data.assign(size_t(t.numel()), 0.5f);
      }
    }
  }
}

Checkpoint Mutate(fuzz::Input& in) {
  Checkpoint c = Valid();
  MutateTensors(in, &c.weights);
  if (in.Byte() & 1) {
    c.optimizer_state = c.weights;
    MutateTensors(in, &c.optimizer_state);
  }
  LayerSpec& layer = c.spec.layers[in.Byte() % c.spec.layers.size()];
  if (in.Byte() & 1) layer.filters = in.Byte() % 9;
  if (in.Byte() & 1) layer.units = in.Byte() % 9;
  if (in.Byte() & 1) {
    c.calibration.samples = int64_t(in.U32());
    for (int i = in.Byte() % 4; i > 0; --i) c.calibration.sigma_scale.push_back(in.Double());
    if (in.Byte() & 1)
      for (int i = in.Byte() % 4; i > 0; --i) {
        c.calibration.sigma_exponent.push_back(in.Double());
        c.calibration.sigma_reference.push_back(in.Double());
      }
    if (in.Byte() & 1)
      for (int i = in.Byte() % 4; i > 0; --i) c.calibration.sigma_edge.push_back(in.Double());
    if (in.Byte() & 1)
      for (int i = in.Byte() % 4; i > 0; --i) {
        c.calibration.prior_low.push_back(in.Double());
        c.calibration.prior_high.push_back(in.Double());
      }
  }
  c.state.step = int64_t(in.U32()) - (1 << 30);
  c.state.optimizer = std::string(in.Bytes(16));
  c.provenance[std::string(in.Bytes(8))] = std::string(in.Bytes(32));
  return c;
}

bool SameTensors(const std::vector<NamedTensor>& a, const std::vector<NamedTensor>& b) {
  if (a.size() != b.size()) return false;
  for (size_t i = 0; i < a.size(); ++i)
    if (a[i].name != b[i].name || a[i].shape != b[i].shape || a[i].data != b[i].data) return false;
  return true;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  fuzz::Input in(data, size);
  const Checkpoint written = Mutate(in);
  const std::string& path = fuzz::ScratchPath(".h5");
  if (!WriteCheckpoint(path, written).ok()) return 0;
  auto read = ReadCheckpoint(path);
  if (!read.ok()) return 0;
  FUZZ_CHECK(SameTensors(read->weights, written.weights));
  FUZZ_CHECK(SameTensors(read->optimizer_state, written.optimizer_state));
  FUZZ_CHECK(read->state.step == written.state.step && read->state.optimizer == written.state.optimizer);
  for (double f : read->calibration.sigma_scale) FUZZ_CHECK(std::isfinite(f) && f > 0);
  for (double b : read->calibration.sigma_exponent) FUZZ_CHECK(b >= 0 && b <= 4);
  for (double r : read->calibration.sigma_reference) FUZZ_CHECK(std::isfinite(r) && r > 0);
  for (double e : read->calibration.sigma_edge) FUZZ_CHECK(std::abs(e) <= kEdgeLimit && !read->calibration.prior_low.empty());
  NetworkOptions options;
  options.batch = 1;
  auto net = Network::Create(read->spec, options);
  if (net.ok()) (void)(*net)->LoadParameters(read->weights);
  return 0;
}
