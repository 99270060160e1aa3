// The KServe v2 protocol service (server/kserve.h) over real gRPC on loopback, against real tiny32
// checkpoints: its numbers equal cosmoflow.v1's and the engine's, readiness follows the model, and
// bad requests get statuses that name the problem.
#include "server/kserve.h"

#include <gtest/gtest.h>

#include <cstring>
#include <thread>

#include "proto/kserve_v2.grpc.pb.h"
#include "server/server.h"
#include "tests/server/server_test_util.h"

namespace cosmoflow {
namespace {

using namespace cosmoflow::testing;
using grpc::StatusCode;
namespace kv2 = ::inference;

class KServeTest : public ::testing::Test {
 protected:
  void Start(const Checkpoint& ckpt, bool load = true) {
    checkpoint_ = dir_ / "model.h5";
    ASSERT_TRUE(WriteCheckpoint(checkpoint_, ckpt).ok());
    ServerOptions o;
    o.address = "127.0.0.1:0";
    o.checkpoint = checkpoint_;
    o.max_batch = 4;
    o.max_queue = 8;
    o.max_queue_delay = std::chrono::microseconds(2000);
    o.watch_interval = std::chrono::milliseconds(0);
    auto s = InferenceServer::Start(o);
    ASSERT_TRUE(s.ok()) << s.status().ToString();
    server_ = std::move(*s);
    if (load) {
      ASSERT_TRUE(server_->LoadInitialModel().ok());
    }
    kserve_ = kv2::GRPCInferenceService::NewStub(LoopbackChannel(server_->port()));
    v1_ = v1::CosmoFlow::NewStub(LoopbackChannel(server_->port()));
  }

  // A ModelInfer request for `n` cubes of counts, INT16 raw bytes, channels first.
  static kv2::ModelInferRequest Int16Request(const std::vector<std::vector<int16_t>>& cubes) {
    kv2::ModelInferRequest req;
    req.set_model_name(kKServeModelName);
    req.set_id("req-7");
    auto* in = req.add_inputs();
    in->set_name("cube");
    in->set_datatype("INT16");
    for (int64_t d : {int64_t(cubes.size()), int64_t{1}, int64_t{kSide}, int64_t{kSide},
                      int64_t{kSide}})
      in->add_shape(d);
    std::string raw;
    for (const auto& c : cubes) raw.append(reinterpret_cast<const char*>(c.data()), c.size() * 2);
    req.add_raw_input_contents(raw);
    return req;
  }

  grpc::Status Infer(const kv2::ModelInferRequest& req, kv2::ModelInferResponse* resp) {
    auto ctx = ContextWithDeadline(30);
    return kserve_->ModelInfer(ctx.get(), req, resp);
  }

  v1::PredictResponse PredictV1(const std::vector<int16_t>& counts) {
    v1::PredictResponse resp;
    auto ctx = ContextWithDeadline(30);
    grpc::Status s = v1_->Predict(ctx.get(), MakeInt16Request(counts), &resp);
    EXPECT_TRUE(s.ok()) << s.error_message();
    return resp;
  }

  bool ServerReady() {
    kv2::ServerReadyResponse resp;
    auto ctx = ContextWithDeadline(10);
    EXPECT_TRUE(kserve_->ServerReady(ctx.get(), {}, &resp).ok());
    return resp.ready();
  }

