// A real Prometheus (Debian's, on loopback) scrapes the server; a query of the request counter
// returns the number of requests made.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include "server/server.h"
#include "tests/server/server_test_util.h"

namespace cosmoflow {
namespace {

using namespace cosmoflow::testing;

int FreePort() {
  int fd = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr));
  socklen_t len = sizeof(addr);
  getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len);
  close(fd);
  return ntohs(addr.sin_port);
}

TEST(PrometheusTest, ScrapedCounterEqualsRequestsMade) {
  if (access("/usr/bin/prometheus", X_OK) != 0)
    GTEST_SKIP() << "/usr/bin/prometheus is not installed";
  TempDir dir;
  ServerOptions o;
  o.address = "127.0.0.1:0";
  o.metrics_address = "127.0.0.1:0";
  o.checkpoint = WriteTinyCheckpoint(dir / "a.h5", 1);
  o.watch_interval = std::chrono::milliseconds(0);
  auto server = InferenceServer::Start(o);
  ASSERT_TRUE(server.ok()) << server.status().ToString();
  ASSERT_TRUE((*server)->LoadInitialModel().ok());

  const int requests = 7;
  auto stub = v1::CosmoFlow::NewStub(LoopbackChannel((*server)->port()));
  for (int i = 0; i < requests; ++i) {
    v1::PredictResponse resp;
    auto ctx = ContextWithDeadline();
    ASSERT_TRUE(stub->Predict(ctx.get(), MakeInt16Request(RandomCounts(i, kVoxels)), &resp).ok());
  }
  {  // and one rejected request, which must be counted under its own code
    v1::PredictResponse resp;
    auto ctx = ContextWithDeadline();
    ASSERT_FALSE(stub->Predict(ctx.get(), v1::PredictRequest(), &resp).ok());
  }

  std::ofstream(dir / "prometheus.yml")
      << "global:\n  scrape_interval: 1s\n  evaluation_interval: 1s\n"
      << "scrape_configs:\n  - job_name: cosmoflow\n    static_configs:\n"
      << "      - targets: ['127.0.0.1:" << (*server)->metrics_port() << "']\n";
  ASSERT_EQ(
      std::system(
          ("promtool check config " + (dir / "prometheus.yml") + " > /dev/null 2>&1").c_str()),
      0);
  const int prom_port = FreePort();
  pid_t prom = Spawn({"/usr/bin/prometheus", "--config.file=" + (dir / "prometheus.yml"),
                      "--storage.tsdb.path=" + (dir / "tsdb"),
                      "--web.listen-address=127.0.0.1:" + std::to_string(prom_port)},
                     dir / "prometheus.log");
  ASSERT_GT(prom, 0);

  auto query = [&](const std::string& encoded) -> double {
    std::string body = HttpGet(prom_port, "/api/v1/query?query=" + encoded);
    auto j = nlohmann::json::parse(body, nullptr, /*allow_exceptions=*/false);
    if (j.is_discarded() || j.value("status", "") != "success") return -1;
    const auto& result = j["data"]["result"];
    if (!result.is_array() || result.empty()) return -1;
    return std::stod(result[0]["value"][1].get<std::string>());
  };
  // sum(cosmoflow_requests_total{method="Predict",code="OK"})
  const std::string ok_query =
      "sum(cosmoflow_requests_total%7Bmethod%3D%22Predict%22%2Ccode%3D%22OK%22%7D)";
  double value = -1;
  auto until = std::chrono::steady_clock::now() + std::chrono::seconds(45);
  while (std::chrono::steady_clock::now() < until) {
    value = query(ok_query);
    if (value >= 0) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(250));
  }
  EXPECT_EQ(value, requests) << ReadFileText(dir / "prometheus.log");
  EXPECT_EQ(query("sum(cosmoflow_requests_total%7Bcode%3D%22INVALID_ARGUMENT%22%7D)"), 1);
  EXPECT_EQ(query("cosmoflow_model_info"), 1);
  kill(prom, SIGTERM);
  EXPECT_EQ(WaitExit(prom, std::chrono::seconds(20)), 0);
}

}  // namespace
}  // namespace cosmoflow
