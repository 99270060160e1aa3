// The inference server against real tiny32 checkpoints, over real gRPC on loopback.
#include "server/server.h"

#include <gtest/gtest.h>

#include <atomic>
#include <set>
#include <thread>

#include "tests/server/server_test_util.h"

namespace cosmoflow {
namespace {

using namespace cosmoflow::testing;
using grpc::StatusCode;
using HealthStatus = grpc::health::v1::HealthCheckResponse;

class ServerTest : public ::testing::Test {
 protected:
  void SetUp() override {
    checkpoint_ = WriteTinyCheckpoint(dir_ / "a.h5", /*seed=*/1, /*step=*/10);
  }

  ServerOptions Options() {
    ServerOptions o;
    o.address = "127.0.0.1:0";
    o.metrics_address = "127.0.0.1:0";
    o.checkpoint = checkpoint_;
    o.max_batch = 4;
    o.max_queue_delay = std::chrono::microseconds(2000);
    o.watch_interval = std::chrono::milliseconds(0);
    // ReloadModel is admin-only (tests/server/admin_test.cc covers refusals); these tests call it
    // with the token, on checkpoints in dir_, the checkpoint root.
    o.admin.enabled = true;
    o.admin.token_file = dir_ / "admin.token";
    token_ = WriteAdminToken(o.admin.token_file);
    return o;
  }

  void StartServer(const ServerOptions& o, bool load = true) {
    auto s = InferenceServer::Start(o);
    ASSERT_TRUE(s.ok()) << s.status().ToString();
    server_ = std::move(*s);
    if (load) {
      ASSERT_TRUE(server_->LoadInitialModel().ok());
    }
    stub_ = v1::CosmoFlow::NewStub(LoopbackChannel(server_->port()));
  }

  grpc::Status Predict(const v1::PredictRequest& req, v1::PredictResponse* resp,
                       double timeout = 30) {
    auto ctx = ContextWithDeadline(timeout);
    return stub_->Predict(ctx.get(), req, resp);
  }

  std::string ModelVersion() {
    v1::ModelInfo info;
    auto ctx = ContextWithDeadline();
    EXPECT_TRUE(stub_->GetModelInfo(ctx.get(), {}, &info).ok());
    return info.version();
  }

