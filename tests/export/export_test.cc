// cosmoflow-export against the server: for checkpoints of several specs (every layer type, SAME
// convs with the odd padding voxel, batch_norm on 5-D and 2-D activations, all four input
// transforms, an empty channel), the exported PyTorch module (python3-torch) and the ONNX model
// (onnxruntime-node) predict the same cubes as cosmoflow-server, asked with cosmoflow-client over
// loopback, within kRelTol, and for uncertainty heads the calibrated covariance too. The server
// runs its default kernels (direct convolutions: the FFT candidate is never chosen by rule), so
// one tolerance holds for every spec. Also: onnx.checker passes, and bad checkpoints are refused with
// one line and leave nothing behind.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <random>
#include <string>
#include <vector>

#include "core/io/npy.h"
#include "core/nn/checkpoint.h"
#include "core/nn/network.h"
#include "tests/common/files.h"
#include "tests/server/server_test_util.h"

namespace cosmoflow::testing {
namespace {

using nlohmann::json;
constexpr double kRelTol = 1e-5;

const std::string kBin = COSMOFLOW_BINARY_DIR;
const std::string kSrc = COSMOFLOW_SOURCE_DIR;

// Every layer type; SAME convs whose padding is uneven (20 -> 10 with stride 2, 5 -> 5 with kernel
// 2: the odd voxel on the right); batch norm after a conv and after a dense; a floor pool (5 -> 2).
constexpr char kBatchNormSpec[] = R"({"name": "bn-same", "input_channels": 2, "input_side": 20,
  "input_transform": "divide_by_mean",
  "outputs": [{"name": "Omega_M", "offset": 0.3, "scale": 0.05}, {"name": "sigma_8", "offset": 0.865, "scale": 0.085},
              {"name": "n_s", "offset": 0.95, "scale": 0.05}],
  "layers": [{"type": "conv3d", "filters": 8, "kernel": 3, "stride": 2, "padding": "same"},
             {"type": "batch_norm", "momentum": 0.2, "epsilon": 0.001}, {"type": "leaky_relu", "alpha": 0.1},
             {"type": "max_pool", "size": 2},
             {"type": "conv3d", "filters": 8, "kernel": 2, "padding": "same"}, {"type": "leaky_relu", "alpha": 0.2},
             {"type": "avg_pool", "size": 2}, {"type": "flatten"}, {"type": "dropout", "rate": 0.3},
             {"type": "dense", "units": 16}, {"type": "batch_norm"}, {"type": "leaky_relu", "alpha": 0.3},
             {"type": "dense", "units": 3}, {"type": "scaled_tanh", "scale": 2.0}]})";

// Four channels, overdensity, VALID convs, H0 with a unit.
constexpr char kOverdensitySpec[] =
    R"({"name": "overdensity4", "input_channels": 4, "input_side": 16,
  "input_transform": "overdensity",
  "outputs": [{"name": "Omega_M", "offset": 0.3, "scale": 0.05}, {"name": "sigma_8", "offset": 0.865, "scale": 0.085},
              {"name": "n_s", "offset": 0.95, "scale": 0.05}, {"name": "H0", "unit": "km/s/Mpc", "offset": 70, "scale": 7}],
  "layers": [{"type": "conv3d", "filters": 8, "kernel": 3}, {"type": "leaky_relu", "alpha": 0.01},
             {"type": "avg_pool", "size": 2}, {"type": "conv3d", "filters": 16, "kernel": 3},
             {"type": "leaky_relu", "alpha": 0.01}, {"type": "max_pool", "size": 2}, {"type": "flatten"},
             {"type": "dense", "units": 4}]})";

