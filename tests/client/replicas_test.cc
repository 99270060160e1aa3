// Replicated serving from the client side (client/channel.h): three cosmoflow-server processes on
// loopback behind one "ipv4:" target. Calls spread over every replica; a replica kill -9'd under
// load, and one drained with SIGTERM under load, lose no call (round_robin drops it, UNAVAILABLE
// is retried elsewhere); the CLI takes the same target.
#include "client/channel.h"

#include <gtest/gtest.h>
#include <signal.h>
#include <unistd.h>

#include <atomic>
#include <cstring>
#include <fstream>
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
  std::string ip;
};

// Where a replica runs: argv prefix (empty on this host; `ip netns exec NS ...` on a test host)
// and the address it listens on.
struct Host {
  std::vector<std::string> prefix;
  std::string ip = "127.0.0.1";
};

class ReplicasTest : public ::testing::Test {
 protected:
  void SetUp() override { StartReplicas({Host{}, Host{}, Host{}}); }

  void StartReplicas(const std::vector<Host>& hosts) {
    const std::string ckpt = WriteTinyCheckpoint(dir_ / "model.h5", 3);
    for (size_t i = 0; i < hosts.size(); ++i) {
      const std::string n = std::to_string(i);
      std::vector<std::string> argv = hosts[i].prefix;
      for (const std::string& a :
           {kBin + "/server/cosmoflow-server", std::string("--checkpoint"), ckpt,
            std::string("--address"), hosts[i].ip + ":0", std::string("--port-file"),
            std::string(dir_ / ("port" + n)), std::string("--metrics-address"),
            hosts[i].ip + ":0", std::string("--metrics-port-file"), std::string(dir_ / ("mport" + n)),
            std::string("--drain-timeout-s"), std::string("5"), std::string("--watch-interval-ms"),
            std::string("0")})
        argv.push_back(a);
      Replica r;
      r.ip = hosts[i].ip;
      r.pid = Spawn(argv, dir_ / ("server" + n + ".log"));
      r.port = ReadPortFile(dir_ / ("port" + n), std::chrono::seconds(60));
      r.metrics_port = ReadPortFile(dir_ / ("mport" + n), std::chrono::seconds(60));
      ASSERT_GT(r.port, 0) << ReadFileText(dir_ / ("server" + n + ".log"));
      replicas_.push_back(r);
      target_ += (i ? "," : "ipv4:") + r.ip + ":" + std::to_string(r.port);
    }
    for (const Replica& r : replicas_)  // each one SERVING (model loaded) before the test starts
      for (int k = 0; k < 600 && Health(r.port, "", r.ip) != grpc::health::v1::HealthCheckResponse::SERVING; ++k)
        std::this_thread::sleep_for(std::chrono::milliseconds(50));
    grpc::ChannelArguments args;
    args.SetMaxReceiveMessageSize(64 << 20);
    args.SetMaxSendMessageSize(64 << 20);
    // Pings every second: a replica behind a cut link is found within ~2 s.
    stub_ = v1::CosmoFlow::NewStub(MakeClientChannel(target_, grpc::InsecureChannelCredentials(),
                                                     args, std::chrono::seconds(1)));
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
    return MetricValue(HttpGet(r.metrics_port, "/metrics", r.ip), "cosmoflow_requests_total",
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

// A port nothing listens on now (for a program that cannot pick its own, like nginx).
int FreePort() {
  int fd = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t len = sizeof addr;
  bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr);
  getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len);
  close(fd);
  return ntohs(addr.sin_port);
}

// deploy/nginx/cosmoflow-grpc.conf in front of the three replicas: one address for the clients,
// calls spread over the replicas, and a replica killed under load loses no call (nginx passes
// refused connections on; the client retries the call that was running on it).
TEST_F(ReplicasTest, ThroughTheNginxProxyCallsSpreadAndAKilledReplicaLosesNoCall) {
  if (std::system("command -v nginx > /dev/null") != 0)
    GTEST_SKIP() << "nginx is not installed (deploy/install-deps.sh installs nginx-light)";
  std::string conf = ReadFileText(std::string(COSMOFLOW_SOURCE_DIR) + "/deploy/nginx/cosmoflow-grpc.conf");
  std::string upstream;
  for (const Replica& r : replicas_)
    upstream += "    server 127.0.0.1:" + std::to_string(r.port) + " max_fails=1 fail_timeout=10s;\n";
  const size_t first = conf.find("    server 127.0.0.1:8501"), last = conf.find("    keepalive");
  ASSERT_NE(first, std::string::npos);
  conf.replace(first, last - first, upstream);
  const int port = FreePort();
  const size_t listen = conf.find("listen 8500");
  ASSERT_NE(listen, std::string::npos);
  conf.replace(listen, 11, "listen 127.0.0.1:" + std::to_string(port));
  const std::string d = dir_.path();
  std::ofstream(d + "/nginx.conf")
      << "daemon off; pid " << d << "/nginx.pid; error_log " << d << "/nginx.err info;\n"
      << "events {}\nhttp {\naccess_log off; client_body_temp_path " << d << "/body;\n"
      << conf << "\n}\n";
  pid_t nginx = Spawn({"/usr/sbin/nginx", "-p", d, "-c", d + "/nginx.conf"}, d + "/nginx.log");
  for (int i = 0; i < 200 && HttpGet(port, "/").empty() &&
                  ReadFileText(d + "/nginx.err").find("start worker") == std::string::npos;
       ++i)
    std::this_thread::sleep_for(std::chrono::milliseconds(25));
  grpc::ChannelArguments args;
  args.SetMaxReceiveMessageSize(64 << 20);
  args.SetMaxSendMessageSize(64 << 20);
  stub_ = v1::CosmoFlow::NewStub(MakeClientChannel("ipv4:127.0.0.1:" + std::to_string(port),
                                                   grpc::InsecureChannelCredentials(), args));
  EXPECT_EQ(FailedCalls(2, 60, [](int) {}), 0) << ReadFileText(d + "/nginx.err");
  for (size_t i = 0; i < replicas_.size(); ++i)
    EXPECT_GE(Predicted(replicas_[i]), 5) << "replica " << i << " got (almost) no calls via nginx";
  t_during_ = 40;
  const int failed = FailedCalls(4, 200, [&](int) {
    kill(replicas_[1].pid, SIGKILL);
    WaitExit(replicas_[1].pid, std::chrono::seconds(10));
    replicas_[1].pid = 0;
  });
  EXPECT_EQ(failed, 0) << ReadFileText(d + "/nginx.err");
  kill(nginx, SIGQUIT);
  EXPECT_EQ(WaitExit(nginx, std::chrono::seconds(20)), 0) << ReadFileText(d + "/nginx.err");
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

// Three test hosts made by the test: network namespaces on a bridge, each with its own hostname
// and address (10.213.N.11-13, used only inside them), one replica on each.
class NamespacedReplicasTest : public ReplicasTest {
 protected:
  void SetUp() override {
    if (geteuid() != 0 || std::system("ip netns list > /dev/null 2>&1") != 0)
      GTEST_SKIP() << "needs root and iproute2 (ip netns) to make test hosts";
    tag_ = std::to_string(getpid() % 100000);
    subnet_ = "10.213." + std::to_string(getpid() % 250 + 1) + ".";
    bridge_ = "cfbr" + tag_;
    made_ = true;
    ASSERT_EQ(Sh("ip link add " + bridge_ + " type bridge && ip addr add " + subnet_ + "1/24 dev " +
                 bridge_ + " && ip link set " + bridge_ + " up"),
              0);
    std::vector<Host> hosts;
    for (int i = 0; i < 3; ++i) {
      const std::string ns = Namespace(i), ip = subnet_ + std::to_string(11 + i);
      ASSERT_EQ(Sh("ip netns add " + ns + " && ip link add " + Veth(i) + " type veth peer name cfp" +
                   tag_ + std::to_string(i) + " && ip link set cfp" + tag_ + std::to_string(i) +
                   " netns " + ns + " && ip link set " + Veth(i) + " master " + bridge_ +
                   " up && ip netns exec " + ns + " ip addr add " + ip + "/24 dev cfp" + tag_ +
                   std::to_string(i) + " && ip netns exec " + ns + " ip link set cfp" + tag_ +
                   std::to_string(i) + " up && ip netns exec " + ns + " ip link set lo up"),
                0);
      hosts.push_back({{"/usr/sbin/ip", "netns", "exec", ns, "unshare", "--uts", "/bin/sh", "-c",
                        "hostname h" + std::to_string(i) + " && exec \"$0\" \"$@\""},
                       ip});
    }
    StartReplicas(hosts);
  }
  void TearDown() override {
    ReplicasTest::TearDown();
    if (!made_) return;
    for (int i = 0; i < 3; ++i) Sh("ip netns del " + Namespace(i) + " 2> /dev/null");
    Sh("ip link del " + bridge_ + " 2> /dev/null");
    EXPECT_NE(Sh("ip link show " + bridge_ + " > /dev/null 2>&1"), 0) << "bridge left behind";
  }
  static int Sh(const std::string& cmd) { return std::system(cmd.c_str()); }
  std::string Namespace(int i) const { return "cf" + tag_ + "h" + std::to_string(i); }
  std::string Veth(int i) const { return "cfv" + tag_ + std::to_string(i); }

  std::string tag_, subnet_, bridge_;
  bool made_ = false;
};

TEST_F(NamespacedReplicasTest, CallsSpreadOverTheHosts) {
  EXPECT_EQ(FailedCalls(2, 60, [](int) {}), 0);
  for (size_t i = 0; i < replicas_.size(); ++i)
    EXPECT_GE(Predicted(replicas_[i]), 5) << "host " << i << " got (almost) no calls";
}

// The link of one host goes down under load (no reset reaches the client): its calls time out
// on keepalive and are retried on the other hosts; none is lost.
TEST_F(NamespacedReplicasTest, AHostWhoseLinkIsCutLosesNoCall) {
  t_during_ = 40;
  const auto start = std::chrono::steady_clock::now();
  const int failed = FailedCalls(4, 200, [&](int) { Sh("ip link set " + Veth(1) + " down"); });
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  EXPECT_EQ(failed, 0);
  EXPECT_LT(seconds, 45) << "the cut host held calls for too long";
  EXPECT_GE(Predicted(replicas_[0]) + Predicted(replicas_[2]), 150);
  std::printf("a host cut off after 40 of 200 calls: all answered in %.1f s\n", seconds);
}

}  // namespace
}  // namespace cosmoflow::testing
