// Prints the synthetic-universe generator's speed (128^3 x 4-channel cubes per second, 1 and 2
// threads, alternating runs, medians), where its time goes (per stage, one thread), and the MLPerf
// importer's throughput (MB/s of compressed input and of TFRecord stream; decode only, and the
// full import into an HDF5 shard with fsync).
//
//   bench_synth [--cubes N] [--side S] [--repeats R] [--data DIR] [--settings mlperf,pm,za,2lpt]
//
// The `mlperf` setting is `synth --preset mlperf` (parsed by the same code as the program), with
// parameters drawn from its prior; `mlperf-cola` adds `--pm-scheme cola`, `mlperf-cola-mesh2`
// also `--pm-mesh 2` (the full-resolution study's generator). The others use the default ranges
// and h.
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <ctime>
#include <filesystem>
#include <sstream>
#include <string>
#include <vector>

#include "synth/generator_pool.h"
#include "synth/importer.h"
#include "synth/mlperf.h"
#include "synth/synth_options.h"
#include "synth/tfrecord.h"
#include "synth/universe.h"

using namespace cosmoflow;
using namespace cosmoflow::synth;
using Clock = std::chrono::steady_clock;

namespace {

double Median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  const size_t n = v.size();
  return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

double Seconds(Clock::time_point a) {
  return std::chrono::duration<double>(Clock::now() - a).count();
}

// CPU time of the whole process (all threads): robust to other load on the machine, which
// stretches wall time but not (much) CPU time.
double CpuSeconds() {
  timespec ts{};
  clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
  return ts.tv_sec + 1e-9 * ts.tv_nsec;
}

struct BenchFlags {
  int cubes = 5, side = 128, repeats = 5;
  std::string data = std::string(COSMOFLOW_SHARED_DIR) + "/data/mlperf-cosmoflow";
  std::vector<std::string> settings = {"mlperf", "pm", "za", "2lpt"};
};

bool ParseBenchFlags(int argc, char** argv, BenchFlags* f) {
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string flag = argv[i], value = argv[i + 1];
    if (flag == "--cubes") {
      f->cubes = std::atoi(value.c_str());
    } else if (flag == "--side") {
      f->side = std::atoi(value.c_str());
    } else if (flag == "--repeats") {
      f->repeats = std::atoi(value.c_str());
    } else if (flag == "--data") {
      f->data = value;
    } else if (flag == "--settings") {
      f->settings.clear();
      std::stringstream ss(value);
      for (std::string s; std::getline(ss, s, ',');) f->settings.push_back(s);
    } else {
      std::fprintf(stderr, "bench_synth: unknown option %s\n", argv[i]);
      return false;
    }
  }
  if (argc % 2 == 0) {
    std::fprintf(stderr, "bench_synth: %s needs a value\n", argv[argc - 1]);
    return false;
  }
  return f->cubes >= 1 && f->side >= 8 && f->repeats >= 1;
}

// One generator configuration: universe options, the parameter ranges and the fixed cosmology.
struct Setting {
  std::string name;
  UniverseOptions universe;
  ParamRanges ranges;
  CosmologyParams base;
};

// The MLPerf preset as `synth --preset mlperf <extra>` parses it (the same code as the program).
StatusOr<Setting> MlperfSetting(const std::string& name, int side, std::vector<std::string> extra) {
  std::vector<std::string> args = {"synth", "--preset", "mlperf", "--out", "unused.h5",
                                   "--side", std::to_string(side)};
  args.insert(args.end(), extra.begin(), extra.end());
  std::vector<char*> argv;
  for (std::string& a : args) argv.push_back(a.data());
  bool help = false;
  CF_ASSIGN_OR_RETURN(SynthOptions o,
                      ParseSynthOptions(static_cast<int>(argv.size()), argv.data(), &help));
  return Setting{name, o.universe, o.ranges, o.base};
}

