// The dynamic batcher: groups concurrent requests into one forward pass.
//
// Requests wait in a bounded FIFO queue. One worker thread takes the oldest request, waits until
// either max_batch requests are queued or max_queue_delay has passed (since the oldest arrived or
// the last batch ended, whichever is later), and runs them as one batch through the current model.
// Requests whose deadline has passed or whose RPC was cancelled are answered without computing. The
// network runs only on this worker thread, never on a gRPC thread, and the model is read once per
// batch, so a reload swaps models between batches and no request fails because of it.
//
// Thread-safety: every public method may be called from any thread. `done` callbacks run on the
// worker thread (or on the caller of Submit/Stop when a request is refused) and must not block.
#pragma once

#include <chrono>
#include <condition_variable>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "core/base/status.h"
#include "server/metrics.h"
#include "server/model.h"
#include "server/validate.h"

namespace cosmoflow {

struct InferenceResult {
  std::vector<float> values;           // P outputs in physical units, spec order
  std::vector<double> covariance;      // P x P row-major, physical units; empty without uncertainty
  std::shared_ptr<const Model> model;  // the model that computed them
  double queue_seconds = 0;
  double compute_seconds = 0;
  int batch_size = 0;
};

struct InferenceRequest {
  CubeView cube;  // validated, not yet transformed; its bytes must outlive `done`
  std::chrono::system_clock::time_point deadline = std::chrono::system_clock::time_point::max();
  std::function<bool()> cancelled;  // optional; polled before computing
  // Called exactly once with OK and the result, or the reason the request was not computed.
  std::function<void(const Status&, InferenceResult&&)> done;
  // The client connection it came on (grpc::ServerContext::peer()); empty: not counted against
  // BatcherOptions::max_inflight_per_connection.
  std::string connection;
  std::chrono::steady_clock::time_point enqueued;  // set by Submit
};

struct BatcherOptions {
  int max_batch = 4;
  // Negative = automatic: 10% of the model's batch-1 forward time (at most 100 ms), so waiting for
  // company costs a lone request at most 10% latency, and scales with the model: large cubes take
  // long to arrive, and a small model must not wait as long as a large one.
  std::chrono::microseconds max_queue_delay{-1};
  int max_queue = 64;  // requests waiting (not counting the batch being computed)
  // When the queue delay has passed but requests are still being received and validated on gRPC
  // threads (128^3 cubes take milliseconds), the batch waits for them up to this much longer: on
  // two cores a fuller batch is worth far more than a few ms. 0 = never wait for them.
  std::chrono::microseconds max_prepare_wait{50000};
  // Adaptive early flush: a batch leaves as soon as it holds as many cubes as were recently
  // outstanding at once (queued + being prepared + being computed, peak over the last few
  // seconds), capped by max_batch. A lone client then never waits for company that is not coming,
  // and a burst still fills batches. false: always wait up to max_queue_delay for max_batch.
  bool adaptive = true;
  // Most cubes one client connection may have queued or computing at once (0: no limit), so one
  // client cannot fill the whole queue and starve the others.
  int max_inflight_per_connection = 0;
};

class Batcher {
 public:
  Batcher(const BatcherOptions& options, Metrics* metrics);
  ~Batcher();  // Stop()

  // The model the next batch will use; may be swapped at any time.
  void SetModel(std::shared_ptr<Model> model);
  std::shared_ptr<Model> model() const;

  // Enqueues all `requests` or none: RESOURCE_EXHAUSTED when the queue has no room for all of them
  // or their connection would exceed max_inflight_per_connection, UNAVAILABLE once stopping. On
  // error the requests' `done` is not called (the caller answers).
  Status Submit(std::vector<std::unique_ptr<InferenceRequest>>& requests);

  // Marks a request as being prepared (validated) so that a batch about to be flushed
  // waits for it (see max_prepare_wait). Every BeginPrepare is followed by one EndPrepare, after
  // the Submit of that request (or after giving up on it).
  void BeginPrepare();
  void EndPrepare();

  // Refuses new requests, computes those already queued, joins the worker.
  void Stop();
  int queue_depth() const;
  const BatcherOptions& options() const { return options_; }

 private:
  void WorkerLoop();
  void RunBatch(std::vector<std::unique_ptr<InferenceRequest>>& batch);
  // Answers the requests that must not be computed (expired, cancelled, no model, a shape the
  // model no longer takes) and returns the others.
  std::vector<InferenceRequest*> AnswerUncomputable(
      std::vector<std::unique_ptr<InferenceRequest>>& batch, const Model* model,
      std::chrono::steady_clock::time_point start);
  // Transforms `computed` into the batch input, runs the model and answers them.
  void Compute(const std::vector<InferenceRequest*>& computed, const std::shared_ptr<Model>& model,
               std::chrono::steady_clock::time_point start);

  const BatcherOptions options_;
  Metrics* metrics_;
  mutable std::mutex mu_;
  std::condition_variable cv_;
  std::deque<std::unique_ptr<InferenceRequest>> queue_;
  std::shared_ptr<Model> model_;
  void NoteLoadLocked(int submitting);
  // Counts `requests` against their connections' limit (RESOURCE_EXHAUSTED if over it) and wraps
  // their `done` so that each releases its slot first.
  Status ChargeConnectionsLocked(std::vector<std::unique_ptr<InferenceRequest>>& requests);
  void ReleaseConnection(const std::string& connection);
  std::map<std::string, int> inflight_;  // cubes queued or computing, by connection
  int TargetBatchLocked(int max_batch) const;

  int preparing_ = 0;
  int computing_ = 0;    // cubes in the running batch
  int recent_peak_ = 0;  // most cubes outstanding at once, recently
  std::chrono::steady_clock::time_point recent_peak_at_;
  double last_compute_seconds_ = 0;
  bool stopping_ = false;
  std::vector<float> batch_input_;   // worker only
  std::vector<float> batch_output_;  // worker only
  std::vector<double> batch_cov_;    // worker only
  std::mutex join_mu_;               // guards worker_ (joined by Stop)
  std::thread worker_;
};

// Marks one request as being prepared for as long as it lives (Batcher::BeginPrepare/EndPrepare):
// a handler holds one from receiving a request until it has submitted it or given up.
class PrepareScope {
 public:
  explicit PrepareScope(Batcher* batcher) : batcher_(batcher) { batcher_->BeginPrepare(); }
  ~PrepareScope() { batcher_->EndPrepare(); }
  PrepareScope(const PrepareScope&) = delete;
  PrepareScope& operator=(const PrepareScope&) = delete;

 private:
  Batcher* batcher_;
};

}  // namespace cosmoflow
