// cf_make_trainer_dataset: writes a small HDF5 dataset shard (DatasetWriter, schema v1) of toy
// cubes whose statistics depend on the parameters, so that a network can learn something in a few
// steps. Used by the trainer tests, the Slurm integration test and the trainer benchmark.
//
//   cf_make_trainer_dataset OUT.h5 N SIDE [SEED] [CHANNELS]
// The mean count grows with Omega_M and the contrast with sigma_8; n_s sets a large-scale gradient.
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <string>

#include "core/io/dataset.h"

namespace {
uint64_t Next(uint64_t& s) {
  uint64_t z = (s += 0x9e3779b97f4a7c15ull);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}
double Uniform(uint64_t& s) { return (Next(s) >> 11) * (1.0 / 9007199254740992.0); }
}  // namespace

int main(int argc, char** argv) {
  if (argc < 4) {
    std::fprintf(stderr, "usage: %s OUT.h5 N SIDE [SEED] [CHANNELS]\n", argv[0]);
    return 2;
  }
  const std::string out = argv[1];
  const int n = std::atoi(argv[2]), side = std::atoi(argv[3]);
  uint64_t seed = argc > 4 ? std::strtoull(argv[4], nullptr, 10) : 1;
  const int channels = argc > 5 ? std::atoi(argv[5]) : 1;
  cosmoflow::DatasetInfo info;
  info.shape = {channels, side, side, side};
  info.param_names = {"Omega_M", "sigma_8", "n_s"};
  info.param_units = {"", "", ""};
  for (int c = 0; c < channels; ++c) info.redshifts.push_back(0.5 * c);
  info.box_size_mpc_h = 4.0 * side;
  info.generator = "cf_make_trainer_dataset seed=" + std::to_string(seed);
  info.provenance = "toy cubes for trainer tests";
  auto writer = cosmoflow::DatasetWriter::Create(out, info);
  if (!writer.ok()) {
    std::fprintf(stderr, "%s\n", writer.status().ToString().c_str());
    return 1;
  }
  uint64_t s = seed * 7919 + 17;
  for (int i = 0; i < n; ++i) {
    const float om = 0.25f + 0.10f * static_cast<float>(Uniform(s));
    const float s8 = 0.78f + 0.17f * static_cast<float>(Uniform(s));
    const float ns = 0.90f + 0.10f * static_cast<float>(Uniform(s));
    cosmoflow::Cube cube(info.shape, cosmoflow::DType::kInt16);
    int16_t* v = cube.int16_data();
    const double mean = 2.0 + 40.0 * (om - 0.25);
    const double contrast = 0.5 + 4.0 * (s8 - 0.78);
    for (int64_t k = 0; k < info.shape.elements(); ++k) {
      const int64_t x = k % side;
      const double grad = 1.0 + 5.0 * (ns - 0.95) * (2.0 * x / side - 1.0);
      const double u = Uniform(s);
      const double value = mean * grad * std::exp(contrast * (u - 0.5) * 2.0);
      v[k] = static_cast<int16_t>(std::min(30000.0, std::max(0.0, value)));
    }
    auto st = (*writer)->Append(cube, {om, s8, ns});
    if (!st.ok()) {
      std::fprintf(stderr, "%s\n", st.ToString().c_str());
      return 1;
    }
  }
  auto st = (*writer)->Close();
  if (!st.ok()) {
    std::fprintf(stderr, "%s\n", st.ToString().c_str());
    return 1;
  }
  return 0;
}