  TempDir dir_;
  std::string token_;
  std::string checkpoint_;
  std::unique_ptr<InferenceServer> server_;
  std::unique_ptr<v1::CosmoFlow::Stub> stub_;
};

std::vector<double> Values(const v1::PredictResponse& r) {
  std::vector<double> v;
  for (const auto& p : r.parameters()) v.push_back(p.value());
  return v;
}

void ExpectNear(const std::vector<double>& got, const std::vector<double>& want,
                double tol = 1e-5) {
  ASSERT_EQ(got.size(), want.size());
  for (size_t i = 0; i < got.size(); ++i)
    EXPECT_NEAR(got[i], want[i], tol * (1 + std::abs(want[i]))) << i;
}

TEST_F(ServerTest, PredictEqualsEngineForward) {
  StartServer(Options());
  for (uint64_t seed : {11, 12, 13}) {
    auto counts = RandomCounts(seed, kVoxels);
    v1::PredictResponse resp;
    grpc::Status s = Predict(MakeInt16Request(counts, "id-" + std::to_string(seed)), &resp);
    ASSERT_TRUE(s.ok()) << s.error_message();
    EXPECT_EQ(resp.request_id(), "id-" + std::to_string(seed));
    ASSERT_EQ(resp.parameters_size(), 3);
    EXPECT_EQ(resp.parameters(0).name(), "Omega_M");
    EXPECT_EQ(resp.parameters(1).name(), "sigma_8");
    EXPECT_EQ(resp.parameters(2).name(), "n_s");
    ExpectNear(Values(resp), EngineForward(checkpoint_, counts));
    EXPECT_EQ(resp.model_version(), ModelVersion());
    EXPECT_GE(resp.timings().batch_size(), 1);
    EXPECT_GT(resp.timings().compute_seconds(), 0);
    EXPECT_GE(resp.timings().total_seconds(), resp.timings().compute_seconds());

    // The same counts as float32, and as a 3-D shape, give the same numbers.
    std::vector<float> as_float(counts.begin(), counts.end());
    v1::PredictResponse fresp;
    ASSERT_TRUE(Predict(MakeFloatRequest(as_float), &fresp).ok());
    ExpectNear(Values(fresp), Values(resp));
  }
}

// A model with batch_norm (running statistics moved off their initial values by training
// forwards) serves the engine's numbers: the state tensors travel through the checkpoint.
TEST_F(ServerTest, BatchNormModelServesTheEngineNumbers) {
  ModelSpec spec = *BuiltinSpec("tiny32");
  LayerSpec bn;
  bn.type = LayerType::kBatchNorm;
  spec.layers.insert(spec.layers.begin() + 5, bn);  // after conv1 + leaky
  ASSERT_TRUE(spec.Validate().ok()) << spec.Validate().ToString();
  NetworkOptions o;
  o.batch = 2;
  o.training = true;
  auto net = Network::Create(spec, o);
  ASSERT_TRUE(net.ok()) << net.status().ToString();
  std::vector<float> x(2 * kVoxels), y(6);
  for (int step = 0; step < 3; ++step) {
    auto counts = RandomCounts(40 + step, 2 * kVoxels);
    ApplyInputTransform(spec.input_transform, counts.data(), 2 * kVoxels, kVoxels, x.data());
    (*net)->Forward(x.data(), y.data());
  }
  Checkpoint ckpt;
  ckpt.spec = spec;
  ckpt.weights = (*net)->ExportParameters();
  checkpoint_ = dir_ / "bn.h5";
  ASSERT_TRUE(WriteCheckpoint(checkpoint_, ckpt).ok());
  StartServer(Options());
  auto counts = RandomCounts(50, kVoxels);
  v1::PredictResponse resp;
  grpc::Status s = Predict(MakeInt16Request(counts), &resp);
  ASSERT_TRUE(s.ok()) << s.error_message();
  ExpectNear(Values(resp), EngineForward(checkpoint_, counts));
}

TEST_F(ServerTest, ChannelLastLayoutWithOneChannelMatches) {
  StartServer(Options());
  auto counts = RandomCounts(5, kVoxels);
  v1::PredictResponse a, b;
  ASSERT_TRUE(Predict(MakeInt16Request(counts), &a).ok());
  auto req = MakeInt16Request(counts);
  req.mutable_cube()->clear_shape();
  for (int64_t e : {kSide, kSide, kSide, 1}) req.mutable_cube()->add_shape(e);
  req.mutable_cube()->set_layout(v1::LAYOUT_CHANNEL_LAST);
  ASSERT_TRUE(Predict(req, &b).ok());
  ExpectNear(Values(b), Values(a));
}

TEST_F(ServerTest, BatchAndStreamEqualSingleCalls) {
  StartServer(Options());
  const int n = 6;
  std::vector<std::vector<double>> single;
  v1::PredictBatchRequest batch;
  for (int i = 0; i < n; ++i) {
    auto counts = RandomCounts(100 + i, kVoxels);
    v1::PredictResponse r;
    ASSERT_TRUE(Predict(MakeInt16Request(counts), &r).ok());
    single.push_back(Values(r));
    *batch.add_requests() = MakeInt16Request(counts, "b" + std::to_string(i));
  }
  v1::PredictBatchResponse bresp;
  auto ctx = ContextWithDeadline();
  ASSERT_TRUE(stub_->PredictBatch(ctx.get(), batch, &bresp).ok());
  ASSERT_EQ(bresp.responses_size(), n);
  bool batched = false;
  for (int i = 0; i < n; ++i) {
    EXPECT_EQ(bresp.responses(i).request_id(), "b" + std::to_string(i));
    ExpectNear(Values(bresp.responses(i)), single[i]);
    batched |= bresp.responses(i).timings().batch_size() > 1;
  }
  EXPECT_TRUE(batched) << "6 cubes submitted at once never shared a forward pass";

  auto sctx = ContextWithDeadline();
  auto stream = stub_->PredictStream(sctx.get());
  for (int i = 0; i < n; ++i) ASSERT_TRUE(stream->Write(batch.requests(i)));
  stream->WritesDone();
  v1::PredictStreamResponse sresp;
  std::set<std::string> seen;
  while (stream->Read(&sresp)) {
    ASSERT_EQ(sresp.code(), 0) << sresp.message();
    int i = std::stoi(sresp.request_id().substr(1));
    ExpectNear(Values(sresp.result()), single[i]);
    seen.insert(sresp.request_id());
  }
  EXPECT_TRUE(stream->Finish().ok());
  EXPECT_EQ(seen.size(), size_t(n));
}

TEST_F(ServerTest, HealthIsNotServingUntilTheModelIsLoaded) {
  StartServer(Options(), /*load=*/false);
  EXPECT_EQ(Health(server_->port()), HealthStatus::NOT_SERVING);
  v1::PredictResponse resp;
  grpc::Status s = Predict(MakeInt16Request(RandomCounts(1, kVoxels)), &resp);
  EXPECT_EQ(s.error_code(), StatusCode::UNAVAILABLE);
  EXPECT_NE(s.error_message().find("no model is loaded"), std::string::npos) << s.error_message();
  ASSERT_TRUE(server_->LoadInitialModel().ok());
  EXPECT_EQ(Health(server_->port()), HealthStatus::SERVING);
  EXPECT_EQ(Health(server_->port(), "cosmoflow.v1.CosmoFlow"), HealthStatus::SERVING);
  EXPECT_TRUE(Predict(MakeInt16Request(RandomCounts(1, kVoxels)), &resp).ok());
  server_->Shutdown(std::chrono::milliseconds(100));
  EXPECT_NE(Health(server_->port()), HealthStatus::SERVING);
}

TEST_F(ServerTest, ModelInfoDescribesTheCheckpoint) {
  StartServer(Options());
  v1::ModelInfo info;
  auto ctx = ContextWithDeadline();
  ASSERT_TRUE(stub_->GetModelInfo(ctx.get(), {}, &info).ok());
  auto ckpt = ReadCheckpoint(checkpoint_);
  ASSERT_TRUE(ckpt.ok());
  EXPECT_EQ(info.checksum(), ckpt->checksum);
  EXPECT_EQ(info.version(), "tiny32-000000010-" + ckpt->checksum);
  EXPECT_EQ(info.spec_name(), "tiny32");
  EXPECT_EQ(std::vector<int64_t>(info.input_shape().begin(), info.input_shape().end()),
            (std::vector<int64_t>{1, 32, 32, 32}));
  EXPECT_EQ(info.input_transform(), "log1p");
  ASSERT_EQ(info.outputs_size(), 3);
  EXPECT_EQ(info.outputs(1).name(), "sigma_8");
  EXPECT_EQ(info.step(), 10);
  EXPECT_EQ(info.num_parameters(), ckpt->spec.NumParameters());
  EXPECT_EQ(info.provenance().at("test"), "server_test_util");
  EXPECT_EQ(info.max_batch(), 4);
  EXPECT_EQ(info.max_message_bytes(), 64 << 20);
  EXPECT_EQ(info.checkpoint_path(), checkpoint_);
  EXPECT_GT(info.load_seconds(), 0);
}

// Every bad-input case answers precisely, and the server keeps serving.
TEST_F(ServerTest, BadInputsGetPreciseStatusAndTheServerKeepsServing) {
  ServerOptions o = Options();
  o.max_message_bytes = 1 << 20;  // 1 MiB: a 64^3 float cube is above it
  StartServer(o);
  const auto counts = RandomCounts(7, kVoxels);
  struct Case {
    std::string name;
    v1::PredictRequest request;
    StatusCode code;
    std::string message;
  };
  std::vector<Case> cases;
  auto add = [&](std::string name, auto mutate, StatusCode code, std::string message) {
    v1::PredictRequest r = MakeInt16Request(counts);
    mutate(r);
    cases.push_back({std::move(name), std::move(r), code, std::move(message)});
  };
  auto set_shape = [](v1::PredictRequest& r, std::vector<int64_t> shape) {
    r.mutable_cube()->clear_shape();
    for (auto e : shape) r.mutable_cube()->add_shape(e);
  };
  add(
      "empty message", [](v1::PredictRequest& r) { r.Clear(); }, StatusCode::INVALID_ARGUMENT,
      "is empty");
  add(
      "wrong shape",
      [&](v1::PredictRequest& r) {
        set_shape(r, {1, 16, 64, 32});
      },
      StatusCode::INVALID_ARGUMENT, "but the model takes 1x32x32x32");
  add(
      "two channels",
      [&](v1::PredictRequest& r) {
        set_shape(r, {2, 32, 32, 16});
      },
      StatusCode::INVALID_ARGUMENT, "model takes 1x32x32x32");
  add(
      "rank 5",
      [&](v1::PredictRequest& r) {
        set_shape(r, {1, 1, 32, 32, 32});
      },
      StatusCode::INVALID_ARGUMENT, "has 5 extents");
  add(
      "negative extent",
      [&](v1::PredictRequest& r) {
        set_shape(r, {1, -32, 32, 32});
      },
      StatusCode::INVALID_ARGUMENT, "extent -32 at axis 1");
  add(
      "unspecified dtype",
      [](v1::PredictRequest& r) { r.mutable_cube()->set_dtype(v1::DTYPE_UNSPECIFIED); },
      StatusCode::INVALID_ARGUMENT, "dtype is unspecified");
  add(
      "unknown dtype", [](v1::PredictRequest& r) { r.mutable_cube()->set_dtype(v1::DType(7)); },
      StatusCode::INVALID_ARGUMENT, "dtype has unknown value 7");
  add(
      "unknown layout", [](v1::PredictRequest& r) { r.mutable_cube()->set_layout(v1::Layout(9)); },
      StatusCode::INVALID_ARGUMENT, "layout has unknown value 9");
  add(
      "wrong dtype for the bytes",
      [](v1::PredictRequest& r) { r.mutable_cube()->set_dtype(v1::DTYPE_FLOAT32); },
      StatusCode::INVALID_ARGUMENT,
      "has 65536 bytes, but shape [1, 32, 32, 32] of float32 needs 131072");
  add(
      "short data", [](v1::PredictRequest& r) { r.mutable_cube()->mutable_data()->resize(1000); },
      StatusCode::INVALID_ARGUMENT, "has 1000 bytes");
  add(
      "negative count",
      [](v1::PredictRequest& r) {
        int16_t v = -3;
        std::memcpy(r.mutable_cube()->mutable_data()->data() + 2 * (5 * 1024 + 6 * 32 + 7), &v, 2);
      },
      StatusCode::INVALID_ARGUMENT, "negative count -3 at voxel (c=0, d=5, h=6, w=7)");
  add(
      "model version", [](v1::PredictRequest& r) { r.set_model_version("other-1"); },
      StatusCode::FAILED_PRECONDITION, "model_version is 'other-1'");
  std::vector<float> values(kVoxels, 1.f);
  for (auto [name, bad, what] : {std::tuple{"NaN", std::nanf(""), "NaN at voxel"},
                                 std::tuple{"Inf", INFINITY, "infinite value at voxel"},
                                 std::tuple{"negative float", -0.5f, "negative value -0.5"}}) {
    std::vector<float> v = values;
    v[123] = bad;
    cases.push_back({name, MakeFloatRequest(v), StatusCode::INVALID_ARGUMENT, what});
  }
  {  // over the message limit: gRPC itself refuses it
    std::vector<float> big(64 * 64 * 64, 1.f);
    auto r = MakeFloatRequest(big);
    cases.push_back({"over the size limit", r, StatusCode::RESOURCE_EXHAUSTED, "larger than max"});
  }
  for (const auto& c : cases) {
    v1::PredictResponse resp;
    grpc::Status s = Predict(c.request, &resp);
    EXPECT_EQ(s.error_code(), c.code) << c.name << ": " << s.error_message();
    EXPECT_NE(s.error_message().find(c.message), std::string::npos)
        << c.name << ": message '" << s.error_message() << "' lacks '" << c.message << "'";
    // ...and a valid request right after still works.
    v1::PredictResponse ok;
    ASSERT_TRUE(Predict(MakeInt16Request(counts), &ok).ok()) << "after " << c.name;
  }

  // A batch with one bad cube names its index; an empty batch is refused.
  v1::PredictBatchRequest batch;
  *batch.add_requests() = MakeInt16Request(counts);
  *batch.add_requests() = cases[1].request;
  v1::PredictBatchResponse bresp;
  auto ctx = ContextWithDeadline();
  grpc::Status s = stub_->PredictBatch(ctx.get(), batch, &bresp);
  EXPECT_EQ(s.error_code(), StatusCode::INVALID_ARGUMENT);
  EXPECT_NE(s.error_message().find("requests[1].cube.shape"), std::string::npos)
      << s.error_message();
  auto ctx2 = ContextWithDeadline();
  s = stub_->PredictBatch(ctx2.get(), v1::PredictBatchRequest(), &bresp);
  EXPECT_EQ(s.error_code(), StatusCode::INVALID_ARGUMENT);
  EXPECT_NE(s.error_message().find("requests is empty"), std::string::npos);

  std::string metrics = server_->metrics().Serialize();
  EXPECT_GE(MetricValue(metrics, "cosmoflow_requests_total",
                        "code=\"INVALID_ARGUMENT\",method=\"Predict\""),
            13);
  EXPECT_EQ(MetricValue(metrics, "cosmoflow_requests_total",
                        "code=\"FAILED_PRECONDITION\",method=\"Predict\""),
            1);
}

TEST_F(ServerTest, StreamWithGarbageThenValidCubesKeepsGoing) {
  StartServer(Options());
  auto counts = RandomCounts(3, kVoxels);
  const auto want = EngineForward(checkpoint_, counts);
  auto ctx = ContextWithDeadline();
  auto stream = stub_->PredictStream(ctx.get());
  v1::PredictRequest garbage;
  garbage.set_request_id("garbage");
  garbage.mutable_cube()->set_data("\x01\x02\x03");
  garbage.mutable_cube()->add_shape(3);
  ASSERT_TRUE(stream->Write(garbage));
  v1::PredictRequest empty;
  empty.set_request_id("empty");
  ASSERT_TRUE(stream->Write(empty));
  for (int i = 0; i < 3; ++i)
    ASSERT_TRUE(stream->Write(MakeInt16Request(counts, "ok" + std::to_string(i))));
  stream->WritesDone();
  v1::PredictStreamResponse r;
  int ok = 0, bad = 0;
  while (stream->Read(&r)) {
    if (r.request_id().rfind("ok", 0) == 0) {
      ASSERT_EQ(r.code(), 0) << r.message();
      ExpectNear(Values(r.result()), want);
      ++ok;
    } else {
      EXPECT_EQ(r.code(), int(StatusCode::INVALID_ARGUMENT)) << r.request_id();
      EXPECT_NE(r.message().find("request.cube"), std::string::npos) << r.message();
      ++bad;
    }
  }
  EXPECT_TRUE(stream->Finish().ok());
  EXPECT_EQ(ok, 3);
  EXPECT_EQ(bad, 2);
}

TEST_F(ServerTest, ClientDisconnectMidStreamLeavesTheServerServing) {
  StartServer(Options());
  auto counts = RandomCounts(4, kVoxels);
  for (int round = 0; round < 5; ++round) {
    grpc::ClientContext ctx;
    auto stream = stub_->PredictStream(&ctx);
    for (int i = 0; i < 8; ++i) stream->Write(MakeInt16Request(counts, std::to_string(i)));
    ctx.TryCancel();  // vanish without WritesDone or reading
    stream->Finish();
  }
  v1::PredictResponse resp;
  ASSERT_TRUE(Predict(MakeInt16Request(counts), &resp).ok());
  ExpectNear(Values(resp), EngineForward(checkpoint_, counts));
  EXPECT_EQ(Health(server_->port()), HealthStatus::SERVING);
}

// Many streams at once, mixing garbage, valid cubes, half-closes and abrupt cancels: every
// completed stream gets one reply per message, and the server stays healthy (run under
// COSMOFLOW_SANITIZE to check the reactor's lifetime rules).
TEST_F(ServerTest, ConcurrentStreamsWithGarbageAndCancels) {
  StartServer(Options());
  const auto good = MakeInt16Request(RandomCounts(8, kVoxels), "good");
  v1::PredictRequest bad;
  bad.set_request_id("bad");
  bad.mutable_cube()->add_shape(-1);
  std::atomic<int> incomplete{0};
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t)
    threads.emplace_back([&, t] {
      for (int round = 0; round < 8; ++round) {
        grpc::ClientContext ctx;
        ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(30));
        auto stream = stub_->PredictStream(&ctx);
        const int n = 6;
        for (int i = 0; i < n; ++i) stream->Write(i % 3 == 1 ? bad : good);
        if ((round + t) % 3 == 0) {  // vanish
          ctx.TryCancel();
          stream->Finish();
          continue;
        }
        stream->WritesDone();
        v1::PredictStreamResponse r;
        int replies = 0;
        while (stream->Read(&r)) ++replies;
        if (!stream->Finish().ok() || replies != n) ++incomplete;
      }
    });
  for (auto& t : threads) t.join();
  EXPECT_EQ(incomplete, 0);
  v1::PredictResponse resp;
  EXPECT_TRUE(Predict(good, &resp).ok());
  EXPECT_EQ(Health(server_->port()), HealthStatus::SERVING);
}