  TempDir dir_{"kserve"};
  std::string checkpoint_;
  std::unique_ptr<InferenceServer> server_;
  std::unique_ptr<kv2::GRPCInferenceService::Stub> kserve_;
  std::unique_ptr<v1::CosmoFlow::Stub> v1_;
};

// The floats of output `k` of a response.
std::vector<float> OutputFloats(const kv2::ModelInferResponse& resp, int k) {
  const std::string& raw = resp.raw_output_contents(k);
  std::vector<float> v(raw.size() / sizeof(float));
  std::memcpy(v.data(), raw.data(), v.size() * sizeof(float));
  return v;
}

TEST_F(KServeTest, ModelInferEqualsEngineAndV1ForABatch) {
  Start(MakeTinyCheckpoint(/*seed=*/3, /*step=*/9));
  std::vector<std::vector<int16_t>> cubes;
  for (uint64_t seed : {21, 22, 23}) cubes.push_back(RandomCounts(seed, kVoxels));
  kv2::ModelInferResponse resp;
  grpc::Status s = Infer(Int16Request(cubes), &resp);
  ASSERT_TRUE(s.ok()) << s.error_message();
  EXPECT_EQ(resp.model_name(), "cosmoflow");
  EXPECT_EQ(resp.model_version(), server_->model()->version());
  EXPECT_EQ(resp.id(), "req-7");
  const char* names[] = {"Omega_M", "sigma_8", "n_s"};
  ASSERT_EQ(resp.outputs_size(), 3);
  ASSERT_EQ(resp.raw_output_contents_size(), 3);
  for (int p = 0; p < 3; ++p) {
    EXPECT_EQ(resp.outputs(p).name(), names[p]);
    EXPECT_EQ(resp.outputs(p).datatype(), "FP32");
    EXPECT_EQ(std::vector<int64_t>(resp.outputs(p).shape().begin(), resp.outputs(p).shape().end()),
              (std::vector<int64_t>{3, 1}));
  }
  for (size_t c = 0; c < cubes.size(); ++c) {
    const std::vector<double> engine = EngineForward(checkpoint_, cubes[c]);
    const v1::PredictResponse v1 = PredictV1(cubes[c]);
    for (int p = 0; p < 3; ++p) {
      const std::vector<float> got = OutputFloats(resp, p);
      ASSERT_EQ(got.size(), 3u);
      EXPECT_NEAR(got[c], engine[p], 1e-5 * (1 + std::abs(engine[p]))) << c << "," << p;
      // v1 computes the cube alone: a batch of 3 may sum in another order.
      const double want = v1.parameters(p).value();
      EXPECT_NEAR(got[c], want, 1e-5 * (1 + std::abs(want))) << c << "," << p;
    }
  }
}

TEST_F(KServeTest, TypedContentsAndChannelsLastGiveTheSameNumbers) {
  Start(MakeTinyCheckpoint(4, 2));
  const auto counts = RandomCounts(31, kVoxels);
  kv2::ModelInferResponse raw_resp;
  ASSERT_TRUE(Infer(Int16Request({counts}), &raw_resp).ok());

  kv2::ModelInferRequest typed = Int16Request({counts});
  typed.clear_raw_input_contents();
  for (int16_t c : counts) typed.mutable_inputs(0)->mutable_contents()->add_int_contents(c);
  kv2::ModelInferResponse typed_resp;
  grpc::Status s = Infer(typed, &typed_resp);
  ASSERT_TRUE(s.ok()) << s.error_message();
  for (int p = 0; p < 3; ++p) EXPECT_EQ(OutputFloats(typed_resp, p), OutputFloats(raw_resp, p));

  // FP32, shape [1, D, H, W, 1] channels last: one channel, so the same bytes in another order.
  kv2::ModelInferRequest fp32 = Int16Request({counts});
  fp32.clear_raw_input_contents();
  auto* in = fp32.mutable_inputs(0);
  in->set_datatype("FP32");
  in->clear_shape();
  for (int64_t d : {int64_t{1}, int64_t{kSide}, int64_t{kSide}, int64_t{kSide}, int64_t{1}})
    in->add_shape(d);
  (*in->mutable_parameters())["layout"].set_string_param("channels_last");
  for (int16_t c : counts) in->mutable_contents()->add_fp32_contents(float(c));
  kv2::ModelInferResponse fp32_resp;
  s = Infer(fp32, &fp32_resp);
  ASSERT_TRUE(s.ok()) << s.error_message();
  for (int p = 0; p < 3; ++p) {
    const auto a = OutputFloats(fp32_resp, p), b = OutputFloats(raw_resp, p);
    ASSERT_EQ(a.size(), b.size());
    for (size_t i = 0; i < a.size(); ++i) EXPECT_NEAR(a[i], b[i], 1e-6 * (1 + std::abs(b[i])));
  }
}

TEST_F(KServeTest, UncertaintyModelReturnsSigmaAndCovarianceAsV1Does) {
  Start(MakeTinyHeadCheckpoint(7, 3, UncertaintyHead::kGaussianFull, {1.5, 0.8, 1.1}));
  const auto counts = RandomCounts(41, kVoxels);
  kv2::ModelInferResponse resp;
  grpc::Status s = Infer(Int16Request({counts}), &resp);
  ASSERT_TRUE(s.ok()) << s.error_message();
  // Omega_M, sigma_8, n_s, then Omega_M_sigma, sigma_8_sigma, n_s_sigma, then covariance.
  ASSERT_EQ(resp.outputs_size(), 7);
  EXPECT_EQ(resp.outputs(3).name(), "Omega_M_sigma");
  EXPECT_EQ(resp.outputs(5).name(), "n_s_sigma");
  EXPECT_EQ(resp.outputs(6).name(), "covariance");
  EXPECT_EQ(std::vector<int64_t>(resp.outputs(6).shape().begin(), resp.outputs(6).shape().end()),
            (std::vector<int64_t>{1, 3, 3}));
  EXPECT_EQ(resp.outputs(6).parameters().at("names").string_param(), "Omega_M,sigma_8,n_s");
  const v1::PredictResponse v1 = PredictV1(counts);
  const auto cov = OutputFloats(resp, 6);
  ASSERT_EQ(cov.size(), 9u);
  for (int p = 0; p < 3; ++p) {
    EXPECT_FLOAT_EQ(OutputFloats(resp, p)[0], float(v1.parameters(p).value()));
    EXPECT_FLOAT_EQ(OutputFloats(resp, 3 + p)[0], float(v1.parameters(p).sigma()));
  }
  for (int k = 0; k < 9; ++k) EXPECT_FLOAT_EQ(cov[k], float(v1.covariance(k))) << k;

  // Only the requested outputs, in the requested order.
  kv2::ModelInferRequest req = Int16Request({counts});
  req.add_outputs()->set_name("sigma_8_sigma");
  req.add_outputs()->set_name("Omega_M");
  kv2::ModelInferResponse only;
  ASSERT_TRUE(Infer(req, &only).ok());
  ASSERT_EQ(only.outputs_size(), 2);
  EXPECT_EQ(only.outputs(0).name(), "sigma_8_sigma");
  EXPECT_EQ(OutputFloats(only, 0), OutputFloats(resp, 4));
  EXPECT_EQ(OutputFloats(only, 1), OutputFloats(resp, 0));

  // ModelConfig lists the same outputs with the batch dimension left out.
  kv2::ModelConfigRequest cq;
  cq.set_name("cosmoflow");
  kv2::ModelConfigResponse config;
  auto ctx = ContextWithDeadline(10);
  ASSERT_TRUE(kserve_->ModelConfig(ctx.get(), cq, &config).ok());
  ASSERT_EQ(config.config().output_size(), 7);
  EXPECT_EQ(config.config().output(6).name(), "covariance");
  EXPECT_EQ(config.config().output(6).dims_size(), 2);
  EXPECT_EQ(config.config().output(4).name(), "sigma_8_sigma");
  EXPECT_EQ(config.config().output(4).dims_size(), 1);
}

TEST_F(KServeTest, ReadinessAndMetadataFollowTheModel) {
  Start(MakeTinyCheckpoint(5, 12), /*load=*/false);
  kv2::ServerLiveResponse live;
  auto ctx = ContextWithDeadline(10);
  ASSERT_TRUE(kserve_->ServerLive(ctx.get(), {}, &live).ok());
  EXPECT_TRUE(live.live());
  EXPECT_FALSE(ServerReady());
  kv2::ModelInferResponse resp;
  EXPECT_EQ(Infer(Int16Request({RandomCounts(1, kVoxels)}), &resp).error_code(),
            StatusCode::UNAVAILABLE);

  ASSERT_TRUE(server_->LoadInitialModel().ok());
  EXPECT_TRUE(ServerReady());
  kv2::ModelReadyRequest mr;
  mr.set_name("cosmoflow");
  kv2::ModelReadyResponse ready;
  ctx = ContextWithDeadline(10);
  ASSERT_TRUE(kserve_->ModelReady(ctx.get(), mr, &ready).ok());
  EXPECT_TRUE(ready.ready());
  mr.set_version("no-such-version");
  ctx = ContextWithDeadline(10);
  ASSERT_TRUE(kserve_->ModelReady(ctx.get(), mr, &ready).ok());
  EXPECT_FALSE(ready.ready());
  mr.set_name("other");
  ctx = ContextWithDeadline(10);
  EXPECT_EQ(kserve_->ModelReady(ctx.get(), mr, &ready).error_code(), StatusCode::NOT_FOUND);

  kv2::ModelMetadataRequest mq;
  mq.set_name("cosmoflow");
  kv2::ModelMetadataResponse meta;
  ctx = ContextWithDeadline(10);
  ASSERT_TRUE(kserve_->ModelMetadata(ctx.get(), mq, &meta).ok());
  ASSERT_EQ(meta.versions_size(), 1);
  EXPECT_EQ(meta.versions(0), server_->model()->version());
  ASSERT_EQ(meta.inputs_size(), 1);
  EXPECT_EQ(meta.inputs(0).name(), "cube");
  EXPECT_EQ(std::vector<int64_t>(meta.inputs(0).shape().begin(), meta.inputs(0).shape().end()),
            (std::vector<int64_t>{-1, 1, kSide, kSide, kSide}));
  ASSERT_EQ(meta.outputs_size(), 3);  // no uncertainty: no sigma, no covariance
  EXPECT_EQ(meta.outputs(0).name(), "Omega_M");
  EXPECT_EQ(meta.outputs(2).name(), "n_s");
  EXPECT_EQ(std::vector<int64_t>(meta.outputs(1).shape().begin(), meta.outputs(1).shape().end()),
            (std::vector<int64_t>{-1, 1}));

  kv2::ModelConfigRequest cq;
  cq.set_name("cosmoflow");
  kv2::ModelConfigResponse config;
  ctx = ContextWithDeadline(10);
  ASSERT_TRUE(kserve_->ModelConfig(ctx.get(), cq, &config).ok());
  const kv2::ModelConfig& mc = config.config();
  EXPECT_EQ(mc.name(), "cosmoflow");
  EXPECT_EQ(mc.max_batch_size(), 8);  // the server's max_queue
  ASSERT_EQ(mc.input_size(), 1);
  EXPECT_EQ(mc.input(0).name(), "cube");
  EXPECT_EQ(mc.input(0).data_type(), kv2::TYPE_INT16);
  EXPECT_EQ(std::vector<int64_t>(mc.input(0).dims().begin(), mc.input(0).dims().end()),
            (std::vector<int64_t>{1, kSide, kSide, kSide}));
  ASSERT_EQ(mc.output_size(), 3);
  EXPECT_EQ(mc.output(0).name(), "Omega_M");
  EXPECT_EQ(mc.output(0).data_type(), kv2::TYPE_FP32);
  EXPECT_EQ(mc.dynamic_batching().preferred_batch_size(0), 4);  // the server's max_batch
  EXPECT_EQ(mc.dynamic_batching().max_queue_delay_microseconds(), 2000u);
  EXPECT_EQ(mc.parameters().at("model_version").string_value(), server_->model()->version());
  cq.set_name("other");
  ctx = ContextWithDeadline(10);
  EXPECT_EQ(kserve_->ModelConfig(ctx.get(), cq, &config).error_code(), StatusCode::NOT_FOUND);

  // Repository and shared-memory calls exist in the protocol but not in this server.
  kv2::RepositoryIndexResponse index;
  ctx = ContextWithDeadline(10);
  EXPECT_EQ(kserve_->RepositoryIndex(ctx.get(), {}, &index).error_code(),
            StatusCode::UNIMPLEMENTED);
  kv2::SystemSharedMemoryStatusResponse shm;
  ctx = ContextWithDeadline(10);
  EXPECT_EQ(kserve_->SystemSharedMemoryStatus(ctx.get(), {}, &shm).error_code(),
            StatusCode::UNIMPLEMENTED);

  kv2::ServerMetadataResponse sm;
  ctx = ContextWithDeadline(10);
  ASSERT_TRUE(kserve_->ServerMetadata(ctx.get(), {}, &sm).ok());
  EXPECT_EQ(sm.name(), "cosmoflow-server");
  EXPECT_FALSE(sm.version().empty());
  EXPECT_EQ(Health(server_->port(), "inference.GRPCInferenceService"),
            grpc::health::v1::HealthCheckResponse::SERVING);

  // Draining: the server is no longer ready (new calls are refused or answered not ready).
  std::thread drain([this] { server_->Shutdown(std::chrono::milliseconds(2000)); });
  kv2::ServerReadyResponse after;
  bool ready_seen = true;
  for (int i = 0; i < 200 && ready_seen; ++i) {
    ctx = ContextWithDeadline(2);
    grpc::Status s = kserve_->ServerReady(ctx.get(), {}, &after);
    ready_seen = s.ok() && after.ready();
    if (ready_seen) std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  drain.join();
  EXPECT_FALSE(ready_seen) << "still ready while draining";
}

// Each bad request gets its status and a message naming the field; the server keeps serving.
TEST_F(KServeTest, BadRequestsGetPreciseStatuses) {
  Start(MakeTinyCheckpoint(6, 1));
  const auto counts = RandomCounts(51, kVoxels);
  struct Case {
    const char* what;
    std::function<void(kv2::ModelInferRequest*)> mutate;
    StatusCode code;
    const char* message;
  };
  const std::vector<Case> cases = {
      {"unknown model", [](auto* r) { r->set_model_name("resnet"); }, StatusCode::NOT_FOUND,
       "model 'resnet'"},
      {"stale version", [](auto* r) { r->set_model_version("x-1"); }, StatusCode::NOT_FOUND,
       "no version 'x-1'"},
      {"no input", [](auto* r) { r->clear_inputs(); }, StatusCode::INVALID_ARGUMENT,
       "inputs has 0 tensors"},
      {"input name", [](auto* r) { r->mutable_inputs(0)->set_name("x"); },
       StatusCode::INVALID_ARGUMENT, "inputs[0].name is 'x'"},
      {"datatype", [](auto* r) { r->mutable_inputs(0)->set_datatype("FP16"); },
       StatusCode::INVALID_ARGUMENT, "inputs[0].datatype is 'FP16'"},
      {"rank", [](auto* r) { r->mutable_inputs(0)->mutable_shape()->RemoveLast(); },
       StatusCode::INVALID_ARGUMENT, "inputs[0].shape has 4 dimensions"},
      {"batch too large", [](auto* r) { r->mutable_inputs(0)->set_shape(0, 9); },
       StatusCode::INVALID_ARGUMENT, "inputs[0].shape[0] (the batch) is 9"},
      {"short raw", [](auto* r) { r->mutable_raw_input_contents(0)->resize(100); },
       StatusCode::INVALID_ARGUMENT, "raw_input_contents[0] has 100 bytes"},
      {"wrong side", [](auto* r) {
         auto* in = r->mutable_inputs(0);
         in->set_shape(2, 16); in->set_shape(3, 64);  // same byte count, not the model's side
       }, StatusCode::INVALID_ARGUMENT, "inputs[0][0]"},
      {"negative count", [](auto* r) { (*r->mutable_raw_input_contents(0))[1] = char(0x80); },
       StatusCode::INVALID_ARGUMENT, "inputs[0][0]"},
      {"layout", [](auto* r) {
         (*r->mutable_inputs(0)->mutable_parameters())["layout"].set_string_param("zyx");
       }, StatusCode::INVALID_ARGUMENT, "parameters[layout] is 'zyx'"},
      {"unknown output", [](auto* r) { r->add_outputs()->set_name("sigma"); },
       StatusCode::INVALID_ARGUMENT, "outputs[0].name 'sigma' is not an output"},
      {"output twice", [](auto* r) {
         r->add_outputs()->set_name("n_s");
         r->add_outputs()->set_name("n_s");
       }, StatusCode::INVALID_ARGUMENT, "outputs[1].name 'n_s' is requested twice"},
      {"typed too short", [](auto* r) {
         r->clear_raw_input_contents();
         r->mutable_inputs(0)->mutable_contents()->add_int_contents(1);
       }, StatusCode::INVALID_ARGUMENT, "int_contents has 1 elements"},
  };
  for (const Case& c : cases) {
    kv2::ModelInferRequest req = Int16Request({counts});
    c.mutate(&req);
    kv2::ModelInferResponse resp;
    grpc::Status s = Infer(req, &resp);
    EXPECT_EQ(s.error_code(), c.code) << c.what << ": " << s.error_message();
    EXPECT_NE(s.error_message().find(c.message), std::string::npos)
        << c.what << ": '" << s.error_message() << "'";
  }
  kv2::ModelInferResponse ok;
  EXPECT_TRUE(Infer(Int16Request({counts}), &ok).ok());
  EXPECT_NE(server_->metrics().Serialize().find("method=\"ModelInfer\""), std::string::npos);
}

}  // namespace
}  // namespace cosmoflow