StatusOr<Setting> MakeSetting(const std::string& name, int side) {
  if (name == "mlperf") return MlperfSetting("mlperf preset (pm 10 steps, H0 prior)", side, {});
  if (name == "mlperf-cola") {
    return MlperfSetting("mlperf preset, pyCOLA integrator", side, {"--pm-scheme", "cola"});
  }
  if (name == "mlperf-cola-mesh2") {
    return MlperfSetting("mlperf preset, cola, force mesh 2", side,
                         {"--pm-scheme", "cola", "--pm-mesh", "2"});
  }
  Setting s;
  s.universe.side = side;
  s.universe.smoothing = -1;
  if (name == "pm") {
    s.name = "pm, 10 steps (default)";
    s.universe.displacement = Displacement::kPm;
  } else if (name == "za") {
    s.name = "za, auto truncation";
    s.universe.displacement = Displacement::kZeldovich;
  } else if (name == "2lpt") {
    s.name = "2lpt, auto truncation";
    s.universe.displacement = Displacement::k2Lpt;
  } else {
    return InvalidArgumentError("unknown setting '" + name +
                                "' (mlperf, mlperf-cola, mlperf-cola-mesh2, pm, za, 2lpt)");
  }
  return s;
}

std::vector<double> StageSeconds(const UniverseGenerator& g) {
  std::vector<double> v(UniverseGenerator::kNumStages);
  for (int st = 0; st < UniverseGenerator::kNumStages; ++st)
    v[st] = g.StageSeconds(static_cast<UniverseGenerator::Stage>(st));
  return v;
}

// Where the time of `cubes` cubes went: the stage times now minus `before`.
void PrintProfile(const UniverseGenerator& g, const std::vector<double>& before, int cubes) {
  const std::vector<double> now = StageSeconds(g);
  double total = 0;
  for (int st = 0; st < UniverseGenerator::kNumStages; ++st) total += now[st] - before[st];
  std::printf("  profile, 1 thread, s per cube:");
  for (int st = 0; st < UniverseGenerator::kNumStages; ++st) {
    const double d = now[st] - before[st];
    if (d <= 0) continue;
    std::printf(" %s %.3f (%.0f%%);",
                UniverseGenerator::StageName(static_cast<UniverseGenerator::Stage>(st)), d / cubes,
                100 * d / total);
  }
  std::printf(" total %.3f\n", total / cubes);
}

// 1 thread and 2 threads inside one cube, alternating; then 2 workers of one thread each.
int BenchSetting(const Setting& s, int cubes) {
  std::vector<double> times[3], cpu[3];
  std::unique_ptr<UniverseGenerator> gens[3];
  for (int t : {1, 2}) {
    UniverseOptions o = s.universe;
    o.threads = t;
    auto g = UniverseGenerator::Create(o);
    if (!g.ok()) {
      std::fprintf(stderr, "bench_synth: %s\n", g.status().ToString().c_str());
      return 1;
    }
    gens[t] = std::move(g).value();
    auto c = Cosmology::Create(DrawParams(s.ranges, 0, 999, s.base), o.transfer);
    (void)gens[t]->Generate(*c, 0, 999);  // warm-up: first touch of the buffers
  }
  const std::vector<double> before = StageSeconds(*gens[1]);  // after the warm-up
  for (int i = 0; i < cubes; ++i) {  // alternate so that background load hits both alike
    for (int t : {1, 2}) {
      auto c = Cosmology::Create(DrawParams(s.ranges, 1, i, s.base), s.universe.transfer);
      const auto t0 = Clock::now();
      const double c0 = CpuSeconds();
      auto cube = gens[t]->Generate(*c, 1, i);
      times[t].push_back(Seconds(t0));
      cpu[t].push_back(CpuSeconds() - c0);
      if (!cube.ok()) return 1;
    }
  }
  for (int t : {1, 2}) {
    const double m = Median(times[t]);
    std::printf("%-40s %10s %14.3f %10.2f %14.3f\n", s.name.c_str(), t == 1 ? "1" : "2 in cube", m,
                1.0 / m, Median(cpu[t]));
  }
  auto pool = GeneratorPool::Create(s.universe, 2, s.ranges, s.base, 1, 0, 2 * cubes);
  if (!pool.ok()) return 1;
  const auto t0 = Clock::now();
  const double c0 = CpuSeconds();
  for (int i = 0; i < 2 * cubes; ++i) {
    if (!(*pool)->Next().ok()) return 1;
  }
  const double wall = Seconds(t0) / (2 * cubes), cpu_per = (CpuSeconds() - c0) / (2 * cubes);
  std::printf("%-40s %10s %14.3f %10.2f %14.3f\n", s.name.c_str(), "2 workers", wall, 1.0 / wall,
              cpu_per);
  std::printf("%-40s %10s %14s %9.2fx\n", "", "", "2 workers vs 1", Median(times[1]) / wall);
  PrintProfile(*gens[1], before, cubes);
  return 0;
}

