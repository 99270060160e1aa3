// cosmoflow-client (the CLI) and the Python client example against a real server on loopback:
// the engine's numbers for .npy, HDF5 and raw input; one-line errors and exit codes.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include "core/io/dataset.h"
#include "core/io/npy.h"
#include "server/server.h"
#include "tests/server/server_test_util.h"

namespace cosmoflow {
namespace {

using namespace cosmoflow::testing;

const std::string kClient = std::string(COSMOFLOW_BINARY_DIR) + "/client/cosmoflow-client";

struct Result {
  int code;
  std::string out;
  std::string err;
};

class ClientTest : public ::testing::Test {
 protected:
  void SetUp() override {
    checkpoint_ = WriteTinyCheckpoint(dir_ / "a.h5", 1, 3);
    counts_ = RandomCounts(21, kVoxels);
    Cube cube(CubeShape{1, kSide, kSide, kSide}, DType::kInt16);
    std::memcpy(cube.int16_data(), counts_.data(), counts_.size() * 2);
    ASSERT_TRUE(WriteNpy(dir_ / "cube.npy", cube, /*squeeze_single_channel=*/true).ok());
    ServerOptions o;
    o.address = "127.0.0.1:0";
    o.checkpoint = checkpoint_;
    o.watch_interval = std::chrono::milliseconds(0);
    o.max_batch = 8;
    o.max_queue_delay = std::chrono::milliseconds(1);
    o.max_queue = 4;  // small, so the Python stream check shows that its window paces the sender
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

  static std::vector<double> JsonValues(const std::string& text) {
    auto j = nlohmann::json::parse(text);
    std::vector<double> v;
    for (const char* name : {"Omega_M", "sigma_8", "n_s"})
      v.push_back(j["parameters"][name].get<double>());
    return v;
  }

  TempDir dir_;
  std::string checkpoint_;
  std::vector<int16_t> counts_;
  std::unique_ptr<InferenceServer> server_;
  std::string address_;
};

void ExpectNear(const std::vector<double>& got, const std::vector<double>& want) {
  ASSERT_EQ(got.size(), want.size());
  for (size_t i = 0; i < got.size(); ++i)
    EXPECT_NEAR(got[i], want[i], 1e-5 * (1 + std::abs(want[i]))) << i;
}

TEST_F(ClientTest, NpyHdf5AndRawGiveTheEngineNumbers) {
  const auto want = EngineForward(checkpoint_, counts_);
  Result npy = Client("predict --npy " + (dir_ / "cube.npy") + " --json --request-id r1");
  ASSERT_EQ(npy.code, 0) << npy.err;
  ExpectNear(JsonValues(npy.out), want);
  EXPECT_EQ(nlohmann::json::parse(npy.out)["request_id"], "r1");

  // HDF5: a dataset shard with the cube at index 1.
  DatasetInfo info;
  info.shape = {1, kSide, kSide, kSide};
  info.param_names = {"Omega_M", "sigma_8", "n_s"};
  info.param_units = {"", "", ""};
  auto writer = DatasetWriter::Create(dir_ / "shard.h5", info);
  ASSERT_TRUE(writer.ok()) << writer.status().ToString();
  Cube zeros(info.shape, DType::kInt16), cube(info.shape, DType::kInt16);
  std::memcpy(cube.int16_data(), counts_.data(), counts_.size() * 2);
  ASSERT_TRUE((*writer)->Append(zeros, {0.3f, 0.8f, 0.95f}).ok());
  ASSERT_TRUE((*writer)->Append(cube, {0.3f, 0.8f, 0.95f}).ok());
  ASSERT_TRUE((*writer)->Close().ok());
  Result h5 = Client("predict --h5 " + (dir_ / "shard.h5") + " --dataset /cubes --index 1 --json");
  ASSERT_EQ(h5.code, 0) << h5.err;
  EXPECT_EQ(JsonValues(h5.out), JsonValues(npy.out));

  std::ofstream(dir_ / "cube.raw", std::ios::binary)
      .write(reinterpret_cast<const char*>(counts_.data()), std::streamsize(counts_.size() * 2));
  Result raw =
      Client("predict --raw " + (dir_ / "cube.raw") + " --shape 32x32x32 --dtype int16 --json");
  ASSERT_EQ(raw.code, 0) << raw.err;
  EXPECT_EQ(JsonValues(raw.out), JsonValues(npy.out));

  // The table form prints the same numbers (9 significant digits).
  Result table = Client("predict --npy " + (dir_ / "cube.npy"));
  ASSERT_EQ(table.code, 0) << table.err;
  EXPECT_NE(table.out.find("Omega_M"), std::string::npos) << table.out;
  char buf[32];
  std::snprintf(buf, sizeof(buf), "%.9g", JsonValues(npy.out)[1]);
  EXPECT_NE(table.out.find(buf), std::string::npos) << table.out;
}

TEST_F(ClientTest, PythonClientGivesTheSameNumbersAsTheCli) {
  Result cli = Client("predict --npy " + (dir_ / "cube.npy") + " --json");
  ASSERT_EQ(cli.code, 0) << cli.err;
  const std::string src = COSMOFLOW_SOURCE_DIR;
  Result py = Exec("COSMOFLOW_STUBS_DIR=" + (dir_ / "stubs") + " /usr/bin/python3 " + src +
                   "/tests/client/python_client_check.py " + src + "/client/python " + address_ +
                   " " + (dir_ / "cube.npy"));
  ASSERT_EQ(py.code, 0) << py.err;
  EXPECT_EQ(JsonValues(py.out), JsonValues(cli.out));  // the same doubles, bit for bit
  EXPECT_EQ(nlohmann::json::parse(py.out)["model_version"],
            nlohmann::json::parse(cli.out)["model_version"]);

  // The example's own command line, too, as a user runs it: stubs generated into a temporary
  // directory that must be gone afterwards (TMPDIR points at an empty one to check).
  std::filesystem::create_directories(dir_ / "tmp");
  Result main = Exec("TMPDIR=" + (dir_ / "tmp") + " /usr/bin/python3 " + src +
                     "/client/python/cosmoflow_client.py --address " + address_ + " --npy " +
                     (dir_ / "cube.npy") + " --json");
  ASSERT_EQ(main.code, 0) << main.err;
  EXPECT_EQ(JsonValues(main.out), JsonValues(cli.out));
  EXPECT_TRUE(std::filesystem::is_empty(dir_ / "tmp")) << "the client left its stubs behind";
}

// The Open Inference Protocol (KServe v2 / Triton) from Python, sending what tritonclient sends,
// gives cosmoflow-client's numbers as float32 (the protocol's output datatype).
TEST_F(ClientTest, KServeProtocolClientGivesTheSameNumbersAsTheCli) {
  Result cli = Client("predict --npy " + (dir_ / "cube.npy") + " --json");
  ASSERT_EQ(cli.code, 0) << cli.err;
  const std::string src = COSMOFLOW_SOURCE_DIR;
  Result py = Exec("COSMOFLOW_STUBS_DIR=" + (dir_ / "stubs") + " /usr/bin/python3 " + src +
                   "/client/python/kserve_client.py --address " + address_ + " --npy " +
                   (dir_ / "cube.npy"));
  ASSERT_EQ(py.code, 0) << py.err;
  const std::vector<double> got = JsonValues(py.out), want = JsonValues(cli.out);
  for (size_t i = 0; i < want.size(); ++i) EXPECT_EQ(got[i], double(float(want[i]))) << i;
  EXPECT_EQ(nlohmann::json::parse(py.out)["model_version"],
            nlohmann::json::parse(cli.out)["model_version"]);
  EXPECT_FALSE(nlohmann::json::parse(py.out).contains("sigma"));  // the model has no uncertainty

  // A cube of the wrong side: exit 1 with the server's status on one line.
  Result bad = Exec("/usr/bin/python3 -c \"import numpy; numpy.save('" + (dir_ / "small.npy") +
                    "', numpy.zeros((1, 8, 8, 8), numpy.int16))\" && COSMOFLOW_STUBS_DIR=" +
                    (dir_ / "stubs") + " /usr/bin/python3 " + src +
                    "/client/python/kserve_client.py --address " + address_ + " --npy " +
                    (dir_ / "small.npy"));
  EXPECT_EQ(bad.code, 1) << bad.out;
  EXPECT_NE(bad.err.find("INVALID_ARGUMENT"), std::string::npos) << bad.err;
}

TEST_F(ClientTest, InfoAndHealth) {
  Result info = Client("info --json");
  ASSERT_EQ(info.code, 0) << info.err;
  auto j = nlohmann::json::parse(info.out);
  EXPECT_EQ(j["version"], server_->model()->version());
  EXPECT_EQ(j["input_shape"], nlohmann::json::array({1, 32, 32, 32}));
  Result text = Client("info");
  ASSERT_EQ(text.code, 0);
  EXPECT_NE(text.out.find(server_->model()->version()), std::string::npos) << text.out;
  Result health = Client("health");
  EXPECT_EQ(health.code, 0) << health.err;
  EXPECT_EQ(health.out, "SERVING\n");
  server_->Shutdown(std::chrono::milliseconds(0));
  Result down = Client("health --timeout 2");
  EXPECT_EQ(down.code, 4) << down.out << down.err;
}

TEST_F(ClientTest, ErrorsAreOneLineWithDistinctExitCodes) {
  auto one_line = [](const Result& r) {
    EXPECT_EQ(r.err.find("cosmoflow-client: error: "), 0u) << r.err;
    EXPECT_EQ(std::count(r.err.begin(), r.err.end(), '\n'), 1) << r.err;
  };
  Result r = Client("predict --npy " + (dir_ / "missing.npy"));
  EXPECT_EQ(r.code, 3);
  one_line(r);
  EXPECT_NE(r.err.find("missing.npy"), std::string::npos);

  std::ofstream(dir_ / "short.raw") << "abc";
  r = Client("predict --raw " + (dir_ / "short.raw") + " --shape 32x32x32 --dtype int16");
  EXPECT_EQ(r.code, 3);
  one_line(r);

  // A well-formed cube the model does not take: the server's reason, exit 5.
  std::vector<int16_t> small(16 * 16 * 16, 1);
  std::ofstream(dir_ / "small.raw", std::ios::binary)
      .write(reinterpret_cast<const char*>(small.data()), std::streamsize(small.size() * 2));
  r = Client("predict --raw " + (dir_ / "small.raw") + " --shape 16x16x16 --dtype int16");
  EXPECT_EQ(r.code, 5);
  one_line(r);
  EXPECT_NE(r.err.find("INVALID_ARGUMENT: request.cube.shape"), std::string::npos) << r.err;

  r = Client("predict --model-version nope --npy " + (dir_ / "cube.npy"));
  EXPECT_EQ(r.code, 5);
  EXPECT_NE(r.err.find("FAILED_PRECONDITION"), std::string::npos) << r.err;

  r = Client("predict --bogus");
  EXPECT_EQ(r.code, 2);
  one_line(r);
  r = Client("launch");
  EXPECT_EQ(r.code, 2);
  r = Client("predict");
  EXPECT_EQ(r.code, 2);
  r = Client("predict --raw x --shape 0x3 --dtype int16");
  EXPECT_EQ(r.code, 2);

  r = Exec(kClient + " --address 127.0.0.1:1 --timeout 2 predict --npy " + (dir_ / "cube.npy"));
  EXPECT_EQ(r.code, 4);
  one_line(r);
}

TEST_F(ClientTest, ReloadSendsTheAdminToken) {
  // The fixture's server has admin calls off.
  Result r = Client("reload");
  EXPECT_EQ(r.code, 5) << r.err;
  EXPECT_NE(r.err.find("UNIMPLEMENTED"), std::string::npos) << r.err;
  ServerOptions o;
  o.address = "127.0.0.1:0";
  o.checkpoint = checkpoint_;
  o.watch_interval = std::chrono::milliseconds(0);
  o.admin.enabled = true;
  o.admin.token_file = dir_ / "token";
  WriteAdminToken(o.admin.token_file);
  auto admin = InferenceServer::Start(o);
  ASSERT_TRUE(admin.ok()) << admin.status().ToString();
  ASSERT_TRUE((*admin)->LoadInitialModel().ok());
  WriteTinyCheckpoint(dir_ / "b.h5", 2, 7);
  const std::string call =
      kClient + " --address 127.0.0.1:" + std::to_string((*admin)->port()) + " reload ";
  r = Exec(call + "--checkpoint-path b.h5");
  EXPECT_EQ(r.code, 5);
  EXPECT_NE(r.err.find("UNAUTHENTICATED"), std::string::npos) << r.err;
  WriteAdminToken(dir_ / "wrong", "not-the-admin-token-at-all");
  r = Exec(call + "--checkpoint-path b.h5 --admin-token-file " + (dir_ / "wrong"));
  EXPECT_EQ(r.code, 5);
  EXPECT_NE(r.err.find("PERMISSION_DENIED"), std::string::npos) << r.err;
  r = Exec(call + "--checkpoint-path b.h5 --admin-token-file " + (dir_ / "missing"));
  EXPECT_EQ(r.code, 3) << r.err;
  r = Exec(call + "--checkpoint-path b.h5 --json --admin-token-file " + (dir_ / "token"));
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_EQ(nlohmann::json::parse(r.out)["step"].get<int64_t>(), 7) << r.out;
  EXPECT_EQ((*admin)->model()->checkpoint().state.step, 7);
}

TEST_F(ClientTest, DeadlineExitCode) {
  // A second server whose batches wait 2 s to fill: a 0.3 s timeout expires.
  ServerOptions o;
  o.address = "127.0.0.1:0";
  o.checkpoint = checkpoint_;
  o.watch_interval = std::chrono::milliseconds(0);
  o.max_batch = 8;
  o.max_queue_delay = std::chrono::seconds(2);
  o.adaptive_batching = false;  // the lone request waits out the delay
  auto slow = InferenceServer::Start(o);
  ASSERT_TRUE(slow.ok());
  ASSERT_TRUE((*slow)->LoadInitialModel().ok());
  Result r = Exec(kClient + " --address 127.0.0.1:" + std::to_string((*slow)->port()) +
                  " --timeout 0.3 predict --npy " + (dir_ / "cube.npy"));
  EXPECT_EQ(r.code, 6) << r.err;
  EXPECT_NE(r.err.find("DEADLINE_EXCEEDED"), std::string::npos) << r.err;
}

}  // namespace
}  // namespace cosmoflow
