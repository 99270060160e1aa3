// Replicated serving from the client side (client/channel.h): three cosmoflow-server processes on
// loopback behind one "ipv4:" target. Calls spread over every replica; a replica kill -9'd under
// load, and one drained with SIGTERM under load, lose no call (round_robin drops it, UNAVAILABLE
// is retried elsewhere); the CLI takes the same target.
#include "client/channel.h"

#include <gtest/gtest.h>
#include <signal.h>

#include <atomic>
#include <cstring>
#include <functional>
#include <nlohmann/json.hpp>
#include <thread>

#include "core/io/npy.h"
#include "proto/cosmoflow.grpc.pb.h"
#include "tests/server/server_test_util.h"

namespace cosmoflow::testing {
namespace {

const std::string kBin = COSMOFLOW_BINARY_DIR;

struct Replica {
  pid_t pid = 0;
  int port = 0, metrics_port = 0;
};

class ReplicasTest : public ::testing::Test {
 protected:
  void SetUp() override {
    const std::string ckpt = WriteTinyCheckpoint(dir_ / "model.h5", 3);
    for (int i = 0; i < 3; ++i) {
      const std::string n = std::to_string(i);
      Replica r;
      r.pid = Spawn({kBin + "/server/cosmoflow-server", "--checkpoint", ckpt, "--address",
                     "127.0.0.1:0", "--port-file", dir_ / ("port" + n), "--metrics-address",
                     "127.0.0.1:0", "--metrics-port-file", dir_ / ("mport" + n),
                     "--drain-timeout-s", "5", "--watch-interval-ms", "0"},
                    dir_ / ("server" + n + ".log"));
      r.port = ReadPortFile(dir_ / ("port" + n), std::chrono::seconds(60));
      r.metrics_port = ReadPortFile(dir_ / ("mport" + n), std::chrono::seconds(60));
      ASSERT_GT(r.port, 0) << ReadFileText(dir_ / ("server" + n + ".log"));
      replicas_.push_back(r);
      target_ += (i ? "," : "ipv4:") + std::string("127.0.0.1:") + std::to_string(r.port);
    }
    for (const Replica& r : replicas_)  // each one SERVING (model loaded) before the test starts
      for (int k = 0; k < 600 && Health(r.port) != grpc::health::v1::HealthCheckResponse::SERVING; ++k)
        std::this_thread::sleep_for(std::chrono::milliseconds(50));
    grpc::ChannelArguments args;
    args.SetMaxReceiveMessageSize(64 << 20);
    args.SetMaxSendMessageSize(64 << 20);
    stub_ = v1::CosmoFlow::NewStub(MakeClientChannel(target_, grpc::InsecureChannelCredentials(), args));
    request_ = MakeInt16Request(RandomCounts(9, kVoxels));
  }
  void TearDown() override {
    for (const Replica& r : replicas_)
      if (r.pid > 0) {
        kill(r.pid, SIGKILL);
        WaitExit(r.pid, std::chrono::seconds(10));
      }
  }

  double Predicted(const Replica& r) {
    return MetricValue(HttpGet(r.metrics_port, "/metrics"), "cosmoflow_requests_total",
                       "code=\"OK\",method=\"Predict\"");
  }

  // `threads` clients making `calls` Predict calls in all; `during(k)` runs after the k-th call.
  int FailedCalls(int threads, int calls, const std::function<void(int)>& during) {
    std::atomic<int> next{0}, failed{0};
    std::vector<std::thread> clients;
    for (int t = 0; t < threads; ++t)
      clients.emplace_back([&] {
        for (int k; (k = next.fetch_add(1)) < calls;) {
          v1::PredictResponse resp;
          auto ctx = ContextWithDeadline(60);
          grpc::Status s = stub_->Predict(ctx.get(), request_, &resp);
          if (!s.ok()) {
            ++failed;
            std::fprintf(stderr, "call %d: %s\n", k, s.error_message().c_str());
          }
          if (t_during_ == k) during(k);
        }
      });
    for (auto& c : clients) c.join();
    return failed.load();
  }