TEST_F(ServerTest, FullQueueAnswersResourceExhausted) {
  ServerOptions o = Options();
  o.max_queue = 4;
  o.max_batch = 8;  // never reached with 4 queued, so the batch waits out the full delay
  o.adaptive_batching = false;
  o.max_queue_delay = std::chrono::milliseconds(500);
  StartServer(o);
  auto request = MakeInt16Request(RandomCounts(9, kVoxels));
  const int n = 16;
  std::vector<grpc::Status> statuses(n);
  std::vector<std::thread> threads;
  for (int i = 0; i < n; ++i)
    threads.emplace_back([&, i] {
      v1::PredictResponse resp;
      auto ctx = ContextWithDeadline();
      statuses[i] = stub_->Predict(ctx.get(), request, &resp);
    });
  for (auto& t : threads) t.join();
  int ok = 0, exhausted = 0;
  for (const auto& s : statuses) {
    if (s.ok()) ++ok;
    if (s.error_code() == StatusCode::RESOURCE_EXHAUSTED) {
      ++exhausted;
      EXPECT_NE(s.error_message().find("queue is full"), std::string::npos) << s.error_message();
    }
  }
  EXPECT_EQ(ok + exhausted, n);
  EXPECT_GE(ok, 4);
  EXPECT_GE(exhausted, 1);
  EXPECT_EQ(MetricValue(server_->metrics().Serialize(), "cosmoflow_requests_total",
                        "code=\"RESOURCE_EXHAUSTED\",method=\"Predict\""),
            exhausted);
}

