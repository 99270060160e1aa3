// Uncertainties through the real server on loopback: sigma and covariance of a Gaussian-head
// checkpoint and of an ensemble equal what the engine's raw outputs give by hand (precision
// Cholesky -> covariance, mixture, calibration, label scales); a model without uncertainty leaves
// sigma absent; a bad ensemble reload keeps the old model serving.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <filesystem>

#include "core/nn/ensemble.h"
#include "server/server.h"
#include "tests/server/server_test_util.h"

namespace cosmoflow {
namespace {

using namespace cosmoflow::testing;

// 3x3 inverse by cofactors (not the server's forward substitution).
std::vector<double> Inverse3(const std::vector<double>& a) {
  auto at = [&](int i, int j) { return a[i * 3 + j]; };
  std::vector<double> c(9);
  for (int i = 0; i < 3; ++i)
    for (int j = 0; j < 3; ++j) {
      const int r0 = (i + 1) % 3, r1 = (i + 2) % 3, c0 = (j + 1) % 3, c1 = (j + 2) % 3;
      c[j * 3 + i] = at(r0, c0) * at(r1, c1) - at(r0, c1) * at(r1, c0);
    }
  const double det = at(0, 0) * c[0] + at(0, 1) * c[3] + at(0, 2) * c[6];
  for (auto& v : c) v /= det;
  return c;
}

struct Posterior {
  std::vector<double> mean, cov;  // physical units
};

// Normalised covariance of a full head's raw output: (L L^T)^-1 with L built by hand.
std::vector<double> FullHeadCovariance(const std::vector<float>& raw) {
  double l[9] = {std::exp(double(raw[3])), 0, 0,      raw[6],
                 std::exp(double(raw[4])), 0, raw[7], raw[8],
                 std::exp(double(raw[5]))};
  std::vector<double> precision(9, 0.0);
  for (int i = 0; i < 3; ++i)
    for (int j = 0; j < 3; ++j)
      for (int k = 0; k < 3; ++k) precision[i * 3 + j] += l[i * 3 + k] * l[j * 3 + k];
  return Inverse3(precision);
}

// Calibration and label scales applied to a normalised posterior.
Posterior ToPhysical(const ModelSpec& spec, const std::vector<double>& mean,
                     std::vector<double> cov, const std::vector<double>& sigma_scale) {
  Posterior p;
  for (int i = 0; i < 3; ++i) {
    p.mean.push_back(spec.outputs[i].offset + spec.outputs[i].scale * mean[i]);
    for (int j = 0; j < 3; ++j)
      cov[i * 3 + j] *=
          sigma_scale[i] * sigma_scale[j] * spec.outputs[i].scale * spec.outputs[j].scale;
  }
  p.cov = cov;
  return p;
}

void ExpectPosterior(const v1::PredictResponse& r, const Posterior& want) {
  ASSERT_EQ(r.parameters_size(), 3);
  ASSERT_EQ(r.covariance_size(), 9);
  for (int i = 0; i < 3; ++i) {
    EXPECT_NEAR(r.parameters(i).value(), want.mean[i], 1e-5 * (1 + std::abs(want.mean[i]))) << i;
    ASSERT_TRUE(r.parameters(i).has_sigma()) << i;
    const double sigma = std::sqrt(want.cov[i * 3 + i]);
    EXPECT_NEAR(r.parameters(i).sigma(), sigma, 1e-5 * sigma) << i;
  }
  for (int k = 0; k < 9; ++k) {
    const double scale = std::sqrt(want.cov[(k / 3) * 4] * want.cov[(k % 3) * 4]);
    EXPECT_NEAR(r.covariance(k), want.cov[k], 1e-5 * scale) << "covariance entry " << k;
  }
}

class UncertaintyServerTest : public ::testing::Test {
 protected:
  void Start(const std::string& checkpoint) {
    ServerOptions o;
    o.address = "127.0.0.1:0";
    o.metrics_address = "";
    o.checkpoint = checkpoint;
    o.max_batch = 4;
    o.max_queue_delay = std::chrono::microseconds(2000);
    o.watch_interval = std::chrono::milliseconds(0);
    // ReloadModel is admin-only: the reload test calls it with the token.
    o.admin.enabled = true;
    o.admin.token_file = dir_ / "admin.token";
    token_ = WriteAdminToken(o.admin.token_file);
    auto s = InferenceServer::Start(o);
    ASSERT_TRUE(s.ok()) << s.status().ToString();
    server_ = std::move(*s);
    ASSERT_TRUE(server_->LoadInitialModel().ok());
    stub_ = v1::CosmoFlow::NewStub(LoopbackChannel(server_->port()));
  }
  v1::PredictResponse Predict(const std::vector<int16_t>& counts) {
    v1::PredictResponse resp;
    auto ctx = ContextWithDeadline();
    grpc::Status s = stub_->Predict(ctx.get(), MakeInt16Request(counts), &resp);
    EXPECT_TRUE(s.ok()) << s.error_message();
    return resp;
  }
  v1::ModelInfo Info() {
    v1::ModelInfo info;
    auto ctx = ContextWithDeadline();
    EXPECT_TRUE(stub_->GetModelInfo(ctx.get(), {}, &info).ok());
    return info;
  }
  // Three diagonal-head members and a manifest with calibration factors for the mixture.
  std::string WriteEnsemble(const std::vector<double>& sigma_scale) {
    std::filesystem::create_directories(dir_ / "run/members");
    EnsembleManifest m;
    for (int k = 0; k < 3; ++k) {
      const std::string rel = "members/m" + std::to_string(k) + ".h5";
      auto sum = WriteCheckpoint(dir_ / ("run/" + rel),
                                 MakeTinyHeadCheckpoint(40 + k, 5, UncertaintyHead::kGaussian));
      EXPECT_TRUE(sum.ok()) << sum.status().ToString();
      m.members.push_back({rel, *sum});
    }
    Calibration c;
    c.sigma_scale = sigma_scale;
    c.samples = 16;
    m.calibration_json =
        CalibrationToJson(c, MakeTinyHeadCheckpoint(1, 1, UncertaintyHead::kGaussian).spec);
    EXPECT_TRUE(WriteEnsembleManifest(dir_ / "run/ensemble.json", m).ok());
    return dir_ / "run";
  }