  TempDir dir_{"replicas"};
  std::vector<Replica> replicas_;
  std::string target_;
  std::unique_ptr<v1::CosmoFlow::Stub> stub_;
  v1::PredictRequest request_;
  int t_during_ = -1;
};

TEST_F(ReplicasTest, CallsSpreadOverEveryReplica) {
  EXPECT_EQ(FailedCalls(2, 60, [](int) {}), 0);
  for (size_t i = 0; i < replicas_.size(); ++i)
    EXPECT_GE(Predicted(replicas_[i]), 5) << "replica " << i << " got (almost) no calls";
}

TEST_F(ReplicasTest, AReplicaKilledUnderLoadLosesNoCall) {
  t_during_ = 40;
  const int failed = FailedCalls(4, 200, [&](int) {
    kill(replicas_[1].pid, SIGKILL);
    WaitExit(replicas_[1].pid, std::chrono::seconds(10));
    replicas_[1].pid = 0;
  });
  EXPECT_EQ(failed, 0);
  EXPECT_GE(Predicted(replicas_[0]) + Predicted(replicas_[2]), 150);
}

TEST_F(ReplicasTest, AReplicaDrainedUnderLoadLosesNoCall) {
  t_during_ = 40;
  const int failed = FailedCalls(4, 200, [&](int) { kill(replicas_[2].pid, SIGTERM); });
  EXPECT_EQ(failed, 0);
  EXPECT_EQ(WaitExit(replicas_[2].pid, std::chrono::seconds(30)), 0);
  replicas_[2].pid = 0;
}

TEST_F(ReplicasTest, TheCliTakesAReplicaTarget) {
  Cube cube(CubeShape{1, kSide, kSide, kSide}, DType::kInt16);
  const auto counts = RandomCounts(9, kVoxels);
  std::memcpy(cube.int16_data(), counts.data(), counts.size() * 2);
  ASSERT_TRUE(WriteNpy(dir_ / "cube.npy", cube).ok());
  const int rc = std::system((kBin + "/client/cosmoflow-client --address " + target_ +
                              " predict --npy " + (dir_ / "cube.npy") + " --json > " +
                              (dir_ / "out.json") + " 2>&1").c_str());
  EXPECT_EQ(rc, 0) << ReadFileText(dir_ / "out.json");
  EXPECT_NE(ReadFileText(dir_ / "out.json").find("\"Omega_M\""), std::string::npos)
      << ReadFileText(dir_ / "out.json");
}

// The Python client carries the same service config and balances over the same target.
TEST_F(ReplicasTest, ThePythonClientBalancesWithTheSameConfig) {
  const std::string src = COSMOFLOW_SOURCE_DIR;
  const std::string script =
      "import json, sys; sys.path.insert(0, '" + src + "/client/python'); "
      "import cosmoflow_client as c; import numpy as np; "
      "print(c.REPLICA_SERVICE_CONFIG); cl = c.CosmoFlowClient(sys.argv[1]); "
      "[cl.predict(np.ones((1, " + std::to_string(kSide) + ",) * 1 + (" + std::to_string(kSide) +
      ",) * 2, np.int16)) for _ in range(30)]";
  const int rc = std::system(("COSMOFLOW_STUBS_DIR=" + (dir_ / "stubs") + " /usr/bin/python3 -c \"" +
                              script + "\" " + target_ + " > " + (dir_ / "py.out") + " 2>&1")
                                 .c_str());
  ASSERT_EQ(rc, 0) << ReadFileText(dir_ / "py.out");
  const std::string out = ReadFileText(dir_ / "py.out");
  EXPECT_EQ(nlohmann::json::parse(out.substr(0, out.find('\n'))),
            nlohmann::json::parse(kReplicaServiceConfig));
  for (size_t i = 0; i < replicas_.size(); ++i)
    EXPECT_GE(Predicted(replicas_[i]), 3) << "replica " << i << " got (almost) no Python calls";
}

}  // namespace
}  // namespace cosmoflow::testing