TEST_F(ServerTest, ExpiredRequestsAreNotComputed) {
  ServerOptions o = Options();
  o.max_batch = 8;
  o.max_queue_delay = std::chrono::milliseconds(400);
  o.adaptive_batching = false;  // the lone request must wait out the delay
  StartServer(o);
  auto before = MetricValue(server_->metrics().Serialize(), "cosmoflow_predicted_cubes_total");
  v1::PredictResponse resp;
  grpc::Status s = Predict(MakeInt16Request(RandomCounts(2, kVoxels)), &resp, /*timeout=*/0.1);
  EXPECT_EQ(s.error_code(), StatusCode::DEADLINE_EXCEEDED);
  // The server answers the request when its batch is flushed (after the queue delay); wait for
  // that answer rather than for a fixed time, which a loaded machine may overrun.
  auto deadline_answers = [&] {
    return MetricValue(server_->metrics().Serialize(), "cosmoflow_requests_total",
                       "code=\"DEADLINE_EXCEEDED\",method=\"Predict\"");
  };
  const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(60);
  while (!(deadline_answers() >= 1) && std::chrono::steady_clock::now() < until)
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  EXPECT_EQ(deadline_answers(), 1);
  EXPECT_EQ(MetricValue(server_->metrics().Serialize(), "cosmoflow_predicted_cubes_total"), before);
}

