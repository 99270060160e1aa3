// Soak benchmark: cosmoflow-server in-process on loopback under mixed traffic for a fixed number of
// calls, while the model is reloaded every few hundred milliseconds. Each client thread draws its
// calls at random: valid Predict and PredictBatch calls, Open Inference Protocol ModelInfer calls,
// invalid cubes, messages above the size limit, and streams cancelled half-way. Every answer is
// checked against the answer a quiet server gave for the same cube and model version (so a
// cross-talk between requests, or a result from a half-swapped model, is a wrong answer), and every
// status against what that kind of call may get. Prints calls by kind and status, wrong answers,
// RSS and open file descriptors before and after. Exits 1 on any wrong answer, unexpected status or
// a growth in open file descriptors. ctest runs a short form (tests/server/CMakeLists.txt).
//
//   soak_bench [--calls 20000] [--seconds 0] [--threads 4] [--reload-every-ms 500] [--seed 1]
// (--seconds S > 0: stop after S seconds if the calls are not done by then.)
#include <dirent.h>
#include <grpcpp/grpcpp.h>

#include <atomic>
#include <chrono>
#include <cmath>
#include <cstring>
#include <cstdio>
#include <fstream>
#include <map>
#include <mutex>
#include <random>
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
constexpr int kCubes = 6;
constexpr int64_t kMaxMessage = 1 << 20;  // small, so that an oversized call is cheap

double RssMiB() {
  std::ifstream in("/proc/self/status");
  for (std::string line; std::getline(in, line);)
    if (line.rfind("VmRSS:", 0) == 0) return std::stod(line.substr(6)) / 1024.0;
  return 0;
}

int OpenFds() {
  int n = 0;
  if (DIR* d = opendir("/proc/self/fd")) {
    while (readdir(d)) ++n;
    closedir(d);
  }
  return n - 2;  // . and ..
}

// What the traffic needs: the cubes, the two checkpoints, and each model version's answers.
struct Fixture {
  ModelSpec spec;
  std::vector<v1::PredictRequest> cubes;          // valid requests, one per cube
  std::string paths[2];                           // the two checkpoints reloads alternate between
  std::map<std::string, std::vector<std::vector<double>>> answers;  // version -> cube -> values
};

// Mutex-guarded tallies of what the calls got.
struct Tally {
  std::mutex mu;
  std::map<std::string, int64_t> by_kind_and_code;
  int64_t wrong = 0, unexpected = 0;
  void Count(const std::string& kind, grpc::StatusCode code, bool expected) {
    std::lock_guard<std::mutex> lock(mu);
    ++by_kind_and_code[kind + " " + StatusCodeName(static_cast<StatusCode>(int(code)))];
    if (!expected) ++unexpected;
  }
  void Wrong() {
    std::lock_guard<std::mutex> lock(mu);
    ++wrong;
  }
};

std::shared_ptr<grpc::Channel> Channel(int port) {
  grpc::ChannelArguments args;
  args.SetMaxReceiveMessageSize(64 << 20);
  args.SetMaxSendMessageSize(64 << 20);  // the client sends oversized messages; the server refuses
  return grpc::CreateCustomChannel("127.0.0.1:" + std::to_string(port),
                                   grpc::InsecureChannelCredentials(), args);
}

std::unique_ptr<grpc::ClientContext> Context() {
  auto ctx = std::make_unique<grpc::ClientContext>();
  ctx->set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(60));
  return ctx;
}

// True if `values` (from model `version`) are cube `i`'s answer within rounding (batches of other
// sizes sum in another order; the cubes' answers differ by far more, see CheckDistinct).
bool Right(const Fixture& f, const std::string& version, int i, const std::vector<double>& values) {
  auto it = f.answers.find(version);
  if (it == f.answers.end() || values.size() != it->second[i].size()) return false;
  for (size_t k = 0; k < values.size(); ++k)
    if (std::abs(values[k] - it->second[i][k]) > 1e-4 * (1 + std::abs(it->second[i][k])))
      return false;
  return true;
}

std::vector<double> Values(const v1::PredictResponse& r) {
  std::vector<double> v;
  for (const auto& p : r.parameters()) v.push_back(p.value());
  return v;
}

class Client {
 public:
  Client(const Fixture& f, int port, Tally* tally, uint64_t seed)
      : f_(f), tally_(tally), rng_(seed), v1_(v1::CosmoFlow::NewStub(Channel(port))),
        kserve_(inference::GRPCInferenceService::NewStub(Channel(port))) {}

