#include "server/batcher.h"

#include <omp.h>

#include <algorithm>

#include "core/base/log.h"

namespace cosmoflow {
namespace {

double Seconds(std::chrono::steady_clock::duration d) {
  return std::chrono::duration<double>(d).count();
}

}  // namespace

Batcher::Batcher(const BatcherOptions& options, Metrics* metrics)
    : options_(options), metrics_(metrics) {
  worker_ = std::thread([this] { WorkerLoop(); });
}

Batcher::~Batcher() { Stop(); }

void Batcher::SetModel(std::shared_ptr<Model> model) {
  std::lock_guard<std::mutex> lock(mu_);
  model_ = std::move(model);
}

std::shared_ptr<Model> Batcher::model() const {
  std::lock_guard<std::mutex> lock(mu_);
  return model_;
}

int Batcher::queue_depth() const {
  std::lock_guard<std::mutex> lock(mu_);
  return int(queue_.size());
}

Status Batcher::Submit(std::vector<std::unique_ptr<InferenceRequest>>& requests) {
  const auto now = std::chrono::steady_clock::now();
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (stopping_) return UnavailableError("the server is shutting down");
    if (queue_.size() + requests.size() > size_t(options_.max_queue))
      return ResourceExhaustedError("the request queue is full (" + std::to_string(queue_.size()) +
                                    " of " + std::to_string(options_.max_queue) +
                                    " cubes waiting); retry later");
    CF_RETURN_IF_ERROR(ChargeConnectionsLocked(requests));
    NoteLoadLocked(int(requests.size()));
    for (auto& r : requests) {
      r->enqueued = now;
      queue_.push_back(std::move(r));
    }
    if (metrics_) metrics_->SetQueueDepth(double(queue_.size()));
  }
  requests.clear();
  cv_.notify_one();
  return Status::Ok();
}

Status Batcher::ChargeConnectionsLocked(std::vector<std::unique_ptr<InferenceRequest>>& requests) {
  const int limit = options_.max_inflight_per_connection;
  if (limit <= 0) return Status::Ok();
  std::map<std::string, int> adding;
  for (const auto& r : requests)
    if (!r->connection.empty()) ++adding[r->connection];
  for (const auto& [connection, n] : adding) {
    const int have = inflight_.count(connection) ? inflight_[connection] : 0;
    if (have + n > limit) {
      if (metrics_) metrics_->RecordLimitRejection("inflight_per_connection");
      return ResourceExhaustedError("this connection has " + std::to_string(have) +
                                    " cubes in flight and sends " + std::to_string(n) +
                                    " more; the server allows " + std::to_string(limit) +
                                    " per connection (--max-inflight-per-connection)");
    }
  }
  for (const auto& [connection, n] : adding) inflight_[connection] += n;
  for (auto& r : requests) {
    if (r->connection.empty()) continue;
    r->done = [this, connection = r->connection, done = std::move(r->done)](
                  const Status& s, InferenceResult&& result) {
      ReleaseConnection(connection);  // first: the client may send its next cube from `done`
      done(s, std::move(result));
    };
  }
  return Status::Ok();
}

void Batcher::ReleaseConnection(const std::string& connection) {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = inflight_.find(connection);
  if (it != inflight_.end() && --it->second <= 0) inflight_.erase(it);
}

std::chrono::steady_clock::duration PeakWindow(double last_compute_seconds) {
  return std::chrono::duration_cast<std::chrono::steady_clock::duration>(
      std::chrono::duration<double>(std::max(2.0, 3 * last_compute_seconds)));
}

void Batcher::NoteLoadLocked(int submitting) {
  // The submitter itself is among those preparing (server handlers hold a BeginPrepare).
  const int outstanding =
      int(queue_.size()) + computing_ + std::max(0, preparing_ - 1) + submitting;
  const auto now = std::chrono::steady_clock::now();
  if (outstanding >= recent_peak_ || now - recent_peak_at_ > PeakWindow(last_compute_seconds_)) {
    recent_peak_ = outstanding;
    recent_peak_at_ = now;
  }
}