// No transform, float cubes, a symmetric SAME conv.
constexpr char kNoTransformSpec[] = R"({"name": "plain8", "input_channels": 1, "input_side": 8,
  "input_transform": "none",
  "outputs": [{"name": "Omega_M", "offset": 0.3, "scale": 0.05}, {"name": "sigma_8", "offset": 0.865, "scale": 0.085},
              {"name": "n_s", "offset": 0.95, "scale": 0.05}],
  "layers": [{"type": "conv3d", "filters": 4, "kernel": 3, "padding": "same"}, {"type": "leaky_relu", "alpha": 0.05},
             {"type": "max_pool", "size": 2}, {"type": "flatten"}, {"type": "dense", "units": 3},
             {"type": "scaled_tanh", "scale": 1.5}]})";

// Uncertainty heads: a full covariance (the precision's Cholesky factor) for 3 outputs with
// calibration factors, and a diagonal one for 4 outputs.
constexpr char kFullCovSpec[] = R"({"name": "fullcov8", "input_channels": 1, "input_side": 8,
  "input_transform": "log1p", "uncertainty": "gaussian_full",
  "outputs": [{"name": "Omega_M", "offset": 0.3, "scale": 0.05}, {"name": "sigma_8", "offset": 0.865, "scale": 0.085},
              {"name": "n_s", "offset": 0.95, "scale": 0.05}],
  "layers": [{"type": "conv3d", "filters": 4, "kernel": 3}, {"type": "leaky_relu", "alpha": 0.1},
             {"type": "max_pool", "size": 2}, {"type": "flatten"}, {"type": "dense", "units": 9}]})";

constexpr char kDiagonalSpec[] = R"({"name": "gauss8", "input_channels": 2, "input_side": 8,
  "input_transform": "overdensity", "uncertainty": "gaussian",
  "outputs": [{"name": "Omega_M", "offset": 0.3, "scale": 0.05}, {"name": "sigma_8", "offset": 0.865, "scale": 0.085},
              {"name": "n_s", "offset": 0.95, "scale": 0.05}, {"name": "H0", "unit": "km/s/Mpc", "offset": 70, "scale": 7}],
  "layers": [{"type": "conv3d", "filters": 4, "kernel": 3}, {"type": "leaky_relu", "alpha": 0.1},
             {"type": "avg_pool", "size": 2}, {"type": "flatten"}, {"type": "dense", "units": 8}]})";

std::string OrtNodeDir() {
  const char* env = std::getenv("COSMOFLOW_ORT_NODE_DIR");
  return env ? env : kSrc + "/.deps/node";
}

// Runs a shell command; returns its exit status and fills `out` with stdout (stderr goes to `err`).
int RunCommand(const std::string& cmd, std::string* out, const std::string& err) {
  FILE* p = popen((cmd + " 2>" + err).c_str(), "r");
  if (p == nullptr) return -1;
  char buf[4096];
  for (size_t n; (n = fread(buf, 1, sizeof buf, p)) > 0;) out->append(buf, n);
  const int status = pclose(p);
  return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
}

// Seeded weights, and random values in every tensor the initialiser leaves constant (biases,
// gamma, beta, running statistics), so that a swapped or dropped tensor changes the outputs.
Checkpoint MakeCheckpoint(const ModelSpec& spec, uint64_t seed) {
  NetworkOptions options;
  options.batch = 1;
  auto net = Network::Create(spec, options);
  EXPECT_TRUE(net.ok()) << net.status().ToString();
  (*net)->InitParameters(seed);
  Checkpoint ckpt;
  ckpt.spec = spec;
  ckpt.weights = (*net)->ExportParameters();
  std::mt19937_64 rng(seed);
  std::uniform_real_distribution<float> u(-1.f, 1.f);
  for (auto& t : ckpt.weights) {
    const std::string suffix = t.name.substr(t.name.find('.') + 1);
    for (float& v : t.data) {
      if (suffix == "bias" || suffix == "beta" || suffix == "running_mean") v = 0.1f * u(rng);
      if (suffix == "gamma" || suffix == "running_var") v = 1.f + 0.5f * u(rng);
    }
  }
  ckpt.state.step = 7;
  ckpt.provenance["test"] = "export_test";
  return ckpt;
}

