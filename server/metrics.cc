#include "server/metrics.h"

#include <prometheus/text_serializer.h>

#include <exception>

namespace cosmoflow {
namespace {

using prometheus::BuildCounter;
using prometheus::BuildGauge;
using prometheus::BuildHistogram;
using prometheus::Histogram;

// Latency buckets from 1 ms to 60 s: a 32^3 test cube takes about a millisecond, a 128^3 batch of
// the SC18 network about a second on two cores.
Histogram::BucketBoundaries LatencyBuckets() {
  return {0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60};
}

}  // namespace

Metrics::Metrics()
    : registry_(std::make_shared<prometheus::Registry>()),
      process_(std::make_shared<ProcessMetrics>()),
      requests_(
          BuildCounter()
              .Name("cosmoflow_requests_total")
              .Help("Finished requests (a stream counts each message) by method and gRPC code")
              .Register(*registry_)),
      request_duration_(BuildHistogram()
                            .Name("cosmoflow_request_duration_seconds")
                            .Help("Time from a request's arrival to its reply, by method")
                            .Register(*registry_)),
      received_bytes_(BuildCounter()
                          .Name("cosmoflow_received_bytes_total")
                          .Help("Bytes of cube data received in requests")
                          .Register(*registry_)
                          .Add({})),
      queue_wait_(BuildHistogram()
                      .Name("cosmoflow_queue_wait_seconds")
                      .Help("Time a cube waited in the batcher queue before its forward pass")
                      .Register(*registry_)
                      .Add({}, LatencyBuckets())),
      compute_(BuildHistogram()
                   .Name("cosmoflow_compute_seconds")
                   .Help("Duration of one batched forward pass")
                   .Register(*registry_)
                   .Add({}, LatencyBuckets())),
      batch_size_(BuildHistogram()
                      .Name("cosmoflow_batch_size")
                      .Help("Cubes per forward pass")
                      .Register(*registry_)
                      .Add({}, Histogram::BucketBoundaries{1, 2, 4, 8, 16, 32, 64})),
      cubes_(BuildCounter()
                 .Name("cosmoflow_predicted_cubes_total")
                 .Help("Cubes that went through a forward pass")
                 .Register(*registry_)
                 .Add({})),
      queue_depth_(BuildGauge()
                       .Name("cosmoflow_queue_depth")
                       .Help("Cubes waiting in the batcher queue")
                       .Register(*registry_)
                       .Add({})),
      model_info_(
          BuildGauge()
              .Name("cosmoflow_model_info")
              .Help("The model being served (value 1; version, spec and checksum as labels)")
              .Register(*registry_)),
      load_duration_(BuildGauge()
                         .Name("cosmoflow_model_load_duration_seconds")
                         .Help("Time to read, verify, build and warm up the current model")
                         .Register(*registry_)
                         .Add({})),
      load_timestamp_(BuildGauge()
                          .Name("cosmoflow_model_load_timestamp_seconds")
                          .Help("Unix time at which the current model started serving")
                          .Register(*registry_)
                          .Add({})),
      reloads_(BuildCounter()
                   .Name("cosmoflow_model_reloads_total")
                   .Help("Model reload attempts by result")
                   .Register(*registry_)),
      reload_success_(reloads_.Add({{"result", "success"}})),
      reload_failure_(reloads_.Add({{"result", "failure"}})),
      limit_rejections_(BuildCounter()
                            .Name("cosmoflow_limit_rejections_total")
                            .Help("Requests and streams refused or closed by a per-connection limit")
                            .Register(*registry_)) {}

Metrics::~Metrics() = default;

Status Metrics::StartExposer(const std::string& address) {
  try {
    exposer_ = std::make_unique<prometheus::Exposer>(address);
  } catch (const std::exception& e) {
    return UnavailableError("metrics: cannot listen on '" + address + "': " + e.what());
  }
  exposer_->RegisterCollectable(registry_);
  exposer_->RegisterCollectable(process_);
  return Status::Ok();
}

int Metrics::exposer_port() const {
  if (!exposer_) return 0;
  auto ports = exposer_->GetListeningPorts();
  return ports.empty() ? 0 : ports.front();
}

void Metrics::RecordRequest(const std::string& method, const std::string& code, double seconds) {
  prometheus::Counter* counter;
  prometheus::Histogram* histogram;
  {
    std::lock_guard<std::mutex> lock(mu_);
    auto& c = request_counters_[{method, code}];
    if (!c) c = &requests_.Add({{"method", method}, {"code", code}});
    counter = c;
    auto& h = duration_histograms_[method];
    if (!h) h = &request_duration_.Add({{"method", method}}, LatencyBuckets());
    histogram = h;
  }
  counter->Increment();
  histogram->Observe(seconds);
}

void Metrics::RecordLimitRejection(const std::string& limit) {
  limit_rejections_.Add({{"limit", limit}}).Increment();  // Add returns the existing series
}

void Metrics::AddReceivedBytes(double bytes) { received_bytes_.Increment(bytes); }
void Metrics::RecordQueueWait(double seconds) { queue_wait_.Observe(seconds); }

void Metrics::RecordBatch(int batch_size, double compute_seconds) {
  batch_size_.Observe(batch_size);
  compute_.Observe(compute_seconds);
  cubes_.Increment(batch_size);
}

void Metrics::SetQueueDepth(double depth) { queue_depth_.Set(depth); }

void Metrics::SetModel(const std::string& version, const std::string& spec,
                       const std::string& checksum, double load_seconds,
                       double loaded_at_unix_seconds) {
  std::lock_guard<std::mutex> lock(mu_);
  // Only the serving model has an info series, so a query of cosmoflow_model_info is unambiguous.
  if (current_model_info_) model_info_.Remove(current_model_info_);
  current_model_info_ =
      &model_info_.Add({{"version", version}, {"spec", spec}, {"checksum", checksum}});
  current_model_info_->Set(1);
  load_duration_.Set(load_seconds);
  load_timestamp_.Set(loaded_at_unix_seconds);
}

void Metrics::RecordReload(bool success) {
  (success ? reload_success_ : reload_failure_).Increment();
}

std::string Metrics::Serialize() const {
  prometheus::TextSerializer serializer;
  auto families = registry_->Collect();
  for (auto& f : process_->Collect()) families.push_back(std::move(f));
  return serializer.Serialize(families);
}

}  // namespace cosmoflow
