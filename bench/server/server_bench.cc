// Serving benchmark: a C++ load generator against cosmoflow-server's service on loopback, at
// several concurrencies, with 128^3 int16 cubes, next to the engine's own forward pass on the same
// cores. Prints cubes/s, p50/p99 latency, the ratio of served to raw batched throughput, and RSS
// before and after a bounded soak. Not run by ctest (minutes on two cores).
//
//   server_bench [--spec sc18] [--max-batch 4] [--concurrency 1,4,16] [--requests 24]
//                [--soak-requests 200] [--queue-delay-ms auto] [--repeats 5]
//                [--protocols v1,kserve] [--rounds 1]
// With both protocols, each level runs them alternately --rounds times and prints the ratio of
// their throughputs (the same server, batcher and cube).
#include <grpcpp/grpcpp.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <fstream>
#include <map>
#include <functional>
#include <random>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "core/base/flags.h"
#include "core/nn/checkpoint.h"
#include "core/nn/network.h"
#include "proto/cosmoflow.grpc.pb.h"
#include "proto/kserve_v2.grpc.pb.h"
#include "server/kserve.h"
#include "server/server.h"

namespace {

using namespace cosmoflow;
using Clock = std::chrono::steady_clock;

double Seconds(Clock::duration d) { return std::chrono::duration<double>(d).count(); }

double Percentile(std::vector<double> v, double p) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  size_t i = size_t(p * double(v.size() - 1) + 0.5);
  return v[std::min(i, v.size() - 1)];
}

double Median(std::vector<double> v) { return Percentile(std::move(v), 0.5); }

double RssMiB() {
  std::ifstream in("/proc/self/status");
  for (std::string line; std::getline(in, line);)
    if (line.rfind("VmRSS:", 0) == 0) return std::stod(line.substr(6)) / 1024.0;
  return 0;
}

std::vector<int16_t> RandomCounts(uint64_t seed, int64_t n) {
  std::mt19937_64 rng(seed);
  std::poisson_distribution<int> dist(2.0);
  std::vector<int16_t> v(n);
  for (auto& x : v) x = int16_t(dist(rng));
  return v;
}

// The engine alone: one network per batch size, inputs already transformed.
class RawEngine {
 public:
  RawEngine(const Checkpoint& ckpt, int batch, const std::vector<int16_t>& counts) : batch_(batch) {
    NetworkOptions o;
    o.batch = batch;
    auto net = Network::Create(ckpt.spec, o);
    if (!net.ok() || !(*net)->LoadParameters(ckpt.weights).ok()) {
      std::fprintf(stderr, "cannot build the raw engine: %s\n", net.status().ToString().c_str());
      std::exit(1);
    }
    net_ = std::move(*net);
    const int64_t n = int64_t(counts.size());
    src_.resize(size_t(batch) * n);
    dst_.resize(size_t(batch) * ckpt.spec.outputs.size());
    for (int b = 0; b < batch; ++b)
      ApplyInputTransform(ckpt.spec.input_transform, counts.data(), n, n / ckpt.spec.input_channels,
                          src_.data() + b * n);
    net_->Forward(src_.data(), dst_.data());  // warm-up
  }
  // Median seconds of one Forward over `repeats` runs.
  double Seconds(int repeats) {
    std::vector<double> times;
    for (int r = 0; r < repeats; ++r) {
      auto t0 = Clock::now();
      net_->Forward(src_.data(), dst_.data());
      times.push_back(std::chrono::duration<double>(Clock::now() - t0).count());
    }
    return Median(times);
  }
  int batch() const { return batch_; }

 private:
  int batch_;
  std::unique_ptr<Network> net_;
  std::vector<float> src_, dst_;
};

struct LevelResult {
  double cubes_per_second = 0;
  double p50 = 0, p99 = 0;
  int failures = 0;
  double mean_batch = 0;
  double queue_p50 = 0, compute_p50 = 0, server_total_p50 = 0;  // from the replies' timings
};

// What one call reports about itself (zero for a protocol without timings in its reply).
struct CallTimings {
  double batch = 0, queue = 0, compute = 0, total = 0;
};
// One blocking inference call of one cube.
using Call = std::function<grpc::Status(CallTimings*)>;

