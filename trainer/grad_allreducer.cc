#include "trainer/grad_allreducer.h"

#include <cassert>
#include <chrono>
#include <cstring>

namespace cosmoflow {
namespace {
// Not MPI_Wtime: in kThread mode the communication thread may be inside MPI at that moment.
double Now() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}
}  // namespace

GradientAllreducer::GradientAllreducer(std::vector<Parameter>* params, MPI_Comm comm,
                                       int64_t bucket_bytes, Mode mode)
    : params_(params), comm_(comm), mode_(mode) {
  MPI_Comm_size(comm_, &world_size_);
  const int n = static_cast<int>(params_->size());
  bucket_of_.assign(n, -1);
  slot_of_.assign(n, -1);
  const int64_t bucket_floats = bucket_bytes / 4 > 0 ? bucket_bytes / 4 : 1;
  for (int i = n - 1; i >= 0; --i) {
    const int64_t numel = (*params_)[i].numel();
    if (buckets_.empty() ||
        (static_cast<int64_t>(buckets_.back().buffer.size()) > 0 &&
         static_cast<int64_t>(buckets_.back().buffer.size()) + numel > bucket_floats)) {
      buckets_.emplace_back();
    }
    Bucket& b = buckets_.back();
    bucket_of_[i] = static_cast<int>(buckets_.size()) - 1;
    slot_of_[i] = static_cast<int>(b.params.size());
    b.params.push_back(i);
    b.offset.push_back(static_cast<int64_t>(b.buffer.size()));
    b.buffer.resize(b.buffer.size() + numel);
    total_floats_ += numel;
  }
  in_flight_.reserve(buckets_.size());
  if (mode_ == Mode::kThread && world_size_ > 1)
    comm_thread_ = std::thread([this] { CommThread(); });
}

GradientAllreducer::~GradientAllreducer() {
  if (comm_thread_.joinable()) {
    {
      std::lock_guard<std::mutex> lock(mu_);
      stop_ = true;
    }
    cv_.notify_all();
    comm_thread_.join();
  }
  for (Bucket& b : buckets_) {
    if (b.request != MPI_REQUEST_NULL) MPI_Wait(&b.request, MPI_STATUS_IGNORE);
  }
}

void GradientAllreducer::CommThread() {
  for (;;) {
    int k = -1;
    {
      std::unique_lock<std::mutex> lock(mu_);
      cv_.wait(lock, [&] { return stop_ || !queue_.empty(); });
      if (queue_.empty()) return;  // stop requested and nothing left
      k = queue_.front();
      queue_.pop_front();
    }
    Bucket& b = buckets_[k];
    MPI_Allreduce(MPI_IN_PLACE, b.buffer.data(), static_cast<int>(b.buffer.size()), MPI_FLOAT,
                  MPI_SUM, comm_);
    {
      std::lock_guard<std::mutex> lock(mu_);
      ++done_;
    }
    cv_.notify_all();
  }
}

void GradientAllreducer::StartBucket(int k) {
  Bucket& s = buckets_[k];
  if (mode_ == Mode::kThread) {
    {
      std::lock_guard<std::mutex> lock(mu_);
      queue_.push_back(k);
    }
    cv_.notify_all();
  } else {
    MPI_Iallreduce(MPI_IN_PLACE, s.buffer.data(), static_cast<int>(s.buffer.size()), MPI_FLOAT,
                   MPI_SUM, comm_, &s.request);
  }
}

void GradientAllreducer::BeginStep() {
  for (Bucket& b : buckets_) {
    assert(b.request == MPI_REQUEST_NULL);
    b.pending = static_cast<int>(b.params.size());
  }
  next_bucket_to_start_ = 0;
  first_start_time_ = 0;
  std::lock_guard<std::mutex> lock(mu_);
  done_ = 0;
}

void GradientAllreducer::OnGradReady(int param_index) {
  if (world_size_ == 1) return;
  Bucket& b = buckets_[bucket_of_[param_index]];
  const Parameter& p = (*params_)[param_index];
  std::memcpy(b.buffer.data() + b.offset[slot_of_[param_index]], p.grad, p.numel() * sizeof(float));
  if (--b.pending == 0) {
    // Collectives must start in the same order on every rank; buckets are filled in a fixed order,
    // so start every bucket that is complete, in order (a later one never starts before an
    // earlier).
    while (next_bucket_to_start_ < num_buckets() && buckets_[next_bucket_to_start_].pending == 0) {
      if (first_start_time_ == 0) first_start_time_ = Now();
      StartBucket(next_bucket_to_start_++);
    }
  }
  if (mode_ == Mode::kNonblocking) Progress();
}

void GradientAllreducer::Progress() {
  // MPI_Test* drives OpenMPI's progress engine; without it a nonblocking collective advances only
  // inside the final wait, and nothing would overlap.
  for (int k = 0; k < next_bucket_to_start_; ++k) {
    if (buckets_[k].request != MPI_REQUEST_NULL) {
      int done = 0;
      MPI_Test(&buckets_[k].request, &done, MPI_STATUS_IGNORE);
    }
  }
}

void GradientAllreducer::FinishStep() {
  last_wait_seconds_ = 0;
  last_span_seconds_ = 0;
  if (world_size_ == 1) return;
  assert(next_bucket_to_start_ == num_buckets() &&
         "OnGradReady was not called for every parameter");
  const double t0 = Now();
  if (mode_ == Mode::kThread) {
    std::unique_lock<std::mutex> lock(mu_);
    cv_.wait(lock, [&] { return done_ == num_buckets(); });
  }
  const float inv = 1.0f / static_cast<float>(world_size_);
  for (Bucket& b : buckets_) {
    if (b.request != MPI_REQUEST_NULL) MPI_Wait(&b.request, MPI_STATUS_IGNORE);
    for (size_t k = 0; k < b.params.size(); ++k) {
      Parameter& p = (*params_)[b.params[k]];
      const float* src = b.buffer.data() + b.offset[k];
      const int64_t n = p.numel();
      for (int64_t j = 0; j < n; ++j) p.grad[j] = src[j] * inv;
    }
  }
  const double t1 = Now();
  last_wait_seconds_ = t1 - t0;
  last_span_seconds_ = first_start_time_ > 0 ? t1 - first_start_time_ : 0;
}

}  // namespace cosmoflow
