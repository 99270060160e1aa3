// The process's own metrics under the standard Prometheus client names, read from /proc at each
// scrape (prometheus-cpp has no process collector): process_resident_memory_bytes,
// process_virtual_memory_bytes, process_cpu_seconds_total, process_start_time_seconds,
// process_open_fds. Linux only. Thread-safe: Collect() keeps no state.
#pragma once

#include <prometheus/collectable.h>
#include <prometheus/metric_family.h>

#include <vector>

namespace cosmoflow {

class ProcessMetrics : public prometheus::Collectable {
 public:
  // Families whose /proc source cannot be read are left out of the scrape.
  std::vector<prometheus::MetricFamily> Collect() const override;
};

}  // namespace cosmoflow
