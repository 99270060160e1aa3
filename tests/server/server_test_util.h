// Helpers for the server and client tests: real tiny32 checkpoints in temp dirs, random count
// cubes, the engine's own forward pass as the reference, loopback channels, a minimal HTTP GET, and
// subprocesses. Header-only so tests/client can share it.
#pragma once

#include <arpa/inet.h>
#include <grpcpp/grpcpp.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <memory>
#include <random>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "core/nn/checkpoint.h"
#include "core/nn/network.h"
#include "core/nn/spec.h"
#include "proto/cosmoflow.grpc.pb.h"
#include "proto/health.grpc.pb.h"
#include "tests/common/files.h"

namespace cosmoflow::testing {

namespace fs = std::filesystem;

// A tiny32 checkpoint whose weights come from `seed`.
inline Checkpoint MakeTinyCheckpoint(uint64_t seed, int64_t step) {
  auto spec = BuiltinSpec("tiny32");
  EXPECT_TRUE(spec.ok()) << spec.status().ToString();
  NetworkOptions options;
  options.batch = 1;
  auto net = Network::Create(*spec, options);
  EXPECT_TRUE(net.ok()) << net.status().ToString();
  (*net)->InitParameters(seed);
  Checkpoint ckpt;
  ckpt.spec = *spec;
  ckpt.weights = (*net)->ExportParameters();
  ckpt.state.step = step;
  ckpt.state.rng_seed = seed;
  ckpt.provenance["test"] = "server_test_util";
  return ckpt;
}

// A tiny32 checkpoint with an uncertainty head (last dense layer widened to HeadWidth) and, if
// given, calibration factors.
inline Checkpoint MakeTinyHeadCheckpoint(uint64_t seed, int64_t step, UncertaintyHead head,
                                         std::vector<double> sigma_scale = {}) {
  auto spec = BuiltinSpec("tiny32");
  EXPECT_TRUE(spec.ok()) << spec.status().ToString();
  spec->uncertainty = head;
  spec->layers.back().units = HeadWidth(head, 3);
  NetworkOptions options;
  auto net = Network::Create(*spec, options);
  EXPECT_TRUE(net.ok()) << net.status().ToString();
  (*net)->InitParameters(seed);
  Checkpoint ckpt;
  ckpt.spec = *spec;
  ckpt.weights = (*net)->ExportParameters();
  ckpt.state.step = step;
  ckpt.state.rng_seed = seed;
  ckpt.calibration.sigma_scale = std::move(sigma_scale);
  if (!ckpt.calibration.empty()) ckpt.calibration.samples = 100;
  return ckpt;
}

// The engine's raw network output (head width floats, normalised) for one cube.
inline std::vector<float> EngineRawOutput(const std::string& checkpoint_path,
                                          const std::vector<int16_t>& counts) {
  auto ckpt = ReadCheckpoint(checkpoint_path);
  EXPECT_TRUE(ckpt.ok()) << ckpt.status().ToString();
  NetworkOptions options;
  auto net = Network::Create(ckpt->spec, options);
  EXPECT_TRUE(net.ok());
  EXPECT_TRUE((*net)->LoadParameters(ckpt->weights).ok());
  std::vector<float> src(counts.size());
  ApplyInputTransform(ckpt->spec.input_transform, counts.data(), int64_t(counts.size()),
                      int64_t(counts.size()) / ckpt->spec.input_channels, src.data());
  std::vector<float> dst(ckpt->spec.NetworkOutputs());
  (*net)->Forward(src.data(), dst.data());
  return dst;
}

inline std::string WriteTinyCheckpoint(const std::string& path, uint64_t seed, int64_t step = 1) {
  auto written = WriteCheckpoint(path, MakeTinyCheckpoint(seed, step));
  EXPECT_TRUE(written.ok()) << written.status().ToString();
  return path;
}

// Random particle counts, roughly Poisson-like, for a C x side^3 cube.
inline std::vector<int16_t> RandomCounts(uint64_t seed, int64_t n) {
  std::mt19937_64 rng(seed);
  std::poisson_distribution<int> dist(3.0);
  std::vector<int16_t> v(n);
  for (auto& x : v) x = int16_t(dist(rng));
  return v;
}

inline constexpr int kSide = 32;
inline constexpr int64_t kVoxels = int64_t{kSide} * kSide * kSide;

inline v1::PredictRequest MakeInt16Request(const std::vector<int16_t>& counts,
                                           const std::string& id = "") {
  v1::PredictRequest r;
  r.set_request_id(id);
  auto* c = r.mutable_cube();
  for (int64_t e : {1, kSide, kSide, kSide}) c->add_shape(e);
  c->set_dtype(v1::DTYPE_INT16);
  c->set_layout(v1::LAYOUT_CHANNEL_FIRST);
  c->set_data(std::string(reinterpret_cast<const char*>(counts.data()), counts.size() * 2));
  return r;
}

inline v1::PredictRequest MakeFloatRequest(const std::vector<float>& values,
                                           const std::string& id = "") {
  v1::PredictRequest r;
  r.set_request_id(id);
  auto* c = r.mutable_cube();
  for (int64_t e : {kSide, kSide, kSide}) c->add_shape(e);
  c->set_dtype(v1::DTYPE_FLOAT32);
  c->set_data(std::string(reinterpret_cast<const char*>(values.data()), values.size() * 4));
  return r;
}

// The engine's own answer for one cube: read the checkpoint, build a batch-1 network, apply the
// spec's input transform and label de-normalisation.
inline std::vector<double> EngineForward(const std::string& checkpoint_path,
                                         const std::vector<int16_t>& counts) {
  auto ckpt = ReadCheckpoint(checkpoint_path);
  EXPECT_TRUE(ckpt.ok()) << ckpt.status().ToString();
  NetworkOptions options;
  options.batch = 1;
  auto net = Network::Create(ckpt->spec, options);
  EXPECT_TRUE(net.ok());
  EXPECT_TRUE((*net)->LoadParameters(ckpt->weights).ok());
  std::vector<float> src(counts.size());
  ApplyInputTransform(ckpt->spec.input_transform, counts.data(), int64_t(counts.size()),
                      int64_t(counts.size()) / ckpt->spec.input_channels, src.data());
  std::vector<float> dst(ckpt->spec.outputs.size());
  (*net)->Forward(src.data(), dst.data());
  std::vector<double> physical;
  for (size_t i = 0; i < dst.size(); ++i)
    physical.push_back(ckpt->spec.outputs[i].offset + ckpt->spec.outputs[i].scale * dst[i]);
  return physical;
}

inline std::shared_ptr<grpc::Channel> LoopbackChannel(
    int port, std::shared_ptr<grpc::ChannelCredentials> creds = nullptr,
    const std::string& host = "127.0.0.1") {
  grpc::ChannelArguments args;
  args.SetMaxReceiveMessageSize(64 << 20);
  args.SetMaxSendMessageSize(64 << 20);
  return grpc::CreateCustomChannel(host + ":" + std::to_string(port),
                                   creds ? creds : grpc::InsecureChannelCredentials(), args);
}

inline std::unique_ptr<grpc::ClientContext> ContextWithDeadline(double seconds = 30) {
  auto ctx = std::make_unique<grpc::ClientContext>();
  ctx->set_deadline(std::chrono::system_clock::now() +
                    std::chrono::milliseconds(int64_t(seconds * 1000)));
  return ctx;
}

// A token file as the admin surface wants it (mode 0600); returns the token.
inline std::string WriteAdminToken(const std::string& path,
                                   const std::string& token = "test-admin-token-0123456789") {
  {
    std::ofstream out(path);
    out << token << "\n";
  }
  fs::permissions(path, fs::perms::owner_read | fs::perms::owner_write);
  return token;
}

// A client context carrying `authorization: Bearer <token>` (none when token is empty).
inline std::unique_ptr<grpc::ClientContext> AdminContext(const std::string& token,
                                                         double seconds = 60) {
  auto ctx = ContextWithDeadline(seconds);
  if (!token.empty()) ctx->AddMetadata("authorization", "Bearer " + token);
  return ctx;
}

inline grpc::health::v1::HealthCheckResponse::ServingStatus Health(
    int port, const std::string& service = "", const std::string& host = "127.0.0.1") {
  auto stub = grpc::health::v1::Health::NewStub(LoopbackChannel(port, nullptr, host));
  grpc::health::v1::HealthCheckRequest req;
  req.set_service(service);
  grpc::health::v1::HealthCheckResponse resp;
  auto ctx = ContextWithDeadline(5);
  grpc::Status s = stub->Check(ctx.get(), req, &resp);
  if (!s.ok()) return grpc::health::v1::HealthCheckResponse::UNKNOWN;
  return resp.status();
}

// GET http://host:port/path (host: an IPv4 address); returns the body ("" on failure).
inline std::string HttpGet(int port, const std::string& path,
                           const std::string& host = "127.0.0.1") {
  int fd = socket(AF_INET, SOCK_STREAM, 0);
  if (fd < 0) return "";
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(uint16_t(port));
  if (inet_pton(AF_INET, host.c_str(), &addr.sin_addr) != 1) {
    close(fd);
    return "";
  }
  if (connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0) {
    close(fd);
    return "";
  }
  std::string req = "GET " + path + " HTTP/1.0\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n";
  if (write(fd, req.data(), req.size()) != ssize_t(req.size())) {
    close(fd);
    return "";
  }
  std::string response;
  char buf[65536];
  for (ssize_t n; (n = read(fd, buf, sizeof(buf))) > 0;) response.append(buf, size_t(n));
  close(fd);
  auto body = response.find("\r\n\r\n");
  return body == std::string::npos ? "" : response.substr(body + 4);
}

// The value of the sample `name{labels}` in a text exposition, e.g.
// MetricValue(text, "cosmoflow_requests_total", "code=\"OK\",method=\"Predict\""); NaN if absent.
inline double MetricValue(const std::string& exposition, const std::string& name,
                          const std::string& labels = "") {
  std::istringstream in(exposition);
  const std::string key = labels.empty() ? name + " " : name + "{" + labels + "} ";
  for (std::string line; std::getline(in, line);)
    if (line.compare(0, key.size(), key) == 0) return std::stod(line.substr(key.size()));
  return std::nan("");
}

// Runs `argv` as a child process with stdout+stderr to `log`; returns the pid.
inline pid_t Spawn(const std::vector<std::string>& argv, const std::string& log,
                   const std::vector<std::string>& env = {}) {
  pid_t pid = fork();
  if (pid == 0) {
    FILE* f = std::fopen(log.c_str(), "w");
    if (f) {
      dup2(fileno(f), 1);
      dup2(fileno(f), 2);
    }
    for (const auto& e : env) putenv(const_cast<char*>(e.c_str()));
    std::vector<char*> args;
    for (const auto& a : argv) args.push_back(const_cast<char*>(a.c_str()));
    args.push_back(nullptr);
    execv(args[0], args.data());
    _exit(127);
  }
  return pid;
}

// Waits for the child up to `timeout`; returns its exit status (or -1 on timeout, after SIGKILL).
inline int WaitExit(pid_t pid, std::chrono::milliseconds timeout) {
  const auto until = std::chrono::steady_clock::now() + timeout;
  for (;;) {
    int status = 0;
    pid_t r = waitpid(pid, &status, WNOHANG);
    if (r == pid) return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
    if (std::chrono::steady_clock::now() > until) {
      kill(pid, SIGKILL);
      waitpid(pid, &status, 0);
      return -1;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
}

// Polls a file written atomically by the server (--port-file); 0 on timeout.
inline int ReadPortFile(const std::string& path, std::chrono::milliseconds timeout) {
  const auto until = std::chrono::steady_clock::now() + timeout;
  while (std::chrono::steady_clock::now() < until) {
    std::ifstream in(path);
    int port = 0;
    if (in >> port && port > 0) return port;
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  return 0;
}

inline std::string ReadFileText(const std::string& path) {
  std::ifstream in(path);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

}  // namespace cosmoflow::testing