TEST_F(ServerTest, ReloadUnderLoadSwapsTheVersionWithoutAFailedRequest) {
  StartServer(Options());
  const std::string old_version = ModelVersion();
  const std::string b = WriteTinyCheckpoint(dir_ / "b.h5", /*seed=*/2, /*step=*/20);
  std::atomic<bool> stop{false};
  std::atomic<int> failures{0}, requests{0};
  std::mutex mu;
  std::set<std::string> versions;
  std::vector<std::thread> clients;
  for (int t = 0; t < 3; ++t)
    clients.emplace_back([&, t] {
      auto req = MakeInt16Request(RandomCounts(50 + t, kVoxels));
      while (!stop) {
        v1::PredictResponse resp;
        grpc::Status s = Predict(req, &resp);
        ++requests;
        if (!s.ok()) {
          ++failures;
          continue;
        }
        std::lock_guard<std::mutex> lock(mu);
        versions.insert(resp.model_version());
      }
    });
  std::this_thread::sleep_for(std::chrono::milliseconds(200));
  v1::ReloadModelRequest reload;
  reload.set_checkpoint_path(b);
  v1::ReloadModelResponse reloaded;
  auto ctx = AdminContext(token_);
  grpc::Status s = stub_->ReloadModel(ctx.get(), reload, &reloaded);
  ASSERT_TRUE(s.ok()) << s.error_message();
  EXPECT_TRUE(reloaded.changed());
  EXPECT_NE(reloaded.model().version(), old_version);
  EXPECT_EQ(reloaded.model().step(), 20);
  std::this_thread::sleep_for(std::chrono::milliseconds(200));
  stop = true;
  for (auto& t : clients) t.join();
  EXPECT_EQ(failures, 0) << "of " << requests << " requests";
  EXPECT_TRUE(versions.count(old_version));
  EXPECT_TRUE(versions.count(reloaded.model().version()));
  EXPECT_EQ(ModelVersion(), reloaded.model().version());
  auto counts = RandomCounts(50, kVoxels);
  v1::PredictResponse resp;
  ASSERT_TRUE(Predict(MakeInt16Request(counts), &resp).ok());
  ExpectNear(Values(resp), EngineForward(b, counts));
  EXPECT_EQ(MetricValue(server_->metrics().Serialize(), "cosmoflow_model_reloads_total",
                        "result=\"success\""),
            1);
}