int Batcher::TargetBatchLocked(int max_batch) const {
  if (!options_.adaptive) return max_batch;
  const bool recent =
      std::chrono::steady_clock::now() - recent_peak_at_ <= PeakWindow(last_compute_seconds_);
  return std::max(1, std::min(max_batch, recent ? recent_peak_ : 1));
}

void Batcher::BeginPrepare() {
  std::lock_guard<std::mutex> lock(mu_);
  ++preparing_;
}

void Batcher::EndPrepare() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    --preparing_;
  }
  cv_.notify_one();
}

void Batcher::Stop() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stopping_ = true;
  }
  cv_.notify_all();
  // worker_ itself is touched only under join_mu_, so concurrent Stop() calls join it once.
  std::lock_guard<std::mutex> lock(join_mu_);
  if (worker_.joinable()) worker_.join();
}

void Batcher::WorkerLoop() {
  std::vector<std::unique_ptr<InferenceRequest>> batch;
  std::chrono::steady_clock::time_point last_batch_end;
  std::unique_lock<std::mutex> lock(mu_);
  for (;;) {
    cv_.wait(lock, [&] { return stopping_ || !queue_.empty(); });
    if (queue_.empty()) break;  // stopping and drained
    const int max_batch = model_ ? std::min(options_.max_batch, model_->options().max_batch) : 1;
    // Wait for company, but never longer than max_queue_delay after the oldest arrived, or
    // max_prepare_wait more while requests that will join are still being prepared. While
    // stopping, queued work is run at once.
    auto delay = options_.max_queue_delay;
    if (delay.count() < 0) {
      const double auto_seconds = model_ ? std::min(0.1, 0.1 * model_->forward1_seconds()) : 0.0;
      delay = std::chrono::microseconds(int64_t(auto_seconds * 1e6));
    }
    // Counted from the oldest arrival or the end of the last batch, whichever is later: requests
    // that queued during a long forward pass must not make the next batch leave at once, half
    // full, while the clients just answered are sending their next cubes (with four closed-loop
    // clients that would settle into batches of 2 + 2 instead of 4).
    const auto flush_at = std::max(queue_.front()->enqueued, last_batch_end) + delay;
    const auto hard_flush_at = flush_at + options_.max_prepare_wait;
    auto full = [&] {
      return stopping_ || int(queue_.size()) >= TargetBatchLocked(max_batch) ||
             (options_.adaptive && int(queue_.size()) >= options_.max_queue);  // none can join
    };
    cv_.wait_until(lock, flush_at, full);
    while (!full() && preparing_ > 0 && std::chrono::steady_clock::now() < hard_flush_at)
      cv_.wait_until(lock, hard_flush_at);
    const int n = std::min<int>(max_batch, int(queue_.size()));
    batch.clear();
    for (int i = 0; i < n; ++i) {
      batch.push_back(std::move(queue_.front()));
      queue_.pop_front();
    }
    if (metrics_) metrics_->SetQueueDepth(double(queue_.size()));
    computing_ = n;
    lock.unlock();
    RunBatch(batch);
    last_batch_end = std::chrono::steady_clock::now();
    batch.clear();
    lock.lock();
  }
}

void Batcher::RunBatch(std::vector<std::unique_ptr<InferenceRequest>>& batch) {
  const auto start = std::chrono::steady_clock::now();
  std::shared_ptr<Model> model = this->model();
  std::vector<InferenceRequest*> computed = AnswerUncomputable(batch, model.get(), start);
  if (computed.empty()) {
    std::lock_guard<std::mutex> lock(mu_);
    computing_ = 0;
    return;
  }
  Compute(computed, model, start);
}

