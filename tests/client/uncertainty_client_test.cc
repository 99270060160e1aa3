// Uncertainties in every client against a real server on loopback: the CLI prints "value ± sigma"
// (and the 68.3% interval on a calibrated prior) and its JSON carries sigma and the covariance
// exactly as served; the Python client returns the
// same; a model without uncertainty says so (null, never 0); and a client generated from the
// proto as it was before uncertainties keeps working against this server.
#include <gtest/gtest.h>

#include <filesystem>
#include <nlohmann/json.hpp>
#include <regex>
#include <sstream>

#include "core/base/truncated_normal.h"
#include "core/io/npy.h"
#include "server/server.h"
#include "tests/server/server_test_util.h"

namespace cosmoflow {
namespace {

using namespace cosmoflow::testing;
using nlohmann::json;

const std::string kClient = std::string(COSMOFLOW_BINARY_DIR) + "/client/cosmoflow-client";
const std::string kSource = COSMOFLOW_SOURCE_DIR;

struct Result {
  int code;
  std::string out, err;
};

class UncertaintyClientTest : public ::testing::Test {
 protected:
  void SetUp() override {
    counts_ = RandomCounts(31, kVoxels);
    Cube cube(CubeShape{1, kSide, kSide, kSide}, DType::kInt16);
    std::memcpy(cube.int16_data(), counts_.data(), counts_.size() * 2);
    ASSERT_TRUE(WriteNpy(dir_ / "cube.npy", cube, /*squeeze_single_channel=*/true).ok());
  }
  void Start(const Checkpoint& ckpt) {
    ASSERT_TRUE(WriteCheckpoint(dir_ / "model.h5", ckpt).ok());
    ServerOptions o;
    o.address = "127.0.0.1:0";
    o.metrics_address = "";
    o.checkpoint = dir_ / "model.h5";
    o.watch_interval = std::chrono::milliseconds(0);
    o.max_queue_delay = std::chrono::milliseconds(1);
    auto s = InferenceServer::Start(o);
    ASSERT_TRUE(s.ok()) << s.status().ToString();
    server_ = std::move(*s);
    ASSERT_TRUE(server_->LoadInitialModel().ok());
    address_ = "127.0.0.1:" + std::to_string(server_->port());
  }
  Result Exec(const std::string& command) {
    const std::string out = dir_ / "out.txt", err = dir_ / "err.txt";
    int status = std::system((command + " > " + out + " 2> " + err).c_str());
    return {WIFEXITED(status) ? WEXITSTATUS(status) : -1, ReadFileText(out), ReadFileText(err)};
  }
  Result Client(const std::string& args) {
    return Exec(kClient + " --address " + address_ + " " + args);
  }
  Result Python(const std::string& args) {
    return Exec("COSMOFLOW_STUBS_DIR=" + (dir_ / "stubs") + " /usr/bin/python3 " + kSource +
                "/client/python/cosmoflow_client.py --address " + address_ + " " + args);
  }
  // The server's own answer over gRPC.
  v1::PredictResponse Served() {
    auto stub = v1::CosmoFlow::NewStub(LoopbackChannel(server_->port()));
    v1::PredictResponse resp;
    auto ctx = ContextWithDeadline();
    EXPECT_TRUE(stub->Predict(ctx.get(), MakeInt16Request(counts_), &resp).ok());
    return resp;
  }