TEST_F(ServerTest, BadReloadKeepsTheOldModel) {
  StartServer(Options());
  const std::string version = ModelVersion();
  // A checkpoint with one flipped payload byte, a file that is not HDF5, and a missing file.
  const std::string corrupt = WriteTinyCheckpoint(dir_ / "corrupt.h5", 3, 30);
  {
    std::fstream f(corrupt, std::ios::in | std::ios::out | std::ios::binary);
    f.seekg(0, std::ios::end);
    const auto size = int64_t(f.tellg());
    f.seekp(size - 4096);
    char c;
    f.seekg(size - 4096);
    f.read(&c, 1);
    c ^= 0x5a;
    f.seekp(size - 4096);
    f.write(&c, 1);
  }
  std::ofstream(dir_ / "foreign.h5") << "this is not a checkpoint\n";
  // A missing file is refused before loading, like a path outside the root (admin_test.cc).
  const std::vector<std::pair<std::string, StatusCode>> cases = {
      {corrupt, StatusCode::FAILED_PRECONDITION},
      {dir_ / "foreign.h5", StatusCode::FAILED_PRECONDITION},
      {dir_ / "missing.h5", StatusCode::PERMISSION_DENIED}};
  for (const auto& [path, code] : cases) {
    v1::ReloadModelRequest reload;
    reload.set_checkpoint_path(path);
    v1::ReloadModelResponse resp;
    auto ctx = AdminContext(token_);
    grpc::Status s = stub_->ReloadModel(ctx.get(), reload, &resp);
    EXPECT_EQ(s.error_code(), code) << path << ": " << s.error_message();
    if (code == StatusCode::FAILED_PRECONDITION) {
      EXPECT_NE(s.error_message().find(path), std::string::npos) << s.error_message();
    }
    EXPECT_EQ(ModelVersion(), version);
    v1::PredictResponse presp;
    EXPECT_TRUE(Predict(MakeInt16Request(RandomCounts(1, kVoxels)), &presp).ok());
    EXPECT_EQ(presp.model_version(), version);
  }
  EXPECT_EQ(MetricValue(server_->metrics().Serialize(), "cosmoflow_model_reloads_total",
                        "result=\"failure\""),
            2);
  EXPECT_EQ(Health(server_->port()), HealthStatus::SERVING);
}

TEST_F(ServerTest, CorruptCheckpointAtStartUpIsAClearError) {
  std::ofstream(dir_ / "junk.h5") << "junk";
  ServerOptions o = Options();
  o.checkpoint = dir_ / "junk.h5";
  StartServer(o, /*load=*/false);
  Status s = server_->LoadInitialModel();
  EXPECT_EQ(s.code(), cosmoflow::StatusCode::kFailedPrecondition);
  EXPECT_NE(s.message().find(dir_ / "junk.h5"), std::string::npos) << s.message();
  EXPECT_EQ(Health(server_->port()), HealthStatus::NOT_SERVING);
}

