// Prometheus metrics of the inference server: one object owns the prometheus-cpp registry and every
// metric family (the core knows nothing of Prometheus). Names are a public contract, listed in
// docs/serving.md; they follow Prometheus conventions (cosmoflow_ prefix, base units, _total for
// counters, _seconds for durations, _bytes for sizes).
//
// Thread-safety: every method may be called from any thread.
#pragma once

#include <prometheus/counter.h>
#include <prometheus/exposer.h>
#include <prometheus/family.h>
#include <prometheus/gauge.h>
#include <prometheus/histogram.h>
#include <prometheus/registry.h>

#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <utility>

#include "core/base/status.h"
#include "server/process_metrics.h"

namespace cosmoflow {

class Metrics {
 public:
  Metrics();
  ~Metrics();

  // Serves the text exposition at http://<address>/metrics. Port 0 picks a free port.
  Status StartExposer(const std::string& address);
  int exposer_port() const;  // 0 when not started

  // One finished RPC (or one message of a stream): by method ("Predict", ...) and gRPC code name
  // ("OK", "INVALID_ARGUMENT", ...), and its latency.
  void RecordRequest(const std::string& method, const std::string& code, double seconds);
  void AddReceivedBytes(double bytes);
  // One cube's wait in the batcher queue.
  void RecordQueueWait(double seconds);
  // One forward pass of `batch_size` cubes.
  void RecordBatch(int batch_size, double compute_seconds);
  void SetQueueDepth(double depth);
  // The model now serving; replaces the previous model's info series.
  void SetModel(const std::string& version, const std::string& spec, const std::string& checksum,
                double load_seconds, double loaded_at_unix_seconds);
  void RecordReload(bool success);
  // A request or stream refused by a per-connection limit ("inflight_per_connection",
  // "streams_per_connection") or a stream closed for idling ("stream_idle").
  void RecordLimitRejection(const std::string& limit);

  // The text exposition (what /metrics returns, with the process_* families), for tests and logs.
  std::string Serialize() const;
  prometheus::Registry& registry() { return *registry_; }

 private:
  std::shared_ptr<prometheus::Registry> registry_;
  std::shared_ptr<ProcessMetrics> process_;  // process_resident_memory_bytes, ... (not in the registry)
  std::unique_ptr<prometheus::Exposer> exposer_;

  prometheus::Family<prometheus::Counter>& requests_;
  prometheus::Family<prometheus::Histogram>& request_duration_;
  prometheus::Counter& received_bytes_;
  prometheus::Histogram& queue_wait_;
  prometheus::Histogram& compute_;
  prometheus::Histogram& batch_size_;
  prometheus::Counter& cubes_;
  prometheus::Gauge& queue_depth_;
  prometheus::Family<prometheus::Gauge>& model_info_;
  prometheus::Gauge& load_duration_;
  prometheus::Gauge& load_timestamp_;
  prometheus::Family<prometheus::Counter>& reloads_;
  prometheus::Counter& reload_success_;
  prometheus::Counter& reload_failure_;
  prometheus::Family<prometheus::Counter>& limit_rejections_;

  mutable std::mutex mu_;  // guards the caches below and model_info_ replacement
  std::map<std::pair<std::string, std::string>, prometheus::Counter*> request_counters_;
  std::map<std::string, prometheus::Histogram*> duration_histograms_;
  prometheus::Gauge* current_model_info_ = nullptr;
};

}  // namespace cosmoflow