  TempDir dir_;
  std::vector<int16_t> counts_;
  std::unique_ptr<InferenceServer> server_;
  std::string address_;
};

TEST_F(UncertaintyClientTest, CliAndPythonCarrySigmaAndCovarianceAsServed) {
  Start(MakeTinyHeadCheckpoint(5, 2, UncertaintyHead::kGaussianFull, {1.5, 0.8, 1.1}));
  const v1::PredictResponse want = Served();
  ASSERT_EQ(want.covariance_size(), 9);

  Result cli = Client("predict --npy " + (dir_ / "cube.npy") + " --json");
  ASSERT_EQ(cli.code, 0) << cli.err;
  const json j = json::parse(cli.out);
  for (int i = 0; i < 3; ++i) {
    const auto& p = want.parameters(i);
    EXPECT_EQ(j["sigma"][p.name()].get<double>(), p.sigma()) << p.name();  // the same double
    for (int k = 0; k < 3; ++k)
      EXPECT_EQ(j["covariance"][i][k].get<double>(), want.covariance(i * 3 + k));
  }
  Result py = Python("--npy " + (dir_ / "cube.npy") + " --json");
  ASSERT_EQ(py.code, 0) << py.err;
  const json pj = json::parse(py.out);
  EXPECT_EQ(pj["sigma"], j["sigma"]);
  EXPECT_EQ(pj["covariance"], j["covariance"]);
  EXPECT_EQ(pj["parameters"], j["parameters"]);

  // The Open Inference Protocol client (what tritonclient sends) carries the same uncertainty,
  // as float32: the server's doubles rounded once.
  Result kv2 = Exec("COSMOFLOW_STUBS_DIR=" + (dir_ / "stubs") + " /usr/bin/python3 " + kSource +
                    "/client/python/kserve_client.py --address " + address_ + " --npy " +
                    (dir_ / "cube.npy"));
  ASSERT_EQ(kv2.code, 0) << kv2.err;
  const json kj = json::parse(kv2.out);
  for (int i = 0; i < 3; ++i) {
    const auto& p = want.parameters(i);
    EXPECT_EQ(kj["parameters"][p.name()].get<double>(), double(float(p.value()))) << p.name();
    EXPECT_EQ(kj["sigma"][p.name()].get<double>(), double(float(p.sigma()))) << p.name();
    for (int k = 0; k < 3; ++k)
      EXPECT_EQ(kj["covariance"][i][k].get<double>(), double(float(want.covariance(i * 3 + k))));
  }

  // The table: "Omega_M    0.3012 ± 0.0061", sigma to two significant digits, the value to the
  // same decimal place, then the correlations.
  Result table = Client("predict --npy " + (dir_ / "cube.npy"));
  ASSERT_EQ(table.code, 0) << table.err;
  for (int i = 0; i < 3; ++i) {
    const auto& p = want.parameters(i);
    std::smatch m;
    const std::regex line(p.name() + " +(-?[0-9.]+) \u00b1 ([0-9.]+)");
    ASSERT_TRUE(std::regex_search(table.out, m, line)) << table.out;
    const std::string value = m[1], sigma = m[2];
    EXPECT_NEAR(std::stod(sigma), p.sigma(), 0.05 * p.sigma()) << table.out;
    EXPECT_NEAR(std::stod(value), p.value(), p.sigma() / 10) << table.out;
    const size_t decimals = sigma.size() - sigma.find('.') - 1;
    EXPECT_EQ(value.size() - value.find('.') - 1, decimals)
        << "value and sigma to the same decimal: " << table.out;
    const std::string significant = sigma.substr(sigma.find_first_not_of("0."));
    EXPECT_EQ(significant.size(), 2u) << "sigma to two significant digits: " << table.out;
  }
  EXPECT_NE(table.out.find("correlation: Omega_M/sigma_8 "), std::string::npos) << table.out;

  Result info = Client("info --json");
  ASSERT_EQ(info.code, 0) << info.err;
  const json ij = json::parse(info.out);
  EXPECT_EQ(ij["uncertainty"], "gaussian");
  EXPECT_EQ(ij["uncertainty_head"], "gaussian_full");
  EXPECT_EQ(ij["calibration"], json::array({1.5, 0.8, 1.1}));
  Result text = Client("info");
  EXPECT_NE(
      text.out.find(
          "uncertainty      gaussian (gaussian_full head), sigma calibrated x1.5 / 0.8 / 1.1"),
      std::string::npos)
      << text.out;
}

// A power calibration with an edge term: every client's model info names the exponents and the
// edge terms as the checkpoint holds them.
TEST_F(UncertaintyClientTest, InfoCarriesThePowerCalibrationAndItsEdgeTerm) {
  Checkpoint ckpt = MakeTinyHeadCheckpoint(5, 2, UncertaintyHead::kGaussianFull, {1.5, 0.8, 1.1});
  ckpt.calibration.sigma_exponent = {0.5, 1.0, 0.0};
  ckpt.calibration.sigma_reference = {0.1, 0.2, 0.3};
  ckpt.calibration.sigma_edge = {0.25, 0.0, 0.0};
  ckpt.calibration.prior_low = {0.2, 0.7, 0.9};
  ckpt.calibration.prior_high = {0.4, 0.9, 1.0};
  Start(ckpt);
  Result info = Client("info --json");
  ASSERT_EQ(info.code, 0) << info.err;
  const json ij = json::parse(info.out);
  EXPECT_EQ(ij["calibration_exponent"], json::array({0.5, 1.0, 0.0}));
  EXPECT_EQ(ij["calibration_edge"], json::array({0.25, 0.0, 0.0}));
  Result text = Client("info");
  EXPECT_NE(text.out.find("x1.5 (sigma^0.5) (edge 0.25) / 0.8 (sigma^1) / 1.1 (sigma^0)"), std::string::npos)
      << text.out;
  Result py = Python("info --json");
  ASSERT_EQ(py.code, 0) << py.err;
  const json pj = json::parse(py.out);
  EXPECT_EQ(pj["calibration_edge"], ij["calibration_edge"]);
  EXPECT_EQ(pj["calibration_exponent"], ij["calibration_exponent"]);
}

TEST_F(UncertaintyClientTest, WithoutUncertaintyEveryClientSaysSo) {
  Start(MakeTinyCheckpoint(3, 1));
  Result cli = Client("predict --npy " + (dir_ / "cube.npy") + " --json");
  ASSERT_EQ(cli.code, 0) << cli.err;
  const json j = json::parse(cli.out);
  EXPECT_TRUE(j.contains("sigma") && j["sigma"].is_null()) << cli.out;
  EXPECT_TRUE(j["covariance"].is_null()) << cli.out;
  Result table = Client("predict --npy " + (dir_ / "cube.npy"));
  EXPECT_NE(table.out.find("uncertainty: none"), std::string::npos) << table.out;
  EXPECT_EQ(table.out.find("\u00b1"), std::string::npos) << table.out;
  Result py = Python("--npy " + (dir_ / "cube.npy") + " --json");
  ASSERT_EQ(py.code, 0) << py.err;
  EXPECT_TRUE(json::parse(py.out)["sigma"].is_null()) << py.out;
  EXPECT_EQ(json::parse(py.out)["parameters"], j["parameters"]);
  Result info = Client("info --json");
  EXPECT_EQ(json::parse(info.out)["uncertainty"], "none");
}

// With a calibrated prior the CLI adds each parameter's central 68.3% interval of the truncated
// posterior (JSON: interval_68), as core/base/truncated_normal.h computes it from the served value
// and sigma; a value half a sigma inside the prior's lower end gives an interval inside the prior,
// narrower than value -+ sigma and reaching further up than down.
TEST_F(UncertaintyClientTest, CliPrintsTheTruncatedIntervalOnThePrior) {
  Checkpoint ckpt = MakeTinyHeadCheckpoint(5, 2, UncertaintyHead::kGaussianFull, {1.5, 0.8, 1.1});
  Start(ckpt);
  const v1::PredictResponse unbounded = Served();
  Result none = Client("predict --npy " + (dir_ / "cube.npy") + " --json");
  ASSERT_EQ(none.code, 0) << none.err;
  EXPECT_TRUE(json::parse(none.out)["interval_68"].is_null()) << "no prior, no interval";
  Result py_none = Python("--npy " + (dir_ / "cube.npy") + " --json");
  ASSERT_EQ(py_none.code, 0) << py_none.err;
  EXPECT_TRUE(json::parse(py_none.out)["interval_68"].is_null()) << py_none.out;
  for (const auto& p : unbounded.parameters()) {
    ckpt.calibration.prior_low.push_back(p.value() - 0.5 * p.sigma());
    ckpt.calibration.prior_high.push_back(p.value() + 10 * p.sigma());
  }
  Start(ckpt);
  const v1::PredictResponse want = Served();
  Result cli = Client("predict --npy " + (dir_ / "cube.npy") + " --json");
  ASSERT_EQ(cli.code, 0) << cli.err;
  const json j = json::parse(cli.out);
  Result py_json = Python("--npy " + (dir_ / "cube.npy") + " --json");
  ASSERT_EQ(py_json.code, 0) << py_json.err;
  const json pj = json::parse(py_json.out);
  Result table = Client("predict --npy " + (dir_ / "cube.npy"));
  ASSERT_EQ(table.code, 0) << table.err;
  EXPECT_NE(table.out.find("68.3% interval"), std::string::npos) << table.out;
  for (int i = 0; i < 3; ++i) {
    const auto& p = want.parameters(i);
    const Interval iv = TruncatedInterval(p.value(), p.sigma(), ckpt.calibration.prior_low[i],
                                          ckpt.calibration.prior_high[i], 0.682689492137);
    EXPECT_EQ(j["interval_68"][p.name()][0].get<double>(), iv.low) << p.name();
    EXPECT_EQ(j["interval_68"][p.name()][1].get<double>(), iv.high) << p.name();
    EXPECT_GE(iv.low, ckpt.calibration.prior_low[i]) << p.name();
    EXPECT_LT(iv.high - iv.low, 2 * p.sigma()) << p.name() << ": narrower than -+ sigma";
    EXPECT_LT(p.value() - iv.low, iv.high - p.value()) << p.name() << ": further up than down";
    // tools/calibration.py's interval(), which the study's report uses, is the same interval.
    char args[256];
    std::snprintf(args, sizeof(args), "%.17g, %.17g, %.17g, %.17g, 0.682689492137", p.value(),
                  p.sigma(), ckpt.calibration.prior_low[i], ckpt.calibration.prior_high[i]);
    Result py = Exec("cd " + kSource + "/tools && /usr/bin/python3 -c 'import calibration; " +
                     "print(\"%.17g %.17g\" % calibration.interval(" + args + "))'");
    ASSERT_EQ(py.code, 0) << py.err;
    std::istringstream py_out(py.out);
    double py_low = 0, py_high = 0;
    py_out >> py_low >> py_high;
    EXPECT_NEAR(py_low, iv.low, 1e-9 * p.sigma()) << p.name();
    EXPECT_NEAR(py_high, iv.high, 1e-9 * p.sigma()) << p.name();
    // So is the Python client's (its own copy of the arithmetic: the client is a single file).
    const json& py_iv = pj["interval_68"][p.name()];
    EXPECT_NEAR(py_iv[0].get<double>(), iv.low, 1e-9 * p.sigma()) << p.name();
    EXPECT_NEAR(py_iv[1].get<double>(), iv.high, 1e-9 * p.sigma()) << p.name();
    std::smatch m;
    const std::regex line(p.name() + " +[-0-9.]+ \u00b1 [0-9.]+ +(-?[0-9.]+) - (-?[0-9.]+)");
    ASSERT_TRUE(std::regex_search(table.out, m, line)) << table.out;
    EXPECT_NEAR(std::stod(m[1]), iv.low, p.sigma() / 10) << table.out;
    EXPECT_NEAR(std::stod(m[2]), iv.high, p.sigma() / 10) << table.out;
  }
}

TEST_F(UncertaintyClientTest, ClientFromThePreviousProtoKeepsWorking) {
  const std::string old_proto = CF_PREVIOUS_PROTO_DIR;
  ASSERT_TRUE(std::filesystem::exists(old_proto + "/cosmoflow.proto"))
      << "the previous proto was not extracted at configure time (git show failed: not a git "
         "checkout?)";
  Start(MakeTinyHeadCheckpoint(6, 2, UncertaintyHead::kGaussianFull, {1.2, 1.0, 0.9}));
  std::filesystem::create_directories(dir_ / "old_stubs");
  Result old =
      Exec("/usr/bin/python3 " + kSource + "/tests/client/old_client_check.py " + old_proto + " " +
           (dir_ / "old_stubs") + " " + address_ + " " + (dir_ / "cube.npy"));
  ASSERT_EQ(old.code, 0) << old.err;
  Result cli = Client("predict --npy " + (dir_ / "cube.npy") + " --json");
  ASSERT_EQ(cli.code, 0) << cli.err;
  EXPECT_EQ(json::parse(old.out), json::parse(cli.out)["parameters"]) << "old: " << old.out;
}

}  // namespace
}  // namespace cosmoflow