TEST_F(ServerTest, WatchesTheCheckpointDirectoryAndSighupFlag) {
  TempDir ckpt_dir;
  ASSERT_TRUE(SaveCheckpointToDir(ckpt_dir.path(), MakeTinyCheckpoint(1, 100), 3).ok());
  ServerOptions o = Options();
  o.checkpoint = ckpt_dir.path();
  o.watch_interval = std::chrono::milliseconds(100);
  StartServer(o);
  EXPECT_EQ(server_->model()->checkpoint().state.step, 100);
  ASSERT_TRUE(SaveCheckpointToDir(ckpt_dir.path(), MakeTinyCheckpoint(2, 200), 3).ok());
  auto until = std::chrono::steady_clock::now() + std::chrono::seconds(20);
  while (server_->model()->checkpoint().state.step != 200 &&
         std::chrono::steady_clock::now() < until)
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  EXPECT_EQ(server_->model()->checkpoint().state.step, 200);
  EXPECT_EQ(ModelVersion(), server_->model()->version());
}

TEST_F(ServerTest, MetricsMoveAndPassPromtool) {
  StartServer(Options());
  ASSERT_GT(server_->metrics_port(), 0);
  const std::string before = HttpGet(server_->metrics_port(), "/metrics");
  ASSERT_FALSE(before.empty());
  auto req = MakeInt16Request(RandomCounts(1, kVoxels));
  for (int i = 0; i < 5; ++i) {
    v1::PredictResponse resp;
    ASSERT_TRUE(Predict(req, &resp).ok());
  }
  const std::string after = HttpGet(server_->metrics_port(), "/metrics");
  EXPECT_EQ(MetricValue(after, "cosmoflow_requests_total", "code=\"OK\",method=\"Predict\""), 5);
  EXPECT_EQ(MetricValue(after, "cosmoflow_request_duration_seconds_count", "method=\"Predict\""),
            5);
  EXPECT_EQ(MetricValue(after, "cosmoflow_predicted_cubes_total"),
            5);  // warm-up passes are not counted
  EXPECT_EQ(MetricValue(after, "cosmoflow_received_bytes_total"), 5 * kVoxels * 2);
  EXPECT_EQ(MetricValue(after, "cosmoflow_queue_wait_seconds_count"), 5);
  EXPECT_GE(MetricValue(after, "cosmoflow_compute_seconds_count"), 1);
  EXPECT_EQ(MetricValue(after, "cosmoflow_batch_size_sum"), 5);
  EXPECT_EQ(MetricValue(after, "cosmoflow_queue_depth"), 0);
  const auto& m = *server_->model();
  EXPECT_EQ(MetricValue(after, "cosmoflow_model_info",
                        "checksum=\"" + m.checkpoint().checksum + "\",spec=\"tiny32\",version=\"" +
                            m.version() + "\""),
            1);
  EXPECT_GT(MetricValue(after, "cosmoflow_model_load_duration_seconds"), 0);

  TempDir tmp;
  std::ofstream(tmp / "metrics.txt") << after;
  const std::string cmd =
      "promtool check metrics < " + (tmp / "metrics.txt") + " > " + (tmp / "out.txt") + " 2>&1";
  int rc = std::system(cmd.c_str());
  EXPECT_EQ(rc, 0) << ReadFileText(tmp / "out.txt");
}

TEST_F(ServerTest, ReflectionListsTheService) {
  StartServer(Options());
  // A raw-bytes reflection call from python3-grpcio (no reflection stubs needed):
  // ServerReflectionRequest{list_services: ""} is field 7, length 0.
  const std::string script =
      "import grpc, sys\n"
      "ch = grpc.insecure_channel('127.0.0.1:" +
      std::to_string(server_->port()) +
      "')\n"
      "call = ch.stream_stream('/grpc.reflection.v1alpha.ServerReflection/ServerReflectionInfo')\n"
      "reply = b''.join(call(iter([b'\\x3a\\x00']), timeout=10))\n"
      "sys.exit(0 if b'cosmoflow.v1.CosmoFlow' in reply and b'grpc.health.v1.Health' in reply else "
      "1)\n";
  std::ofstream(dir_ / "reflect.py") << script;
  EXPECT_EQ(std::system(("/usr/bin/python3 " + (dir_ / "reflect.py")).c_str()), 0);
}

// A channel with its own TCP connection (gRPC otherwise shares one between identical channels).
std::shared_ptr<grpc::Channel> SeparateConnection(int port) {
  grpc::ChannelArguments args;
  args.SetMaxReceiveMessageSize(64 << 20);
  args.SetMaxSendMessageSize(64 << 20);
  args.SetInt("grpc.use_local_subchannel_pool", 1);
  return grpc::CreateCustomChannel("127.0.0.1:" + std::to_string(port),
                                   grpc::InsecureChannelCredentials(), args);
}

using Stream = grpc::ClientReaderWriter<v1::PredictRequest, v1::PredictStreamResponse>;

// Sends one cube on `stream` and reads its answer: the stream is established and admitted.
bool RoundTrip(Stream* stream, const std::vector<int16_t>& counts) {
  v1::PredictStreamResponse r;
  return stream->Write(MakeInt16Request(counts, "x")) && stream->Read(&r) && r.code() == 0;
}

