// deploy/grafana/cosmoflow-server.json: every query of the dashboard (panel targets and the
// instance variable) returns data from a real Prometheus (Debian's, on loopback) scraping a real
// cosmoflow-server on loopback that is answering requests. Grafana's own variables are replaced by
// what Grafana would send: $instance by its "All" value, $__rate_interval by 1m.
#include <gtest/gtest.h>

#include <cmath>
#include <nlohmann/json.hpp>
#include <set>
#include <string>
#include <vector>

#include "tests/server/server_test_util.h"

namespace cosmoflow::testing {
namespace {

using nlohmann::json;

const std::string kDashboard =
    std::string(COSMOFLOW_SOURCE_DIR) + "/deploy/grafana/cosmoflow-server.json";

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

std::string UrlEncode(const std::string& s) {
  std::string out;
  for (unsigned char c : s) {
    if (std::isalnum(c) || c == '-' || c == '_' || c == '.' || c == '~') {
      out += char(c);
    } else {
      char buf[4];
      std::snprintf(buf, sizeof buf, "%%%02X", c);
      out += buf;
    }
  }
  return out;
}

std::string Substitute(std::string expr) {
  for (const auto& [var, value] :
       {std::pair<std::string, std::string>{"$instance", ".*"}, {"$__rate_interval", "1m"}}) {
    for (size_t at; (at = expr.find(var)) != std::string::npos;)
      expr.replace(at, var.size(), value);
  }
  return expr;
}

// Every PromQL expression of the dashboard; label_values(metric, label) becomes the series query
// `metric` (what Grafana's Prometheus data source asks for it).
std::vector<std::string> DashboardQueries(const json& dash) {
  std::vector<std::string> queries;
  for (const auto& panel : dash["panels"])
    for (const auto& target : panel["targets"])
      queries.push_back(target["expr"].get<std::string>());
  for (const auto& var : dash["templating"]["list"]) {
    if (var["type"] != "query") continue;
    const std::string q = var["query"]["query"].get<std::string>();
    const std::string prefix = "label_values(";
    EXPECT_EQ(q.rfind(prefix, 0), 0u) << q;
    queries.push_back(q.substr(prefix.size(), q.find(',') - prefix.size()));
  }
  return queries;
}

// "" when the query returns at least one series with a finite value, else why not.
std::string QueryProblem(int prom_port, const std::string& expr) {
  const std::string body = HttpGet(prom_port, "/api/v1/query?query=" + UrlEncode(Substitute(expr)));
  const json j = json::parse(body, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded() || j.value("status", "") != "success") return "query failed: " + body;
  const auto& result = j["data"]["result"];
  if (!result.is_array() || result.empty()) return "no data";
  for (const auto& series : result) {
    const std::string v = series["value"][1].get<std::string>();
    if (v != "NaN" && v != "+Inf" && v != "-Inf") return "";
  }
  return "only NaN/Inf values: " + result.dump();
}

void CheckStructure(const json& dash) {
  bool datasource_var = false;
  for (const auto& var : dash["templating"]["list"])
    datasource_var |=
        var["type"] == "datasource" && var["query"] == "prometheus" && var["name"] == "datasource";
  EXPECT_TRUE(datasource_var) << "no Prometheus data-source variable named 'datasource'";
  std::set<int> ids;
  for (const auto& panel : dash["panels"]) {
    EXPECT_TRUE(ids.insert(panel["id"].get<int>()).second) << "duplicate panel id " << panel["id"];
    EXPECT_EQ(panel["datasource"]["uid"], "${datasource}") << panel["title"];
    EXPECT_FALSE(panel["targets"].empty()) << panel["title"];
    for (const auto& target : panel["targets"])
      EXPECT_EQ(target["datasource"]["uid"], "${datasource}");
  }
}

class Processes {
 public:
  ~Processes() {
    for (pid_t pid : pids_) {
      kill(pid, SIGTERM);
      WaitExit(pid, std::chrono::seconds(30));
    }
  }
  void Add(pid_t pid) { pids_.push_back(pid); }