LevelResult RunLevel(const Call& call, int concurrency, int total) {
  std::atomic<int> next{0};
  std::vector<std::vector<double>> latencies(concurrency);
  std::vector<int> failures(concurrency, 0);
  std::vector<std::vector<CallTimings>> timings(concurrency);
  auto t0 = Clock::now();
  std::vector<std::thread> threads;
  for (int c = 0; c < concurrency; ++c)
    threads.emplace_back([&, c] {
      while (next.fetch_add(1) < total) {
        CallTimings t;
        auto s0 = Clock::now();
        grpc::Status s = call(&t);
        latencies[c].push_back(Seconds(Clock::now() - s0));
        if (!s.ok()) {
          ++failures[c];
          std::fprintf(stderr, "request failed: %s\n", s.error_message().c_str());
        }
        timings[c].push_back(t);
      }
    });
  for (auto& t : threads) t.join();
  const double elapsed = Seconds(Clock::now() - t0);
  LevelResult r;
  std::vector<double> all, queue, compute, server_total;
  double batches = 0;
  for (int c = 0; c < concurrency; ++c) {
    for (const CallTimings& t : timings[c]) {
      queue.push_back(t.queue);
      compute.push_back(t.compute);
      server_total.push_back(t.total);
      batches += t.batch;
    }
    all.insert(all.end(), latencies[c].begin(), latencies[c].end());
    r.failures += failures[c];
  }
  r.cubes_per_second = double(total - r.failures) / elapsed;
  r.p50 = Percentile(all, 0.5);
  r.p99 = Percentile(all, 0.99);
  r.mean_batch = batches / double(total);
  r.queue_p50 = Median(queue);
  r.compute_p50 = Median(compute);
  r.server_total_p50 = Median(server_total);
  return r;
}

// cosmoflow.v1 Predict of `request`, with the server's timings.
Call V1Call(v1::CosmoFlow::Stub* stub, const v1::PredictRequest& request) {
  return [stub, &request](CallTimings* t) {
    grpc::ClientContext ctx;
    ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::minutes(5));
    v1::PredictResponse resp;
    grpc::Status s = stub->Predict(&ctx, request, &resp);
    *t = {double(resp.timings().batch_size()), resp.timings().queue_seconds(),
          resp.timings().compute_seconds(), resp.timings().total_seconds()};
    return s;
  };
}

// The Open Inference Protocol's ModelInfer of the same cube (raw_input_contents, as tritonclient
// sends it); its reply carries no timings.
Call KServeCall(inference::GRPCInferenceService::Stub* stub,
                const inference::ModelInferRequest& request) {
  return [stub, &request](CallTimings*) {
    grpc::ClientContext ctx;
    ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::minutes(5));
    inference::ModelInferResponse resp;
    return stub->ModelInfer(&ctx, request, &resp);
  };
}

inference::ModelInferRequest KServeRequest(const ModelSpec& spec,
                                           const std::vector<int16_t>& counts) {
  inference::ModelInferRequest req;
  req.set_model_name(kKServeModelName);
  auto* in = req.add_inputs();
  in->set_name("cube");
  in->set_datatype("INT16");
  for (int64_t e : {int64_t{1}, int64_t(spec.input_channels), int64_t(spec.input_side),
                    int64_t(spec.input_side), int64_t(spec.input_side)})
    in->add_shape(e);
  req.add_raw_input_contents(
      std::string(reinterpret_cast<const char*>(counts.data()), counts.size() * 2));
  return req;
}

// One line per protocol and level: medians over the rounds.
void PrintLevel(int concurrency, const std::string& protocol, const std::vector<LevelResult>& runs,
                double raw1, double raw_rate) {
  auto median = [&](double LevelResult::*field) {
    std::vector<double> v;
    for (const LevelResult& r : runs) v.push_back(r.*field);
    return Median(v);
  };
  int failures = 0;
  for (const LevelResult& r : runs) failures += r.failures;
  const double rate = median(&LevelResult::cubes_per_second), p50 = median(&LevelResult::p50);
  char batch[16] = "n/a";  // the KServe reply carries no batch size
  if (protocol == "v1") std::snprintf(batch, sizeof batch, "%.2f", median(&LevelResult::mean_batch));
  std::printf("%-12d %-7s %10.2f %10.3f %10.3f %10s | %10.3f %10.2f | %11.0f%% %12.2f%s\n",
              concurrency, protocol.c_str(), rate, p50, median(&LevelResult::p99), batch, raw1,
              raw_rate, 100 * rate / raw_rate, p50 / raw1, failures ? "  FAILURES" : "");
  if (protocol == "v1")
    std::printf("             server side p50: queue %.3f s, compute %.3f s, total %.3f s\n",
                median(&LevelResult::queue_p50), median(&LevelResult::compute_p50),
                median(&LevelResult::server_total_p50));
}

}  // namespace

