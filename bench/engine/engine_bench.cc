// Times one mode of the engine and prints one JSON line in the peer's format
// (../shared/peers/torch_cosmoflow.py), so run_engine_bench.py can put them side by side.
//
//   engine_bench --model sc18 --mode train --precision bf16 --batch 4 --iters 5 --warmup 2 [--profile]
//
// A training step is what the peer's step does: forward, MSE loss gradient, backward, SGD with
// momentum 0.9 on the fp32 master weights, refresh of the working weights.
#include <omp.h>
#include <sys/resource.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "bench/engine/fma_peak.h"
#include "core/base/flags.h"
#include "core/nn/loss.h"
#include "core/nn/network.h"
#include "core/nn/optimizer.h"

using namespace cosmoflow;  // NOLINT

int main(int argc, char** argv) {
  std::string model = "sc18", mode = "train", precision = "fp32", selection = "rule";
  std::string cache = DefaultKernelCachePath();
  int64_t batch64 = 4, iters64 = 5, warmup64 = 2;
  bool profile = false, fma_peak = false, help = false;
  FlagParser flags;
  flags.AddString("model", &model, "built-in spec (sc18, mlperf, tiny32, small64, mlperf64) or a .json spec file");
  flags.AddString("mode", &mode, "train (forward, loss, backward, SGD step) or infer");
  flags.AddString("precision", &precision, "fp32 or bf16");
  flags.AddInt("batch", &batch64, "cubes per step");
  flags.AddInt("iters", &iters64, "timed steps (the median is reported)");
  flags.AddInt("warmup", &warmup64, "untimed steps first");
  flags.AddBool("profile", &profile, "per-op time table on stderr");
  flags.AddBool("fma-peak", &fma_peak, "also measure the fp32 FMA peak of the OpenMP threads (JSON fma_peak_gflops)");
  flags.AddString("kernel-selection", &selection, "conv kernels: measure (time every candidate, keep the fastest) or rule");
  flags.AddString("kernel-cache", &cache, "file of measured kernel timings (none: no file)");
  flags.AddBool("help", &help, "this text");
  std::vector<std::string> positional;
  if (Status st = flags.Parse(argc, argv, &positional); !st.ok() || !positional.empty()) {
    std::fprintf(stderr, "engine_bench: %s\n",
                 st.ok() ? ("unexpected argument '" + positional[0] + "'").c_str() : st.message().c_str());
    return 2;
  }
  if (help) {
    std::printf("usage: engine_bench [flags]\n%s", flags.Usage().c_str());
    return 0;
  }
  if (mode != "train" && mode != "infer") {
    std::fprintf(stderr, "engine_bench: --mode=%s: expected train or infer\n", mode.c_str());
    return 2;
  }
  if (batch64 < 1 || batch64 > 4096 || iters64 < 1 || iters64 > 100000 || warmup64 < 0 || warmup64 > 100000) {
    std::fprintf(stderr, "engine_bench: --batch must be 1..4096, --iters 1..100000, --warmup 0..100000\n");
    return 2;
  }
  const int batch = static_cast<int>(batch64), iters = static_cast<int>(iters64), warmup = static_cast<int>(warmup64);
  StatusOr<ModelSpec> spec = LoadSpec(model);
  if (!spec.ok()) {
    std::fprintf(stderr, "%s\n", spec.status().ToString().c_str());
    return 2;
  }
  auto prec = ParsePrecision(precision);
  if (!prec.ok()) {
    std::fprintf(stderr, "%s\n", prec.status().ToString().c_str());
    return 2;
  }
  auto kernel_selection = ParseKernelSelection(selection);
  if (!kernel_selection.ok()) {
    std::fprintf(stderr, "engine_bench: --kernel-selection: %s\n", kernel_selection.status().message().c_str());
    return 2;
  }
  const bool train = mode == "train";
  NetworkOptions opts;
  opts.kernel_selection = *kernel_selection;
  opts.kernel_cache = cache == "none" ? "" : cache;
  opts.batch = batch;
  opts.precision = *prec;
  opts.training = train;
  opts.seed = 0;
  auto net_or = Network::Create(*spec, opts);
  if (!net_or.ok()) {
    std::fprintf(stderr, "%s\n", net_or.status().ToString().c_str());
    return 1;
  }
  auto& net = *net_or;
  net->SetProfiling(profile);
  const int64_t in = int64_t{spec->input_channels} * spec->input_side * spec->input_side * spec->input_side;
  // The network's own output width: an uncertainty head writes more than one value per output.
  const int p = static_cast<int>(spec->NetworkOutputs());
  std::vector<float> x(in * batch), y(batch * p), target(batch * p), diff(batch * p);
  std::mt19937 rng(0);
  std::uniform_real_distribution<float> u(0.f, 1.f);
  for (auto& v : x) v = u(rng);
  for (auto& v : target) v = u(rng);
  OptimizerConfig oc;
  oc.name = "sgd";
  oc.momentum = 0.9f;
  auto opt = Optimizer::Create(oc);
  if (!opt.ok()) {
    std::fprintf(stderr, "%s\n", opt.status().ToString().c_str());
    return 1;
  }
  auto step = [&]() {
    net->Forward(x.data(), y.data());
    if (train) {
      ComputeLoss(LossType::kMse, y.data(), target.data(), batch * p, diff.data());
      net->Backward(diff.data());
      (*opt)->Step(net->parameters(), 1e-4f);
      net->ParametersUpdated();
    }
  };
  for (int i = 0; i < warmup; ++i) step();
  std::vector<double> times;
  for (int i = 0; i < iters; ++i) {
    auto t0 = std::chrono::steady_clock::now();
    step();
    times.push_back(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
  }
  std::vector<double> sorted = times;
  std::sort(sorted.begin(), sorted.end());
  const double med = sorted[sorted.size() / 2];
  const double fwd = spec->ForwardFlops();
  // Same accounting as the peer: training = 3x forward minus the first layer's data gradient term.
  const auto& l0 = spec->layers.front();
  const double fl_first = 2.0 * spec->input_channels * l0.filters * l0.kernel * l0.kernel * l0.kernel;
  const double per_sample = train ? 3 * fwd - fl_first : fwd;
  struct rusage ru;
  getrusage(RUSAGE_SELF, &ru);
  std::printf("{\"engine\": \"cosmoflow\", \"model\": \"%s\", \"mode\": \"%s\", \"precision\": \"%s\", \"batch\": %d, "
              "\"median_s\": %.5f, \"samples_per_s\": %.4f, \"gflop_per_sample\": %.4f, \"gflops\": %.2f, "
              "\"peak_rss_mib\": %.1f, \"times_s\": [",
              model.c_str(), mode.c_str(), precision.c_str(), batch, med, batch / med, per_sample / 1e9,
              per_sample * batch / med / 1e9, ru.ru_maxrss / 1024.0);
  for (size_t i = 0; i < times.size(); ++i) std::printf("%s%.4f", i ? ", " : "", times[i]);
  std::printf("]");
  if (fma_peak) std::printf(", \"fma_peak_gflops\": %.1f", MeasureFmaPeakGflops(omp_get_max_threads()));
  std::printf("}\n");
  if (profile) std::fprintf(stderr, "%s", net->ProfileReport().c_str());
  return 0;
}
