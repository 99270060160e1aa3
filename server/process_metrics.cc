#include "server/process_metrics.h"

#include <dirent.h>
#include <unistd.h>

#include <fstream>
#include <sstream>
#include <string>

namespace cosmoflow {
namespace {

using prometheus::ClientMetric;
using prometheus::MetricFamily;
using prometheus::MetricType;

MetricFamily One(const char* name, const char* help, MetricType type, double value) {
  ClientMetric m;
  if (type == MetricType::Counter)
    m.counter.value = value;
  else
    m.gauge.value = value;
  return MetricFamily{name, help, type, {m}};
}

// Fields 14 (utime), 15 (stime), 22 (starttime, ticks after boot), 23 (vsize, bytes) and 24 (rss,
// pages) of /proc/self/stat; field 2 (the command) may hold spaces, so count after its ')'.
bool ReadStat(double* cpu_ticks, double* start_ticks, double* vsize, double* rss_pages) {
  std::ifstream in("/proc/self/stat");
  std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  const auto close = text.rfind(')');
  if (close == std::string::npos) return false;
  std::istringstream fields(text.substr(close + 2));  // field 3 onwards
  std::string f;
  double utime = 0, stime = 0;
  for (int i = 3; i <= 24 && (fields >> f); ++i) {
    if (i == 14) utime = std::stod(f);
    if (i == 15) stime = std::stod(f);
    if (i == 22) *start_ticks = std::stod(f);
    if (i == 23) *vsize = std::stod(f);
    if (i == 24) *rss_pages = std::stod(f);
  }
  *cpu_ticks = utime + stime;
  return bool(fields);
}

// "btime" of /proc/stat: the boot time in Unix seconds; 0 if unreadable.
double BootTime() {
  std::ifstream in("/proc/stat");
  for (std::string key; in >> key;) {
    if (key == "btime") {
      double t = 0;
      in >> t;
      return t;
    }
    in.ignore(1 << 20, '\n');
  }
  return 0;
}

int OpenFds() {
  DIR* d = ::opendir("/proc/self/fd");
  if (d == nullptr) return -1;
  int n = 0;
  while (const dirent* e = ::readdir(d)) n += e->d_name[0] != '.';
  ::closedir(d);
  return n - 1;  // the directory stream's own descriptor
}

}  // namespace

std::vector<MetricFamily> ProcessMetrics::Collect() const {
  std::vector<MetricFamily> out;
  double cpu = 0, start = 0, vsize = 0, rss = 0;
  const double ticks = static_cast<double>(::sysconf(_SC_CLK_TCK));
  if (ReadStat(&cpu, &start, &vsize, &rss)) {
    out.push_back(One("process_resident_memory_bytes", "Resident memory size in bytes",
                      MetricType::Gauge, rss * static_cast<double>(::sysconf(_SC_PAGESIZE))));
    out.push_back(One("process_virtual_memory_bytes", "Virtual memory size in bytes",
                      MetricType::Gauge, vsize));
    out.push_back(One("process_cpu_seconds_total",
                      "Total user and system CPU time spent in seconds", MetricType::Counter,
                      cpu / ticks));
    if (const double boot = BootTime(); boot > 0)
      out.push_back(One("process_start_time_seconds",
                        "Start time of the process since unix epoch in seconds", MetricType::Gauge,
                        boot + start / ticks));
  }
  if (const int fds = OpenFds(); fds >= 0)
    out.push_back(
        One("process_open_fds", "Number of open file descriptors", MetricType::Gauge, fds));
  return out;
}

}  // namespace cosmoflow