int main(int argc, char** argv) {
  LimitMallocArenas();  // as cosmoflow-server does, so that the soak measures the server's heap
  Flags flags({{"spec", true},
               {"max-batch", true},
               {"concurrency", true},
               {"requests", true},
               {"soak-requests", true},
               {"queue-delay-ms", true},
               {"repeats", true},
               {"protocols", true},
               {"rounds", true},
               {"help", false}});
  auto fail = [](const std::string& message) {
    std::fprintf(stderr, "server_bench: %s\n", message.c_str());
    return 2;
  };
  if (Status s = flags.Parse(argc, argv); !s.ok()) return fail(s.message());
  if (flags.Has("help")) {
    std::printf(
        "usage: server_bench [--spec sc18] [--max-batch 4] [--concurrency 1,4,16] [--requests 24]\n"
        "                    [--soak-requests 200] [--queue-delay-ms auto] [--repeats 5]\n"
        "                    [--protocols v1,kserve] [--rounds 1]\n");
    return 0;
  }
  auto max_batch_flag = flags.GetInt("max-batch", 4);
  auto requests_flag = flags.GetInt("requests", 24);
  auto soak_flag = flags.GetInt("soak-requests", 200);
  auto repeats_flag = flags.GetInt("repeats", 5);
  auto rounds_flag = flags.GetInt("rounds", 1);
  auto delay = flags.GetDouble("queue-delay-ms", -1);  // -1: auto
  for (const auto* v : {&max_batch_flag, &requests_flag, &soak_flag, &repeats_flag, &rounds_flag}) {
    if (!v->ok()) return fail(v->status().message());
  }
  if (!delay.ok()) return fail(delay.status().message());
  if (*max_batch_flag < 1 || *max_batch_flag > 64 || *requests_flag < 1 || *soak_flag < 0 ||
      *repeats_flag < 1 || *rounds_flag < 1) {
    return fail(
        "--max-batch must be 1..64, --requests, --repeats and --rounds >= 1, --soak-requests >= 0");
  }
  std::vector<std::string> protocols;
  {
    std::stringstream ss(flags.Get("protocols", "v1"));
    for (std::string part; std::getline(ss, part, ',');) {
      if (part != "v1" && part != "kserve")
        return fail("--protocols: each must be v1 or kserve, got '" + part + "'");
      protocols.push_back(part);
    }
    if (protocols.empty()) return fail("--protocols is empty");
  }
  const std::string spec_name = flags.Get("spec", "sc18");
  std::vector<int> levels;
  {
    std::stringstream ss(flags.Get("concurrency", "1,4,16"));
    for (std::string part; std::getline(ss, part, ',');) {
      auto level = ParseInt(part, "--concurrency");
      if (!level.ok()) return fail(level.status().message());
      if (*level < 1 || *level > 256) return fail("--concurrency: each level must be 1..256, got " + part);
      levels.push_back(static_cast<int>(*level));
    }
  }
  const int max_batch = static_cast<int>(*max_batch_flag), requests = static_cast<int>(*requests_flag);
  const int soak = static_cast<int>(*soak_flag), repeats = static_cast<int>(*repeats_flag);
  const int rounds = static_cast<int>(*rounds_flag);
  const double delay_ms = *delay;

  auto spec = BuiltinSpec(spec_name);
  if (!spec.ok()) {
    std::fprintf(stderr, "%s\n", spec.status().ToString().c_str());
    return 1;
  }
  char dir_template[] = "/tmp/cf-server-bench-XXXXXX";
  const std::string dir = mkdtemp(dir_template);
  Checkpoint ckpt;
  {
    NetworkOptions o;
    auto net = Network::Create(*spec, o);
    if (!net.ok()) return 1;
    (*net)->InitParameters(1);
    ckpt.spec = *spec;
    ckpt.weights = (*net)->ExportParameters();
  }
  const std::string path = dir + "/bench.h5";
  if (auto w = WriteCheckpoint(path, ckpt); !w.ok()) {
    std::fprintf(stderr, "%s\n", w.status().ToString().c_str());
    return 1;
  }
  const int64_t voxels =
      int64_t(spec->input_channels) * spec->input_side * spec->input_side * spec->input_side;
  const auto counts = RandomCounts(7, voxels);

  std::printf(
      "# serving benchmark: spec %s, %lld-voxel int16 cubes, max batch %d, queue delay %s, "
      "%u hardware threads (medians; noisy when other work shares the cores)\n",
      spec_name.c_str(), static_cast<long long>(voxels), max_batch,
      delay_ms < 0 ? "auto" : (std::to_string(int(delay_ms * 1000)) + " us").c_str(),
      std::thread::hardware_concurrency());
  RawEngine raw_one(ckpt, 1, counts), raw_batch(ckpt, max_batch, counts);
  ServerOptions o;
  o.address = "127.0.0.1:0";
  o.checkpoint = path;
  o.max_batch = max_batch;
  o.max_queue = 256;
  o.max_queue_delay = std::chrono::microseconds(int64_t(delay_ms * 1000));
  o.watch_interval = std::chrono::milliseconds(0);
  auto server = InferenceServer::Start(o);
  if (!server.ok() || !(*server)->LoadInitialModel().ok()) {
    std::fprintf(stderr, "cannot start the server\n");
    return 1;
  }
  std::printf("server: batch-1 forward at load %.4f s, so the automatic queue delay is %.1f ms\n",
              (*server)->model()->forward1_seconds(),
              1000 * std::min(0.1, 0.1 * (*server)->model()->forward1_seconds()));
  grpc::ChannelArguments args;
  args.SetMaxReceiveMessageSize(64 << 20);
  args.SetMaxSendMessageSize(64 << 20);
  auto channel = grpc::CreateCustomChannel("127.0.0.1:" + std::to_string((*server)->port()),
                                           grpc::InsecureChannelCredentials(), args);
  auto stub = v1::CosmoFlow::NewStub(channel);
  v1::PredictRequest request;
  auto* cube = request.mutable_cube();
  for (int64_t e : {int64_t(spec->input_channels), int64_t(spec->input_side),
                    int64_t(spec->input_side), int64_t(spec->input_side)})
    cube->add_shape(e);
  cube->set_dtype(v1::DTYPE_INT16);
  cube->set_data(std::string(reinterpret_cast<const char*>(counts.data()), counts.size() * 2));

  auto kserve_stub = inference::GRPCInferenceService::NewStub(channel);
  const inference::ModelInferRequest kserve_request = KServeRequest(*spec, counts);
  std::map<std::string, Call> calls = {{"v1", V1Call(stub.get(), request)},
                                       {"kserve", KServeCall(kserve_stub.get(), kserve_request)}};
  for (const std::string& p : protocols) RunLevel(calls[p], 1, 2);  // connection warm-up
  // Raw engine and served throughput alternate, level by level, and the protocols alternate
  // round by round, so that all see the same background load (the two cores are shared).
  std::printf("%-12s %-7s %10s %10s %10s %10s | %10s %10s | %12s %12s\n", "concurrency",
              "proto", "cubes/s", "p50 s", "p99 s", "mean batch", "raw b1 s", "raw cubes/s",
              "served/raw", "p50/raw b1");
  for (int c : levels) {
    // Raw engine right before and right after the level; their mean is the reference.
    double raw1 = raw_one.Seconds(repeats);
    double rawb = raw_batch.Seconds(repeats);
    const int total = std::max(requests, 3 * c);
    std::map<std::string, std::vector<LevelResult>> runs;
    for (int round = 0; round < rounds; ++round)
      for (const std::string& p : protocols) runs[p].push_back(RunLevel(calls[p], c, total));
    raw1 = 0.5 * (raw1 + raw_one.Seconds(repeats));
    rawb = 0.5 * (rawb + raw_batch.Seconds(repeats));
    const double raw_rate = std::max(1 / raw1, max_batch / rawb);  // the engine's best batching
    for (const std::string& p : protocols) PrintLevel(c, p, runs[p], raw1, raw_rate);
    if (runs.size() == 2) {
      std::vector<double> ratios;
      for (int round = 0; round < rounds; ++round)
        ratios.push_back(runs["kserve"][round].cubes_per_second /
                         runs["v1"][round].cubes_per_second);
      std::printf("             kserve/v1 throughput: %.3f (median of %d alternating rounds)\n",
                  Median(ratios), rounds);
    }
    std::fflush(stdout);
  }

  if (soak > 0) {
    // Two halves: growth in the first half can be allocator warm-up (freed 4-8 MiB request buffers
    // kept by glibc's arenas, two here); a leak would keep growing in the second.
    const double before = RssMiB();
    LevelResult a = RunLevel(calls[protocols[0]], 4, soak / 2);
    const double middle = RssMiB();
    LevelResult b = RunLevel(calls[protocols[0]], 4, soak - soak / 2);
    const double after = RssMiB();
    std::printf(
        "soak: %d requests at concurrency 4, %d failed; RSS %.0f MiB before, %.0f MiB after %d, "
        "%.0f MiB after %d (second half %+.1f%%)\n",
        soak, a.failures + b.failures, before, middle, soak / 2, after, soak,
        100 * (after - middle) / middle);
  }
  (*server)->Shutdown(std::chrono::seconds(5));
  std::remove(path.c_str());
  rmdir(dir.c_str());
  return 0;
}