 private:
  std::vector<pid_t> pids_;
};

// Predict requests (and one invalid one) every 50 ms for `seconds`.
void SendRequests(int port, double seconds) {
  auto stub = v1::CosmoFlow::NewStub(LoopbackChannel(port));
  const auto until =
      std::chrono::steady_clock::now() + std::chrono::milliseconds(int(seconds * 1000));
  for (int i = 0; std::chrono::steady_clock::now() < until; ++i) {
    v1::PredictResponse resp;
    auto ctx = ContextWithDeadline();
    const bool bad = i % 10 == 9;
    grpc::Status s = stub->Predict(
        ctx.get(), bad ? v1::PredictRequest() : MakeInt16Request(RandomCounts(i, kVoxels)), &resp);
    EXPECT_EQ(s.ok(), !bad) << s.error_message();
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
}

TEST(GrafanaDashboardTest, EveryQueryReturnsDataFromARealServer) {
  if (access("/usr/bin/prometheus", X_OK) != 0)
    GTEST_SKIP() << "/usr/bin/prometheus is not installed";
  std::ifstream in(kDashboard);
  const json dash = json::parse(in, nullptr, /*allow_exceptions=*/false);
  ASSERT_FALSE(dash.is_discarded()) << kDashboard << " is not valid JSON";
  CheckStructure(dash);

  TempDir dir("grafana");
  Processes procs;
  procs.Add(Spawn({std::string(COSMOFLOW_BINARY_DIR) + "/server/cosmoflow-server", "--checkpoint",
                   WriteTinyCheckpoint(dir / "a.h5", 1), "--address", "127.0.0.1:0", "--port-file",
                   dir / "port", "--metrics-address", "127.0.0.1:0", "--metrics-port-file",
                   dir / "metrics_port"},
                  dir / "server.log"));
  const int port = ReadPortFile(dir / "port", std::chrono::seconds(60));
  const int metrics_port = ReadPortFile(dir / "metrics_port", std::chrono::seconds(60));
  ASSERT_GT(port, 0) << ReadFileText(dir / "server.log");
  ASSERT_GT(metrics_port, 0) << ReadFileText(dir / "server.log");
  for (int i = 0; i < 600 && Health(port) != grpc::health::v1::HealthCheckResponse::SERVING; ++i)
    std::this_thread::sleep_for(std::chrono::milliseconds(50));

  std::ofstream(dir / "prometheus.yml")
      << "global:\n  scrape_interval: 1s\n  evaluation_interval: 1s\n"
      << "scrape_configs:\n  - job_name: cosmoflow-server\n    static_configs:\n"
      << "      - targets: ['127.0.0.1:" << metrics_port << "']\n";
  const int prom_port = FreePort();
  procs.Add(Spawn({"/usr/bin/prometheus", "--config.file=" + (dir / "prometheus.yml"),
                   "--storage.tsdb.path=" + (dir / "tsdb"),
                   "--web.listen-address=127.0.0.1:" + std::to_string(prom_port)},
                  dir / "prometheus.log"));
  // Requests until Prometheus has scraped the server, then some more so that every rate() window
  // holds increasing samples.
  for (int i = 0; i < 60 && !QueryProblem(prom_port, "cosmoflow_model_info").empty(); ++i)
    SendRequests(port, 0.5);
  ASSERT_EQ(QueryProblem(prom_port, "cosmoflow_model_info"), "")
      << ReadFileText(dir / "prometheus.log");
  SendRequests(port, 4);

  const auto queries = DashboardQueries(dash);
  EXPECT_GE(queries.size(), 18u);
  for (const auto& expr : queries) EXPECT_EQ(QueryProblem(prom_port, expr), "") << expr;
}

}  // namespace
}  // namespace cosmoflow::testing
