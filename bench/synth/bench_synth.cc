// Prints the synthetic-universe generator's speed (128^3 x 4-channel cubes per second, 1 and 2
// threads, alternating runs, medians) and the MLPerf importer's throughput (MB/s of compressed
// input and of TFRecord stream; decode only, and the full import into an HDF5 shard with fsync).
//
//   bench_synth [--cubes N] [--side S] [--repeats R] [--data DIR]
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <ctime>
#include <filesystem>
#include <string>
#include <vector>

#include "synth/generator_pool.h"
#include "synth/importer.h"
#include "synth/mlperf.h"
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

}  // namespace

int main(int argc, char** argv) {
  int cubes = 5, side = 128, repeats = 5;
  std::string data = std::string(COSMOFLOW_SHARED_DIR) + "/data/mlperf-cosmoflow";
  for (int i = 1; i + 1 < argc; i += 2) {
    if (!std::strcmp(argv[i], "--cubes"))
      cubes = std::atoi(argv[i + 1]);
    else if (!std::strcmp(argv[i], "--side"))
      side = std::atoi(argv[i + 1]);
    else if (!std::strcmp(argv[i], "--repeats"))
      repeats = std::atoi(argv[i + 1]);
    else if (!std::strcmp(argv[i], "--data"))
      data = argv[i + 1];
    else {
      std::fprintf(stderr, "bench_synth: unknown option %s\n", argv[i]);
      return 2;
    }
  }

  // ---- generator ----
  std::printf("== synth generator: %d^3 x 4 channels (z = 0, 0.5, 1.5, 3), %d cubes per setting\n",
              side, cubes);
  std::printf("%-34s %8s %14s %10s %14s\n", "setting", "threads", "median s/cube", "cubes/s",
              "CPU s/cube");
  std::printf(
      "(s/cube for the 2-worker row is wall time per cube of the pair, i.e. 1/throughput)\n");
  struct Setting {
    const char* name;
    Displacement d;
    double smoothing;
  };
  const Setting settings[] = {{"pm, 10 steps (default)", Displacement::kPm, -1},
                              {"za, auto truncation", Displacement::kZeldovich, -1},
                              {"2lpt, auto truncation", Displacement::k2Lpt, -1}};
  for (const Setting& s : settings) {
    std::vector<double> times[3], cpu[3];
    std::unique_ptr<UniverseGenerator> gens[3];
    for (int t : {1, 2}) {
      UniverseOptions o;
      o.side = side;
      o.displacement = s.d;
      o.smoothing = s.smoothing;
      o.threads = t;
      auto g = UniverseGenerator::Create(o);
      if (!g.ok()) {
        std::fprintf(stderr, "%s\n", g.status().ToString().c_str());
        return 1;
      }
      gens[t] = std::move(g).value();
      CosmologyParams p;
      auto c = Cosmology::Create(p);
      (void)gens[t]->Generate(*c, 0, 999);  // warm-up: first touch of the buffers
    }
    // Alternate 1 and 2 threads so that background load hits both alike.
    for (int i = 0; i < cubes; ++i) {
      for (int t : {1, 2}) {
        const CosmologyParams p = DrawParams(ParamRanges(), 1, i);
        auto c = Cosmology::Create(p);
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
      std::printf("%-34s %8s %14.3f %10.2f %14.3f\n", s.name, t == 1 ? "1" : "2 in cube", m,
                  1.0 / m, Median(cpu[t]));
    }
    // Two workers, one cube each at a time (what `synth` does by default).
    {
      UniverseOptions o;
      o.side = side;
      o.displacement = s.d;
      o.smoothing = s.smoothing;
      o.threads = 1;
      auto pool = GeneratorPool::Create(o, 2, ParamRanges(), CosmologyParams(), 1, 0, 2 * cubes);
      if (!pool.ok()) return 1;
      const auto t0 = Clock::now();
      const double c0 = CpuSeconds();
      for (int i = 0; i < 2 * cubes; ++i) {
        if (!(*pool)->Next().ok()) return 1;
      }
      const double wall = Seconds(t0) / (2 * cubes), cpu_per = (CpuSeconds() - c0) / (2 * cubes);
      std::printf("%-34s %8s %14.3f %10.2f %14.3f\n", s.name, "2 workers", wall, 1.0 / wall,
                  cpu_per);
      std::printf("%-34s %8s %14s %9.2fx\n", "", "", "2 workers vs 1", Median(times[1]) / wall);
    }
  }

  // ---- importer ----
  std::vector<std::string> files;
  std::error_code ec;
  for (const auto& e : std::filesystem::directory_iterator(data, ec)) {
    if (e.path().extension() == ".tfrecord") files.push_back(e.path().string());
  }
  std::sort(files.begin(), files.end());
  if (files.empty()) {
    std::printf("== importer: no .tfrecord files in %s, skipped\n", data.c_str());
    return 0;
  }
  double compressed = 0;
  for (const auto& f : files) {
    struct stat st {};
    ::stat(f.c_str(), &st);
    compressed += st.st_size;
  }
  std::printf(
      "\n== importer: %zu real MLPerf files, %.1f MB compressed, %d repeats (page cache warm)\n",
      files.size(), compressed / 1e6, repeats);
  std::vector<double> decode_times, import_times;
  double stream_bytes = 0;
  const std::string out =
      std::string(COSMOFLOW_BINARY_DIR) + "/bench-synth-import-" + std::to_string(::getpid());
  for (int r = 0; r < repeats; ++r) {
    // Decode only: gunzip + both CRCs + Example parse + channel-first transpose.
    auto t0 = Clock::now();
    stream_bytes = 0;
    for (const auto& f : files) {
      auto reader = TfRecordReader::Open(f);
      std::string record;
      bool eof = false;
      while ((*reader)->Next(&record, &eof).ok() && !eof) {
        auto s = DecodeMlperfExample(record);
        if (!s.ok()) return 1;
      }
      stream_bytes += (*reader)->uncompressed_offset();
    }
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
  std::printf("%-34s %14s %16s %18s\n", "stage", "median s", "MB/s compressed",
              "MB/s uncompressed");
  for (auto [name, t] :
       {std::pair<const char*, double>{"decode (gunzip+CRC+parse+transpose)", Median(decode_times)},
        {"import to HDF5 shard (with fsync)", Median(import_times)}}) {
    std::printf("%-34s %14.3f %16.1f %18.1f\n", name, t, compressed / 1e6 / t,
                stream_bytes / 1e6 / t);
  }
  std::printf(
      "(files/s for the full import: %.2f; one process per file list scales across nodes)\n",
      files.size() / Median(import_times));
  return 0;
}