  void OneCall() {
    const int kind = std::uniform_int_distribution<int>(0, 19)(rng_);
    if (kind < 10) return PredictOne();
    if (kind < 12) return PredictBatch();
    if (kind < 14) return KServeInfer();
    if (kind < 16) return Invalid();
    if (kind < 17) return Oversized();
    return CancelledStream();
  }

 private:
  int Cube() { return std::uniform_int_distribution<int>(0, kCubes - 1)(rng_); }

  void PredictOne() {
    const int i = Cube();
    v1::PredictResponse resp;
    grpc::Status s = v1_->Predict(Context().get(), f_.cubes[i], &resp);
    tally_->Count("Predict", s.error_code(), s.ok());
    if (s.ok() && !Right(f_, resp.model_version(), i, Values(resp))) tally_->Wrong();
  }

  void PredictBatch() {
    v1::PredictBatchRequest batch;
    std::vector<int> idx;
    for (int k = 0; k < 3; ++k) {
      idx.push_back(Cube());
      *batch.add_requests() = f_.cubes[idx.back()];
    }
    v1::PredictBatchResponse resp;
    grpc::Status s = v1_->PredictBatch(Context().get(), batch, &resp);
    tally_->Count("PredictBatch", s.error_code(), s.ok());
    for (int k = 0; s.ok() && k < 3; ++k)
      if (!Right(f_, resp.responses(k).model_version(), idx[k], Values(resp.responses(k))))
        tally_->Wrong();
  }

  void KServeInfer();
  void Invalid();
  void Oversized();
  void CancelledStream();

  const Fixture& f_;
  Tally* tally_;
  std::mt19937_64 rng_;
  std::unique_ptr<v1::CosmoFlow::Stub> v1_;
  std::unique_ptr<inference::GRPCInferenceService::Stub> kserve_;
};

void Client::KServeInfer() {
  const int i = Cube();
  inference::ModelInferRequest req;
  req.set_model_name(kKServeModelName);
  auto* in = req.add_inputs();
  in->set_name("cube");
  in->set_datatype("INT16");
  in->add_shape(1);
  for (int64_t d : f_.cubes[i].cube().shape()) in->add_shape(d);
  req.add_raw_input_contents(f_.cubes[i].cube().data());
  inference::ModelInferResponse resp;
  grpc::Status s = kserve_->ModelInfer(Context().get(), req, &resp);
  tally_->Count("ModelInfer", s.error_code(), s.ok());
  if (!s.ok()) return;
  std::vector<double> values;
  for (int k = 0; k < int(f_.spec.outputs.size()) && k < resp.raw_output_contents_size(); ++k) {
    float v = 0;
    if (resp.raw_output_contents(k).size() == sizeof v)
      std::memcpy(&v, resp.raw_output_contents(k).data(), sizeof v);
    values.push_back(v);
  }
  if (!Right(f_, resp.model_version(), i, values)) tally_->Wrong();
}

void Client::Invalid() {
  v1::PredictRequest bad = f_.cubes[Cube()];
  bad.mutable_cube()->set_shape(1, bad.cube().shape(1) / 2);  // bytes no longer match the shape
  v1::PredictResponse resp;
  grpc::Status s = v1_->Predict(Context().get(), bad, &resp);
  tally_->Count("Invalid", s.error_code(), s.error_code() == grpc::StatusCode::INVALID_ARGUMENT);
}

void Client::Oversized() {
  v1::PredictRequest big = f_.cubes[0];
  big.mutable_cube()->set_data(std::string(kMaxMessage + 1024, '\0'));
  v1::PredictResponse resp;
  grpc::Status s = v1_->Predict(Context().get(), big, &resp);
  tally_->Count("Oversized", s.error_code(),
                s.error_code() == grpc::StatusCode::RESOURCE_EXHAUSTED);
}

void Client::CancelledStream() {
  auto ctx = Context();
  auto stream = v1_->PredictStream(ctx.get());
  std::vector<int> idx;
  for (int k = 0; k < 3; ++k) {
    idx.push_back(Cube());
    v1::PredictRequest r = f_.cubes[idx.back()];
    r.set_request_id(std::to_string(k));
    if (!stream->Write(r)) break;
  }
  v1::PredictStreamResponse reply;
  if (stream->Read(&reply) && reply.code() == 0) {
    const int k = std::atoi(reply.request_id().c_str());
    if (k < 0 || k >= int(idx.size()) ||
        !Right(f_, reply.result().model_version(), idx[k], Values(reply.result())))
      tally_->Wrong();
  }
  ctx->TryCancel();  // the other cubes are still in the server
  grpc::Status s = stream->Finish();
  tally_->Count("CancelledStream", s.error_code(),
                s.ok() || s.error_code() == grpc::StatusCode::CANCELLED);
}