// Cubes of the spec's shape, each at a different density: Poisson counts (int16), or positive
// floats for the `none` spec. Cube 1 of a multi-channel spec has an empty channel (the transforms'
// zero-mean branch). All of them go through the exports as one batch.
std::vector<std::string> WriteCubes(const ModelSpec& spec, const TempDir& dir, int n, bool floats) {
  std::vector<std::string> paths;
  std::mt19937_64 rng(42);
  const int s = spec.input_side;
  for (int i = 0; i < n; ++i) {
    std::poisson_distribution<int> counts(2.0 + 3.0 * i);
    std::gamma_distribution<float> density(2.0f, 1.0f + 2.0f * i);
    Cube cube(CubeShape{spec.input_channels, s, s, s}, floats ? DType::kFloat32 : DType::kInt16);
    const int64_t total = cube.shape().elements(), per = cube.shape().voxels();
    for (int64_t k = 0; k < total; ++k) {
      const bool empty = i == 1 && spec.input_channels > 1 && k / per == 1;
      if (floats)
        cube.float_data()[k] = empty ? 0.f : density(rng);
      else
        cube.int16_data()[k] = int16_t(empty ? 0 : counts(rng));
    }
    paths.push_back(dir / ("cube" + std::to_string(i) + ".npy"));
    EXPECT_TRUE(WriteNpy(paths.back(), cube).ok());
  }
  return paths;
}