int BenchGenerator(const BenchFlags& f) {
  std::printf("== synth generator: %d^3 x 4 channels (z = 0, 0.5, 1.5, 3), %d cubes per setting\n",
              f.side, f.cubes);
  std::printf("%-40s %10s %14s %10s %14s\n", "setting", "threads", "median s/cube", "cubes/s",
              "CPU s/cube");
  std::printf(
      "(s/cube for the 2-worker row is wall time per cube of the pair, i.e. 1/throughput)\n");
  for (const std::string& name : f.settings) {
    auto s = MakeSetting(name, f.side);
    if (!s.ok()) {
      std::fprintf(stderr, "bench_synth: %s\n", s.status().message().c_str());
      return 2;
    }
    if (int rc = BenchSetting(*s, f.cubes); rc != 0) return rc;
  }
  return 0;
}

std::vector<std::string> TfRecordFiles(const std::string& dir, double* compressed) {
  std::vector<std::string> files;
  std::error_code ec;
  for (const auto& e : std::filesystem::directory_iterator(dir, ec)) {
    if (e.path().extension() == ".tfrecord") files.push_back(e.path().string());
  }
  std::sort(files.begin(), files.end());
  *compressed = 0;
  for (const auto& f : files) {
    struct stat st {};
    ::stat(f.c_str(), &st);
    *compressed += st.st_size;
  }
  return files;
}

// Decode only: gunzip + both CRCs + Example parse + channel-first transpose. Returns the stream
// bytes, or -1 on an error.
double DecodeAll(const std::vector<std::string>& files) {
  double stream_bytes = 0;
  for (const auto& f : files) {
    auto reader = TfRecordReader::Open(f);
    if (!reader.ok()) return -1;
    std::string record;
    bool eof = false;
    while ((*reader)->Next(&record, &eof).ok() && !eof) {
      if (!DecodeMlperfExample(record).ok()) return -1;
    }
    stream_bytes += (*reader)->uncompressed_offset();
  }
  return stream_bytes;
}

int BenchImporter(const BenchFlags& f) {
  double compressed = 0;
  const std::vector<std::string> files = TfRecordFiles(f.data, &compressed);
  if (files.empty()) {
    std::printf("== importer: no .tfrecord files in %s, skipped\n", f.data.c_str());
    return 0;
  }
  std::printf(
      "\n== importer: %zu real MLPerf files, %.1f MB compressed, %d repeats (page cache warm)\n",
      files.size(), compressed / 1e6, f.repeats);
  std::vector<double> decode_times, import_times;
  double stream_bytes = 0;
  const std::string out =
      std::string(COSMOFLOW_BINARY_DIR) + "/bench-synth-import-" + std::to_string(::getpid());
  for (int r = 0; r < f.repeats; ++r) {
    auto t0 = Clock::now();
    stream_bytes = DecodeAll(files);
    if (stream_bytes < 0) return 1;
    decode_times.push_back(Seconds(t0));
    // Full import: the above on a prefetch thread + HDF5 writes + fsync + rename.
    std::filesystem::remove_all(out);
    ImportOptions o;
    o.out_dir = out;
    o.progress = false;
    ImportStats stats;
    t0 = Clock::now();
    Status s = ImportMlperf(files, o, &stats);
    import_times.push_back(Seconds(t0));
    if (!s.ok()) {
      std::fprintf(stderr, "%s\n", s.ToString().c_str());
      return 1;
    }
  }
  std::filesystem::remove_all(out);
  std::printf("%-40s %14s %16s %18s\n", "stage", "median s", "MB/s compressed",
              "MB/s uncompressed");
  for (auto [name, t] :
       {std::pair<const char*, double>{"decode (gunzip+CRC+parse+transpose)", Median(decode_times)},
        {"import to HDF5 shard (with fsync)", Median(import_times)}}) {
    std::printf("%-40s %14.3f %16.1f %18.1f\n", name, t, compressed / 1e6 / t,
                stream_bytes / 1e6 / t);
  }
  std::printf(
      "(files/s for the full import: %.2f; one process per file list scales across nodes)\n",
      files.size() / Median(import_times));
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  BenchFlags f;
  if (!ParseBenchFlags(argc, argv, &f)) return 2;
  if (int rc = BenchGenerator(f); rc != 0) return rc;
  return BenchImporter(f);
}