StatusOr<Fixture> MakeFixture(const std::string& dir) {
  Fixture f;
  CF_ASSIGN_OR_RETURN(f.spec, BuiltinSpec("tiny32"));
  for (int m = 0; m < 2; ++m) {
    NetworkOptions o;
    CF_ASSIGN_OR_RETURN(auto net, Network::Create(f.spec, o));
    net->InitParameters(uint64_t(m + 1));
    Checkpoint ckpt;
    ckpt.spec = f.spec;
    ckpt.weights = net->ExportParameters();
    ckpt.state.step = m + 1;
    f.paths[m] = dir + "/model" + std::to_string(m) + ".h5";
    CF_RETURN_IF_ERROR(WriteCheckpoint(f.paths[m], ckpt).status());
  }
  const int side = f.spec.input_side;
  std::mt19937_64 rng(7);
  for (int i = 0; i < kCubes; ++i) {
    std::poisson_distribution<int> counts(1.0 + i);
    std::string data(size_t(side) * side * side * 2, '\0');
    for (size_t k = 0; k < data.size() / 2; ++k) {
      const int16_t c = int16_t(counts(rng));
      std::memcpy(&data[2 * k], &c, 2);
    }
    v1::PredictRequest r;
    for (int64_t d : {int64_t(f.spec.input_channels), int64_t(side), int64_t(side), int64_t(side)})
      r.mutable_cube()->add_shape(d);
    r.mutable_cube()->set_dtype(v1::DTYPE_INT16);
    r.mutable_cube()->set_data(data);
    f.cubes.push_back(r);
  }
  return f;
}

// The quiet server's answers for every cube under both models; the cubes must be told apart.
Status RecordAnswers(InferenceServer* server, Fixture* f) {
  auto stub = v1::CosmoFlow::NewStub(Channel(server->port()));
  for (int m = 0; m < 2; ++m) {
    CF_RETURN_IF_ERROR(server->Reload(f->paths[m]).status());
    const std::string version = server->model()->version();
    for (int i = 0; i < kCubes; ++i) {
      v1::PredictResponse resp;
      grpc::Status s = stub->Predict(Context().get(), f->cubes[i], &resp);
      if (!s.ok()) return InternalError("reference call failed: " + s.error_message());
      f->answers[version].push_back(Values(resp));
    }
  }
  for (const auto& [version, rows] : f->answers)
    for (int i = 1; i < kCubes; ++i)
      if (Right(*f, version, i, rows[0])) return InternalError("cubes 0 and " + std::to_string(i) +
                                                               " give the same answer");
  return Status::Ok();
}

struct Settings {
  int64_t calls = 20000;
  double seconds = 0;
  int threads = 4;
  int reload_every_ms = 500;
  uint64_t seed = 1;
};

StatusOr<Settings> ParseSettings(int argc, char** argv) {
  Flags flags({{"calls", true},
               {"seconds", true},
               {"threads", true},
               {"reload-every-ms", true},
               {"seed", true}});
  CF_RETURN_IF_ERROR(flags.Parse(argc, argv));
  Settings s;
  CF_ASSIGN_OR_RETURN(s.calls, flags.GetInt("calls", s.calls));
  CF_ASSIGN_OR_RETURN(s.seconds, flags.GetDouble("seconds", 0));
  CF_ASSIGN_OR_RETURN(int64_t threads, flags.GetInt("threads", s.threads));
  CF_ASSIGN_OR_RETURN(int64_t reload, flags.GetInt("reload-every-ms", s.reload_every_ms));
  CF_ASSIGN_OR_RETURN(int64_t seed, flags.GetInt("seed", 1));
  if (s.calls < 1 || s.seconds < 0 || threads < 1 || threads > 64 || reload < 10)
    return InvalidArgumentError(
        "--calls >= 1, --seconds >= 0, --threads 1..64, --reload-every-ms >= 10");
  s.threads = int(threads);
  s.reload_every_ms = int(reload);
  s.seed = uint64_t(seed);
  return s;
}