  TempDir dir_;
  std::string token_;
  std::unique_ptr<InferenceServer> server_;
  std::unique_ptr<v1::CosmoFlow::Stub> stub_;
};

TEST_F(UncertaintyServerTest, FullHeadSigmaAndCovarianceEqualTheEngines) {
  const std::vector<double> scale = {1.5, 0.75, 2.0};
  const std::string path = dir_ / "full.h5";
  ASSERT_TRUE(
      WriteCheckpoint(path, MakeTinyHeadCheckpoint(7, 3, UncertaintyHead::kGaussianFull, scale))
          .ok());
  Start(path);
  const ModelSpec spec = ReadCheckpoint(path)->spec;
  for (uint64_t seed : {1, 2}) {
    const auto counts = RandomCounts(seed, kVoxels);
    const std::vector<float> raw = EngineRawOutput(path, counts);
    const std::vector<double> mean(raw.begin(), raw.begin() + 3);
    ExpectPosterior(Predict(counts), ToPhysical(spec, mean, FullHeadCovariance(raw), scale));
  }
  const v1::ModelInfo info = Info();
  EXPECT_EQ(info.uncertainty(), "gaussian");
  EXPECT_EQ(info.uncertainty_head(), "gaussian_full");
  EXPECT_EQ(info.ensemble_members(), 1);
  ASSERT_EQ(info.calibration_size(), 3);
  EXPECT_EQ(info.calibration(2), 2.0);
  EXPECT_EQ(info.calibration_samples(), 100);
}

// An edge term: each cube's sigma grows by exp(e u^2), u the place of its served mean in the prior,
// computed here by hand; ModelInfo lists e.
TEST_F(UncertaintyServerTest, EdgeCalibrationScalesSigmaByTheMeansPlaceInThePrior) {
  const std::vector<double> scale = {1.5, 0.75, 2.0}, edge = {0.6, 0.0, -0.4};
  Checkpoint ck = MakeTinyHeadCheckpoint(7, 3, UncertaintyHead::kGaussianFull, scale);
  ck.calibration.sigma_edge = edge;
  // A narrow prior about each offset puts the random network's means at varied u (some clamped).
  for (const OutputSpec& o : ck.spec.outputs) {
    ck.calibration.prior_low.push_back(o.offset - 0.05 * std::abs(o.scale));
    ck.calibration.prior_high.push_back(o.offset + 0.05 * std::abs(o.scale));
  }
  const std::string path = dir_ / "edge.h5";
  ASSERT_TRUE(WriteCheckpoint(path, ck).ok());
  Start(path);
  double max_u = 0;
  for (uint64_t seed : {1, 2}) {
    const auto counts = RandomCounts(seed, kVoxels);
    const std::vector<float> raw = EngineRawOutput(path, counts);
    const std::vector<double> mean(raw.begin(), raw.begin() + 3);
    std::vector<double> factor(3);
    for (int i = 0; i < 3; ++i) {
      const OutputSpec& o = ck.spec.outputs[i];
      const double lo = ck.calibration.prior_low[i], hi = ck.calibration.prior_high[i];
      const double u = std::clamp((2 * (o.offset + o.scale * mean[i]) - lo - hi) / (hi - lo), -3.0, 3.0);
      factor[i] = scale[i] * std::exp(edge[i] * u * u);
      max_u = std::max(max_u, std::abs(u));
    }
    ExpectPosterior(Predict(counts), ToPhysical(ck.spec, mean, FullHeadCovariance(raw), factor));
  }
  EXPECT_GT(max_u, 0.2) << "the means must lie away from the prior's centre for the test to mean anything";
  const v1::ModelInfo info = Info();
  ASSERT_EQ(info.calibration_edge_size(), 3);
  EXPECT_EQ(info.calibration_edge(0), 0.6);
  EXPECT_EQ(info.calibration_edge(2), -0.4);
}

TEST_F(UncertaintyServerTest, EnsembleIsTheMixtureOfItsMembersOnEveryCubeOfABatch) {
  const std::vector<double> scale = {1.25, 1.0, 0.5};
  const std::string run = WriteEnsemble(scale);
  Start(run);
  const ModelSpec spec = ReadCheckpoint(run + "/members/m0.h5")->spec;
  std::vector<std::vector<int16_t>> cubes;
  v1::PredictBatchRequest batch;
  for (uint64_t seed : {3, 4, 5}) {
    cubes.push_back(RandomCounts(seed, kVoxels));
    *batch.add_requests() = MakeInt16Request(cubes.back());
  }
  v1::PredictBatchResponse out;
  auto ctx = ContextWithDeadline();
  ASSERT_TRUE(stub_->PredictBatch(ctx.get(), batch, &out).ok());
  ASSERT_EQ(out.responses_size(), 3);
  for (int c = 0; c < 3; ++c) {
    // By hand: member means and variances exp(log-variance), then the mixture's moments.
    std::vector<std::vector<float>> raws;
    for (int k = 0; k < 3; ++k)
      raws.push_back(EngineRawOutput(run + "/members/m" + std::to_string(k) + ".h5", cubes[c]));
    std::vector<double> mean(3, 0.0), cov(9, 0.0);
    for (const auto& r : raws)
      for (int i = 0; i < 3; ++i) mean[i] += r[i] / 3.0;
    for (const auto& r : raws)
      for (int i = 0; i < 3; ++i) {
        cov[i * 4] += std::exp(double(r[3 + i])) / 3.0;
        for (int j = 0; j < 3; ++j) cov[i * 3 + j] += (r[i] - mean[i]) * (r[j] - mean[j]) / 3.0;
      }
    SCOPED_TRACE("cube " + std::to_string(c));
    ExpectPosterior(out.responses(c), ToPhysical(spec, mean, cov, scale));
  }
  const v1::ModelInfo info = Info();
  EXPECT_EQ(info.uncertainty(), "ensemble");
  EXPECT_EQ(info.ensemble_members(), 3);
  EXPECT_EQ(info.member_checkpoints_size(), 3);
  EXPECT_EQ(info.calibration(0), 1.25);
  EXPECT_EQ(info.checkpoint_path(), run + "/ensemble.json");
}

TEST_F(UncertaintyServerTest, WithoutUncertaintySigmaIsAbsentNotZero) {
  Start(WriteTinyCheckpoint(dir_ / "plain.h5", 1));
  const v1::PredictResponse r = Predict(RandomCounts(9, kVoxels));
  ASSERT_EQ(r.parameters_size(), 3);
  for (const auto& p : r.parameters()) EXPECT_FALSE(p.has_sigma()) << p.name();
  EXPECT_EQ(r.covariance_size(), 0);
  const v1::ModelInfo info = Info();
  EXPECT_EQ(info.uncertainty(), "none");
  EXPECT_EQ(info.calibration_size(), 0);
}

TEST_F(UncertaintyServerTest, BadEnsembleReloadKeepsTheOldModelAndNamesTheProblem) {
  const std::string run = WriteEnsemble({1.0, 1.0, 1.0});
  Start(run);
  const std::string version = Info().version();
  auto reload = [&](const std::string& path) {
    v1::ReloadModelRequest req;
    req.set_checkpoint_path(path);
    v1::ReloadModelResponse resp;
    auto ctx = AdminContext(token_);
    return stub_->ReloadModel(ctx.get(), req, &resp);
  };
  // A manifest naming a member that is not there.
  std::filesystem::copy_file(run + "/ensemble.json", run + "/missing.json");
  std::filesystem::rename(run + "/members/m2.h5", run + "/members/gone.h5");
  grpc::Status s = reload(run + "/missing.json");
  EXPECT_EQ(s.error_code(), grpc::StatusCode::FAILED_PRECONDITION);
  EXPECT_NE(s.error_message().find("member 2 (members/m2.h5)"), std::string::npos)
      << s.error_message();
  std::filesystem::rename(run + "/members/gone.h5", run + "/members/m2.h5");
  // A calibration factor that is not positive.
  auto m = ReadEnsembleManifest(run + "/ensemble.json");
  ASSERT_TRUE(m.ok());
  m->calibration_json = R"({"sigma_scale": {"Omega_M": 1, "sigma_8": -3, "n_s": 1}})";
  ASSERT_TRUE(WriteEnsembleManifest(run + "/bad.json", *m).ok());
  s = reload(run + "/bad.json");
  EXPECT_EQ(s.error_code(), grpc::StatusCode::FAILED_PRECONDITION);
  EXPECT_NE(s.error_message().find("sigma_scale.sigma_8"), std::string::npos) << s.error_message();
  // Still the old model, still answering with uncertainties.
  EXPECT_EQ(Info().version(), version);
  EXPECT_EQ(Predict(RandomCounts(1, kVoxels)).covariance_size(), 9);
}

}  // namespace
}  // namespace cosmoflow
