// The cosmoflow-server binary as a subprocess: SIGTERM drains in-flight requests, SIGHUP reloads,
// start-up errors give distinct exit codes and a one-line reason.
#include <gtest/gtest.h>
#include <signal.h>

#include "tests/server/server_test_util.h"

namespace cosmoflow {
namespace {

using namespace cosmoflow::testing;

const std::string kServer = std::string(COSMOFLOW_BINARY_DIR) + "/server/cosmoflow-server";

class ServerProcessTest : public ::testing::Test {
 protected:
  void SetUp() override { checkpoint_ = WriteTinyCheckpoint(dir_ / "model.h5", 1, 5); }

  // Starts the binary; returns the gRPC port once health says SERVING.
  int Launch(std::vector<std::string> extra) {
    std::vector<std::string> argv = {kServer,     "--checkpoint", checkpoint_,
                                     "--address", "127.0.0.1:0",  "--metrics-address",
                                     "",          "--port-file",  dir_ / "port"};
    argv.insert(argv.end(), extra.begin(), extra.end());
    pid_ = Spawn(argv, dir_ / "server.log");
    int port = ReadPortFile(dir_ / "port", std::chrono::seconds(20));
    EXPECT_GT(port, 0) << ReadFileText(dir_ / "server.log");
    auto until = std::chrono::steady_clock::now() + std::chrono::seconds(20);
    while (Health(port) != grpc::health::v1::HealthCheckResponse::SERVING &&
           std::chrono::steady_clock::now() < until)
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    return port;
  }
  void TearDown() override {
    if (pid_ > 0 && kill(pid_, 0) == 0) {
      kill(pid_, SIGKILL);
      WaitExit(pid_, std::chrono::seconds(5));
    }
  }

  TempDir dir_;
  std::string checkpoint_;
  pid_t pid_ = -1;
};

TEST_F(ServerProcessTest, SigtermDrainsInFlightRequests) {
  // Batches wait up to 400 ms to fill, so requests are surely in flight when SIGTERM arrives.
  int port = Launch({"--max-batch", "16", "--max-queue-delay-ms", "400", "--fixed-batch-wait"});
  ASSERT_GT(port, 0);
  auto stub = v1::CosmoFlow::NewStub(LoopbackChannel(port));
  const int n = 8;
  std::vector<grpc::Status> statuses(n);
  std::vector<v1::PredictResponse> responses(n);
  std::vector<std::thread> clients;
  auto request = MakeInt16Request(RandomCounts(3, kVoxels));
  for (int i = 0; i < n; ++i)
    clients.emplace_back([&, i] {
      auto ctx = ContextWithDeadline(20);
      statuses[i] = stub->Predict(ctx.get(), request, &responses[i]);
    });
  std::this_thread::sleep_for(std::chrono::milliseconds(150));
  ASSERT_EQ(kill(pid_, SIGTERM), 0);
  for (auto& t : clients) t.join();
  for (int i = 0; i < n; ++i) {
    EXPECT_TRUE(statuses[i].ok()) << i << ": " << statuses[i].error_message();
    EXPECT_EQ(responses[i].parameters_size(), 3);
  }
  EXPECT_EQ(WaitExit(pid_, std::chrono::seconds(20)), 0) << ReadFileText(dir_ / "server.log");
  pid_ = -1;
  EXPECT_NE(ReadFileText(dir_ / "server.log").find("draining"), std::string::npos);
  // Nothing listens any more.
  v1::PredictResponse resp;
  auto ctx = ContextWithDeadline(2);
  EXPECT_FALSE(stub->Predict(ctx.get(), request, &resp).ok());
}

TEST_F(ServerProcessTest, SighupReloadsTheCheckpoint) {
  int port = Launch({"--watch-interval-ms", "100"});
  ASSERT_GT(port, 0);
  auto stub = v1::CosmoFlow::NewStub(LoopbackChannel(port));
  auto version = [&] {
    v1::ModelInfo info;
    auto ctx = ContextWithDeadline(5);
    EXPECT_TRUE(stub->GetModelInfo(ctx.get(), {}, &info).ok());
    return info.step();
  };
  EXPECT_EQ(version(), 5);
  WriteTinyCheckpoint(checkpoint_, 2, 6);  // atomically replaced under the same name
  ASSERT_EQ(kill(pid_, SIGHUP), 0);
  auto until = std::chrono::steady_clock::now() + std::chrono::seconds(20);
  while (version() != 6 && std::chrono::steady_clock::now() < until)
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  EXPECT_EQ(version(), 6) << ReadFileText(dir_ / "server.log");
  kill(pid_, SIGTERM);
  EXPECT_EQ(WaitExit(pid_, std::chrono::seconds(20)), 0);
  pid_ = -1;
}

TEST_F(ServerProcessTest, StartUpErrorsHaveDistinctExitCodes) {
  auto run = [&](std::vector<std::string> argv) {
    argv.insert(argv.begin(), kServer);
    pid_t pid = Spawn(argv, dir_ / "err.log");
    return WaitExit(pid, std::chrono::seconds(30));
  };
  EXPECT_EQ(run({"--checkpoint", checkpoint_, "--no-such-flag"}), 2);
  EXPECT_NE(ReadFileText(dir_ / "err.log").find("unknown flag --no-such-flag"), std::string::npos);
  EXPECT_EQ(run({"--address", "127.0.0.1:0"}), 2);
  EXPECT_NE(ReadFileText(dir_ / "err.log").find("--checkpoint is required"), std::string::npos);
  EXPECT_EQ(run({"--checkpoint", checkpoint_, "--max-batch", "many"}), 2);
  // Admin flags that cannot work are usage errors; an unusable token file cannot start.
  EXPECT_EQ(run({"--checkpoint", checkpoint_, "--enable-admin"}), 2);
  EXPECT_NE(ReadFileText(dir_ / "err.log").find("needs a credential"), std::string::npos);
  EXPECT_EQ(run({"--checkpoint", checkpoint_, "--admin-token-file", dir_ / "token"}), 2);
  EXPECT_EQ(run({"--checkpoint", checkpoint_, "--enable-admin", "--admin-client-cert-name", "x"}),
            2);
  WriteAdminToken(dir_ / "short.token", "short");
  EXPECT_EQ(run({"--checkpoint", checkpoint_, "--enable-admin", "--admin-token-file",
                 dir_ / "short.token", "--address", "127.0.0.1:0", "--metrics-address", ""}),
            3);
  EXPECT_NE(ReadFileText(dir_ / "err.log").find("fewer than 16"), std::string::npos)
      << ReadFileText(dir_ / "err.log");
  EXPECT_EQ(run({"--checkpoint", checkpoint_, "--address", "256.1.1.1:1", "--metrics-address", ""}),
            3);
  EXPECT_NE(ReadFileText(dir_ / "err.log").find("cannot listen"), std::string::npos)
      << ReadFileText(dir_ / "err.log");
  std::ofstream(dir_ / "bad.h5") << "not a checkpoint";
  EXPECT_EQ(
      run({"--checkpoint", dir_ / "bad.h5", "--address", "127.0.0.1:0", "--metrics-address", ""}),
      4);
  EXPECT_NE(ReadFileText(dir_ / "err.log").find(dir_ / "bad.h5"), std::string::npos)
      << ReadFileText(dir_ / "err.log");
  EXPECT_EQ(run({"--checkpoint", dir_ / "empty-dir-does-not-exist", "--address", "127.0.0.1:0",
                 "--metrics-address", ""}),
            4);
}

}  // namespace
}  // namespace cosmoflow