// Runs the clients and the reloads; returns the number of calls made (reloads in *reloads).
int64_t RunTraffic(const Settings& st, const Fixture& f, InferenceServer* server, Tally* tally,
                   int* reloads_out) {
  std::atomic<int64_t> next{0};
  const auto end = st.seconds > 0 ? Clock::now() + std::chrono::milliseconds(int64_t(st.seconds * 1000))
                                  : Clock::time_point::max();
  std::atomic<bool> done{false};
  const auto start = Clock::now();
  int total_reloads = 0;
  std::thread progress_and_reloads([&] {
    int reloads = 0;
    while (!done.load()) {
      std::this_thread::sleep_for(std::chrono::milliseconds(st.reload_every_ms));
      if (done.load()) break;
      (void)server->Reload(f.paths[++reloads % 2]);
      const double elapsed = std::chrono::duration<double>(Clock::now() - start).count();
      const int64_t n = std::min(next.load(), st.calls);
      std::fprintf(stderr, "\r%lld/%lld calls, %.0f calls/s, %d reloads   ", (long long)n,
                   (long long)st.calls, n / std::max(elapsed, 1e-9), reloads);
    }
    total_reloads = reloads;
  });
  std::vector<std::thread> clients;
  for (int t = 0; t < st.threads; ++t)
    clients.emplace_back([&, t] {
      Client c(f, server->port(), tally, st.seed * 1000 + uint64_t(t));
      while (Clock::now() < end && next.fetch_add(1) < st.calls) c.OneCall();
    });
  for (auto& c : clients) c.join();
  done.store(true);
  progress_and_reloads.join();
  std::fprintf(stderr, "\n");
  *reloads_out = total_reloads;
  return std::min(next.load(), st.calls);
}

}  // namespace

int main(int argc, char** argv) {
  LimitMallocArenas();  // as cosmoflow-server does, so that RSS measures the server's heap
  auto settings = ParseSettings(argc, argv);
  if (!settings.ok()) {
    std::fprintf(stderr, "soak_bench: %s\n", settings.status().message().c_str());
    return 2;
  }
  char dir_template[] = "/tmp/cf-soak-XXXXXX";
  const std::string dir = mkdtemp(dir_template);
  auto fixture = MakeFixture(dir);
  if (!fixture.ok()) {
    std::fprintf(stderr, "soak_bench: %s\n", fixture.status().ToString().c_str());
    return 1;
  }
  ServerOptions o;
  o.address = "127.0.0.1:0";
  o.checkpoint = fixture->paths[0];
  o.max_message_bytes = kMaxMessage;
  o.watch_interval = std::chrono::milliseconds(0);
  auto server = InferenceServer::Start(o);
  Status ready = server.ok() ? (*server)->LoadInitialModel() : server.status();
  if (ready.ok()) ready = RecordAnswers(server->get(), &*fixture);
  if (!ready.ok()) {
    std::fprintf(stderr, "soak_bench: %s\n", ready.ToString().c_str());
    return 1;
  }
  const double rss0 = RssMiB();
  const int fds0 = OpenFds();
  Tally tally;
  const auto t0 = Clock::now();
  int reloads = 0;
  const int64_t calls = RunTraffic(*settings, *fixture, server->get(), &tally, &reloads);
  const double seconds = std::chrono::duration<double>(Clock::now() - t0).count();
  const double rss1 = RssMiB();
  // Closed channels release their sockets asynchronously: give them a moment.
  int fds1 = OpenFds();
  for (int i = 0; i < 50 && fds1 > fds0; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
    fds1 = OpenFds();
  }
  std::printf("# soak: %lld calls from %d threads in %.1f s (%.0f calls/s), %d reloads, spec tiny32\n",
              (long long)calls, settings->threads, seconds, calls / seconds,
              reloads);
  std::printf("%-18s %-20s %10s\n", "kind", "code", "calls");
  for (const auto& [key, n] : tally.by_kind_and_code) {
    const size_t space = key.find(' ');
    std::printf("%-18s %-20s %10lld\n", key.substr(0, space).c_str(), key.substr(space + 1).c_str(),
                (long long)n);
  }
  std::printf("wrong answers %lld, unexpected statuses %lld\n", (long long)tally.wrong,
              (long long)tally.unexpected);
  std::printf("RSS %.1f MiB before, %.1f MiB after (%+.1f%%); open fds %d before, %d after\n", rss0,
              rss1, 100 * (rss1 - rss0) / rss0, fds0, fds1);
  (*server)->Shutdown(std::chrono::seconds(5));
  for (const auto& p : fixture->paths) std::remove(p.c_str());
  rmdir(dir.c_str());
  const bool failed = tally.wrong > 0 || tally.unexpected > 0 || fds1 > fds0 + 2;
  if (failed) std::printf("FAILED\n");
  return failed ? 1 : 0;
}