std::vector<InferenceRequest*> Batcher::AnswerUncomputable(
    std::vector<std::unique_ptr<InferenceRequest>>& batch, const Model* model,
    std::chrono::steady_clock::time_point start) {
  // Answer what must not be computed: expired, cancelled, or no model.
  const auto wall_now = std::chrono::system_clock::now();
  std::vector<InferenceRequest*> live;
  for (auto& r : batch) {
    if (metrics_) metrics_->RecordQueueWait(Seconds(start - r->enqueued));
    // Deadline first: gRPC also marks an expired call cancelled, and the deadline is the reason.
    if (r->deadline <= wall_now) {
      r->done(Status(StatusCode::kDeadlineExceeded,
                     "the deadline passed after " + std::to_string(Seconds(start - r->enqueued)) +
                         " s in the queue, before the cube was computed"),
              {});
    } else if (r->cancelled && r->cancelled()) {
      r->done(Status(StatusCode::kCancelled, "the request was cancelled before it was computed"),
              {});
    } else if (!model) {
      r->done(UnavailableError("no model is loaded"), {});
    } else {
      live.push_back(r.get());
    }
  }
  if (live.empty()) return live;
  // A request validated against an earlier model is refused if a reload changed the input shape
  // meanwhile.
  const ModelSpec& spec = model->spec();
  const CubeShape want{spec.input_channels, spec.input_side, spec.input_side, spec.input_side};
  std::vector<InferenceRequest*> computed;
  for (InferenceRequest* r : live) {
    if (r->cube.shape == want) {
      computed.push_back(r);
    } else {
      r->done(
          FailedPreconditionError("the model changed to " + model->version() + ", which takes " +
                                  want.ToString() + " cubes, while the request waited"),
          {});
    }
  }
  return computed;
}

void Batcher::Compute(const std::vector<InferenceRequest*>& computed,
                      const std::shared_ptr<Model>& model,
                      std::chrono::steady_clock::time_point start) {
  // The cubes are transformed here, straight into the batch, rather than on the gRPC threads into
  // a copy of their own: no allocation and copy of a cube per request, and on two cores any work
  // beside the forward pass preempts one of its OpenMP threads, which the other then waits for at
  // every barrier.
  const int64_t elements = model->input_elements();
  const int p = model->num_outputs();
  const InputTransform transform = model->spec().input_transform;
  batch_input_.resize(computed.size() * size_t(elements));
  batch_output_.resize(computed.size() * size_t(p));
  const bool with_cov = model->has_uncertainty();
  batch_cov_.resize(with_cov ? computed.size() * size_t(p) * p : 0);
  const int threads = std::min<int>(int(computed.size()), omp_get_max_threads());
#pragma omp parallel for schedule(static) num_threads(threads)
  for (size_t i = 0; i < computed.size(); ++i)
    CubeToNetworkInput(computed[i]->cube, transform, batch_input_.data() + i * elements);
  const int m = int(computed.size());
  const auto compute_start = std::chrono::steady_clock::now();
  // Every member of an ensemble runs this same batch (Model::Forward).
  model->Forward(m, batch_input_.data(), batch_output_.data(), with_cov ? batch_cov_.data() : nullptr);
  const auto compute_end = std::chrono::steady_clock::now();
  const double compute_seconds = Seconds(compute_end - compute_start);
  {
    // Before the replies go out: a client that sends its next cube at once must not count the
    // batch it was part of as still outstanding.
    std::lock_guard<std::mutex> lock(mu_);
    computing_ = 0;
    last_compute_seconds_ = compute_seconds;
  }
  if (metrics_) metrics_->RecordBatch(m, compute_seconds);

  for (int i = 0; i < m; ++i) {
    InferenceRequest* r = computed[i];
    InferenceResult result;
    result.values.assign(batch_output_.begin() + size_t(i) * p,
                         batch_output_.begin() + size_t(i + 1) * p);
    if (with_cov)
      result.covariance.assign(batch_cov_.begin() + size_t(i) * p * p,
                               batch_cov_.begin() + size_t(i + 1) * p * p);
    result.model = model;
    result.queue_seconds = Seconds(start - r->enqueued);
    result.compute_seconds = compute_seconds;
    result.batch_size = m;
    r->done(Status::Ok(), std::move(result));
  }
}

}  // namespace cosmoflow