// The server's answer for each cube: cosmoflow-server on `checkpoint`, cosmoflow-client --json.
// A row holds the P values, then, for a model with an uncertainty, the P x P covariance.
std::vector<std::vector<double>> ServerPredictions(const std::string& checkpoint,
                                                   const ModelSpec& spec,
                                                   const std::vector<std::string>& cubes,
                                                   const TempDir& dir) {
  pid_t server = Spawn({kBin + "/server/cosmoflow-server", "--checkpoint", checkpoint, "--address",
                        "127.0.0.1:0", "--port-file", dir / "port", "--metrics-address", ""},
                       dir / "server.log");
  const int port = ReadPortFile(dir / "port", std::chrono::seconds(60));
  const std::string client =
      kBin + "/client/cosmoflow-client --address 127.0.0.1:" + std::to_string(port);
  // The port opens before the model is loaded: wait for health SERVING (the CLI exits 0).
  std::string ignored;
  for (int i = 0;
       port != 0 && i < 600 && RunCommand(client + " health", &ignored, "/dev/null") != 0; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  std::vector<std::vector<double>> rows;
  for (const auto& cube : cubes) {
    if (port == 0) break;
    std::string out;
    const int rc = RunCommand(client + " predict --json --npy " + cube, &out, dir / "client.err");
    EXPECT_EQ(rc, 0) << ReadFileText(dir / "client.err");
    if (rc != 0) break;
    std::vector<double> values;
    const json j = json::parse(out);
    for (const auto& o : spec.outputs) values.push_back(j["parameters"][o.name].get<double>());
    if (j.contains("covariance") && !j["covariance"].is_null())
      for (const auto& row : j["covariance"])
        for (const auto& v : row) values.push_back(v.get<double>());
    rows.push_back(values);
  }
  kill(server, SIGTERM);
  EXPECT_EQ(WaitExit(server, std::chrono::seconds(30)), 0) << ReadFileText(dir / "server.log");
  EXPECT_EQ(rows.size(), cubes.size())
      << "server on port " << port << ": " << ReadFileText(dir / "server.log");
  return rows;
}

std::string Joined(const std::vector<std::string>& paths) {
  std::string s;
  for (const auto& p : paths) s += " " + p;
  return s;
}

// Rows of [{"cube": ..., "parameters": [...] or {name: value}, "covariance": [[...], ...]}] in the
// order of the spec's outputs, the covariance (if any) after the values.
std::vector<std::vector<double>> ParseRows(const std::string& text, const ModelSpec& spec) {
  std::vector<std::vector<double>> rows;
  for (const auto& r : json::parse(text)) {
    std::vector<double> values;
    for (size_t i = 0; i < spec.outputs.size(); ++i) {
      const auto& p = r["parameters"];
      values.push_back(p.is_array() ? p[i].get<double>() : p[spec.outputs[i].name].get<double>());
    }
    if (r.contains("covariance"))
      for (const auto& row : r["covariance"])
        for (const auto& v : row) values.push_back(v.get<double>());
    rows.push_back(values);
  }
  return rows;
}

// Values relative to themselves; a covariance entry relative to sqrt(C_ii C_jj), the size of the
// entries of its row and column (an off-diagonal entry may be near zero).
void ExpectClose(const std::vector<std::vector<double>>& got,
                 const std::vector<std::vector<double>>& want, size_t p, const std::string& what) {
  ASSERT_EQ(got.size(), want.size()) << what;
  double worst = 0;
  for (size_t i = 0; i < want.size(); ++i) {
    ASSERT_EQ(got[i].size(), want[i].size()) << what << " (covariance present in one only?)";
    for (size_t j = 0; j < want[i].size(); ++j) {
      double scale = std::abs(want[i][j]);
      if (j >= p) {
        const size_t r = (j - p) / p, c = (j - p) % p;
        scale = std::sqrt(want[i][p + r * p + r] * want[i][p + c * p + c]);
      }
      const double rel = std::abs(got[i][j] - want[i][j]) / scale;
      worst = std::max(worst, rel);
      EXPECT_LE(rel, kRelTol) << what << " cube " << i << " entry " << j << ": " << got[i][j]
                              << " vs server " << want[i][j];
    }
  }
  std::printf("%s: worst relative difference to the server %.3g (tolerance %.0e)\n", what.c_str(),
              worst, kRelTol);
}

// The cubes must give different answers (by far more than the tolerance), else the comparison
// would pass for a model that ignores its input.
void ExpectInputMatters(const std::vector<std::vector<double>>& rows) {
  double spread = 0;
  for (size_t i = 1; i < rows.size(); ++i)
    for (size_t j = 0; j < rows[i].size(); ++j)
      spread = std::max(spread, std::abs(rows[i][j] - rows[0][j]) / std::abs(rows[0][j]));
  EXPECT_GT(spread, 100 * kRelTol) << "the predictions hardly depend on the cube";
}

// Export `ckpt`, then compare PyTorch and ONNX Runtime with the server on a few cubes.
void CheckExportMatchesServer(const Checkpoint& ckpt, bool float_cubes) {
  TempDir dir("export");
  const std::string path = dir / "ckpt.h5";
  ASSERT_TRUE(WriteCheckpoint(path, ckpt).ok());
  const auto cubes = WriteCubes(ckpt.spec, dir, 3, float_cubes);
  const auto server = ServerPredictions(path, ckpt.spec, cubes, dir);
  ASSERT_EQ(server.size(), cubes.size());
  ExpectInputMatters(server);

  std::string out;
  ASSERT_EQ(RunCommand(kBin + "/export/cosmoflow-export --checkpoint " + path + " --out " +
                           (dir / "exported"),
                       &out, dir / "export.err"),
            0)
      << ReadFileText(dir / "export.err");
  const std::string model = dir / "exported/model";
  ASSERT_EQ(
      RunCommand(
          "/usr/bin/python3 -c 'import onnx, sys; onnx.checker.check_model(onnx.load(sys.argv[1]), "
          "full_check=True)' " +
              model + ".onnx",
          &out, dir / "checker.err"),
      0)
      << ReadFileText(dir / "checker.err");

  std::string torch_out;
  ASSERT_EQ(RunCommand("/usr/bin/python3 " + model + ".py" + Joined(cubes), &torch_out,
                       dir / "torch.err"),
            0)
      << ReadFileText(dir / "torch.err");
  const size_t p = ckpt.spec.outputs.size();
  if (ckpt.spec.uncertainty != UncertaintyHead::kNone) {
    ASSERT_EQ(server[0].size(), p + p * p) << "the server gave no covariance";
  }
  ExpectClose(ParseRows(torch_out, ckpt.spec), server, p, ckpt.spec.name + " PyTorch");

  if (!std::filesystem::exists(OrtNodeDir() + "/node_modules/onnxruntime-node")) {
    GTEST_SKIP() << "onnxruntime-node is not in " << OrtNodeDir()
                 << " (deploy/install-deps.sh installs it)";
  }
  std::string ort_out;
  ASSERT_EQ(RunCommand("node " + kSrc + "/tests/export/run_onnx.js " + OrtNodeDir() + " " + model +
                           ".onnx" + Joined(cubes),
                       &ort_out, dir / "ort.err"),
            0)
      << ReadFileText(dir / "ort.err");
  ExpectClose(ParseRows(ort_out, ckpt.spec), server, p, ckpt.spec.name + " ONNX Runtime");
}

ModelSpec Spec(const char* json_text) {
  auto spec = ModelSpec::FromJson(json_text);
  EXPECT_TRUE(spec.ok()) << spec.status().ToString();
  return *spec;
}

TEST(ExportTest, Tiny32Log1pMatchesServer) {
  auto spec = BuiltinSpec("tiny32");
  ASSERT_TRUE(spec.ok());
  CheckExportMatchesServer(MakeCheckpoint(*spec, 11), false);
}

TEST(ExportTest, BatchNormSamePaddingDivideByMeanMatchesServer) {
  CheckExportMatchesServer(MakeCheckpoint(Spec(kBatchNormSpec), 12), false);
}

TEST(ExportTest, OverdensityFourChannelsMatchesServer) {
  CheckExportMatchesServer(MakeCheckpoint(Spec(kOverdensitySpec), 13), false);
}

TEST(ExportTest, NoTransformFloatCubesMatchesServer) {
  CheckExportMatchesServer(MakeCheckpoint(Spec(kNoTransformSpec), 14), true);
}

// The posterior as served: the head decoded, sigma times the calibration factors, de-normalised.
TEST(ExportTest, FullCovarianceHeadWithCalibrationMatchesServer) {
  Checkpoint ckpt = MakeCheckpoint(Spec(kFullCovSpec), 15);
  ckpt.calibration.sigma_scale = {1.5, 0.8, 1.1};
  ckpt.calibration.samples = 100;
  CheckExportMatchesServer(ckpt, false);
}

// A power calibration: each sample's factor depends on its own sigma (a format-3 checkpoint).
TEST(ExportTest, FullCovarianceHeadWithPowerCalibrationMatchesServer) {
  Checkpoint ckpt = MakeCheckpoint(Spec(kFullCovSpec), 17);
  ckpt.calibration.sigma_scale = {1.2, 0.9, 1.0};
  ckpt.calibration.sigma_exponent = {0.6, 1.4, 1.0};
  ckpt.calibration.sigma_reference = {0.5, 2.0, 1.0};
  ckpt.calibration.samples = 100;
  CheckExportMatchesServer(ckpt, false);
}

// An edge term: each sample's factor depends on where its mean lies in the prior (a format-4
// checkpoint); without an exponent, so the plan's exponent of 1 is exercised too. The narrow prior
// puts the random network's means at varied places, some beyond the clamp.
TEST(ExportTest, FullCovarianceHeadWithEdgeCalibrationMatchesServer) {
  Checkpoint ckpt = MakeCheckpoint(Spec(kFullCovSpec), 18);
  ckpt.calibration.sigma_scale = {1.2, 0.9, 1.0};
  ckpt.calibration.sigma_edge = {0.5, -0.3, 0.2};
  for (const OutputSpec& o : ckpt.spec.outputs) {
    ckpt.calibration.prior_low.push_back(o.offset - 0.05 * std::abs(o.scale));
    ckpt.calibration.prior_high.push_back(o.offset + 0.05 * std::abs(o.scale));
  }
  ckpt.calibration.samples = 100;
  CheckExportMatchesServer(ckpt, false);
}

TEST(ExportTest, DiagonalHeadFourOutputsMatchesServer) {
  CheckExportMatchesServer(MakeCheckpoint(Spec(kDiagonalSpec), 16), false);
}

// The files in `dir` (none when it does not exist).
std::vector<std::string> Listing(const std::string& dir) {
  std::vector<std::string> names;
  std::error_code ec;
  for (const auto& e : std::filesystem::directory_iterator(dir, ec))
    names.push_back(e.path().filename());
  return names;
}

// Exit status 1, exactly one line on stderr naming the problem, and no file in the output
// directory.
void ExpectRefused(const std::string& checkpoint, const std::string& message, const TempDir& dir) {
  std::string out;
  EXPECT_EQ(RunCommand(kBin + "/export/cosmoflow-export --checkpoint " + checkpoint + " --out " +
                           (dir / "out"),
                       &out, dir / "err"),
            1);
  const std::string err = ReadFileText(dir / "err");
  EXPECT_EQ(err.rfind("cosmoflow-export: error: ", 0), 0u) << err;
  EXPECT_NE(err.find(message), std::string::npos) << err;
  EXPECT_EQ(std::count(err.begin(), err.end(), '\n'), 1) << err;
  EXPECT_TRUE(Listing(dir / "out").empty());
}

TEST(ExportTest, CorruptCheckpointIsRefused) {
  TempDir dir("export-corrupt");
  const std::string path = dir / "ckpt.h5";
  const Checkpoint ckpt = MakeCheckpoint(Spec(kNoTransformSpec), 3);
  ASSERT_TRUE(WriteCheckpoint(path, ckpt).ok());
  // Flip one bit inside the last dense layer's bias (random values: their bytes occur once).
  const auto& bias = ckpt.weights.back().data;
  std::string bytes = ReadAll(path);
  const size_t at = bytes.find(
      std::string(reinterpret_cast<const char*>(bias.data()), bias.size() * sizeof(float)));
  ASSERT_NE(at, std::string::npos);
  bytes[at + 1] ^= 0x40;
  WriteAll(path, bytes);
  ExpectRefused(path, "checksum mismatch", dir);
}

TEST(ExportTest, SpecFieldTheExporterDoesNotKnowIsRefused) {
  TempDir dir("export-unknown");
  ASSERT_TRUE(WriteCheckpoint(dir / "ckpt.h5", MakeCheckpoint(Spec(kNoTransformSpec), 4)).ok());
  std::string out;
  ASSERT_EQ(RunCommand("/usr/bin/python3 " + kSrc + "/tests/export/add_spec_field.py " + kSrc +
                           "/export " + (dir / "ckpt.h5") + " mixture '\"student_t\"'",
                       &out, dir / "py.err"),
            0)
      << ReadFileText(dir / "py.err");
  ExpectRefused(dir / "ckpt.h5", "field 'mixture' is not supported", dir);
}

TEST(ExportTest, EnsembleDirectoryIsRefusedNamingItsMembers) {
  TempDir dir("export-ensemble");
  std::filesystem::create_directories(dir / "run");
  WriteAll(dir / "run/ensemble.json", R"({"format": "cosmoflow-ensemble", "format_version": 1})");
  ExpectRefused(dir / "run", "members/m<k>/checkpoints", dir);
}

TEST(ExportTest, MissingCheckpointIsRefused) {
  TempDir dir("export-missing");
  ExpectRefused(dir / "nope.h5", "no such file or directory", dir);
}

}  // namespace
}  // namespace cosmoflow::testing