TEST_F(ServerTest, OpenStreamsPerConnectionAreLimited) {
  ServerOptions o = Options();
  o.max_streams_per_connection = 2;
  StartServer(o);
  const auto counts = RandomCounts(5, kVoxels);
  auto channel = SeparateConnection(server_->port());
  auto stub = v1::CosmoFlow::NewStub(channel);
  grpc::ClientContext c1, c2, c3, c4;
  auto s1 = stub->PredictStream(&c1);
  auto s2 = stub->PredictStream(&c2);
  ASSERT_TRUE(RoundTrip(s1.get(), counts));
  ASSERT_TRUE(RoundTrip(s2.get(), counts));
  auto s3 = stub->PredictStream(&c3);  // the third on this connection
  v1::PredictStreamResponse r;
  s3->Write(MakeInt16Request(counts, "x"));
  EXPECT_FALSE(s3->Read(&r));
  grpc::Status refused = s3->Finish();
  EXPECT_EQ(refused.error_code(), StatusCode::RESOURCE_EXHAUSTED) << refused.error_message();
  EXPECT_NE(refused.error_message().find("allows 2 per connection"), std::string::npos)
      << refused.error_message();

  // Another connection is not affected; closing a stream frees its slot.
  auto other = v1::CosmoFlow::NewStub(SeparateConnection(server_->port()));
  grpc::ClientContext c5;
  auto s5 = other->PredictStream(&c5);
  EXPECT_TRUE(RoundTrip(s5.get(), counts));
  s1->WritesDone();
  EXPECT_TRUE(s1->Finish().ok());
  bool admitted = false;
  for (int i = 0; i < 100 && !admitted; ++i) {  // the server counts the close when OnDone runs
    grpc::ClientContext c;
    auto s = stub->PredictStream(&c);
    admitted = RoundTrip(s.get(), counts);
    s->WritesDone();
    s->Finish();
    if (!admitted) std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  EXPECT_TRUE(admitted);
  for (auto* s : {s2.get(), s5.get()}) {
    s->WritesDone();
    EXPECT_TRUE(s->Finish().ok());
  }
  EXPECT_GE(MetricValue(server_->metrics().Serialize(), "cosmoflow_limit_rejections_total",
                        "limit=\"streams_per_connection\""),
            1);
}

TEST_F(ServerTest, IdleStreamIsClosedAndABusyOneIsNot) {
  ServerOptions o = Options();
  o.stream_idle_timeout = std::chrono::milliseconds(300);
  StartServer(o);
  const auto counts = RandomCounts(6, kVoxels);
  grpc::ClientContext idle_ctx, busy_ctx;
  auto idle = stub_->PredictStream(&idle_ctx);
  auto busy = stub_->PredictStream(&busy_ctx);
  ASSERT_TRUE(RoundTrip(idle.get(), counts));
  const auto start = std::chrono::steady_clock::now();
  for (int i = 0; i < 12; ++i) {  // 1.2 s of one cube every 100 ms: never idle for 300 ms
    ASSERT_TRUE(RoundTrip(busy.get(), counts)) << i;
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  v1::PredictStreamResponse r;
  EXPECT_FALSE(idle->Read(&r));  // closed by the server, long before the 1.2 s were over
  grpc::Status closed = idle->Finish();
  EXPECT_EQ(closed.error_code(), StatusCode::RESOURCE_EXHAUSTED) << closed.error_message();
  EXPECT_NE(closed.error_message().find("idle for 300 ms"), std::string::npos)
      << closed.error_message();
  EXPECT_GE(std::chrono::steady_clock::now() - start, std::chrono::milliseconds(300));
  busy->WritesDone();
  EXPECT_TRUE(busy->Finish().ok());
  EXPECT_EQ(MetricValue(server_->metrics().Serialize(), "cosmoflow_limit_rejections_total",
                        "limit=\"stream_idle\""),
            1);
}

TEST_F(ServerTest, InflightCubesPerConnectionAreLimited) {
  ServerOptions o = Options();
  o.max_inflight_per_connection = 3;
  StartServer(o);
  v1::PredictBatchRequest batch;
  for (int i = 0; i < 4; ++i) *batch.add_requests() = MakeInt16Request(RandomCounts(i, kVoxels));
  v1::PredictBatchResponse resp;
  auto ctx = ContextWithDeadline();
  grpc::Status s = stub_->PredictBatch(ctx.get(), batch, &resp);
  EXPECT_EQ(s.error_code(), StatusCode::RESOURCE_EXHAUSTED) << s.error_message();
  EXPECT_NE(s.error_message().find("allows 3 per connection"), std::string::npos)
      << s.error_message();
  batch.mutable_requests()->RemoveLast();
  ctx = ContextWithDeadline();
  EXPECT_TRUE(stub_->PredictBatch(ctx.get(), batch, &resp).ok());
}

}  // namespace
}  // namespace cosmoflow
