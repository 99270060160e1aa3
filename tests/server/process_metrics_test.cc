// server/process_metrics.cc: the process_* families against what the kernel reports otherwise.
#include "server/process_metrics.h"

#include <fcntl.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <chrono>
#include <ctime>
#include <fstream>
#include <map>
#include <string>
#include <vector>

namespace cosmoflow {
namespace {

std::map<std::string, double> Values() {
  std::map<std::string, double> v;
  for (const auto& f : ProcessMetrics().Collect()) {
    EXPECT_EQ(f.metric.size(), 1u) << f.name;
    v[f.name] = f.type == prometheus::MetricType::Counter ? f.metric[0].counter.value
                                                          : f.metric[0].gauge.value;
  }
  return v;
}

// VmRSS of /proc/self/status, in bytes.
double StatusRss() {
  std::ifstream in("/proc/self/status");
  for (std::string key; in >> key;) {
    if (key == "VmRSS:") {
      double kib = 0;
      in >> kib;
      return kib * 1024;
    }
  }
  return -1;
}

TEST(ProcessMetricsTest, ReportsMemoryCpuStartTimeAndFds) {
  std::vector<char> touched(64 << 20, 1);  // 64 MiB resident
  auto before = Values();
  ASSERT_EQ(before.size(), 5u);
  const double rss = StatusRss();
  EXPECT_NEAR(before["process_resident_memory_bytes"], rss, 0.1 * rss);
  EXPECT_GT(before["process_resident_memory_bytes"], 64 << 20);
  EXPECT_GE(before["process_virtual_memory_bytes"], before["process_resident_memory_bytes"]);
  const double now = double(std::time(nullptr));
  EXPECT_LE(before["process_start_time_seconds"], now + 1);
  EXPECT_GT(before["process_start_time_seconds"], now - 3600);

  // Burn 0.3 s of this process's CPU time (measured by the clock, not by wall time: the cores are
  // shared), then the counter must have moved by as much, within the kernel's 10 ms ticks.
  const auto cpu_now = [] {
    timespec t{};
    clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &t);
    return double(t.tv_sec) + 1e-9 * double(t.tv_nsec);
  };
  const double cpu_start = cpu_now();
  volatile double x = 0;
  while (cpu_now() - cpu_start < 0.3) x = x + 1;
  const double burnt = cpu_now() - cpu_start;
  const int fd = ::open("/proc/self/stat", O_RDONLY);
  auto after = Values();
  ::close(fd);
  EXPECT_NEAR(after["process_cpu_seconds_total"] - before["process_cpu_seconds_total"], burnt,
              0.05);
  EXPECT_EQ(after["process_open_fds"], before["process_open_fds"] + 1);
  EXPECT_EQ(touched[12345], 1);
}

}  // namespace
}  // namespace cosmoflow
